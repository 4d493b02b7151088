//! Exact, lossless tracking of the watched pods' processes. Kernel side:
//! `ebpf/src/targets.bpf.h` (`rw_target_pids`, `rw_target_cgroups`: who is tracked;
//! `rw_target_slots`: their CPU and memory, never evicted, read through mmap;
//! `rw_target_procs`: where a process goes when its slots' probe window is full).

use std::{
    collections::{HashMap, HashSet},
    os::fd::AsFd,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, Map},
};
use resourcewatch_ebpf::{
    maps,
    shared::{self, RwTargetProc, RwTargetSlot},
};

use super::Pipelines;
use crate::{
    bpf::{MmapArray, PipelineError, lookup_batch, map_err, read_stat},
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
    /// When the kernel began counting a process that was already running when it became
    /// a target (monotonic ns), on its first row only: its first `cpu_ns` covers that
    /// much of the interval, not all of it. `None` for a process that started tracked.
    pub counted_from_ns: Option<u64>,
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
        // Tasks on a CPU now learn at once that they are targets, and count from now:
        // otherwise from their CPU's next switch or read, and a busy loop alone on its CPU
        // lost up to that much of its first interval (a frame's first 0.5 s read 54 %).
        // A failure is counted in kernel_stats(); those CPUs catch up at the next read.
        let _ = self.sync_cpus(false);
        let counting_from = procfs::monotonic_ns();
        // Processes already running in a target get their RSS now, not at their next change.
        let wanted_cgroups: HashSet<u64> = cgroups.iter().copied().collect();
        let slots = Slots(&self.target_slots);
        let mut spill: BpfHashMap<_, u32, RwTargetProc> = BpfHashMap::try_from(
            self.bpf
                .map_mut(maps::TARGET_PROCS)
                .ok_or(PipelineError::MissingMap(maps::TARGET_PROCS))?,
        )
        .map_err(map_err(maps::TARGET_PROCS))?;
        // Slots held before the scan: only those may be forgotten below. A process started
        // in a target during the scan has claimed its slot since, and is not in the scan.
        let held: Vec<(usize, u32)> = slots.occupied().collect();
        let held_tgids: HashSet<u32> = held.iter().map(|&(_, t)| t).collect();
        let mut in_target: HashSet<u32> = HashSet::new();
        for pid in procfs::pids() {
            let cgroup_id = procfs::cgroup_text(pid)
                .and_then(|t| self.layout.path_in_proc_cgroup(&t))
                .and_then(|p| self.layout.cgroup_id(&p).ok());
            if !(pids.contains(&pid) || cgroup_id.is_some_and(|c| wanted_cgroups.contains(&c))) {
                continue;
            }
            in_target.insert(pid);
            if !held_tgids.contains(&pid) {
                self.counted_from.entry(pid).or_insert(counting_from);
            }
            if let Some(rss) = procfs::rss_breakdown(pid) {
                let seeded = |mut e: RwTargetProc| {
                    e.cgroup_id = cgroup_id.unwrap_or(e.cgroup_id);
                    e.file_pages = rss.file / self.page;
                    e.anon_pages = rss.anon / self.page;
                    e.shmem_pages = rss.shmem / self.page;
                    e.swap_pages = rss.swap / self.page;
                    e.updated_ns = procfs::monotonic_ns();
                    e
                };
                seed(&slots, &mut spill, pid, seeded);
            }
        }
        // Only processes that left every target are forgotten: the others keep their
        // counters across a reconfiguration (wiping them read as 0 % CPU for one interval).
        for (i, tgid) in held {
            if !in_target.contains(&tgid) && slots.retire(i, tgid) {
                self.retired_slots.push((i, Instant::now()));
            }
        }
        let stale: Vec<u32> = spill
            .keys()
            .filter_map(Result::ok)
            .filter(|t| !in_target.contains(t))
            .collect();
        for tgid in stale {
            let _ = spill.remove(&tgid);
        }
        self.counted_from.retain(|t, _| in_target.contains(t));
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
            let from = oc.start_ns.max(oc.target_from_ns);
            if oc.target != 0 && oc.tgid != 0 && now > from {
                *running.entry(oc.tgid).or_default() += now - from;
            }
        }
        let slots = Slots(&self.target_slots);
        // A slot is freed in two steps. Retired: its key leaves every lookup, so no program
        // finds it again. Released, RETIRE_GRACE later: zeroed and free to claim. A program
        // that found the slot just before it was retired (they run for microseconds) has
        // written by then, so nothing it adds lands on the slot's next process.
        self.retired_slots.retain(|&(i, at)| {
            let due = at.elapsed() >= RETIRE_GRACE;
            if due {
                slots.release(i);
            }
            !due
        });
        // Retired one read after the exit was reported: the exiting task's last context
        // switch (after the exit tracepoint) has credited its final slice by then. (A new
        // process given the same PID within that read loses what it was credited until
        // then: PIDs are reused only after the kernel's whole PID space has gone round.)
        for (i, tgid) in self.exited_slots.drain(..) {
            if slots.retire(i, tgid) {
                self.retired_slots.push((i, Instant::now()));
            }
        }
        let mut entries: Vec<(u32, RwTargetProc, Option<usize>)> = slots
            .occupied()
            .map(|(i, tgid)| (tgid, slots.counters(i), Some(i)))
            .collect();
        // The spill map is walked only once a process has spilled into it.
        if read_stat(&self.bpf, shared::stat::TARGETS_SPILLED) > 0 {
            let batch = match self.bpf.map(maps::TARGET_PROCS) {
                Some(Map::HashMap(d)) => lookup_batch::<u32, RwTargetProc>(d.fd().as_fd()).ok(),
                _ => None,
            };
            let spill: BpfHashMap<_, u32, RwTargetProc> = BpfHashMap::try_from(
                self.bpf
                    .map(maps::TARGET_PROCS)
                    .ok_or(PipelineError::MissingMap(maps::TARGET_PROCS))?,
            )
            .map_err(map_err(maps::TARGET_PROCS))?;
            // A kernel without batch lookups (before 5.6): entry by entry.
            let spilled = batch.unwrap_or_else(|| spill.iter().filter_map(Result::ok).collect());
            entries.extend(spilled.into_iter().map(|(t, v)| (t, v, None)));
        }
        // Exited processes that live in the spill map leave it now (one syscall each, so
        // only for those: a slot's process is retired above without any).
        let spilled_exits: Vec<u32> = entries
            .iter()
            .filter(|e| e.2.is_none() && e.1.exited != 0)
            .map(|e| e.0)
            .collect();
        let mut out = merge_entries(entries, &running, self.page, &mut self.exited_slots);
        for t in &mut out {
            t.counted_from_ns = self.counted_from.remove(&t.tgid);
        }
        if !spilled_exits.is_empty() {
            let mut spill: BpfHashMap<_, u32, RwTargetProc> = BpfHashMap::try_from(
                self.bpf
                    .map_mut(maps::TARGET_PROCS)
                    .ok_or(PipelineError::MissingMap(maps::TARGET_PROCS))?,
            )
            .map_err(map_err(maps::TARGET_PROCS))?;
            for tgid in spilled_exits {
                let _ = spill.remove(&tgid);
            }
        }
        Ok(out)
    }
}

