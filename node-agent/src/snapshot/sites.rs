//! Leak growth sites: where a leaking process's memory grows.
//!
//! When a process's leak series reaches [`SITE_CONFIDENCE`], the kernel is asked to charge
//! the growth of its resident memory to the user stacks that make it, and to take back
//! what the process gives back ([`Pipelines::capture_growth_sites`]) for [`CAPTURE_FOR`];
//! no other process pays more
//! than one load and branch per rss_stat event. The stacks are named every few seconds
//! while the capture runs; the sites are shown once two namings in a row agree on the top
//! one (or the capture ends), about ten seconds after the leak is found, and kept while
//! the process lives. A process is captured again only after [`RECAPTURE_AFTER`].
//!
//! What a site means: the code that first touched memory the process still holds. For a
//! leak in a malloc-based program (C, C++, Rust, CPython's objects) that is the leak's
//! allocation or its first write; memory freed and reused adds nothing, and memory given
//! back to the kernel is taken off whoever was charged with it. For a
//! garbage-collected runtime it is wherever the heap reached new pages, which points
//! at allocation pressure rather than at what is retained (the runtime's own heap profile,
//! e.g. Go's pprof inuse_space, answers that).
//!
//! Naming reads the process's files (its binaries' symbols, a perf map), which can take
//! seconds for a large binary whose pages are not cached: it runs on a thread of its own
//! ([`Namer`]), so the engine's reports never wait for it; a naming's result is put on the
//! capture at the first update after it is done.

use std::{collections::HashMap, sync::mpsc};

use serde::Serialize;

use super::LeakRow;
use crate::{
    pipelines::Pipelines,
    procfs,
    stacks::{RawStack, Symbolizer},
};

/// Confidence at which a process's growth sites start being captured.
pub const SITE_CONFIDENCE: u8 = 60;
/// How long one capture lasts.
pub const CAPTURE_FOR_NS: u64 = 60_000_000_000;
/// A process is captured again after this long (its leak may have moved).
pub const RECAPTURE_AFTER_NS: u64 = 600_000_000_000;
/// Stacks are named this often while a capture runs.
const NAME_EVERY_NS: u64 = 5_000_000_000;
/// Captures at once: the control-word slots the kernel compares (ebpf/include/resourcewatch.h).
const MAX_CAPTURES: usize = resourcewatch_ebpf::shared::MAX_SITE_CAPTURES;
/// A capture is ended early for another tenant's leak only after this long (named at
/// 5 s and 10 s: its sites have settled, as a rule).
const PREEMPT_AFTER_NS: u64 = 15_000_000_000;

/// Whose a leak is, for sharing the capture slots: its pod's namespace (or the pod, or
/// the cgroup, or the node's own processes together: `tenant::of`).
fn tenant_of(row: &LeakRow) -> String {
    crate::tenant::of(row.who.pod_uid.as_deref(), row.who.cgroup.as_deref())
}

/// Sites kept per process, and frames per site (leaf first).
pub const SITES_KEPT: usize = 3;
pub const FRAMES_KEPT: usize = 8;

/// A capture's growth so far: bytes by (user stack, caller), as the kernel counted them.
type RawSites = HashMap<(Vec<u64>, u64), u64>;

/// One growth site: a user stack, leaf first, and the resident bytes it added.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GrowthSite {
    pub frames: Vec<String>,
    pub bytes: u64,
    /// Of all the growth captured for the process.
    pub percent: f64,
}

struct Capture {
    /// Whose leak it is (`tenant_of`): slots are shared between tenants.
    tenant: String,
    started_ns: u64,
    active: bool,
    ended_ns: u64,
    named_ns: u64,
    cgroup: Option<String>,
    container_id: Option<String>,
    raw: RawSites,
    sites: Vec<GrowthSite>,
    /// Whether `sites` are shown (see [`settled`]).
    settled: bool,
    /// The process runs HotSpot (maps libjvm.so): see `drop_jvm_collector_growth`.
    jvm: bool,
    /// Namings asked of the [`Namer`] and not yet put back.
    naming: u32,
}

