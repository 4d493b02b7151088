//! Growth-site capture: the stacks that make a leaking process's resident memory grow.
//! Kernel side: `ebpf/src/stacks.bpf.h` (the capture slots in `rw_control`, one stack
//! sample per 256 KiB of growth to the ring `rw_stack_samples`); the user side walks
//! those with `crate::stacks` as they come. When to capture is the snapshot's
//! (`snapshot/sites.rs`).

use std::sync::atomic::Ordering;

use aya::maps::HashMap as BpfHashMap;
use resourcewatch_ebpf::{maps, shared};

use super::Pipelines;
use crate::{
    bpf::{PipelineError, map_err},
    procfs,
};

impl Pipelines {
    /// Starts charging each new high of `tgid`'s resident memory to the user stack that
    /// caused it (ebpf/src/stacks.bpf.h). The high starts at the process's RSS now, so
    /// only growth from here on counts. Up to `MAX_SITE_CAPTURES` processes at once: the
    /// kernel compares each rss_stat event's process with that many control-word slots
    /// before it looks anything up.
    pub fn capture_growth_sites(&mut self, tgid: u32) -> Result<(), PipelineError> {
        let pages = procfs::resident_pages(tgid).ok_or(PipelineError::NoProcess(tgid))?;
        let slots = (0..shared::MAX_SITE_CAPTURES).map(|i| shared::control::SITE_PID + i);
        let slot_of = |this: &Self, pid: u64| {
            slots
                .clone()
                .find(|&w| this.control_word(w).load(Ordering::SeqCst) == pid)
        };
        if slot_of(self, u64::from(tgid)).is_some() {
            return Ok(());
        }
        let free = slot_of(self, 0).ok_or(PipelineError::SiteCapturesFull {
            max: shared::MAX_SITE_CAPTURES,
        })?;
        let name = maps::SITE_PIDS;
        let mut pids: BpfHashMap<_, u32, shared::RwSiteState> = BpfHashMap::try_from(
            self.bpf
                .map_mut(name)
                .ok_or(PipelineError::MissingMap(name))?,
        )
        .map_err(map_err(name))?;
        // The high-water mark first: the kernel acts on the slot, and looks this up.
        let state = shared::RwSiteState {
            high: pages,
            pending: 0,
        };
        pids.insert(tgid, state, 0).map_err(map_err(name))?;
        // Listed for the kernel's Python frame walk before its first sample, if CPython.
        self.python.runtime(tgid);
        self.control_word(free)
            .store(u64::from(tgid), Ordering::SeqCst);
        self.count_site_captures();
        Ok(())
    }

    /// Stops capturing `tgid`'s growth sites (what was captured stays until read).
    pub fn stop_growth_sites(&mut self, tgid: u32) {
        for i in 0..shared::MAX_SITE_CAPTURES {
            let w = self.control_word(shared::control::SITE_PID + i);
            if w.load(Ordering::SeqCst) == u64::from(tgid) {
                w.store(0, Ordering::SeqCst);
            }
        }
        self.count_site_captures();
        let name = maps::SITE_PIDS;
        let Some(map) = self.bpf.map_mut(name) else {
            return;
        };
        let Ok(mut pids) = BpfHashMap::<_, u32, shared::RwSiteState>::try_from(map) else {
            return;
        };
        let _ = pids.remove(&tgid);
        if pids.keys().next().is_none() {
            // No capture left: what the unwinder cached (tables, mappings) goes with it.
            self.unwinder = crate::stacks::unwind::Unwinder::new();
            self.python.clear();
        }
    }

    /// `rw_control.site_pids`: how many slots are taken (0 spares every event the compares).
    fn count_site_captures(&self) {
        let n = (0..shared::MAX_SITE_CAPTURES)
            .filter(|i| {
                self.control_word(shared::control::SITE_PID + i)
                    .load(Ordering::SeqCst)
                    != 0
            })
            .count() as u64;
        self.control_word(shared::control::SITE_PIDS)
            .store(n, Ordering::SeqCst);
    }

    /// The processes whose growth sites are being captured.
    pub fn growth_site_pids(&self) -> Vec<u32> {
        self.bpf
            .map(maps::SITE_PIDS)
            .and_then(|m| BpfHashMap::<_, u32, shared::RwSiteState>::try_from(m).ok())
            .map(|pids| pids.keys().filter_map(Result::ok).collect())
            .unwrap_or_default()
    }

    /// Walks the growth-site stack samples waiting in the ring buffer (cheap when there
    /// are none): call it often while captures run, so the buffer does not fill and the
    /// processes' mappings are still the ones the samples were taken in.
    pub fn read_growth_samples(&mut self) -> Result<(), PipelineError> {
        crate::stacks::read_samples(
            &mut self.stack_samples,
            &self.bpf,
            maps::SITE_STACKS,
            &mut self.unwinder,
            &mut self.python,
            &mut self.site_walked,
        )
    }

    /// Growth captured since the last call, every captured process's (bytes per stack).
    pub fn drain_growth_sites(&mut self) -> Result<Vec<crate::stacks::RawStack>, PipelineError> {
        self.read_growth_samples()?;
        let mut raw = crate::stacks::sampled(std::mem::take(&mut self.site_walked));
        raw.extend(crate::stacks::drain(
            &mut self.bpf,
            maps::SITE_BYTES,
            maps::SITE_STACKS,
        )?);
        Ok(raw)
    }
}