/// One row per process, sorted by tgid. A process normally has one entry; it has two when
/// two CPUs raced to claim it or a slot before its own was freed and reclaimed (CPU adds
/// up; memory is the newer write). Exited processes' slots go to `exited` for freeing.
fn merge_entries(
    mut entries: Vec<(u32, RwTargetProc, Option<usize>)>,
    running: &HashMap<u32, u64>,
    page: u64,
    exited: &mut Vec<(usize, u32)>,
) -> Vec<TargetProcess> {
    entries.sort_by_key(|e| (e.0, std::cmp::Reverse(e.1.updated_ns)));
    // The exit handler marks the first slot it finds; every slot of an exited process is
    // freed (a second one would otherwise stay as a row of a dead process).
    let dead: HashSet<u32> = entries
        .iter()
        .filter(|e| e.1.exited != 0)
        .map(|e| e.0)
        .collect();
    let mut out: Vec<TargetProcess> = Vec::with_capacity(entries.len());
    for (tgid, v, slot) in &entries {
        if dead.contains(tgid)
            && let Some(i) = slot
        {
            exited.push((*i, *tgid));
        }
        if let Some(last) = out.last_mut().filter(|t| t.tgid == *tgid) {
            last.cpu_ns += v.cpu_ns;
            continue;
        }
        out.push(TargetProcess {
            tgid: *tgid,
            cpu_ns: v.cpu_ns + running.get(tgid).copied().unwrap_or(0),
            rss_bytes: (v.file_pages + v.anon_pages + v.shmem_pages) * page,
            anon_bytes: v.anon_pages * page,
            file_bytes: v.file_pages * page,
            shmem_bytes: v.shmem_pages * page,
            swap_bytes: v.swap_pages * page,
            exited: dead.contains(tgid),
            counted_from_ns: None,
        });
    }
    out
}

