//! One interval's frame, as the operator wants it: exact per-container figures of the
//! targeted containers, the node's sketch Top-K, and leaks of targeted containers.

use std::{collections::BTreeMap, path::Path};

use resourcewatch_proto as pb;

use crate::{
    daemon::resolve::ResolvedContainer,
    leak::memory_limit,
    snapshot::{Attribution, Frame, TargetRow, oom::OomKill},
};

pub struct ReportInputs<'a> {
    pub frame: &'a Frame,
    pub config: &'a pb::NodeConfig,
    pub containers: &'a [ResolvedContainer],
    pub unresolved: Vec<String>,
    /// The memory hierarchy's root, for the containers' charge and limit.
    pub cgroup_root: Option<&'a Path>,
    pub agent_cpu_percent: f64,
    pub agent_rss_bytes: u64,
}

pub fn build(i: ReportInputs<'_>) -> pb::Report {
    let k = i.config.top_k.max(1) as usize;
    let mut by_container: BTreeMap<&str, Vec<&TargetRow>> = BTreeMap::new();
    for row in &i.frame.targets {
        if let Some(cid) = row.who.container_id.as_deref() {
            by_container.entry(cid).or_default().push(row);
        }
    }
    let containers = i
        .containers
        .iter()
        .map(|c| {
            let rows = by_container
                .remove(c.container_id.as_str())
                .unwrap_or_default();
            container_report(c, &rows, k, i.cgroup_root)
        })
        .collect();
    let kernel = &i.frame.kernel;
    pb::Report {
        config_version: i.config.version,
        timestamp_unix_ms: (i.frame.ts_ns / 1_000_000) as i64,
        interval_ms: i.frame.interval_ns / 1_000_000,
        containers,
        node_top_cpu: i
            .frame
            .cpu
            .iter()
            .take(k)
            .map(|r| process(r.pid, r.cpu_percent, 0, &r.who))
            .collect(),
        node_top_memory: i
            .frame
            .memory
            .iter()
            .take(k)
            .map(|r| process(r.pid, 0.0, r.rss_bytes, &r.who))
            .collect(),
        leaks: leaks(&i),
        // Added by the engine, which repeats each kill (daemon/mod.rs).
        oom_kills: Vec::new(),
        health: Some(pb::Health {
            samples: kernel.samples,
            samples_lost: kernel.samples_lost,
            full_maps: kernel.proc_mem_full + kernel.targets_full + kernel.alloc_ptrs_full,
            unresolved_containers: i.unresolved,
            agent_cpu_percent: i.agent_cpu_percent,
            agent_rss_bytes: i.agent_rss_bytes,
        }),
    }
}

/// A targeted container from its processes' rows (`rows`, exited ones included in its
/// CPU): its heaviest K by CPU and by memory, its memory and its limit.
fn container_report(
    c: &ResolvedContainer,
    rows: &[&TargetRow],
    k: usize,
    cgroup_root: Option<&Path>,
) -> pb::ContainerReport {
    let live: Vec<&TargetRow> = rows.iter().copied().filter(|r| !r.exited).collect();
    let cpu_percent = rows.iter().map(|r| r.cpu_percent).sum::<f64>();
    // The heaviest K by CPU and the heaviest K by memory, each process once.
    let mut by_cpu = live.clone();
    by_cpu.sort_by(|a, b| b.cpu_percent.total_cmp(&a.cpu_percent));
    let mut by_mem = live;
    by_mem.sort_by_key(|r| std::cmp::Reverse(r.rss_bytes));
    let mut chosen: BTreeMap<u32, &TargetRow> = BTreeMap::new();
    for r in by_cpu.iter().take(k).chain(by_mem.iter().take(k)) {
        chosen.insert(r.pid, r);
    }
    let mut processes: Vec<pb::Process> = chosen
        .values()
        .map(|r| process(r.pid, r.cpu_percent, r.rss_bytes, &r.who))
        .collect();
    processes.sort_by(|a, b| b.cpu_percent.total_cmp(&a.cpu_percent));
    let limit = cgroup_root.and_then(|root| memory_limit::effective(root, &c.cgroup_path));
    let own = cgroup_root
        .and_then(|root| memory_limit::read_one(&root.join(c.cgroup_path.trim_start_matches('/'))));
    pb::ContainerReport {
        pod_uid: c.pod_uid.clone(),
        container_id: c.container_id.clone(),
        memory_bytes: own
            .map(|m| m.usage_bytes)
            .unwrap_or_else(|| rows.iter().map(|r| r.rss_bytes).sum()),
        memory_limit_bytes: limit.and_then(|l| l.limit_bytes).unwrap_or(0),
        cpu_percent: (cpu_percent * 100.0).round() / 100.0,
        processes,
    }
}

