//! The HashPipe sketch in user space: the same update rules as the kernel programs (used by
//! tests, and to seed the memory sketch at start), and the read side that turns sketch
//! slots into a Top-K list.
//!
//! A slot is one `u64`: `(tgid << VALUE_BITS) | value`, zero when empty. The slice of
//! atomics may be plain memory (tests) or the mmapped BPF array the kernel writes to
//! concurrently; every write here is a single atomic instruction for that reason.

use std::{
    collections::HashMap,
    sync::atomic::{AtomicU64, Ordering},
};

use resourcewatch_ebpf::shared::{
    HASH_BASE, HASH_STEP, MAX_DEPTH, MAX_WIDTH_SHIFT, VALUE_BITS, VALUE_MASK,
};

/// Stages and slots per stage of one sketch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub depth: u32,
    pub width_shift: u32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GeometryError {
    #[error("sketch depth must be 1..={MAX_DEPTH}, got {0}")]
    Depth(u32),
    #[error("sketch width must be a power of two between 2 and 65536, got {0}")]
    Width(u32),
}

impl Geometry {
    /// Validates a depth and a width (slots per stage, a power of two).
    pub fn new(depth: u32, width: u32) -> Result<Self, GeometryError> {
        if depth == 0 || depth > MAX_DEPTH {
            return Err(GeometryError::Depth(depth));
        }
        if !width.is_power_of_two() || !(2..=(1 << MAX_WIDTH_SHIFT)).contains(&width) {
            return Err(GeometryError::Width(width));
        }
        Ok(Self {
            depth,
            width_shift: width.trailing_zeros(),
        })
    }

    pub fn width(&self) -> u32 {
        1 << self.width_shift
    }

    /// Slots in one copy of the sketch (one epoch half for the CPU sketch).
    pub fn slots(&self) -> usize {
        (self.depth as usize) << self.width_shift
    }

    /// Slot of `key` within stage `stage` (same formula as `hp_index` in the C program).
    pub fn index(&self, stage: u32, key: u32) -> usize {
        let mult = HASH_BASE.wrapping_add(stage.wrapping_mul(HASH_STEP));
        let h = key.wrapping_mul(mult);
        ((stage as usize) << self.width_shift) + (h >> (32 - self.width_shift)) as usize
    }
}

pub fn pack(key: u32, value: u64) -> u64 {
    ((key as u64) << VALUE_BITS) | (value & VALUE_MASK)
}

pub fn key_of(word: u64) -> u32 {
    (word >> VALUE_BITS) as u32
}

pub fn value_of(word: u64) -> u64 {
    word & VALUE_MASK
}