/// The key of a retired slot: out of every lookup, not yet free (see `targets`).
const RETIRED: u32 = u32::MAX;

/// How long a retired slot waits before it is zeroed and freed: far longer than any
/// program run that may still hold a pointer to it.
const RETIRE_GRACE: Duration = Duration::from_millis(10);

/// `rw_target_slots` through its mapping: an open-addressed table keyed by tgid (see
/// struct rw_target_slot in the shared header). The kernel claims free slots by
/// compare-and-swap; only this side frees them.
/// Gives a process of a target its resident size read from /proc (`seeded` of its entry).
/// An entry an rss_stat event already wrote holds fresher values than /proc. One created
/// by a context switch (CPU only) gets the RSS and keeps its CPU: without this an idle
/// process read 0 bytes until its RSS changed.
fn seed<T: std::borrow::BorrowMut<aya::maps::MapData>>(
    slots: &Slots<'_>,
    spill: &mut BpfHashMap<T, u32, RwTargetProc>,
    pid: u32,
    seeded: impl Fn(RwTargetProc) -> RwTargetProc,
) {
    if let Some(i) = slots.find(pid) {
        if slots.counters(i).updated_ns == 0 {
            slots.seed_memory(i, &seeded(RwTargetProc::default()));
        }
        return;
    }
    match spill.get(&pid, 0) {
        Ok(e) if e.updated_ns != 0 => {}
        // The spill map is written whole: a slice credited between this read and the
        // write is lost (microseconds, once).
        Ok(e) => {
            let _ = spill.insert(pid, seeded(e), 2 /* BPF_EXIST */);
        }
        Err(_) => match slots.claim(pid) {
            Some(i) => slots.seed_memory(i, &seeded(RwTargetProc::default())),
            None => {
                let _ = spill.insert(
                    pid,
                    seeded(RwTargetProc::default()),
                    1, /* BPF_NOEXIST */
                );
            }
        },
    }
}

struct Slots<'a>(&'a MmapArray<RwTargetSlot>);