/// A naming asked of the naming thread.
enum Job {
    Name {
        pid: u32,
        raw: RawSites,
        jvm: bool,
        /// The capture has ended: its sites are shown whatever the namings before said.
        last: bool,
    },
    /// No capture is left: drop the symbolizer's caches (every file and perf map it read),
    /// so that they are bounded by what the captures of one episode touch.
    Forget,
}

/// A naming done.
struct Named {
    pid: u32,
    sites: Vec<GrowthSite>,
    last: bool,
}

/// The naming thread: one job at a time, in the order asked, with a [`Symbolizer`] of its
/// own. Dropped with the tracker: its channel closes and the thread ends after the job
/// it is on (not joined: a read of a workload's file must not hold the engine).
struct Namer {
    jobs: mpsc::Sender<Job>,
    done: mpsc::Receiver<Named>,
    /// Whether anything was named since the last [`Job::Forget`].
    used: bool,
}

/// What the naming thread runs for a job (the tests give a slow one).
type NameFn = fn(&Symbolizer, u32, &RawSites, bool) -> Vec<GrowthSite>;

impl Namer {
    fn spawn(name: NameFn) -> Option<Self> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (tx, done) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("rw-growth-sites".into())
            .spawn(move || {
                let mut sym = Symbolizer::new();
                for job in rx {
                    match job {
                        Job::Name {
                            pid,
                            raw,
                            jvm,
                            last,
                        } => {
                            // Whether it runs HotSpot is read here, off the engine:
                            // its maps are a tenant's to make large.
                            let jvm = jvm || sym.maps_file_named(pid, "libjvm.so");
                            let sites = name(&sym, pid, &raw, jvm);
                            if tx.send(Named { pid, sites, last }).is_err() {
                                return;
                            }
                        }
                        Job::Forget => sym = Symbolizer::new(),
                    }
                }
            });
        match spawned {
            Ok(_) => Some(Self {
                jobs,
                done,
                used: false,
            }),
            Err(e) => {
                tracing::warn!("starting the growth-site naming thread: {e}; sites are not named");
                None
            }
        }
    }
}

#[derive(Default)]
pub struct SiteTracker {
    captures: HashMap<u32, Capture>,
    /// Started with the first capture.
    namer: Option<Namer>,
}