fn cas(slot: &AtomicU64, current: u64, new: u64) -> bool {
    slot.compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

/// Pushes `(key, value)` through the stages, the model of `hp_push`: stage 0 always
/// inserts and kicks its occupant on, later stages keep the larger and pass the smaller on.
/// With `add_on_match`, a stage already holding the key adds to it.
fn push(slots: &[AtomicU64], geo: Geometry, key: u32, value: u64, add_on_match: bool) {
    let (mut ckey, mut cval) = (key, value);
    for stage in 0..geo.depth {
        let slot = &slots[geo.index(stage, ckey)];
        let w = slot.load(Ordering::Acquire);
        if add_on_match && w != 0 && key_of(w) == ckey {
            slot.fetch_add(cval, Ordering::AcqRel);
            return;
        }
        if stage == 0 {
            let old = slot.swap(pack(ckey, cval), Ordering::AcqRel);
            if old == 0 {
                return;
            }
            (ckey, cval) = (key_of(old), value_of(old));
            continue;
        }
        if w == 0 {
            if cas(slot, 0, pack(ckey, cval)) {
                return;
            }
            continue;
        }
        if value_of(w) < cval && cas(slot, w, pack(ckey, cval)) {
            (ckey, cval) = (key_of(w), value_of(w));
        }
    }
}

/// Additive update (CPU time), the model of `cpu_sketch_add`. `slots` is one half.
pub fn add(slots: &[AtomicU64], geo: Geometry, key: u32, delta: u64) {
    push(slots, geo, key, delta, true);
}

/// Level update (resident pages), the model of `mem_sketch_set`: the key is updated in
/// place wherever it is, else inserted through the pipeline. Returns the previous value.
pub fn set(slots: &[AtomicU64], geo: Geometry, key: u32, value: u64) -> Option<u64> {
    for stage in 0..geo.depth {
        let slot = &slots[geo.index(stage, key)];
        let w = slot.load(Ordering::Acquire);
        if w != 0 && key_of(w) == key {
            if value == 0 {
                cas(slot, w, 0);
            } else {
                slot.store(pack(key, value), Ordering::Release);
            }
            return Some(value_of(w));
        }
    }
    if value != 0 {
        push(slots, geo, key, value, false);
    }
    None
}

/// Sums every key's values over all stages. With `take`, each slot is atomically swapped
/// to zero as it is read, so an update that lands after the read is kept for the next one
/// instead of being lost.
pub fn collect(slots: &[AtomicU64], take: bool) -> HashMap<u32, u64> {
    let mut out: HashMap<u32, u64> = HashMap::new();
    for slot in slots {
        let w = if take {
            if slot.load(Ordering::Relaxed) == 0 {
                continue;
            }
            slot.swap(0, Ordering::AcqRel)
        } else {
            slot.load(Ordering::Acquire)
        };
        if w != 0 {
            *out.entry(key_of(w)).or_default() += value_of(w);
        }
    }
    out
}

/// The `k` largest entries, largest first; ties broken by key so output is stable.
pub fn top_k(values: &HashMap<u32, u64>, k: usize) -> Vec<(u32, u64)> {
    let mut v: Vec<(u32, u64)> = values
        .iter()
        .filter(|&(_, &val)| val > 0)
        .map(|(&k, &v)| (k, v))
        .collect();
    v.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v.truncate(k);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sketch(geo: Geometry) -> Vec<AtomicU64> {
        (0..geo.slots()).map(|_| AtomicU64::new(0)).collect()
    }

    /// A deterministic xorshift, so the tests need no rand crate and never flake.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn geometry_rejects_what_the_kernel_cannot_hold() {
        assert_eq!(Geometry::new(0, 1024), Err(GeometryError::Depth(0)));
        assert_eq!(Geometry::new(9, 1024), Err(GeometryError::Depth(9)));
        assert_eq!(Geometry::new(4, 1000), Err(GeometryError::Width(1000)));
        assert_eq!(Geometry::new(4, 1), Err(GeometryError::Width(1)));
        assert!(Geometry::new(8, 65536).is_ok());
    }

    #[test]
    fn index_stays_inside_its_stage() {
        let geo = Geometry::new(4, 256).expect("valid");
        for stage in 0..4 {
            for key in [0, 1, 2, 4_194_303, 31337] {
                let i = geo.index(stage, key);
                assert!(
                    i >= (stage as usize) * 256 && i < (stage as usize + 1) * 256,
                    "{stage} {key} -> {i}"
                );
            }
        }
    }

    #[test]
    fn consecutive_pids_spread_over_a_stage() {
        let geo = Geometry::new(1, 1024).expect("valid");
        let used: std::collections::HashSet<usize> =
            (1000..1512).map(|pid| geo.index(0, pid)).collect();
        // 512 consecutive PIDs into 1024 slots: Fibonacci hashing should collide rarely.
        assert!(used.len() > 500, "only {} distinct slots", used.len());
    }

    #[test]
    fn pack_round_trips_the_largest_pid() {
        let w = pack(4_194_303, VALUE_MASK);
        assert_eq!(key_of(w), 4_194_303);
        assert_eq!(value_of(w), VALUE_MASK);
    }

    #[test]
    fn matching_key_accumulates_and_stage0_kicks() {
        let geo = Geometry::new(2, 2).expect("valid");
        let s = sketch(geo);
        add(&s, geo, 7, 10);
        add(&s, geo, 7, 5);
        assert_eq!(collect(&s, false).get(&7), Some(&15));
        // Find a key that lands on 7's stage-0 slot: it must take the slot and push 7 on.
        let other = (8..1000)
            .find(|&k| geo.index(0, k) == geo.index(0, 7))
            .expect("a colliding key");
        add(&s, geo, other, 1);
        assert_eq!(key_of(s[geo.index(0, 7)].load(Ordering::Relaxed)), other);
        let got = collect(&s, false);
        assert_eq!(got.get(&other), Some(&1));
        assert_eq!(
            got.get(&7),
            Some(&15),
            "the kicked entry survives in stage 1"
        );
    }

    #[test]
    fn later_stages_keep_the_larger_value() {
        let geo = Geometry::new(2, 2).expect("valid");
        let s = sketch(geo);
        // Put a big key in stage 1, then push a small one at it.
        let big = 3;
        add(&s, geo, big, 1000);
        let kicker = (4..1000)
            .find(|&k| geo.index(0, k) == geo.index(0, big))
            .expect("collides at stage 0");
        add(&s, geo, kicker, 1); // big moves to stage 1
        let small = (1000..5000)
            .find(|&k| geo.index(0, k) == geo.index(0, big) && geo.index(1, k) == geo.index(1, big))
            .expect("collides at both stages");
        add(&s, geo, small, 2); // kicks `kicker` (1) on; 1 < 1000 so big stays in stage 1
        let got = collect(&s, false);
        assert_eq!(got.get(&big), Some(&1000));
        assert_eq!(got.get(&small), Some(&2));
        assert_eq!(got.get(&kicker), None, "the smallest fell off the end");
    }

    #[test]
    fn level_updates_keep_one_copy_and_zero_removes() {
        let geo = Geometry::new(4, 64).expect("valid");
        let s = sketch(geo);
        for pid in 1..100 {
            set(&s, geo, pid, pid as u64 * 10);
        }
        assert_eq!(set(&s, geo, 50, 1), Some(500));
        let got = collect(&s, false);
        assert_eq!(got.get(&50), Some(&1));
        assert_eq!(set(&s, geo, 50, 0), Some(1));
        assert_eq!(collect(&s, false).get(&50), None);
    }

    #[test]
    fn take_empties_the_sketch() {
        let geo = Geometry::new(2, 16).expect("valid");
        let s = sketch(geo);
        add(&s, geo, 1, 5);
        assert_eq!(collect(&s, true).get(&1), Some(&5));
        assert!(collect(&s, false).is_empty());
    }

    /// Zipf-like heavy hitters among many small flows: the default geometry must find the
    /// exact Top-30 (the model of the precision benchmark, without the kernel).
    #[test]
    fn finds_the_exact_top_k_of_a_skewed_stream() {
        let geo = Geometry::new(4, 1024).expect("valid");
        let s = sketch(geo);
        let mut truth: HashMap<u32, u64> = HashMap::new();
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let procs: Vec<u32> = (0..600).map(|i| 1000 + i * 7).collect();
        for _ in 0..200_000 {
            // Rank r is chosen with probability ~ 1/r.
            let u = (rng.next() % 1_000_000) as f64 / 1_000_000.0;
            let rank = ((procs.len() as f64).powf(u) as usize).min(procs.len()) - 1;
            let pid = procs[rank];
            let delta = 1000 + rng.next() % 1000;
            add(&s, geo, pid, delta);
            *truth.entry(pid).or_default() += delta;
        }
        // Churn: thousands of short-lived PIDs with small values.
        for pid in 100_000..105_000u32 {
            add(&s, geo, pid, 500);
            truth.insert(pid, 500);
        }
        let est = collect(&s, false);
        for k in [1, 5, 10, 20, 30] {
            let want: std::collections::HashSet<u32> =
                top_k(&truth, k).into_iter().map(|(p, _)| p).collect();
            let got: std::collections::HashSet<u32> =
                top_k(&est, k).into_iter().map(|(p, _)| p).collect();
            assert_eq!(want, got, "top-{k}");
        }
    }
}
