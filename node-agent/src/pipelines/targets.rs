//! Exact, lossless tracking of the watched pods' processes. Kernel side:
//! `ebpf/src/targets.bpf.h` (`rw_target_pids`, `rw_target_cgroups`: who is tracked;
//! `rw_target_procs`: their CPU and memory, never evicted).

use std::{
    collections::{HashMap, HashSet},
    os::fd::AsFd,
    sync::atomic::Ordering,
};

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, Map},
};
use resourcewatch_ebpf::{
    maps,
    shared::{self, RwTargetProc},
};

use super::Pipelines;
use crate::{
    bpf::{PipelineError, lookup_batch, map_err},
    procfs,
};

/// One exactly tracked process.
#[derive(Clone, Copy, Debug)]
pub struct TargetProcess {
    pub tgid: u32,
    /// Cumulative on-CPU ns since tracking began, including the running slice.
    pub cpu_ns: u64,
    pub rss_bytes: u64,
    pub anon_bytes: u64,
    pub file_bytes: u64,
    pub shmem_bytes: u64,
    pub swap_bytes: u64,
    pub exited: bool,
}

impl Pipelines {
    /// Replaces the exactly tracked PIDs and cgroup ids.
    pub fn set_targets(&mut self, pids: &[u32], cgroups: &[u64]) -> Result<(), PipelineError> {
        replace_set(&mut self.bpf, maps::TARGET_PIDS, pids)?;
        replace_set(&mut self.bpf, maps::TARGET_CGROUPS, cgroups)?;
        let bits = if pids.is_empty() {
            0
        } else {
            shared::TARGET_PIDS
        } | if cgroups.is_empty() {
            0
        } else {
            shared::TARGET_CGROUPS
        };
        // `targets` is the low half of word 1 (little-endian), `_pad0` the high half.
        self.control_word(shared::control::TARGETS)
            .store(bits as u64, Ordering::SeqCst);
        // Processes already running in a target get their RSS now, not at their next change.
        let wanted_cgroups: HashSet<u64> = cgroups.iter().copied().collect();
        let mut procs: BpfHashMap<_, u32, RwTargetProc> = BpfHashMap::try_from(
            self.bpf
                .map_mut(maps::TARGET_PROCS)
                .ok_or(PipelineError::MissingMap(maps::TARGET_PROCS))?,
        )
        .map_err(map_err(maps::TARGET_PROCS))?;
        let mut in_target: HashSet<u32> = HashSet::new();
        for pid in procfs::pids() {
            let cgroup_id = procfs::cgroup_text(pid)
                .and_then(|t| self.layout.path_in_proc_cgroup(&t).map(str::to_owned))
                .and_then(|p| self.layout.cgroup_id(&p).ok());
            if !(pids.contains(&pid) || cgroup_id.is_some_and(|c| wanted_cgroups.contains(&c))) {
                continue;
            }
            in_target.insert(pid);
            let Some(rss) = procfs::rss_breakdown(pid) else {
                continue;
            };
            let seeded = |mut e: RwTargetProc| {
                e.cgroup_id = cgroup_id.unwrap_or(e.cgroup_id);
                e.file_pages = rss.file / self.page;
                e.anon_pages = rss.anon / self.page;
                e.shmem_pages = rss.shmem / self.page;
                e.swap_pages = rss.swap / self.page;
                e.updated_ns = procfs::monotonic_ns();
                e
            };
            match procs.get(&pid, 0) {
                // An rss_stat event already wrote fresher values.
                Ok(e) if e.updated_ns != 0 => {}
                // Created by a context switch (CPU only, no RSS yet): add the RSS, keep
                // the CPU. A slice credited between this read and the write is lost
                // (microseconds, once); without this an idle process read 0 bytes until
                // its RSS changed, and a CPU burner almost always did.
                Ok(e) => {
                    let _ = procs.insert(pid, seeded(e), 2 /* BPF_EXIST */);
                }
                Err(_) => {
                    let _ = procs.insert(
                        pid,
                        seeded(RwTargetProc::default()),
                        1, /* BPF_NOEXIST */
                    );
                }
            }
        }
        // Only processes that left every target are forgotten: the others keep their
        // counters across a reconfiguration (wiping them read as 0 % CPU for one interval).
        let stale: Vec<u32> = procs
            .keys()
            .filter_map(Result::ok)
            .filter(|t| !in_target.contains(t))
            .collect();
        for tgid in stale {
            let _ = procs.remove(&tgid);
        }
        Ok(())
    }

    /// Exact values of every tracked process; exited ones are returned once, then removed.
    pub fn targets(&mut self) -> Result<Vec<TargetProcess>, PipelineError> {
        // Resynchronise every CPU's slot first, so the running part below is the running
        // task's, even after a switch the tracepoint did not report.
        // A failure is counted in kernel_stats(); the slots are then as the switches left them.
        let _ = self.sync_cpus(false);
        let now = procfs::monotonic_ns();
        let mut running: HashMap<u32, u64> = HashMap::new();
        for cpu in 0..self.ncpus as usize {
            let oc = self.oncpu.read(cpu);
            if oc.target != 0 && oc.tgid != 0 && now > oc.start_ns {
                *running.entry(oc.tgid).or_default() += now - oc.start_ns;
            }
        }
        let page = self.page;
        let batch = match self.bpf.map(maps::TARGET_PROCS) {
            Some(Map::HashMap(d)) => lookup_batch::<u32, RwTargetProc>(d.fd().as_fd()).ok(),
            _ => None,
        };
        let mut procs: BpfHashMap<_, u32, RwTargetProc> = BpfHashMap::try_from(
            self.bpf
                .map_mut(maps::TARGET_PROCS)
                .ok_or(PipelineError::MissingMap(maps::TARGET_PROCS))?,
        )
        .map_err(map_err(maps::TARGET_PROCS))?;
        // A kernel without batch lookups (before 5.6): entry by entry.
        let entries = batch.unwrap_or_else(|| procs.iter().filter_map(Result::ok).collect());
        let mut out = Vec::with_capacity(entries.len());
        for (tgid, v) in entries {
            out.push(TargetProcess {
                tgid,
                cpu_ns: v.cpu_ns + running.get(&tgid).copied().unwrap_or(0),
                rss_bytes: (v.file_pages + v.anon_pages + v.shmem_pages) * page,
                anon_bytes: v.anon_pages * page,
                file_bytes: v.file_pages * page,
                shmem_bytes: v.shmem_pages * page,
                swap_bytes: v.swap_pages * page,
                exited: v.exited != 0,
            });
        }
        for t in out.iter().filter(|t| t.exited) {
            let _ = procs.remove(&t.tgid);
        }
        out.sort_by_key(|t| t.tgid);
        Ok(out)
    }
}

fn replace_set<K: aya::Pod + Eq + std::hash::Hash>(
    bpf: &mut Ebpf,
    name: &'static str,
    keys: &[K],
) -> Result<(), PipelineError> {
    let mut map: BpfHashMap<_, K, u8> =
        BpfHashMap::try_from(bpf.map_mut(name).ok_or(PipelineError::MissingMap(name))?)
            .map_err(map_err(name))?;
    let want: HashSet<&K> = keys.iter().collect();
    let have: Vec<K> = map.keys().filter_map(Result::ok).collect();
    for k in have.iter().filter(|k| !want.contains(k)) {
        map.remove(k).map_err(map_err(name))?;
    }
    for k in keys {
        map.insert(k, 1, 0).map_err(map_err(name))?;
    }
    Ok(())
}