impl Slots<'_> {
    fn key(&self, i: usize) -> &AtomicU32 {
        // SAFETY: `tgid` is the first, 4-byte aligned field of an element of a live
        // mapping that outlives self; the kernel writes it only with atomic instructions.
        unsafe { AtomicU32::from_ptr(&raw mut (*self.0.ptr(i)).tgid) }
    }

    fn counters(&self, i: usize) -> RwTargetProc {
        // SAFETY: in bounds of a live mapping; plain data, so any bytes are a valid value.
        unsafe { std::ptr::read_volatile(&raw const (*self.0.ptr(i)).v) }
    }

    fn window(tgid: u32) -> impl Iterator<Item = usize> {
        let home = shared::target_home(tgid);
        (0..shared::TARGET_PROBES).map(move |p| (home + p) & (shared::TARGET_SLOTS - 1))
    }

    fn find(&self, tgid: u32) -> Option<usize> {
        Self::window(tgid).find(|&i| self.key(i).load(Ordering::Acquire) == tgid)
    }

    /// The process's slot, claimed if it has none; None if its window is full.
    fn claim(&self, tgid: u32) -> Option<usize> {
        self.find(tgid).or_else(|| {
            Self::window(tgid).find(|&i| {
                match self
                    .key(i)
                    .compare_exchange(0, tgid, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => true,
                    Err(other) => other == tgid,
                }
            })
        })
    }

    /// Slots held by a process (not free, not retired), with its tgid.
    fn occupied(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        (0..shared::TARGET_SLOTS).filter_map(|i| {
            let tgid = self.key(i).load(Ordering::Acquire);
            (tgid != 0 && tgid != RETIRED).then_some((i, tgid))
        })
    }

    /// Takes slot `i` out of every lookup if `tgid` still holds it (a tgid is below 2^22,
    /// so no process matches RETIRED, and only 0 is free); whether it did.
    fn retire(&self, i: usize, tgid: u32) -> bool {
        self.key(i)
            .compare_exchange(tgid, RETIRED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Frees a retired slot: counters first, so a claim starts at zero.
    fn release(&self, i: usize) {
        debug_assert_eq!(self.key(i).load(Ordering::Acquire), RETIRED);
        // SAFETY: in bounds of a live, writable mapping.
        unsafe { std::ptr::write_volatile(&raw mut (*self.0.ptr(i)).v, RwTargetProc::default()) };
        self.key(i).store(0, Ordering::Release);
    }

    /// Writes the memory figures of slot `i`, leaving its CPU counter (the kernel adds to
    /// it concurrently) alone.
    fn seed_memory(&self, i: usize, e: &RwTargetProc) {
        let v = self.0.ptr(i);
        // SAFETY: in bounds of a live, writable mapping; field-wise volatile stores.
        unsafe {
            std::ptr::write_volatile(&raw mut (*v).v.cgroup_id, e.cgroup_id);
            std::ptr::write_volatile(&raw mut (*v).v.file_pages, e.file_pages);
            std::ptr::write_volatile(&raw mut (*v).v.anon_pages, e.anon_pages);
            std::ptr::write_volatile(&raw mut (*v).v.shmem_pages, e.shmem_pages);
            std::ptr::write_volatile(&raw mut (*v).v.swap_pages, e.swap_pages);
            std::ptr::write_volatile(&raw mut (*v).v.updated_ns, e.updated_ns);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(cpu_ns: u64, anon_pages: u64, updated_ns: u64, exited: bool) -> RwTargetProc {
        RwTargetProc {
            cpu_ns,
            anon_pages,
            updated_ns,
            exited: u32::from(exited),
            ..Default::default()
        }
    }

    #[test]
    fn a_process_in_two_slots_is_one_row_and_an_exit_frees_both() {
        let running = HashMap::from([(7, 5)]);
        let entries = vec![
            (9, proc(1, 1, 1, false), Some(3)),
            (7, proc(100, 10, 20, false), Some(1)),
            (7, proc(50, 99, 10, true), Some(2)),
            (8, proc(4, 2, 1, false), None),
        ];
        let mut exited = Vec::new();
        let rows = merge_entries(entries, &running, 4096, &mut exited);
        assert_eq!(
            rows.iter().map(|r| r.tgid).collect::<Vec<_>>(),
            vec![7, 8, 9]
        );
        // CPU adds up (plus the running slice once); memory is the newer write.
        assert_eq!(rows[0].cpu_ns, 155);
        assert_eq!(rows[0].anon_bytes, 10 * 4096);
        assert!(rows[0].exited && !rows[1].exited && !rows[2].exited);
        exited.sort_unstable();
        assert_eq!(exited, vec![(1, 7), (2, 7)]);
    }
}
