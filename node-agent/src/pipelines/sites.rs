//! Growth-site capture: the stacks that make a leaking process's resident memory grow.
//! Kernel side: `ebpf/src/stacks.bpf.h` (the capture slots in `rw_control`, a stack
//! sample per 256 KiB of growth on average to the ring `rw_stack_samples`, and a
//! revocation record when growth is given back); the user side walks those with
//! `crate::stacks` as they come and takes back what is revoked. When to capture is the
//! snapshot's (`snapshot/sites.rs`).

use std::sync::atomic::Ordering;

use std::num::NonZeroU32;

use aya::{
    maps::{HashMap as BpfHashMap, PerCpuHashMap, PerCpuValues},
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeScope},
    },
};
use resourcewatch_ebpf::{maps, programs as progs, shared};

use super::Pipelines;
use crate::{
    bpf::{PipelineError, map_err},
    procfs,
};

impl Pipelines {
    /// Starts charging the growth of `tgid`'s resident memory to the user stacks that
    /// make it, taking back what the process gives back (ebpf/src/stacks.bpf.h,
    /// `record_growth_site`). Only growth from the process's next rss_stat event on
    /// counts. Up to `MAX_SITE_CAPTURES` processes at once: the kernel compares each
    /// rss_stat event's process with that many control-word slots before it looks
    /// anything up.
    pub fn capture_growth_sites(&mut self, tgid: u32) -> Result<(), PipelineError> {
        procfs::resident_pages(tgid).ok_or(PipelineError::NoProcess(tgid))?;
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
        // The per-CPU deltas' entry first (left behind harmlessly if what follows fails),
        // then the state: the kernel acts on the slot, set last, and looks both up.
        let deltas_name = maps::SITE_DELTAS;
        let cpus = procfs::possible_cpus().map_err(PipelineError::Cpus)?;
        let zeros = PerCpuValues::try_from(vec![shared::RwSiteDeltas::default(); cpus as usize])
            .map_err(PipelineError::Cpus)?;
        let mut deltas: PerCpuHashMap<_, u32, shared::RwSiteDeltas> = PerCpuHashMap::try_from(
            self.bpf
                .map_mut(deltas_name)
                .ok_or(PipelineError::MissingMap(deltas_name))?,
        )
        .map_err(map_err(deltas_name))?;
        deltas
            .insert(tgid, zeros, 0)
            .map_err(map_err(deltas_name))?;
        let name = maps::SITE_PIDS;
        let mut pids: BpfHashMap<_, u32, shared::RwSiteState> = BpfHashMap::try_from(
            self.bpf
                .map_mut(name)
                .ok_or(PipelineError::MissingMap(name))?,
        )
        .map_err(map_err(name))?;
        // All zero: the kernel sets the levels from the process's first event, and reads
        // every CPU's counter deltas into its entry of rw_site_deltas then.
        pids.insert(tgid, shared::RwSiteState::default(), 0)
            .map_err(map_err(name))?;
        self.site_revocable.forget(tgid);
        // Its tables asked for now, so its first samples find them ready.
        self.unwinder.refresh(tgid, 0);
        // Listed for the kernel's Python frame walk before its first sample if CPython,
        // asked for its perf map if a JVM, whose heap allocations are sampled too.
        self.runtimes.seen(tgid);
        match self.sample_jvm_allocations(tgid) {
            Ok(true) => tracing::info!(pid = tgid, "sampling the heap allocations of a JVM"),
            Ok(false) => {}
            Err(e) => {
                // The whole chain: the kernel's errno is at its end.
                tracing::warn!(
                    pid = tgid,
                    "cannot sample the heap allocations of a JVM: {}",
                    resourcewatch_runtime::error_chain(&e)
                );
            }
        }
        self.control_word(free)
            .store(u64::from(tgid), Ordering::SeqCst);
        self.count_site_captures();
        Ok(())
    }

