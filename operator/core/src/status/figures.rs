//! The figures of a watch's containers, gathered from its nodes' reports and held to
//! the status's bounds: Top-K rows, thresholds crossed, leaks and their growth sites.

use super::*;

/// The figures of the watch's containers, gathered from its nodes' reports.
#[derive(Default)]
pub(super) struct Figures<'a> {
    pub(super) top_cpu: Vec<Candidate<'a>>,
    pub(super) top_memory: Vec<Candidate<'a>>,
    pub(super) exceeding: Vec<ThresholdEntry>,
    /// One per (pod, container), and whether it is the container-level series.
    pub(super) leaks: BTreeMap<(String, String), (bool, LeakEntry)>,
}

/// The figures as the status shows them: sorted, cut to K and to the status's bounds.
pub(super) struct Ranked {
    pub(super) top_cpu: Vec<TopEntry>,
    pub(super) top_memory: Vec<TopEntry>,
    pub(super) leaks: Vec<LeakEntry>,
    pub(super) exceeding: Vec<ThresholdEntry>,
}

/// A Top-K row before ranking: borrowed from a report (or the old status), made into an
/// owned `TopEntry` only if it is among the K kept. Every process of every report used to
/// be cloned into a row (its pod, container, node and command, once per list), sorted,
/// and all but K dropped: at 100 nodes reporting that was most of a reconcile's
/// allocations (a profile of `make scale-ci`, 28 November 2026).
#[derive(Clone, Copy, Debug)]
pub(super) enum Candidate<'a> {
    Reported {
        value: f64,
        pid: u32,
        pod: &'a str,
        container: &'a str,
        node: &'a str,
        command: &'a str,
    },
    /// An entry of a node that stopped reporting, kept from the old status.
    Kept(&'a TopEntry),
}

impl Candidate<'_> {
    fn key(&self) -> (f64, u32, &str, &str) {
        match *self {
            Candidate::Reported {
                value,
                pid,
                node,
                pod,
                ..
            } => (value, pid, node, pod),
            Candidate::Kept(e) => (e.process.value, e.process.pid, &e.process.node, &e.pod),
        }
    }

    /// Highest value first; ties by pid, node and pod, so the order never depends on the
    /// order the reports were read in.
    fn order(a: &Self, b: &Self) -> std::cmp::Ordering {
        let (av, ap, an, apod) = a.key();
        let (bv, bp, bn, bpod) = b.key();
        bv.total_cmp(&av)
            .then(ap.cmp(&bp))
            .then(an.cmp(bn))
            .then(apod.cmp(bpod))
    }

    fn entry(&self) -> TopEntry {
        match *self {
            Candidate::Reported {
                value,
                pid,
                pod,
                container,
                node,
                command,
            } => TopEntry {
                pod: pod.to_owned(),
                container: container.to_owned(),
                process: ProcessFigure {
                    node: node.to_owned(),
                    pid,
                    command: command.to_owned(),
                    value,
                },
            },
            Candidate::Kept(e) => e.clone(),
        }
    }
}

/// The `k` first of `v` in `Candidate::order`, as status entries.
fn top_k(mut v: Vec<Candidate<'_>>, k: usize) -> Vec<TopEntry> {
    if v.len() > k && k > 0 {
        v.select_nth_unstable_by(k - 1, Candidate::order);
    }
    v.truncate(k);
    v.sort_unstable_by(Candidate::order);
    v.iter().map(Candidate::entry).collect()
}

