//! Leak detection: which process is leaking, how sure we are, and how long until it
//! reaches its memory limit. Kube-free. Fed by the kernel's sample stream (composition,
//! at >= 1 MiB moves) and by the exact RSS the agent reads from the memory sketch every
//! interval (heartbeats: page resolution, and proof that a quiet process is still flat).
//!
//! Why the long history is here and not in the kernel: a slow leak (10 KB/s) needs tens of
//! minutes of points, the regression needs floating point, and the confidence needs the
//! whole shape of the series (falls, curvature); the kernel keeps what filtering needs
//! (last emitted value, a 16-sample ring) and stays within its per-event budget.

pub mod detect;
pub mod jvm;
pub mod memory_limit;

use std::collections::HashMap;

pub use detect::{Context, Eta, Params, Verdict};

/// Which series a sample belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SeriesKey {
    Process { tgid: u32 },
    Cgroup { id: u64 },
}

/// One memory sample (bytes; `ts_ns` on CLOCK_MONOTONIC).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MemSample {
    pub ts_ns: u64,
    pub file_bytes: u64,
    pub anon_bytes: u64,
    pub shmem_bytes: u64,
    pub swap_bytes: u64,
}

impl MemSample {
    pub fn rss_bytes(&self) -> u64 {
        self.file_bytes + self.anon_bytes + self.shmem_bytes
    }
}

/// Points kept per series. When full, the older half is thinned to every other point, so
/// the span covered doubles while recent points keep full resolution: 720 points hold
/// hours of a slow leak's heartbeats in about 17 KiB.
pub const MAX_POINTS: usize = 720;

/// What is known about a series before its first sample: when its process (or the
/// container's oldest process) started, and the highest resident size it ever had
/// (`VmHWM`, the cgroup's `memory.peak` / `max_usage_in_bytes`). An agent that restarts
/// sees a running process for the first time; without these, every series would look
/// newborn and every process that ever freed memory would look like it never had.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seed {
    /// CLOCK_MONOTONIC ns of the process's start.
    pub started_ns: Option<u64>,
    pub peak_bytes: Option<u64>,
}

struct Series {
    points: Vec<detect::Point>,
    started_ns: u64,
    peak_bytes: u64,
    last: MemSample,
}

impl Series {
    fn push(&mut self, s: MemSample) {
        if self
            .points
            .last()
            .is_some_and(|p| (s.ts_ns as f64 / 1e9) <= p.t)
        {
            // Out of order (a heartbeat raced a kernel sample): keep the newest values only.
            self.last = s;
            return;
        }
        self.points.push(detect::Point {
            t: s.ts_ns as f64 / 1e9,
            rss: s.rss_bytes() as f64,
            // shmem counts with anon: tmpfs/memfd pages are not reclaimable cache either.
            anon: (s.anon_bytes + s.shmem_bytes) as f64,
        });
        self.last = s;
        if self.points.len() > MAX_POINTS {
            let half = self.points.len() / 2;
            let mut thinned: Vec<detect::Point> =
                self.points[..half].iter().step_by(2).copied().collect();
            thinned.extend_from_slice(&self.points[half..]);
            self.points = thinned;
        }
    }
}

/// What a verdict was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Basis {
    /// The resident size (or the container's charge).
    #[default]
    Resident,
    /// A JVM's retained heap after each young collection (`jvm.rs`): the time to OOM
    /// still comes from the resident size, which is what the kernel kills on.
    JvmHeap,
}

/// Series of every process that moved memory, and their verdicts.
#[derive(Default)]
pub struct LeakTracker {
    series: HashMap<SeriesKey, Series>,
    /// JVMs' retained heap, one point per young collection, by process.
    heaps: HashMap<u32, Series>,
    params: Params,
}

impl LeakTracker {
    pub fn new(params: Params) -> Self {
        Self {
            series: HashMap::new(),
            heaps: HashMap::new(),
            params,
        }
    }

    /// A JVM's retained heap after a young collection (`jvm::Heap`), for a process
    /// already tracked. Call it once per collection: each call is a point.
    pub fn observe_heap(&mut self, tgid: u32, ts_ns: u64, retained_bytes: u64) {
        let Some(started_ns) = self
            .series
            .get(&SeriesKey::Process { tgid })
            .map(|s| s.started_ns)
        else {
            return;
        };
        let s = MemSample {
            ts_ns,
            anon_bytes: retained_bytes,
            ..Default::default()
        };
        self.heaps
            .entry(tgid)
            .or_insert_with(|| Series {
                points: Vec::new(),
                started_ns,
                peak_bytes: 0,
                last: s,
            })
            .push(s);
    }

