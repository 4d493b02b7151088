//! Replays a fuzz target's committed corpus through the entry point libFuzzer calls, each
//! input as committed and in a fixed number of deterministic mutations, in the ordinary
//! test build (debug assertions and overflow checks on, as in the bounded libFuzzer run).
//!
//! Why not libFuzzer in `make test`: its build is every dependency again with the
//! sanitizer's and coverage's flags, which on a fresh two-CPU machine cost about 19 of
//! CI's minutes (docs/development.md) for 15 s of fuzzing per target. This replay costs
//! no build of its own and keeps what those runs caught: a panic (an overflow, an index
//! out of bounds), and an allocation sized by the input (libFuzzer's `-malloc_limit_mb`).
//! What it gives up, coverage guidance and AddressSanitizer, `make fuzz` keeps.
//!
//! Linking this crate installs [`LimitAlloc`] as the test binary's allocator (it is a
//! dev-dependency of the crates whose targets it replays, nothing else).

use std::{
    alloc::{GlobalAlloc, Layout, System},
    panic::{AssertUnwindSafe, catch_unwind},
    path::{Path, PathBuf},
    sync::atomic::{AtomicUsize, Ordering},
};

/// The largest single allocation an input may cause: what a workload or an agent declares
/// must never size one (the same 64 MiB as `e2e/run-fuzz.sh`'s `-malloc_limit_mb`).
pub const MALLOC_LIMIT: usize = 64 << 20;

/// Inputs longer than this are cut, as `e2e/run-fuzz.sh`'s `-max_len` does.
pub const MAX_LEN: usize = 262_144;

/// The system allocator, noting the largest request since [`take_largest`].
pub struct LimitAlloc;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; the only addition is a
// relaxed atomic maximum, which allocates nothing.
unsafe impl GlobalAlloc for LimitAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: LimitAlloc = LimitAlloc;

/// The largest allocation since the last call, and a fresh start.
pub fn take_largest() -> usize {
    LARGEST.swap(0, Ordering::Relaxed)
}

/// What a replay did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Replayed {
    /// Corpus files.
    pub inputs: usize,
    /// Calls of the target: each file and its mutations.
    pub runs: usize,
}

/// Replays every file of `corpus` through `target`, then `mutations` mutations of each.
/// Panics, naming the input (its file, and the mutation's number: [`mutate`] makes it
/// again), when the target panics or allocates over [`MALLOC_LIMIT`] at once, or when the
/// corpus is missing or empty (a replay of nothing would pass silently).
pub fn replay(corpus: &Path, mutations: u32, target: impl Fn(&[u8])) -> Replayed {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", corpus.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "corpus {} is empty", corpus.display());
    let mut done = Replayed::default();
    for (i, file) in files.iter().enumerate() {
        let mut data = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        data.truncate(MAX_LEN);
        run(&target, &data, file, None);
        for m in 0..mutations {
            let seed = (i as u64) << 32 | u64::from(m);
            run(&target, &mutate(&data, seed), file, Some(seed));
        }
        done.inputs += 1;
        done.runs += 1 + mutations as usize;
    }
    done
}

fn run(target: &impl Fn(&[u8]), data: &[u8], file: &Path, seed: Option<u64>) {
    let what = || match seed {
        None => format!("{}", file.display()),
        Some(s) => format!(
            "{} mutated with seed {s:#x} (fuzz_replay::mutate)",
            file.display()
        ),
    };
    take_largest();
    if catch_unwind(AssertUnwindSafe(|| target(data))).is_err() {
        panic!("the target panicked on {}", what());
    }
    let largest = take_largest();
    assert!(
        largest <= MALLOC_LIMIT,
        "{} allocated {largest} bytes at once (limit {MALLOC_LIMIT})",
        what()
    );
}

/// `data` changed by one to four of libFuzzer's simplest mutations (a bit flipped, a
/// byte or a word set to a boundary value, a cut, a slice repeated, bytes inserted),
/// chosen by `seed` alone, so a finding is made again from its seed.
pub fn mutate(data: &[u8], seed: u64) -> Vec<u8> {
    let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        // xorshift64*
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut out = data.to_vec();
    let steps = 1 + next() % 4;
    for _ in 0..steps {
        let len = out.len();
        let at = if len == 0 {
            0
        } else {
            (next() % len as u64) as usize
        };
        match next() % 6 {
            0 if len > 0 => out[at] ^= 1 << (next() % 8),
            1 if len > 0 => out[at] = [0, 1, 0x7f, 0x80, 0xff][(next() % 5) as usize],
            2 if len >= 4 => {
                let at = at.min(len - 4);
                let v: u32 =
                    [0, 1, 0x7fff_ffff, 0x8000_0000, u32::MAX, len as u32][(next() % 6) as usize];
                out[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
            3 => out.truncate(at),
            4 if len > 0 => {
                let n = 1 + (next() % 64).min(len as u64 - 1) as usize;
                let from = at.min(len - n);
                let chunk = out[from..from + n].to_vec();
                let times = 1 + (next() % 8) as usize;
                for _ in 0..times {
                    out.splice(at..at, chunk.iter().copied());
                }
            }
            _ => {
                let n = 1 + (next() % 16) as usize;
                let bytes: Vec<u8> = (0..n).map(|_| next() as u8).collect();
                out.splice(at..at, bytes);
            }
        }
        out.truncate(MAX_LEN);
    }
    out
}

/// Mutations of each committed input that `make test` replays (about 960,000 runs over
/// both fuzz crates' 3,744 inputs, seconds in the test build).
pub const MUTATIONS: u32 = 256;

/// The committed corpus of `target` in the fuzz crate at `fuzz_dir`.
pub fn corpus(fuzz_dir: &Path, target: &str) -> PathBuf {
    fuzz_dir.join("corpus").join(target)
}

/// The names of a fuzz crate's targets (`fuzz_targets/*.rs`), sorted: a replay test lists
/// the targets it replays and compares, so a target added later is not left out.
pub fn targets(fuzz_dir: &Path) -> Vec<String> {
    let dir = fuzz_dir.join("fuzz_targets");
    let mut v: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(".rs").map(str::to_owned)
        })
        .collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mutation_is_made_again_from_its_seed_and_changes_the_input() {
        let data: Vec<u8> = (0..200u8).collect();
        assert_eq!(mutate(&data, 7), mutate(&data, 7));
        let changed = (0..100).filter(|s| mutate(&data, *s) != data).count();
        assert!(
            changed >= 95,
            "only {changed} of 100 mutations changed the input"
        );
        assert!(mutate(&[], 3).len() <= MAX_LEN);
    }

    #[test]
    fn a_panic_and_a_large_allocation_are_findings_naming_the_input() {
        let dir = std::env::temp_dir().join(format!("fuzz-replay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.join("a"), b"x").unwrap_or_else(|e| panic!("{e}"));
        let ok = replay(&dir, 3, |d| assert!(d.len() < 1000));
        assert_eq!(ok, Replayed { inputs: 1, runs: 4 });
        let big = catch_unwind(|| replay(&dir, 0, |_| drop(vec![0u8; MALLOC_LIMIT + 1])));
        let msg = big
            .err()
            .and_then(|e| e.downcast::<String>().ok())
            .unwrap_or_default();
        assert!(msg.contains("allocated") && msg.contains("/a"), "{msg}");
        let panicked = catch_unwind(|| replay(&dir, 0, |_| panic!("boom")));
        let msg = panicked
            .err()
            .and_then(|e| e.downcast::<String>().ok())
            .unwrap_or_default();
        assert!(msg.contains("panicked on") && msg.contains("/a"), "{msg}");
        std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    }
}