impl SiteTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks for `pid`'s capture to be named; false if it cannot be (no naming thread).
    fn ask(&mut self, pid: u32, last: bool) -> bool {
        let Some(c) = self.captures.get_mut(&pid) else {
            return false;
        };
        if self.namer.is_none() {
            self.namer = Namer::spawn(name_sites);
        }
        let Some(namer) = &mut self.namer else {
            return false;
        };
        let job = Job::Name {
            pid,
            raw: c.raw.clone(),
            jvm: c.jvm,
            last,
        };
        if namer.jobs.send(job).is_err() {
            // The thread is gone (it panicked): a new one at the next naming.
            self.namer = None;
            return false;
        }
        namer.used = true;
        c.naming += 1;
        true
    }

    /// Puts the namings done since the last update on their captures.
    fn collect_named(&mut self) {
        let Some(namer) = &self.namer else { return };
        while let Ok(n) = namer.done.try_recv() {
            let Some(c) = self.captures.get_mut(&n.pid) else {
                continue;
            };
            c.naming = c.naming.saturating_sub(1);
            if n.last {
                c.settled = true;
            } else {
                c.settled |= settled(&c.sites, &n.sites);
            }
            c.sites = n.sites;
        }
    }

    /// Starts, feeds and ends captures for this evaluation's leaks, and puts each leak's
    /// sites on its row (a container's row gets its processes' sites).
    pub fn update(&mut self, pipes: &mut Pipelines, rows: &mut [LeakRow], now: u64) {
        self.start(pipes, rows, now);
        // The kernel keeps adding to its counters between reads: read them only when a
        // capture is due to be named or to end, not at every frame (`top` at 10 ms).
        let due = |pid: &u32, c: &Capture| {
            c.active
                && (now.saturating_sub(c.named_ns) >= NAME_EVERY_NS
                    || now.saturating_sub(c.started_ns) >= CAPTURE_FOR_NS
                    || !procfs::exists(*pid))
        };
        if self.captures.values().any(|c| c.active)
            && let Err(e) = pipes.read_growth_samples()
        {
            tracing::warn!(
                "reading growth-site stack samples failed: {}",
                resourcewatch_runtime::error_chain(&e)
            );
        }
        if self.captures.iter().any(|(pid, c)| due(pid, c)) {
            match pipes.drain_growth_sites() {
                Ok(raw) => {
                    self.accumulate(raw);
                    self.take_back(pipes.revoked_growth_sites());
                }
                Err(e) => tracing::warn!(
                    "reading growth sites failed: {}",
                    resourcewatch_runtime::error_chain(&e)
                ),
            }
        }
        self.collect_named();
        let pids: Vec<u32> = self.captures.keys().copied().collect();
        for pid in pids {
            let alive = procfs::exists(pid);
            let Some(c) = self.captures.get_mut(&pid) else {
                continue;
            };
            if c.active && (!alive || now.saturating_sub(c.started_ns) >= CAPTURE_FOR_NS) {
                self.end(pipes, pid, now);
            } else if c.active && c.naming == 0 && now.saturating_sub(c.named_ns) >= NAME_EVERY_NS {
                // One naming at a time per capture: a slow one is not queued behind
                // itself every 5 s.
                c.named_ns = now;
                self.ask(pid, false);
            }
            if let Some(c) = self.captures.get(&pid)
                && !alive
                && !c.active
                && c.naming == 0
            {
                self.captures.remove(&pid);
            }
        }
        if let Some(namer) = &mut self.namer
            && namer.used
            && self.captures.values().all(|c| !c.active && c.naming == 0)
        {
            namer.used = false;
            let _ = namer.jobs.send(Job::Forget);
        }
        for row in rows.iter_mut() {
            row.growth_sites = self.sites_of(row);
        }
    }

    /// The settled sites of a leak row: its process's, or (a cgroup's row) those of every
    /// process captured in its cgroup or container, heaviest first.
    fn sites_of(&self, row: &LeakRow) -> Vec<GrowthSite> {
        if let Some(pid) = row.pid {
            return self
                .captures
                .get(&pid)
                .filter(|c| c.settled)
                .map(|c| c.sites.clone())
                .unwrap_or_default();
        }
        let mut all: Vec<GrowthSite> = self
            .captures
            .values()
            .filter(|c| {
                c.settled
                    && ((c.cgroup.is_some() && c.cgroup == row.who.cgroup)
                        || (c.container_id.is_some() && c.container_id == row.who.container_id))
            })
            .flat_map(|c| c.sites.iter().cloned())
            .collect();
        all.sort_by_key(|s| std::cmp::Reverse(s.bytes));
        all.truncate(SITES_KEPT);
        all
    }

    /// Ends `pid`'s capture and asks for its last naming.
    fn end(&mut self, pipes: &mut Pipelines, pid: u32, now: u64) {
        let Some(c) = self.captures.get_mut(&pid) else {
            return;
        };
        pipes.stop_growth_sites(pid);
        c.active = false;
        c.ended_ns = now;
        c.named_ns = now;
        if !self.ask(pid, true)
            && let Some(c) = self.captures.get_mut(&pid)
        {
            // Never named: shown as they are (none), not waited for.
            c.settled = true;
        }
    }

    /// With every slot taken, the capture to end for a leak of `tenant`: the oldest of
    /// the tenant holding the most slots, when it holds at least two more than `tenant`
    /// and has run `PREEMPT_AFTER_NS` (its sites named twice). One tenant's leaks cannot
    /// hold every slot while another's wait.
    fn preemptable(&self, tenant: &str, now: u64) -> Option<u32> {
        let mut held: HashMap<&str, usize> = HashMap::new();
        for c in self.captures.values().filter(|c| c.active) {
            *held.entry(c.tenant.as_str()).or_default() += 1;
        }
        let mine = held.get(tenant).copied().unwrap_or(0);
        let (&top, &n) = held.iter().max_by_key(|&(t, n)| (*n, *t))?;
        if n < mine + 2 {
            return None;
        }
        self.captures
            .iter()
            .filter(|(_, c)| {
                c.active && c.tenant == top && now.saturating_sub(c.started_ns) >= PREEMPT_AFTER_NS
            })
            .min_by_key(|(_, c)| c.started_ns)
            .map(|(pid, _)| *pid)
    }

    fn start(&mut self, pipes: &mut Pipelines, rows: &[LeakRow], now: u64) {
        for row in rows {
            let Some(pid) = row.pid else { continue };
            if row.confidence < SITE_CONFIDENCE {
                continue;
            }
            if let Some(c) = self.captures.get(&pid)
                && (c.active || now.saturating_sub(c.ended_ns) < RECAPTURE_AFTER_NS)
            {
                continue;
            }
            let tenant = tenant_of(row);
            if self.captures.values().filter(|c| c.active).count() >= MAX_CAPTURES {
                match self.preemptable(&tenant, now) {
                    Some(victim) => self.end(pipes, victim, now),
                    None => continue,
                }
            }
            match pipes.capture_growth_sites(pid) {
                Ok(()) => {
                    self.captures.insert(
                        pid,
                        Capture {
                            started_ns: now,
                            active: true,
                            ended_ns: 0,
                            named_ns: now,
                            cgroup: row.who.cgroup.clone(),
                            container_id: row.who.container_id.clone(),
                            tenant,
                            raw: HashMap::new(),
                            sites: Vec::new(),
                            settled: false,
                            // Found by the naming thread (see `Namer::spawn`).
                            jvm: false,
                            naming: 0,
                        },
                    );
                }
                Err(e) => tracing::debug!(
                    "capturing the growth sites of {pid}: {}",
                    resourcewatch_runtime::error_chain(&e)
                ),
            }
        }
    }

    fn accumulate(&mut self, raw: Vec<RawStack>) {
        for r in raw {
            if let Some(c) = self.captures.get_mut(&r.tgid) {
                *c.raw.entry((r.user, r.caller)).or_default() += r.value;
            }
        }
    }

    /// Growth given back after an earlier drain counted it (the kernel revoked its charge).
    fn take_back(&mut self, revoked: Vec<RawStack>) {
        for r in revoked {
            let key = (r.user, r.caller);
            if let Some(c) = self.captures.get_mut(&r.tgid)
                && let Some(v) = c.raw.get_mut(&key)
            {
                *v = v.saturating_sub(r.value);
                if *v == 0 {
                    c.raw.remove(&key);
                }
            }
        }
    }
}

