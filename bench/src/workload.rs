//! The workloads the benchmarks run: forked processes of chosen CPU and memory shapes, skewed, churning, killed when dropped.

use std::time::{Duration, Instant};

use resourcewatch_agent::{
    pipelines::{PipelineOptions, Pipelines},
    procfs,
};

use crate::fail;

/// Forked children that are killed (and die with us) when dropped.
pub(crate) struct Workload {
    pub(crate) pids: Vec<u32>,
}

impl Drop for Workload {
    fn drop(&mut self) {
        for &p in &self.pids {
            // SAFETY: signalling and reaping our own children.
            unsafe {
                libc::kill(p as i32, libc::SIGKILL);
                libc::waitpid(p as i32, std::ptr::null_mut(), 0);
            }
        }
    }
}

pub(crate) fn fork(work: impl FnOnce()) -> u32 {
    // SAFETY: the child runs `work` (busy loops, mmap, fork) and _exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        fail(&std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: prctl and _exit with constant arguments.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        work();
        unsafe { libc::_exit(0) };
    }
    pid as u32
}

pub(crate) fn epochs_under_churn(epochs: u32, epoch: Duration, churn: Duration) {
    let hog = fork(|| {
        loop {
            std::hint::spin_loop();
        }
    });
    let churner = fork(move || {
        loop {
            let kid = fork(|| touch_anon(50 << 20));
            // SAFETY: reaping our own child.
            unsafe { libc::waitpid(kid as i32, std::ptr::null_mut(), 0) };
            std::thread::sleep(churn);
        }
    });
    let _workload = Workload {
        pids: vec![hog, churner],
    };
    let pipes = Pipelines::load(PipelineOptions::default()).unwrap_or_else(|e| fail(&e));
    pipes.close_cpu_epoch();
    let mut prev = procfs::cpu_ns(hog).unwrap_or_else(|| fail(&"the hog exited"));
    let (mut off, mut worst) = (0, 1.0f64);
    for _ in 0..epochs {
        std::thread::sleep(epoch);
        let truth = procfs::cpu_ns(hog).unwrap_or_else(|| fail(&"the hog exited"));
        let got = pipes
            .close_cpu_epoch()
            .per_tgid
            .get(&hog)
            .copied()
            .unwrap_or(0);
        let ratio = got as f64 / (truth - prev).max(1) as f64;
        if (ratio - 1.0).abs() > 0.10 {
            off += 1;
        }
        if (ratio - 1.0).abs() > (worst - 1.0).abs() {
            worst = ratio;
        }
        prev = truth;
    }
    let k = pipes.kernel_stats();
    crate::record::figure("epochs_off_by_over_10_percent", off as f64, "epochs");
    crate::record::figure("worst_ratio", worst, "x");
    println!(
        "{epochs} epochs of {epoch:?}, churn every {churn:?}: {off} off by more than 10 % \
         against /proc (worst ratio {worst:.3}); switch-ins unseen {}, rw_cpu_sync failures {}",
        k.switch_ins_unseen, k.cpu_sync_failures
    );
}

pub(crate) fn touch_anon(bytes: usize) {
    // Held for the process's lifetime on purpose.
    std::mem::forget(resourcewatch_workloads::Chunk::new(bytes as u64));
}