impl<'a> Figures<'a> {
    pub(super) fn add_report(
        &mut self,
        settings: &WatchSettings,
        node: &'a str,
        report: &'a pb::Report,
        by_uid: &ByUid<'a>,
    ) {
        let container_of = |pod: &'a SelectedPod, id: &str| -> &'a str {
            pod.containers.get(id).map_or("", String::as_str)
        };
        for c in &report.containers {
            let Some(&pod) = by_uid.get(c.pod_uid.as_str()) else {
                continue;
            };
            let container = container_of(pod, &c.container_id);
            for p in &c.processes {
                let row = |value| Candidate::Reported {
                    value,
                    pid: p.pid,
                    pod: &pod.name,
                    container,
                    node,
                    command: &p.command,
                };
                self.top_cpu.push(row(round2(p.cpu_percent)));
                self.top_memory.push(row(p.rss_bytes as f64));
            }
            self.exceeding
                .extend(thresholds_crossed(settings, c, &pod.name, container));
        }
        if !settings.leaks_enabled {
            return;
        }
        for l in &report.leaks {
            let Some(pod) = by_uid.get(l.pod_uid.as_str()) else {
                continue;
            };
            if l.confidence < settings.min_confidence as u32
                || l.growing_seconds < settings.min_growing.as_secs_f64()
            {
                continue;
            }
            let entry = leak_entry(
                settings,
                node,
                l,
                &pod.name,
                container_of(pod, &l.container_id).to_owned(),
            );
            // One entry per container: the container-level series (pid 0) wins, else the
            // most confident process.
            let k = (entry.pod.clone(), entry.container.clone());
            let container_level = l.pid == 0;
            let replace = match self.leaks.get(&k) {
                None => true,
                Some((true, _)) => false,
                Some((false, _)) if container_level => true,
                Some((false, have)) => have.confidence < entry.confidence,
            };
            if replace {
                self.leaks.insert(k, (container_level, entry));
            }
        }
    }

    /// A node that stopped reporting keeps its last known entries (the Degraded condition
    /// says they are stale): dropping them would turn every agent restart into a
    /// LeakDetected / ThresholdCrossed the moment it reports again. They are never acted
    /// on (only fresh leaks are).
    pub(super) fn keep_stale(&mut self, i: &Inputs<'_>, old: &'a ResourceWatchStatus) {
        let stale: BTreeSet<&str> = i
            .nodes
            .iter()
            .filter(|n| !n.reporting)
            .map(|n| n.name.as_str())
            .collect();
        let live_pods: BTreeMap<&str, Option<&str>> = i
            .pods
            .iter()
            .map(|p| (p.name.as_str(), p.node.as_deref()))
            .collect();
        let keep = |pod: &str, node: &str| {
            stale.contains(node) && live_pods.get(pod).is_some_and(|n| *n == Some(node))
        };
        let kept = |entries: &'a [TopEntry]| -> Vec<Candidate<'a>> {
            entries
                .iter()
                .filter(|e| keep(&e.pod, &e.process.node))
                .map(Candidate::Kept)
                .collect()
        };
        self.top_cpu.extend(kept(&old.top_cpu));
        self.top_memory.extend(kept(&old.top_memory));
        for l in old.leaks.iter().filter(|l| keep(&l.pod, &l.node)) {
            self.leaks
                .entry((l.pod.clone(), l.container.clone()))
                .or_insert((true, l.clone()));
        }
        let on_stale_node = |pod: &str| {
            live_pods
                .get(pod)
                .copied()
                .flatten()
                .is_some_and(|n| stale.contains(n))
        };
        self.exceeding.extend(
            old.exceeding
                .iter()
                .filter(|e| on_stale_node(&e.pod))
                .cloned(),
        );
    }