/// Whether a capture's sites are shown from this naming on: once its top site (`named`,
/// from the growth so far) is the one named the time before (`before`, 5 s earlier), or
/// once the capture has ended. The first namings may be topped by growth the process
/// made as the capture started (a start-up heap, a cache filling) rather than by the
/// leak, and what is shown first is what a `LeakDetected` or `LeakSiteFound` Event
/// says, once: a site shown must not be the first guess.
fn settled(before: &[GrowthSite], named: &[GrowthSite]) -> bool {
    match (before.first(), named.first()) {
        (Some(a), Some(b)) => a.frames == b.frames,
        _ => false,
    }
}

fn name_sites(sym: &Symbolizer, pid: u32, raw: &RawSites, jvm: bool) -> Vec<GrowthSite> {
    let stacks: Vec<RawStack> = raw
        .iter()
        .map(|((user, caller), &value)| RawStack {
            tgid: pid,
            user: user.clone(),
            kernel: Vec::new(),
            caller: *caller,
            value,
        })
        .collect();
    let mut named = crate::stacks::name(&stacks, sym, |_| None);
    if jvm {
        drop_jvm_collector_growth(&mut named, |f| sym.is_jit(f));
    }
    let total: u64 = named.iter().map(|s| s.value).sum::<u64>().max(1);
    let mut merged: HashMap<Vec<String>, u64> = HashMap::new();
    for s in named {
        let leaf_first: Vec<String> = s.frames.into_iter().rev().collect();
        *merged
            .entry(skip_runtime_frames(leaf_first, |f| sym.is_jit(f)))
            .or_default() += s.value;
    }
    let mut sites: Vec<(Vec<String>, u64)> = merged.into_iter().collect();
    sites.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    sites
        .into_iter()
        .take(SITES_KEPT)
        .map(|(frames, bytes)| GrowthSite {
            frames: frames.into_iter().take(FRAMES_KEPT).collect(),
            bytes,
            percent: (bytes as f64 * 1000.0 / total as f64).round() / 10.0,
        })
        .collect()
}