/// The frame's leaks of targeted containers at the configured confidence, when leak
/// detection is on.
fn leaks(i: &ReportInputs<'_>) -> Vec<pb::Leak> {
    let leak_cfg = i.config.leak.unwrap_or_default();
    if !leak_cfg.enabled {
        return Vec::new();
    }
    let targeted = |who: &Attribution| {
        who.container_id
            .as_deref()
            .is_some_and(|cid| i.containers.iter().any(|c| c.container_id == cid))
    };
    i.frame
        .leaks
        .iter()
        .filter(|l| u32::from(l.confidence) >= leak_cfg.min_confidence && targeted(&l.who))
        .map(|l| pb::Leak {
            pod_uid: l.who.pod_uid.clone().unwrap_or_default(),
            container_id: l.who.container_id.clone().unwrap_or_default(),
            pid: l.pid.unwrap_or(0),
            command: l.who.comm.clone().unwrap_or_default(),
            memory_bytes: l.rss_bytes,
            growth_bytes_per_second: l.growth_bytes_per_sec,
            r2: l.r2,
            confidence: u32::from(l.confidence),
            limit_bytes: l.limit_bytes.unwrap_or(0),
            time_to_oom_seconds: l.time_to_oom_secs,
            time_to_oom_low_seconds: l.time_to_oom_low_secs,
            growing_seconds: l.growing_secs,
            growth_sites: l
                .growth_sites
                .iter()
                .map(|g| pb::GrowthSite {
                    frames: g.frames.clone(),
                    bytes: g.bytes,
                    percent: g.percent,
                })
                .collect(),
        })
        .collect()
}

/// An OOM kill as the operator receives it.
pub fn oom_kill(k: &OomKill) -> pb::OomKill {
    let mut predictions: Vec<pb::Prediction> = k
        .predictions
        .iter()
        .map(|p| pb::Prediction {
            timestamp_unix_ms: p.ts_ms,
            confidence: u32::from(p.confidence),
            time_to_oom_seconds: p.time_to_oom_secs,
            time_to_oom_low_seconds: p.time_to_oom_low_secs,
        })
        .collect();
    // The first verdicts (the first alert) and the newest are what is graded.
    if predictions.len() > pb::MAX_PREDICTIONS_PER_KILL {
        let cut = predictions.len() - pb::MAX_PREDICTIONS_PER_KILL;
        predictions.drain(pb::MAX_PREDICTIONS_PER_KILL / 2..pb::MAX_PREDICTIONS_PER_KILL / 2 + cut);
    }
    pb::OomKill {
        pod_uid: k.who.pod_uid.clone().unwrap_or_default(),
        container_id: k.who.container_id.clone().unwrap_or_default(),
        pid: k.pid,
        command: k.who.comm.clone().unwrap_or_default(),
        timestamp_unix_ms: (k.ts_ns / 1_000_000) as i64,
        system_wide: k.system_wide,
        limit_bytes: k.limit_bytes,
        memory_bytes: k.rss_bytes,
        predictions,
        limit_cgroup: k.limit_cgroup.clone().unwrap_or_default(),
    }
}

fn process(pid: u32, cpu: f64, rss: u64, who: &Attribution) -> pb::Process {
    pb::Process {
        pid,
        command: who.comm.clone().unwrap_or_default(),
        cpu_percent: cpu,
        rss_bytes: rss,
        pod_uid: who.pod_uid.clone().unwrap_or_default(),
        container_id: who.container_id.clone().unwrap_or_default(),
    }
}