    pub(super) fn rank(self, settings: &WatchSettings) -> (Ranked, resourcewatch_crds::Truncated) {
        let k = settings.top_k as usize;
        let top = |v: Vec<Candidate<'a>>, on: bool| top_k(v, if on { k } else { 0 });
        let mut leaks: Vec<LeakEntry> = self.leaks.into_values().map(|(_, l)| l).collect();
        leaks.sort_by(|a, b| {
            let ka = a.time_to_oom_seconds.unwrap_or(f64::MAX);
            let kb = b.time_to_oom_seconds.unwrap_or(f64::MAX);
            ka.total_cmp(&kb).then(b.confidence.cmp(&a.confidence))
        });
        let mut exceeding = self.exceeding;
        exceeding.sort_by(|a, b| b.value.total_cmp(&a.value));
        let mut truncated = resourcewatch_crds::Truncated::default();
        let cap = |n: usize, max: usize| n.saturating_sub(max) as u32;
        truncated.leaks = cap(leaks.len(), resourcewatch_crds::MAX_STATUS_LEAKS);
        leaks.truncate(resourcewatch_crds::MAX_STATUS_LEAKS);
        truncated.exceeding = cap(exceeding.len(), resourcewatch_crds::MAX_STATUS_EXCEEDING);
        exceeding.truncate(resourcewatch_crds::MAX_STATUS_EXCEEDING);
        let ranked = Ranked {
            top_cpu: top(self.top_cpu, settings.cpu),
            top_memory: top(self.top_memory, settings.memory),
            leaks,
            exceeding,
        };
        (ranked, truncated)
    }
}

/// The thresholds a container's figures cross.
pub(super) fn thresholds_crossed(
    settings: &WatchSettings,
    c: &pb::ContainerReport,
    pod: &str,
    container: &str,
) -> Vec<ThresholdEntry> {
    let entry = |metric, value: f64, threshold| ThresholdEntry {
        pod: pod.to_owned(),
        container: container.to_owned(),
        metric,
        value: round2(value),
        threshold,
    };
    let mut out = Vec::new();
    if let Some(t) = settings.cpu_threshold.filter(|t| c.cpu_percent > *t) {
        out.push(entry(Metric::Cpu, c.cpu_percent, t));
    }
    if c.memory_limit_bytes > 0 {
        let pct = c.memory_bytes as f64 * 100.0 / c.memory_limit_bytes as f64;
        if let Some(t) = settings.memory_threshold.filter(|t| pct > *t) {
            out.push(entry(Metric::Memory, pct, t));
        }
    }
    out
}

/// A node's leak as the status shows it: a time to OOM only within the watch's horizon,
/// its lower bound never above it.
pub(super) fn leak_entry(
    settings: &WatchSettings,
    node: &str,
    l: &pb::Leak,
    pod: &str,
    container: String,
) -> LeakEntry {
    let tto = l
        .time_to_oom_seconds
        .filter(|s| *s <= settings.horizon.as_secs_f64());
    LeakEntry {
        pod: pod.to_owned(),
        container,
        node: node.to_owned(),
        growth_bytes_per_second: l.growth_bytes_per_second.round(),
        confidence: l.confidence.min(100) as u8,
        time_to_oom_seconds: tto.map(|s| s.round()),
        time_to_oom_lower_bound_seconds: tto.map(|point| {
            l.time_to_oom_low_seconds
                .unwrap_or(point)
                .min(point)
                .floor()
        }),
        growing_for_seconds: Some(l.growing_seconds.floor()),
        limit_bytes: (l.limit_bytes > 0).then_some(l.limit_bytes),
        growth_sites: growth_sites(&l.growth_sites),
    }
}

/// The agent's growth sites, held to the status's bounds (an agent is not trusted to
/// keep them): empty names dropped, long ones cut on a character boundary.
pub(super) fn growth_sites(sites: &[pb::GrowthSite]) -> Vec<GrowthSiteEntry> {
    sites
        .iter()
        .take(MAX_GROWTH_SITES as usize)
        .filter_map(|g| {
            let frames: Vec<String> = g
                .frames
                .iter()
                .filter(|f| !f.is_empty())
                .take(MAX_SITE_FRAMES as usize)
                .map(|f| f.chars().take(MAX_FRAME_LENGTH as usize).collect())
                .collect();
            let percent = if g.percent.is_finite() {
                (g.percent.clamp(0.0, 100.0) * 10.0).round() / 10.0
            } else {
                0.0
            };
            (!frames.is_empty()).then_some(GrowthSiteEntry {
                frames,
                bytes: g.bytes,
                percent,
            })
        })
        .collect()
}
