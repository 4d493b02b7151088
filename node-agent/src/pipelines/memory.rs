//! The memory pipeline's user side. Kernel side: `ebpf/src/mem.bpf.h` (rss_stat updates
//! the sketch `rw_mem_sketch`, each tracked process's `rw_proc_mem`, and sends coalesced
//! samples to the ring `rw_samples` for the leak detector).

use std::collections::HashMap;

use aya::maps::HashMap as BpfHashMap;
use resourcewatch_ebpf::{
    maps,
    shared::{self, RwMemSample, RwProcMem},
};

use super::Pipelines;
use crate::{hashpipe, procfs};

impl Pipelines {
    /// Processes that exist before the programs attach have no rss_stat event until their
    /// RSS changes, so idle ones would never enter the sketch: insert them from /proc with
    /// the same algorithm the kernel runs (concurrent kernel updates are atomic too).
    pub(super) fn seed_memory(&self) {
        let slots = self.mem_sketch.atomics();
        for pid in procfs::pids() {
            if let Some(pages) = procfs::resident_pages(pid).filter(|&p| p > 0) {
                hashpipe::set(slots, self.opts.mem, pid, pages);
            }
        }
    }

    /// Current resident bytes of every process in the memory sketch.
    pub fn memory(&self) -> HashMap<u32, u64> {
        let mut m = hashpipe::collect(self.mem_sketch.atomics(), false);
        for v in m.values_mut() {
            *v *= self.page;
        }
        m
    }

    /// The kernel's ring of recent samples of a process, oldest first, as
    /// (CLOCK_MONOTONIC ns at 100 ms resolution, resident MiB).
    pub fn process_history(&self, tgid: u32) -> Vec<(u64, u64)> {
        let Some(map) = self.bpf.map(maps::PROC_MEM) else {
            return Vec::new();
        };
        let Ok(states) = BpfHashMap::<_, u32, RwProcMem>::try_from(map) else {
            return Vec::new();
        };
        let Ok(st) = states.get(&tgid, 0) else {
            return Vec::new();
        };
        let n = (st.ring_count as usize).min(shared::RING_LEN);
        let start = (st.ring_head as usize + shared::RING_LEN - n) % shared::RING_LEN;
        (0..n)
            .map(|i| {
                let j = (start + i) % shared::RING_LEN;
                (st.ring_ds[j] as u64 * 100_000_000, st.ring_mib[j] as u64)
            })
            .collect()
    }

    /// Hands every queued memory sample to `f`, without blocking.
    pub fn drain_samples(&mut self, mut f: impl FnMut(&RwMemSample)) {
        while let Some(item) = self.samples.next() {
            if item.len() >= size_of::<RwMemSample>() {
                // SAFETY: the record is an rw_mem_sample written by the kernel program; read
                // unaligned because the ring buffer only guarantees 8-byte alignment.
                let s = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<RwMemSample>()) };
                f(&s);
            }
        }
    }
}