    /// The newest point of a process's heap series: (ns, retained bytes).
    pub fn last_heap(&self, tgid: u32) -> Option<(u64, u64)> {
        self.heaps
            .get(&tgid)
            .map(|h| (h.last.ts_ns, h.last.anon_bytes))
    }

    pub fn observe(&mut self, key: SeriesKey, s: MemSample) {
        self.observe_seeded(key, s, Seed::default());
    }

    /// Like `observe`; `seed` is used only if this is the series' first sample.
    pub fn observe_seeded(&mut self, key: SeriesKey, s: MemSample, seed: Seed) {
        self.series
            .entry(key)
            .or_insert_with(|| Series {
                points: Vec::new(),
                started_ns: seed.started_ns.unwrap_or(s.ts_ns).min(s.ts_ns),
                peak_bytes: seed.peak_bytes.unwrap_or(0),
                last: s,
            })
            .push(s);
    }

    /// Whether a series exists (seeding costs /proc reads: done once, for new series).
    pub fn contains(&self, key: SeriesKey) -> bool {
        self.series.contains_key(&key)
    }

    /// The exact resident size of an already tracked series at `ts_ns`; the change since
    /// the last sample is attributed to its anonymous part (the kernel stream corrects
    /// the composition at the next >= 1 MiB move).
    pub fn heartbeat(&mut self, key: SeriesKey, ts_ns: u64, rss_bytes: u64) {
        let Some(series) = self.series.get_mut(&key) else {
            return;
        };
        let mut s = series.last;
        let delta = rss_bytes as i64 - s.rss_bytes() as i64;
        s.anon_bytes = (s.anon_bytes as i64 + delta).max(0) as u64;
        s.ts_ns = ts_ns;
        series.push(s);
    }

    pub fn forget(&mut self, key: SeriesKey) {
        self.series.remove(&key);
        if let SeriesKey::Process { tgid } = key {
            self.heaps.remove(&tgid);
        }
    }

    /// The series tracked, in order (a replay that breaks ties by order is repeatable).
    pub fn keys(&self) -> Vec<SeriesKey> {
        let mut keys: Vec<SeriesKey> = self.series.keys().copied().collect();
        keys.sort_unstable();
        keys
    }

    pub fn last_sample(&self, key: SeriesKey) -> Option<MemSample> {
        self.series.get(&key).map(|s| s.last)
    }

    /// The detectors' verdict on one series at `now_ns`, without a limit.
    pub fn assess(&self, key: SeriesKey, now_ns: u64) -> Option<Verdict> {
        self.assess_with(key, now_ns, None, 0.0)
    }

    /// The verdict with the bytes left before the series' tightest memory limit and the
    /// page cache charged to it, which the time to OOM is computed against.
    pub fn assess_with(
        &self,
        key: SeriesKey,
        now_ns: u64,
        headroom: Option<f64>,
        reclaimable: f64,
    ) -> Option<Verdict> {
        Some(self.assess_basis(key, now_ns, headroom, reclaimable)?.0)
    }

    /// Like `assess_with`, and what the verdict was read from. A JVM's verdict is the more
    /// confident of its resident size's and its retained heap's; the time to OOM is always
    /// the resident size's (the kernel kills on the charge, not on the heap), and only
    /// where that series' own trend supports one.
    pub fn assess_basis(
        &self,
        key: SeriesKey,
        now_ns: u64,
        headroom: Option<f64>,
        reclaimable: f64,
    ) -> Option<(Verdict, Basis)> {
        let s = self.series.get(&key)?;
        let ctx = Context {
            start_t: s.started_ns as f64 / 1e9,
            now_t: now_ns as f64 / 1e9,
            prior_peak: s.peak_bytes as f64,
            headroom,
            reclaimable,
        };
        let resident = detect::assess(&s.points, &ctx, &self.params);
        let heap = match key {
            SeriesKey::Process { tgid } => self.heaps.get(&tgid).and_then(|h| {
                let ctx = Context {
                    prior_peak: 0.0,
                    headroom: None,
                    reclaimable: 0.0,
                    ..ctx
                };
                detect::assess(&h.points, &ctx, &self.params)
            }),
            SeriesKey::Cgroup { .. } => None,
        };
        match (resident, heap) {
            (r, Some(h)) if r.is_none_or(|r| h.confidence > r.confidence) => {
                let eta = r.and_then(|r| r.eta.filter(|_| r.confidence >= 40 && r.r2 >= 0.8));
                Some((Verdict { eta, ..h }, Basis::JvmHeap))
            }
            (r, _) => Some((r?, Basis::Resident)),
        }
    }

