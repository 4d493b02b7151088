//! One interval's view of the node: Top-K by CPU and by memory, exact targets and
//! allocation totals, each process attributed to its cgroup, container and pod. This is
//! what `top` prints and what the agent reports to the operator.

use std::collections::HashMap;

use serde::Serialize;

use crate::{
    cgroup_resolver::{self, CgroupLayout},
    hashpipe,
    pipelines::{CpuEpoch, KernelStats, Pipelines, TargetProcess},
    procfs,
};

/// Where a process runs. Fields are null when unknown (exited, or not in a container).
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Attribution {
    pub comm: Option<String>,
    pub cgroup: Option<String>,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CpuRow {
    pub pid: u32,
    pub cpu_ns: u64,
    /// Of one core, like top: a process busy on two cores shows 200.
    pub cpu_percent: f64,
    #[serde(flatten)]
    pub who: Attribution,
}

#[derive(Clone, Debug, Serialize)]
pub struct MemoryRow {
    pub pid: u32,
    pub rss_bytes: u64,
    #[serde(flatten)]
    pub who: Attribution,
}

#[derive(Clone, Debug, Serialize)]
pub struct TargetRow {
    pub pid: u32,
    /// Cumulative since tracking began.
    pub cpu_ns: u64,
    /// Over this interval.
    pub cpu_percent: f64,
    pub rss_bytes: u64,
    pub anon_bytes: u64,
    pub file_bytes: u64,
    pub shmem_bytes: u64,
    pub swap_bytes: u64,
    pub exited: bool,
    #[serde(flatten)]
    pub who: Attribution,
}

#[derive(Clone, Debug, Serialize)]
pub struct AllocationRow {
    pub pid: u32,
    pub outstanding_bytes: i64,
    pub allocs: u64,
    pub frees: u64,
    pub unknown_frees: u64,
    #[serde(flatten)]
    pub who: Attribution,
}

/// A leak assessment as `top --json` prints it (filled by the leak detector).
#[derive(Clone, Debug, Serialize)]
pub struct LeakRow {
    pub pid: u32,
    pub rss_bytes: u64,
    pub growth_bytes_per_sec: f64,
    pub r2: f64,
    pub confidence: u8,
    pub limit_bytes: Option<u64>,
    pub time_to_oom_secs: Option<f64>,
    #[serde(flatten)]
    pub who: Attribution,
}

#[derive(Clone, Debug, Serialize)]
pub struct Frame {
    /// Wall-clock time (Unix epoch, ns) at the end of the interval.
    pub ts_ns: u64,
    /// Measured length of the interval (monotonic clock).
    pub interval_ns: u64,
    pub cpu: Vec<CpuRow>,
    pub memory: Vec<MemoryRow>,
    pub targets: Vec<TargetRow>,
    pub allocations: Vec<AllocationRow>,
    pub leaks: Vec<LeakRow>,
    pub kernel: KernelStats,
}

/// Attribution is read from /proc once per process and reused: at a 10 ms interval the
/// same Top-K PIDs come back every frame, and /proc reads would dominate the agent's cost.
pub struct Attributor {
    layout: Option<CgroupLayout>,
    cache: HashMap<u32, (u64, Attribution)>,
}

/// Cached entries are re-read after this long (a process may exec or move cgroups).
const ATTRIBUTION_TTL_NS: u64 = 5_000_000_000;

impl Attributor {
    pub fn new(layout: Option<CgroupLayout>) -> Self {
        Self {
            layout,
            cache: HashMap::new(),
        }
    }

    pub fn get(&mut self, pid: u32, now_ns: u64) -> Attribution {
        if let Some((at, a)) = self.cache.get(&pid)
            && now_ns.saturating_sub(*at) < ATTRIBUTION_TTL_NS
            && a.comm.is_some()
        {
            return a.clone();
        }
        let comm = procfs::comm(pid);
        let cgroup = self.layout.as_ref().and_then(|l| {
            procfs::cgroup_text(pid).and_then(|t| l.path_in_proc_cgroup(&t).map(str::to_owned))
        });
        let ids = cgroup
            .as_deref()
            .map(cgroup_resolver::attribute)
            .unwrap_or_default();
        let a = Attribution {
            comm,
            cgroup,
            container_id: ids.container_id,
            pod_uid: ids.pod_uid,
        };
        if a.comm.is_some() {
            self.cache.insert(pid, (now_ns, a.clone()));
        } else if let Some((_, old)) = self.cache.get(&pid) {
            // Exited since we last saw it: keep what we knew.
            return old.clone();
        }
        a
    }

    /// Drops cached processes that no longer exist.
    pub fn prune(&mut self, now_ns: u64) {
        self.cache.retain(|pid, (at, _)| {
            now_ns.saturating_sub(*at) < 4 * ATTRIBUTION_TTL_NS || procfs::exists(*pid)
        });
    }
}

/// Turns a closed CPU epoch and the memory sketch into ranked rows.
pub struct FrameBuilder {
    pub k: usize,
    pub attributor: Attributor,
    prev_target_cpu: HashMap<u32, u64>,
}

impl FrameBuilder {
    pub fn new(k: usize, layout: Option<CgroupLayout>) -> Self {
        Self {
            k,
            attributor: Attributor::new(layout),
            prev_target_cpu: HashMap::new(),
        }
    }

    pub fn build(&mut self, pipes: &mut Pipelines, epoch: &CpuEpoch) -> Frame {
        let now = epoch.end_ns;
        let interval_ns = epoch.end_ns.saturating_sub(epoch.start_ns).max(1);
        let cpu = hashpipe::top_k(&epoch.per_tgid, self.k)
            .into_iter()
            .map(|(pid, ns)| CpuRow {
                pid,
                cpu_ns: ns,
                cpu_percent: round2(ns as f64 * 100.0 / interval_ns as f64),
                who: self.attributor.get(pid, now),
            })
            .collect();
        let mem = pipes.memory();
        let memory = hashpipe::top_k(&mem, self.k)
            .into_iter()
            .map(|(pid, bytes)| MemoryRow {
                pid,
                rss_bytes: bytes,
                who: self.attributor.get(pid, now),
            })
            .collect();
        let targets = match pipes.targets() {
            Ok(t) => t
                .into_iter()
                .map(|t| self.target_row(t, interval_ns, now))
                .collect(),
            Err(e) => {
                tracing::warn!("reading exact targets failed: {e}");
                Vec::new()
            }
        };
        let allocations = pipes
            .allocations()
            .into_iter()
            .map(|(pid, s)| AllocationRow {
                pid,
                outstanding_bytes: s.outstanding_bytes,
                allocs: s.allocs,
                frees: s.frees,
                unknown_frees: s.unknown_frees,
                who: self.attributor.get(pid, now),
            })
            .collect();
        Frame {
            ts_ns: procfs::realtime_ns(),
            interval_ns,
            cpu,
            memory,
            targets,
            allocations,
            leaks: Vec::new(),
            kernel: pipes.kernel_stats(),
        }
    }

    fn target_row(&mut self, t: TargetProcess, interval_ns: u64, now: u64) -> TargetRow {
        let prev = self.prev_target_cpu.insert(t.tgid, t.cpu_ns);
        let delta = prev.map(|p| t.cpu_ns.saturating_sub(p)).unwrap_or(0);
        if t.exited {
            self.prev_target_cpu.remove(&t.tgid);
        }
        TargetRow {
            pid: t.tgid,
            cpu_ns: t.cpu_ns,
            cpu_percent: round2(delta as f64 * 100.0 / interval_ns as f64),
            rss_bytes: t.rss_bytes,
            anon_bytes: t.anon_bytes,
            file_bytes: t.file_bytes,
            shmem_bytes: t.shmem_bytes,
            swap_bytes: t.swap_bytes,
            exited: t.exited,
            who: self.attributor.get(t.tgid, now),
        }
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}