    /// Attaches `rw_jvm_alloc` (stacks.bpf.h) to HotSpot's allocation tracer in the
    /// libjvm.so `tgid` maps, for that process only; false when it maps none (or was
    /// attached to already).
    fn sample_jvm_allocations(&mut self, tgid: u32) -> Result<bool, PipelineError> {
        // Uprobes need CAP_SYS_ADMIN, which the DaemonSet grants only when asked
        // (`agent.uprobes` in the chart): without it a JVM's sites are its resident growth.
        if self.jvm_alloc_links.contains_key(&tgid) || !crate::capabilities::can_create_uprobes() {
            return Ok(false);
        }
        let Some((libjvm, offsets)) = jvm_allocation_tracer(tgid) else {
            return Ok(false);
        };
        let libjvm = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&libjvm));
        let name = progs::JVM_ALLOC;
        let err = |source| PipelineError::Uprobe {
            pid: tgid,
            symbol: "AllocTracer::send_allocation_*",
            source: Box::new(source),
        };
        let prog: &mut UProbe = self
            .bpf
            .program_mut(name)
            .ok_or(PipelineError::MissingProgram(name))?
            .try_into()
            .map_err(err)?;
        if prog.fd().is_err() {
            prog.load().map_err(err)?;
        }
        let scope =
            UProbeScope::OneProcess(NonZeroU32::new(tgid).ok_or(PipelineError::NoProcess(tgid))?);
        let mut links = Vec::new();
        for off in offsets {
            match prog.attach(UProbeAttachLocation::AbsoluteOffset(off), &libjvm, scope) {
                Ok(l) => links.push(l),
                Err(e) => {
                    for l in links {
                        let _ = prog.detach(l);
                    }
                    return Err(err(e));
                }
            }
        }
        self.jvm_alloc_links.insert(tgid, links);
        Ok(true)
    }

    /// Stops capturing `tgid`'s growth sites (what was captured stays until read).
    pub fn stop_growth_sites(&mut self, tgid: u32) {
        // Revocations still in the ring after this are not applied: drain first.
        self.site_revocable.forget(tgid);
        if let Some(links) = self.jvm_alloc_links.remove(&tgid)
            && let Some(prog) = self.bpf.program_mut(progs::JVM_ALLOC)
            && let Ok(prog) = <&mut UProbe>::try_from(prog)
        {
            for l in links {
                let _ = prog.detach(l);
            }
        }
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
        let none_left = pids.keys().next().is_none();
        if let Some(map) = self.bpf.map_mut(maps::SITE_DELTAS)
            && let Ok(mut deltas) = PerCpuHashMap::<_, u32, shared::RwSiteDeltas>::try_from(map)
        {
            let _ = deltas.remove(&tgid);
        }
        self.unwinder.forget(tgid);
        if none_left {
            // No capture left: what the unwinder cached (mappings, held samples) goes
            // with it (the loader's file caches stay, bounded).
            self.unwinder = crate::stacks::unwind::Unwinder::new();
            self.runtimes.clear();
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

    /// The kernel's state of `tgid`'s capture (ebpf/include/resourcewatch.h,
    /// `rw_site_state`), while it runs.
    pub fn growth_site_state(&self, tgid: u32) -> Option<shared::RwSiteState> {
        self.bpf
            .map(maps::SITE_PIDS)
            .and_then(|m| BpfHashMap::<_, u32, shared::RwSiteState>::try_from(m).ok())
            .and_then(|pids| pids.get(&tgid, 0).ok())
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
            &mut self.runtimes,
            &mut self.site_walked,
            Some(&mut self.site_revocable),
        )
    }

    /// Bytes taken back since the last call from stacks an earlier
    /// [`Self::drain_growth_sites`] handed out: its caller subtracts them.
    pub fn revoked_growth_sites(&mut self) -> Vec<crate::stacks::RawStack> {
        self.site_revocable.take_revoked()
    }

    /// Growth captured since the last call, every captured process's (bytes per stack),
    /// less what was given back since (see [`Self::revoked_growth_sites`] for what was
    /// given back of earlier calls').
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

/// The libjvm.so `pid` maps, opened inside its root (a container's symlink cannot point
/// at the node's files), and the file offsets of HotSpot's
/// `AllocTracer::send_allocation_in_new_tlab` and `::send_allocation_outside_tlab`, found
/// in its symbol table by name (their mangled signatures change between releases). The
/// uprobes are attached through `/proc/self/fd/N` of that open file.
fn jvm_allocation_tracer(pid: u32) -> Option<(std::fs::File, Vec<u64>)> {
    crate::stacks::elf::mapped_symbol_offsets(
        pid,
        |name| name == "libjvm.so",
        &[
            "AllocTracer27send_allocation_in_new_tlab",
            "AllocTracer28send_allocation_outside_tlab",
        ],
        |name, wanted| name.contains(wanted),
        // Waited for on the engine, only when uprobes are granted and a JVM's capture
        // starts (behind the JVM's own tables, asked for just before): past it the
        // JVM's sites are its resident growth, as without uprobes.
        2 * crate::reader::DEADLINE,
    )
}