    /// `assess_basis` with what is known around the series: for a process of a watched
    /// container, that container's charge (`container`); for a container, its processes
    /// (`members`).
    ///
    /// **Charged.** A process's growth that its container's charge does not show is no
    /// memory the container consumes, and brings no OOM kill closer (the cgroup's OOM
    /// killer acts on the charge): resident sizes count pages mapped twice (ZGC maps its
    /// heap three times, and its resident size creeps as the collector touches each view;
    /// a shared segment mapped by several processes) and pages another process of the
    /// container frees meanwhile. The verdict is scaled by the share of the process's
    /// anonymous growth over the scored window that the container's anonymous charge
    /// (anon, shmem and kernel memory: what the kernel cannot reclaim) gained in the same
    /// seconds: in full from half, nothing below a fifth. A leak near its limit, where the
    /// kernel reclaims page cache to make room, grows the anonymous charge as much.
    ///
    /// **Runtime.** A JVM whose collector kept its retained heap flat over the window (at
    /// least four young collections in it) while its resident size grew is taking memory
    /// for itself: heap regions first touched or committed for allocation, compiled code,
    /// metaspace, each bounded by a flag and tapering off. Its resident verdict (or its
    /// container's, when the JVM made at least half of the container's growth) is halved,
    /// rising back to whole as the heap grew by half as much as the resident size, unless
    /// the trend reaches a limit within 10 minutes: a native leak threatening a kill is
    /// reported in full whatever the heap says.
    pub fn assess_in(
        &self,
        key: SeriesKey,
        container: Option<SeriesKey>,
        members: &[u32],
        now_ns: u64,
        headroom: Option<f64>,
        reclaimable: f64,
    ) -> Option<(Verdict, Basis)> {
        let (mut v, basis) = self.assess_basis(key, now_ns, headroom, reclaimable)?;
        v.components.charged = 1.0;
        v.components.runtime = 1.0;
        let now_t = now_ns as f64 / 1e9;
        let from = now_t - v.run_secs;
        let own = self.series.get(&key)?;
        if let (SeriesKey::Process { .. }, Some(cg)) =
            (key, container.and_then(|c| self.series.get(&c)))
            && let Some(share) = charged_share(&own.points, &cg.points, from, &self.params)
        {
            v.components.charged = detect::ramp(share, 0.2, 0.5);
        }
        let urgent = v.eta.is_some_and(|e| e.secs < 600.0);
        if basis == Basis::Resident && !urgent {
            let jvms: Vec<u32> = match key {
                SeriesKey::Process { tgid } => vec![tgid],
                SeriesKey::Cgroup { .. } => members.to_vec(),
            };
            let growth = growth_between(&own.points, from);
            for tgid in jvms {
                let (Some(heap), Some(proc)) = (
                    self.heaps.get(&tgid),
                    self.series.get(&SeriesKey::Process { tgid }),
                ) else {
                    continue;
                };
                let (Some(total), Some(jvm)) = (growth, growth_between(&proc.points, from)) else {
                    continue;
                };
                let collections = heap.points.iter().filter(|x| x.t >= from).count();
                if total < self.params.min_growth_bytes || jvm < total / 2.0 || collections < 4 {
                    continue;
                }
                let Some(kept) = heap_growth_between(&heap.points, from) else {
                    continue;
                };
                v.components.runtime = 0.5 + 0.5 * detect::ramp(kept / jvm, 0.0, 0.5);
                break;
            }
        }
        let scaled = f64::from(v.confidence) * v.components.charged * v.components.runtime;
        v.confidence = scaled.round() as u8;
        if v.confidence < 60 {
            v.growing_secs = 0.0;
        }
        Some((v, basis))
    }