/// `duty_cycle` with memory that moves: after each busy part the process allocates or
/// frees 1 MiB mmaps towards `rss x (0.6 + 0.4 sin(2 pi (t / cycle + phase)))`.
pub(crate) fn moving_memory(
    duty: f64,
    period: Duration,
    rss: usize,
    cycle: Duration,
    phase: f64,
) -> ! {
    const CHUNK: usize = 1 << 20;
    let busy = period.mul_f64(duty).as_nanos() as u64;
    let start = Instant::now();
    let mut held: Vec<resourcewatch_workloads::Chunk> = Vec::new();
    let mut next = start;
    loop {
        let t0 = thread_cpu_ns();
        while thread_cpu_ns() - t0 < busy {
            std::hint::spin_loop();
        }
        let x = start.elapsed().as_secs_f64() / cycle.as_secs_f64() + phase;
        let want = rss as f64 * (0.6 + 0.4 * (std::f64::consts::TAU * x).sin());
        let chunks = (want / CHUNK as f64).round() as usize;
        while held.len() < chunks {
            match resourcewatch_workloads::Chunk::new(CHUNK as u64) {
                Some(c) => held.push(c),
                None => break,
            }
        }
        held.truncate(chunks);
        next += period;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

/// Spends `duty` of each period on the CPU. The busy part is measured in the thread's own
/// CPU time, so being preempted does not shorten it: each process gets the share asked
/// for as long as the machine is not saturated.
pub(crate) fn duty_cycle(duty: f64, period: Duration) -> ! {
    let busy = period.mul_f64(duty).as_nanos() as u64;
    let mut next = Instant::now();
    loop {
        let start = thread_cpu_ns();
        while thread_cpu_ns() - start < busy {
            std::hint::spin_loop();
        }
        next += period;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

pub(crate) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// xorshift64*, so runs are reproducible from a seed without a rand dependency.
pub(crate) struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// `procs` long-lived processes: rank i busy 10% x 0.93^i of a core (geometric, so
/// neighbouring ranks differ by 7%, well above measurement noise) and holding
/// 160 MiB x 0.92^j of touched memory, j a seeded permutation of i (CPU and memory ranks
/// are independent). Plus a spawner starting `churn` short-lived processes per second,
/// each touching 1-4 MiB and busy 1-5 ms.
/// The long-lived processes' skew: rank *i* busy `cpu_top` x `cpu_skew`^*i* of a core and
/// holding `mem_top_mib` x `mem_skew`^*j* MiB, *j* a seeded permutation of *i*.
#[derive(Clone, Copy, Debug, clap::Args)]
pub(crate) struct Skew {
    #[arg(long, default_value_t = 0.10)]
    cpu_top: f64,
    #[arg(long, default_value_t = 0.93)]
    cpu_skew: f64,
    #[arg(long, default_value_t = 160.0)]
    mem_top_mib: f64,
    #[arg(long, default_value_t = 0.92)]
    mem_skew: f64,
}

impl Default for Skew {
    fn default() -> Self {
        Self {
            cpu_top: 0.10,
            cpu_skew: 0.93,
            mem_top_mib: 160.0,
            mem_skew: 0.92,
        }
    }
}

/// The precision workload's shape: its skews, and whether its memory moves.
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) skew: Skew,
    pub(crate) memory_cycle: Option<Duration>,
}

pub(crate) fn spawn_workload(procs: usize, churn: u32, seed: u64, shape: Shape) -> Workload {
    let skew = shape.skew;
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut perm: Vec<usize> = (0..procs).collect();
    for i in (1..procs).rev() {
        perm.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let mut pids = Vec::new();
    for (i, &j) in perm.iter().enumerate() {
        let duty = skew.cpu_top * skew.cpu_skew.powi(i as i32);
        let rss = (skew.mem_top_mib * 1048576.0 * skew.mem_skew.powi(j as i32)) as usize;
        // Every 20 ms, or, for the lightest, less often (at most once a second) with at
        // least 200 µs of work each time: thousands of processes waking every 20 ms for
        // a few µs each would be a scheduler benchmark, not a node.
        let period = Duration::from_secs_f64((200e-6 / duty.max(1e-9)).clamp(0.02, 1.0));
        let phase = (rng.next() % 1000) as f64 / 1000.0;
        pids.push(match shape.memory_cycle {
            None => fork(move || {
                touch_anon(rss);
                duty_cycle(duty, period);
            }),
            Some(cycle) => fork(move || moving_memory(duty, period, rss, cycle, phase)),
        });
    }
    if churn > 0 {
        let gap = Duration::from_secs(1) / churn;
        pids.push(fork(move || {
            let mut r = Rng(seed ^ 0xDEAD_BEEF);
            loop {
                let mb = 1 + (r.next() % 4) as usize;
                let busy = Duration::from_micros(1000 + r.next() % 4000);
                fork(move || {
                    touch_anon(mb << 20);
                    let t = Instant::now();
                    while t.elapsed() < busy {
                        std::hint::spin_loop();
                    }
                });
                // Reap whatever has finished.
                // SAFETY: non-blocking reaping of our children.
                while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
                std::thread::sleep(gap);
            }
        }));
    }
    Workload { pids }
}
