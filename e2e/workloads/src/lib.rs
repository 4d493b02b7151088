//! Workload generators used by tests and benchmarks: a process that leaks anonymous memory
//! at a set rate, and the stable patterns a leak detector must not flag (flat, GC
//! sawtooth, cache warm-up plateau, bursty allocate/free, page-cache growth).
//!
//! Every pattern touches each page it allocates, so the memory is really resident and the
//! kernel's RSS counters (and rss_stat) see it. Allocation happens in small steps (every
//! 50 ms) so rates are smooth, as real leaks are. Patterns run until `stop()` is true.

pub use resourcewatch_units::parse_bytes;
use std::{
    io::Write,
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

pub const MIB: u64 = 1 << 20;
const STEP: Duration = Duration::from_millis(50);

/// What to run.
#[derive(Clone, Debug, PartialEq)]
pub enum Pattern {
    /// Hold `baseline` for `delay`, then grow by `rate` bytes/s forever.
    Leak {
        baseline: u64,
        rate: u64,
        delay: Duration,
    },
    /// Hold `size`.
    Flat { size: u64 },
    /// A garbage collector: hold `baseline`, grow by `rate` for `period`, free it all, repeat.
    Sawtooth {
        baseline: u64,
        rate: u64,
        period: Duration,
    },
    /// A cache warming up: from `baseline`, approach `baseline + cap` exponentially with time
    /// constant `tau`, then stay.
    Plateau {
        baseline: u64,
        cap: u64,
        tau: Duration,
    },
    /// Hold `baseline`; every 1-5 s allocate 10-`max_burst` at once, hold it 0.2-3 s, free it.
    Bursty {
        baseline: u64,
        max_burst: u64,
        seed: u64,
    },
    /// Page cache: write a `size` file, then map it and read it at `rate` bytes/s, again and
    /// again: the growth is file-backed (RssFile), not anonymous.
    PageCache { size: u64, rate: u64 },
    /// Spin on the CPU (one core), holding `size` of memory: the e2e tests' CPU hog.
    Burn { size: u64 },
}

/// Anonymous memory, touched page by page; unmapped on drop.
pub struct Chunk {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Chunk {
    pub fn new(len: u64) -> Option<Chunk> {
        let len = len.max(1) as usize;
        // SAFETY: a fresh private anonymous mapping.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        let mut off = 0;
        while off < len {
            // SAFETY: within the mapping.
            unsafe { std::ptr::write_volatile(ptr.cast::<u8>().add(off), 1) };
            off += 4096;
        }
        Some(Chunk { ptr, len })
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: unmapping what new() mapped.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Allocates (and touches) what `held` lacks to reach `target` bytes, in whole pages.
fn grow_to(held: &mut Vec<Chunk>, allocated: &mut u64, target: u64) {
    let target = target & !4095;
    if target > *allocated
        && let Some(c) = Chunk::new(target - *allocated)
    {
        held.push(c);
        *allocated = target;
    }
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Runs `p` until `stop()` returns true.
pub fn run(p: &Pattern, stop: &dyn Fn() -> bool) {
    let start = Instant::now();
    let mut held: Vec<Chunk> = Vec::new();
    let mut allocated = 0u64;
    match p {
        Pattern::Leak {
            baseline,
            rate,
            delay,
        } => {
            let _base = Chunk::new(*baseline);
            sleep_or_stop(*delay, stop);
            let start = Instant::now();
            while !stop() {
                let t = start.elapsed().as_secs_f64();
                grow_to(&mut held, &mut allocated, (*rate as f64 * t) as u64);
                std::thread::sleep(STEP);
            }
        }
        Pattern::Flat { size } => {
            let _base = Chunk::new(*size);
            while !stop() {
                std::thread::sleep(STEP);
            }
        }
        Pattern::Burn { size } => {
            let _base = Chunk::new(*size);
            let mut x = 1u64;
            while !stop() {
                for _ in 0..1_000_000 {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            }
        }
        Pattern::Sawtooth {
            baseline,
            rate,
            period,
        } => {
            let _base = Chunk::new(*baseline);
            let mut cycle_start = Instant::now();
            while !stop() {
                let t = cycle_start.elapsed();
                if t >= *period {
                    held.clear();
                    allocated = 0;
                    cycle_start = Instant::now();
                } else {
                    grow_to(
                        &mut held,
                        &mut allocated,
                        (*rate as f64 * t.as_secs_f64()) as u64,
                    );
                }
                std::thread::sleep(STEP);
            }
        }
        Pattern::Plateau { baseline, cap, tau } => {
            let _base = Chunk::new(*baseline);
            while !stop() {
                let t = start.elapsed().as_secs_f64();
                let target = *cap as f64 * (1.0 - (-t / tau.as_secs_f64()).exp());
                grow_to(&mut held, &mut allocated, target as u64);
                std::thread::sleep(STEP);
            }
        }
        Pattern::Bursty {
            baseline,
            max_burst,
            seed,
        } => {
            let _base = Chunk::new(*baseline);
            let mut s = seed | 1;
            while !stop() {
                let idle = Duration::from_millis(1000 + xorshift(&mut s) % 4000);
                sleep_or_stop(idle, stop);
                let size = 10 * MIB + xorshift(&mut s) % max_burst.saturating_sub(10 * MIB).max(1);
                let burst = Chunk::new(size);
                sleep_or_stop(Duration::from_millis(200 + xorshift(&mut s) % 2800), stop);
                drop(burst);
            }
        }
        Pattern::PageCache { size, rate } => page_cache(*size, *rate, stop),
    }
}

fn sleep_or_stop(d: Duration, stop: &dyn Fn() -> bool) {
    let end = Instant::now() + d;
    while Instant::now() < end && !stop() {
        std::thread::sleep(STEP.min(end.saturating_duration_since(Instant::now())));
    }
}

fn page_cache(size: u64, rate: u64, stop: &dyn Fn() -> bool) {
    // /var/tmp, not /tmp: on tmpfs the mapped pages would be shmem, not page cache.
    let dir = std::env::var_os("LEAK_SIM_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/var/tmp".into());
    let path = dir.join(format!("leak-sim-pagecache-{}", std::process::id()));
    // Readable too: a shared read mapping needs a descriptor opened for reading.
    let Ok(mut f) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
    else {
        return;
    };
    let block = vec![7u8; MIB as usize];
    for _ in 0..size.div_ceil(MIB) {
        if f.write_all(&block).is_err() {
            let _ = std::fs::remove_file(&path);
            return;
        }
    }
    let _ = f.sync_all();
    let len = (size.div_ceil(MIB) * MIB) as usize;
    // SAFETY: a read-only shared mapping of the file we just wrote.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    let _ = std::fs::remove_file(&path);
    if map == libc::MAP_FAILED {
        return;
    }
    let start = Instant::now();
    let mut read = 0usize;
    let mut sum = 0u64;
    while !stop() {
        let target = ((rate as f64 * start.elapsed().as_secs_f64()) as usize).min(len * 1000);
        while read < target {
            // SAFETY: within the mapping (modulo its length).
            sum = sum.wrapping_add(unsafe {
                std::ptr::read_volatile(map.cast::<u8>().add(read % len))
            } as u64);
            read += 4096;
        }
        std::thread::sleep(STEP);
    }
    std::hint::black_box(sum);
    // SAFETY: unmapping what we mapped.
    unsafe { libc::munmap(map, len) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_kb(pid: u32, key: &str) -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .and_then(|v| v.split_whitespace().next()?.parse().ok())
            })
            .unwrap_or(0)
    }

    /// Runs a pattern in a forked child for `secs` and returns (RssAnon, RssFile) growth in
    /// bytes between 1 s and the end.
    fn growth_of(p: Pattern, secs: f64) -> (i64, i64) {
        // SAFETY: the child runs the pattern (mmap, touch, sleep) and _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let end = Instant::now() + Duration::from_secs_f64(secs + 2.0);
            run(&p, &|| Instant::now() >= end);
            // SAFETY: leaving the child.
            unsafe { libc::_exit(0) };
        }
        let pid = pid as u32;
        std::thread::sleep(Duration::from_secs(1));
        let (a0, f0) = (status_kb(pid, "RssAnon:"), status_kb(pid, "RssFile:"));
        std::thread::sleep(Duration::from_secs_f64(secs));
        let (a1, f1) = (status_kb(pid, "RssAnon:"), status_kb(pid, "RssFile:"));
        // SAFETY: killing and reaping our child.
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
            libc::waitpid(pid as i32, std::ptr::null_mut(), 0);
        }
        (
            (a1 as i64 - a0 as i64) * 1024,
            (f1 as i64 - f0 as i64) * 1024,
        )
    }

    #[test]
    fn the_leak_grows_at_the_commanded_rate() {
        let rate = 4 * MIB;
        let (anon, _) = growth_of(
            Pattern::Leak {
                baseline: 8 * MIB,
                rate,
                delay: Duration::ZERO,
            },
            3.0,
        );
        let want = 3.0 * rate as f64;
        assert!(
            (anon as f64 - want).abs() < 0.1 * want,
            "grew {anon} B, wanted {want} B"
        );
    }

    #[test]
    fn page_cache_growth_is_file_backed() {
        let (anon, file) = growth_of(
            Pattern::PageCache {
                size: 64 * MIB,
                rate: 16 * MIB,
            },
            2.0,
        );
        assert!(file > 16 * MIB as i64, "RssFile grew {file} B");
        assert!(anon.abs() < 4 * MIB as i64, "RssAnon moved {anon} B");
    }
}