    /// (seconds, MiB) of a series' points, for diagnostics.
    pub fn debug_points(&self, key: SeriesKey) -> Vec<(f64, f64)> {
        self.series
            .get(&key)
            .map(|s| {
                s.points
                    .iter()
                    .map(|p| {
                        (
                            (p.t * 10.0).round() / 10.0,
                            (p.rss / 1048576.0 * 10.0).round() / 10.0,
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Drops series not updated for `idle_ns` (their process is gone or long flat).
    pub fn prune(&mut self, now_ns: u64, idle_ns: u64) {
        self.series
            .retain(|_, s| now_ns.saturating_sub(s.last.ts_ns) < idle_ns);
    }

    /// Whether any JVM's retained heap is a series.
    pub fn has_heaps(&self) -> bool {
        !self.heaps.is_empty()
    }

    pub fn len(&self) -> usize {
        self.series.len()
    }

    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }
}

/// The anonymous part of `points` at `t` seconds: the median of the points within 2 s
/// of it (one sample's jitter does not decide), or the nearest point within 10 s.
fn anon_at(points: &[detect::Point], t: f64) -> Option<f64> {
    let mut near: Vec<f64> = points
        .iter()
        .filter(|x| (x.t - t).abs() <= 2.0)
        .map(|x| x.anon)
        .collect();
    if near.is_empty() {
        // A quiet series has no point every second: its nearest, if recent enough.
        return points
            .iter()
            .min_by(|a, b| (a.t - t).abs().total_cmp(&(b.t - t).abs()))
            .filter(|x| (x.t - t).abs() <= 10.0)
            .map(|x| x.anon);
    }
    near.sort_by(f64::total_cmp);
    Some(near[near.len() / 2])
}

/// Anonymous growth of a series from `from` (seconds) to its newest point.
fn growth_between(points: &[detect::Point], from: f64) -> Option<f64> {
    Some(anon_at(points, points.last()?.t)? - anon_at(points, from)?)
}

/// Growth of a JVM's retained heap from `from` to its newest collection: what the last
/// collection kept over what the last one before `from` (or the first after it) kept.
fn heap_growth_between(heap: &[detect::Point], from: f64) -> Option<f64> {
    let start = heap
        .iter()
        .rev()
        .find(|x| x.t <= from)
        .or_else(|| heap.iter().find(|x| x.t > from))?;
    Some(heap.last()?.anon - start.anon)
}

/// The container's anonymous growth from `from` (seconds) to now over the process's, or
/// None when the process's is too small to judge (its file-backed growth is
/// `composition`'s) or the container's series does not reach back to `from`.
fn charged_share(
    own: &[detect::Point],
    cg: &[detect::Point],
    from: f64,
    p: &detect::Params,
) -> Option<f64> {
    let (own_last, cg_last) = (own.last()?, cg.last()?);
    if cg.first()?.t > from + 2.0 {
        return None;
    }
    let own_growth = own_last.anon - anon_at(own, from)?;
    if own_growth < p.min_growth_bytes {
        return None;
    }
    let cg_growth = anon_at(cg, cg_last.t)? - anon_at(cg, from)?;
    Some((cg_growth / own_growth).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn history_stays_bounded_and_keeps_its_span() {
        let mut t = LeakTracker::default();
        let key = SeriesKey::Process { tgid: 1 };
        for i in 0..10_000u64 {
            t.observe(
                key,
                MemSample {
                    ts_ns: i * 1_000_000_000,
                    anon_bytes: 10 * MIB + i * 10_000,
                    ..Default::default()
                },
            );
        }
        let s = &t.series[&key];
        assert!(s.points.len() <= MAX_POINTS);
        assert!(
            s.points[0].t < 100.0,
            "the oldest point is kept: {}",
            s.points[0].t
        );
        assert_eq!(s.points.last().map(|p| p.t), Some(9999.0));
        let v = t.assess(key, 9_999_000_000_000).expect("verdict");
        assert!((v.slope - 10_000.0).abs() < 1.0, "slope {}", v.slope);
        assert!(v.confidence >= 60, "a 10 KB/s leak over hours: {v:?}");
    }

    /// A process's growth is judged with its container's charge: growth the charge does
    /// not show (pages mapped twice, as ZGC's heap views are) is not memory the container
    /// consumes; growth it shows is a leak as before.
    #[test]
    fn a_process_grows_only_as_much_as_its_container_charge_shows() {
        let (p, cg) = (SeriesKey::Process { tgid: 7 }, SeriesKey::Cgroup { id: 70 });
        let run = |container_grows: bool| {
            let mut t = LeakTracker::default();
            let (mut plain, mut judged) = (0u8, 0u8);
            for s in 1..=300u64 {
                let ts_ns = s * 1_000_000_000;
                // 200 MiB, then +1 MiB every 10 s (100 KB/s).
                let proc = 200 * MIB + (s / 10) * MIB;
                let charge = if container_grows {
                    proc + 30 * MIB
                } else {
                    230 * MIB
                };
                for (key, anon) in [(p, proc), (cg, charge)] {
                    t.observe(
                        key,
                        MemSample {
                            ts_ns,
                            anon_bytes: anon,
                            ..Default::default()
                        },
                    );
                }
                plain = plain.max(t.assess(p, ts_ns).map_or(0, |v| v.confidence));
                let v = t
                    .assess_in(p, Some(cg), &[], ts_ns, None, 0.0)
                    .map(|(v, _)| v);
                judged = judged.max(v.map_or(0, |v| v.confidence));
                if s == 300 {
                    let v = v.expect("a verdict");
                    let want = if container_grows { 1.0 } else { 0.0 };
                    assert_eq!(v.components.charged, want, "{v:?}");
                }
            }
            (plain, judged)
        };
        let (plain, judged) = run(false);
        assert!(
            plain >= 60,
            "alone, the process's series is a leak: {plain}"
        );
        assert_eq!(judged, 0, "its charge stayed flat");
        let (plain, judged) = run(true);
        assert_eq!(judged, plain, "its charge grew as much");
        assert!(judged >= 60);
    }

    /// A JVM whose collector keeps its retained heap flat while its resident size creeps
    /// is asked twice as much; one whose heap grows with it, or whose creep reaches its
    /// limit within 10 minutes, is not.
    #[test]
    fn a_jvm_with_a_flat_heap_is_asked_more_of_its_resident_growth() {
        let p = SeriesKey::Process { tgid: 8 };
        let judge = |heap_grows: bool, headroom: Option<f64>| {
            let mut t = LeakTracker::default();
            let mut last = None;
            for s in 1..=300u64 {
                let ts_ns = s * 1_000_000_000;
                t.observe(
                    p,
                    MemSample {
                        ts_ns,
                        anon_bytes: 300 * MIB + (s / 10) * MIB,
                        ..Default::default()
                    },
                );
                if s % 5 == 0 {
                    let kept = if heap_grows {
                        100 * MIB + s * 50_000
                    } else {
                        100 * MIB
                    };
                    t.observe_heap(8, ts_ns, kept);
                }
                let left = headroom.map(|h: f64| h - (s / 10) as f64 * MIB as f64);
                last = t.assess_in(p, None, &[], ts_ns, left, 0.0);
            }
            last.expect("a verdict")
        };
        let (flat, basis) = judge(false, None);
        assert_eq!(basis, Basis::Resident);
        assert_eq!(flat.components.runtime, 0.5, "{flat:?}");
        let (grows, _) = judge(true, None);
        // Half as much heap as resident growth: (nearly) whole.
        assert!(grows.components.runtime > 0.95, "{grows:?}");
        // 30 MiB left at 100 KB/s: the limit is 5 minutes away.
        let (near, _) = judge(false, Some(60.0 * MIB as f64));
        assert_eq!(near.components.runtime, 1.0, "{near:?}");
        assert!(
            f64::from(flat.confidence) <= f64::from(grows.confidence) * 0.55,
            "{} vs {}",
            flat.confidence,
            grows.confidence
        );
    }

    /// Highest confidence of a series first observed at `from` s (an agent restarting
    /// then), fed every second until `to`.
    fn seen_from(from: u64, to: u64, seed: Seed, rss: impl Fn(u64) -> u64) -> (u8, Option<u64>) {
        let mut t = LeakTracker::default();
        let key = SeriesKey::Process { tgid: 9 };
        let (mut worst, mut first_60) = (0, None);
        for s in from..=to {
            let r = rss(s);
            t.observe_seeded(
                key,
                MemSample {
                    ts_ns: s * 1_000_000_000,
                    anon_bytes: r,
                    ..Default::default()
                },
                seed,
            );
            if let Some(v) = t.assess(key, s * 1_000_000_000) {
                worst = worst.max(v.confidence);
                if v.confidence >= 60 && first_60.is_none() {
                    first_60 = Some(s - from);
                }
            }
        }
        (worst, first_60)
    }

    #[test]
    fn an_agent_restart_keeps_what_the_process_already_showed() {
        // A 240 s cycle: 20 MiB, +0.5 MiB/s for 240 s, then freed. The agent restarts at
        // 1000 s, just after a collection: the rising edge it sees first is a leak's shape.
        let cycle = |s: u64| 20 * MIB + (s % 240) * MIB / 2;
        let fresh = seen_from(1000, 1150, Seed::default(), cycle).0;
        let seeded = seen_from(
            1000,
            1150,
            Seed {
                started_ns: Some(0),
                peak_bytes: Some(cycle(239)),
            },
            cycle,
        )
        .0;
        assert!(
            fresh >= 60,
            "without the process's peak it is a leak: {fresh}"
        );
        assert!(seeded < 60, "with VmHWM it is a cycle: {seeded}");
        // A process leaking 1 MB/s since long before the restart is found at once.
        let leak = |s: u64| 50 * MIB + s * 1_000_000;
        let (_, found) = seen_from(
            1000,
            1100,
            Seed {
                started_ns: Some(0),
                peak_bytes: Some(leak(1000)),
            },
            leak,
        );
        assert!(found.is_some_and(|s| s <= 10), "{found:?}");
    }

    /// A JVM leaking into heap it already committed: its resident size is flat, its
    /// retained heap rises at every young collection (every 20 s here).
    #[test]
    fn a_jvm_leak_in_committed_heap_is_read_from_its_retained_heap() {
        let key = SeriesKey::Process { tgid: 42 };
        let at = |s: u64| s * 1_000_000_000;
        // 150 s of a flat 300 MiB resident size, and the retained heap `heap(s)` after a
        // young collection every 20 s.
        let jvm = |heap: &dyn Fn(u64) -> u64| {
            let mut t = LeakTracker::default();
            for s in 0..=150u64 {
                let sample = MemSample {
                    ts_ns: at(s),
                    anon_bytes: 300 * MIB,
                    ..Default::default()
                };
                t.observe(key, sample);
                if s % 20 == 5 {
                    t.observe_heap(42, at(s), heap(s));
                }
            }
            t
        };
        // 100 KB/s kept, over a 40 MiB live set.
        let t = jvm(&|s| 40 * MIB + s * 100_000);
        let (v, basis) = t
            .assess_basis(key, at(150), Some(1e9), 0.0)
            .expect("verdict");
        assert_eq!(basis, Basis::JvmHeap);
        assert!(v.confidence >= 60, "{v:?}");
        assert!(
            (v.slope - 100_000.0).abs() < 10_000.0,
            "heap growth {}",
            v.slope
        );
        assert_eq!(v.eta, None, "a flat resident size predicts no OOM kill");
        // Its heap flat: the resident size speaks (and is flat).
        let mut t = jvm(&|_| 40 * MIB);
        let (v, _) = t.assess_basis(key, at(150), None, 0.0).expect("verdict");
        assert!(v.confidence < 40, "{v:?}");
        // Heap points for a process not tracked are dropped; forgetting drops both.
        t.observe_heap(43, at(1), MIB);
        assert_eq!(t.last_heap(43), None);
        t.forget(key);
        assert_eq!(t.last_heap(42), None);
    }

    #[test]
    fn heartbeats_attribute_change_to_anon_and_ignore_unknown_series() {
        let mut t = LeakTracker::default();
        let key = SeriesKey::Process { tgid: 7 };
        t.heartbeat(key, 1, 5 * MIB);
        assert!(t.is_empty(), "heartbeats don't create series");
        t.observe(
            key,
            MemSample {
                ts_ns: 1_000_000_000,
                anon_bytes: 4 * MIB,
                file_bytes: MIB,
                ..Default::default()
            },
        );
        t.heartbeat(key, 2_000_000_000, 8 * MIB);
        let last = t.last_sample(key).expect("series");
        assert_eq!((last.anon_bytes, last.file_bytes), (7 * MIB, MIB));
        t.forget(key);
        assert!(t.is_empty());
    }
}