/// For a JVM, resident growth under no Java frame is left out: the collector copying live
/// objects into new regions (G1, Parallel, Serial: the copy does not say where those
/// objects were made), the JIT compilers' and the VM thread's own memory. What stays is
/// where Java code made the process grow: its heap allocations where they were sampled
/// (stacks.bpf.h's `rw_jvm_alloc`: sites whose leaf is HotSpot's
/// `AllocTracer::send_allocation_*`, needs CAP_SYS_ADMIN), its first touches of new heap
/// pages, and what it grew outside the heap (JNI, direct buffers, class loading). When
/// that leaves nothing (a G1 heap past its first cycles grows only under the collector,
/// and no allocation was sampled), every site stays.
fn drop_jvm_collector_growth(named: &mut Vec<crate::stacks::Stack>, is_jit: impl Fn(&str) -> bool) {
    let java = |s: &crate::stacks::Stack| {
        s.frames
            .last()
            .is_some_and(|f| f.starts_with("AllocTracer::send_allocation"))
            || s.frames.iter().any(|f| is_jit(f))
    };
    if named.iter().any(java) {
        named.retain(java);
    }
}

/// A site's frames (leaf first) without the JIT runtime's or interpreter's own native
/// frames from the faulting leaf to the outermost JIT frame: V8 or HotSpot internals (a
/// dozen frames of C++ templates) between the leaf and the first JIT frame, and CPython's
/// evaluation loop between each Python function's trampoline and the next
/// (`_PyEval_EvalFrameDefault`, `PyObject_Vectorcall`, ...), would otherwise fill the
/// frames a site keeps, and the code that asked for the memory is the first JIT frame.
/// The leaf stays (what touched the page), and so does everything above the outermost
/// JIT frame; CPU profiles keep every frame.
fn skip_runtime_frames(frames: Vec<String>, is_jit: impl Fn(&str) -> bool) -> Vec<String> {
    let Some(last) = frames.iter().rposition(|f| is_jit(f)) else {
        return frames;
    };
    frames
        .into_iter()
        .enumerate()
        .filter(|(i, f)| *i == 0 || *i >= last || is_jit(f))
        .map(|(_, f)| f)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture() -> Capture {
        Capture {
            tenant: "pod:a".into(),
            started_ns: 0,
            active: true,
            ended_ns: 0,
            named_ns: 0,
            cgroup: None,
            container_id: None,
            raw: HashMap::from([((vec![1, 2], 0), 4096)]),
            sites: Vec::new(),
            settled: false,
            jvm: false,
            naming: 0,
        }
    }

    /// With every slot taken by one tenant, another tenant's leak takes the oldest of
    /// them once it has run long enough; a tenant holding one slot more than another is
    /// not preempted, nor a capture too young.
    #[test]
    fn one_tenant_cannot_hold_every_capture_slot() {
        let mut t = SiteTracker::new();
        for pid in 0..MAX_CAPTURES as u32 {
            let mut c = capture();
            c.started_ns = u64::from(pid) * 1_000_000_000;
            t.captures.insert(100 + pid, c);
        }
        let young = PREEMPT_AFTER_NS - 1;
        assert_eq!(t.preemptable("pod:b", young), None, "too young");
        let now = PREEMPT_AFTER_NS + 10_000_000_000;
        assert_eq!(
            t.preemptable("pod:b", now),
            Some(100),
            "the oldest of pod:a"
        );
        assert_eq!(t.preemptable("pod:a", now), None, "its own");
        // Shared fairly: pod:a 5, pod:b 3 slots; pod:b is not preempted for pod:a, and
        // pod:c takes one of pod:a's.
        for pid in 0..3 {
            t.captures.get_mut(&(100 + pid)).expect("capture").tenant = "pod:b".into();
        }
        assert_eq!(t.preemptable("pod:b", now), Some(103));
        assert_eq!(t.preemptable("pod:c", now), Some(103));
        for pid in 3..4 {
            t.captures.get_mut(&(100 + pid)).expect("capture").tenant = "pod:b".into();
        }
        assert_eq!(t.preemptable("pod:b", now), None, "4 and 4");
    }

    /// A naming that takes 300 ms, as reading a large binary with a cold page cache does
    /// (seconds, seen in CI).
    fn slow_naming(_: &Symbolizer, pid: u32, raw: &RawSites, _: bool) -> Vec<GrowthSite> {
        std::thread::sleep(std::time::Duration::from_millis(300));
        vec![GrowthSite {
            frames: vec![format!("leak_{pid}")],
            bytes: raw.values().sum(),
            percent: 100.0,
        }]
    }

    /// The engine asks for a naming and goes on: asking returns at once whatever the
    /// naming costs, the result lands at an update after it is done, and the rule for
    /// showing sites (the same top twice, or the capture's last naming) holds across it.
    #[test]
    fn naming_runs_beside_the_engine_and_lands_later() {
        let mut t = SiteTracker::new();
        t.namer = Namer::spawn(slow_naming);
        t.captures.insert(7, capture());
        let asked = std::time::Instant::now();
        assert!(t.ask(7, false));
        assert!(
            asked.elapsed() < std::time::Duration::from_millis(100),
            "asking waited for the naming ({:?})",
            asked.elapsed()
        );
        t.collect_named();
        assert!(t.captures[&7].sites.is_empty(), "not done yet");
        assert_eq!(t.captures[&7].naming, 1);
        // Up to 2 s for the namings asked of `pid` to land.
        let wait = |t: &mut SiteTracker, pid: u32| {
            for _ in 0..100 {
                t.collect_named();
                if t.captures[&pid].naming == 0 {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            panic!("the naming never landed");
        };
        wait(&mut t, 7);
        let c = &t.captures[&7];
        assert_eq!(c.sites[0].frames, ["leak_7"]);
        assert_eq!(c.sites[0].bytes, 4096);
        assert!(!c.settled, "a first naming is not shown");
        assert!(t.ask(7, false));
        wait(&mut t, 7);
        assert!(t.captures[&7].settled, "the same top twice is shown");
        // A capture's last naming is shown whatever came before it.
        t.captures.insert(8, capture());
        assert!(t.ask(8, true));
        wait(&mut t, 8);
        assert!(t.captures[&8].settled);
        assert_eq!(t.captures[&8].sites[0].frames, ["leak_8"]);
    }

    fn site(frames: &[&str], percent: f64) -> GrowthSite {
        GrowthSite {
            frames: frames.iter().map(|f| f.to_string()).collect(),
            bytes: (percent * 1000.0) as u64,
            percent,
        }
    }

    #[test]
    fn sites_are_shown_once_the_top_one_is_named_twice_in_a_row() {
        let startup = site(&["load_config", "main"], 70.0);
        let leak = site(&["leak_here", "keep", "grow"], 30.0);
        let leak_on_top = site(&["leak_here", "keep", "grow"], 60.0);
        // The first naming: no earlier one to agree with.
        assert!(!settled(&[], &[startup.clone(), leak.clone()]));
        // The start-up growth topped the first naming, the leak the second: not yet.
        assert!(!settled(
            &[startup.clone(), leak.clone()],
            &[leak_on_top.clone(), startup.clone()]
        ));
        // The same top site again (its share may move): shown.
        assert!(settled(
            std::slice::from_ref(&leak_on_top),
            &[site(&["leak_here", "keep", "grow"], 75.0)]
        ));
        // Nothing named.
        assert!(!settled(&[leak_on_top], &[]));
    }

    #[test]
    fn a_jvms_growth_under_no_java_frame_is_left_out_unless_nothing_else_is_left() {
        let stack = |frames: &[&str], value| crate::stacks::Stack {
            tgid: 1,
            comm: None,
            frames: frames.iter().map(|s| s.to_string()).collect(),
            modules: Vec::new(),
            kernel_frames: 0,
            value,
        };
        let jit = |f: &str| f.starts_with("void ");
        let gc = stack(
            &["clone3", "VMThread::run()", "Generation::promote", "memcpy"],
            30,
        );
        let alloc = stack(
            &[
                "main",
                "void Leak.leakInJava()",
                "AllocTracer::send_allocation_outside_tlab(Klass*)",
            ],
            10,
        );
        let unwalked_alloc = stack(
            &[
                "[unknown]",
                "AllocTracer::send_allocation_in_new_tlab(Klass*)",
            ],
            4,
        );
        let touch = stack(&["main", "void Leak.leakInJava()", "memset"], 5);
        let mut named = vec![
            gc.clone(),
            alloc.clone(),
            unwalked_alloc.clone(),
            touch.clone(),
        ];
        drop_jvm_collector_growth(&mut named, jit);
        assert_eq!(named, [alloc, unwalked_alloc, touch.clone()]);
        let mut named = vec![gc.clone(), touch.clone()];
        drop_jvm_collector_growth(&mut named, jit);
        assert_eq!(named, [touch]);
        let mut named = vec![gc.clone()];
        drop_jvm_collector_growth(&mut named, jit);
        assert_eq!(named, [gc]);
    }

    #[test]
    fn runtime_frames_between_the_leaf_and_the_outermost_jit_frame_are_left_out() {
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let jit = |n: &str| n.starts_with("JS:");
        assert_eq!(
            skip_runtime_frames(
                f(&["memset", "Fill", "CEntry", "JS:^alloc", "JS:^leak", "main"]),
                jit
            ),
            f(&["memset", "JS:^alloc", "JS:^leak", "main"])
        );
        assert_eq!(
            skip_runtime_frames(f(&["JS:^a", "JS:^b"]), jit),
            f(&["JS:^a", "JS:^b"])
        );
        assert_eq!(
            skip_runtime_frames(f(&["memset", "JS:^a"]), jit),
            f(&["memset", "JS:^a"])
        );
        assert_eq!(
            skip_runtime_frames(f(&["leak_here", "keep"]), jit),
            f(&["leak_here", "keep"])
        );
        // An interpreter between its functions' frames (CPython's trampolines).
        let py = |n: &str| n.starts_with("py::");
        assert_eq!(
            skip_runtime_frames(
                f(&[
                    "memset",
                    "bytes_repeat",
                    "_PyEval_EvalFrameDefault",
                    "py::leak",
                    "_PyEval_EvalFrameDefault",
                    "PyObject_Vectorcall",
                    "py::grow",
                    "_PyEval_EvalFrameDefault",
                    "PyEval_EvalCode",
                    "main"
                ]),
                py
            ),
            f(&[
                "memset",
                "py::leak",
                "py::grow",
                "_PyEval_EvalFrameDefault",
                "PyEval_EvalCode",
                "main"
            ])
        );
    }
}
