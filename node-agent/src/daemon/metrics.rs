//! The agent's own `/metrics`, `/healthz` and `/readyz` (the DaemonSet mode, `run`, only).
//!
//! `/metrics` is what an SRE needs to trust the agent: its CPU and memory, whether the
//! kernel pipelines loaded, the programs' own counters (samples lost to a full ring,
//! full maps, switch-ins the kernel did not report), the kernel's run time per program
//! (counted while `kernel.bpf_stats_enabled=1`), targets resolved, configurations
//! applied or refused, and the stream to the operator. What the watches *found* is the
//! operator's to export (`resourcewatch_time_to_oom_seconds`, ...): it alone knows pods.
//!
//! `/healthz` fails when the engine thread stopped looping (it wakes at least every
//! 200 ms) for longer than [`STALL`], so kubelet restarts a wedged agent. `/readyz` fails
//! until the kernel pipelines are loaded and the first report is built, and when they
//! are not: an agent that reports health only is running but not doing its job.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    extract::{ConnectInfo, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric, text::encode},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

use crate::{
    pipelines::{KernelStats, ProgramStats},
    procfs,
};

/// How long the engine may go without looping before `/healthz` fails.
pub const STALL: Duration = Duration::from_secs(30);

/// What the engine last measured, and counters the session keeps.
#[derive(Debug, Default)]
pub struct AgentMetrics {
    tick: Mutex<TickSnapshot>,
    /// CLOCK_MONOTONIC ns of the engine loop's last iteration.
    engine_alive_ns: AtomicU64,
    pub connected: AtomicBool,
    pub stream_failures: AtomicU64,
    pub configs_applied: AtomicU64,
    pub configs_rejected: AtomicU64,
    /// OOM kills the kernel made on this node (any process), since the agent started.
    pub oom_kills: AtomicU64,
}

/// One report interval's view, replaced whole at each tick.
#[derive(Clone, Debug, Default)]
pub struct TickSnapshot {
    pub pipelines_loaded: bool,
    pub ticks: u64,
    pub tick_seconds: f64,
    pub kernel: KernelStats,
    pub programs: Vec<ProgramStats>,
    pub targets_resolved: usize,
    pub targets_unresolved: usize,
    pub leaks_reported: usize,
}

impl AgentMetrics {
    pub fn engine_alive(&self) {
        self.engine_alive_ns
            .store(procfs::monotonic_ns(), Ordering::Relaxed);
    }

    pub fn record_tick(&self, snapshot: TickSnapshot) {
        *self.lock() = snapshot;
    }

    /// The next tick's number.
    pub fn next_tick(&self) -> u64 {
        self.lock().ticks + 1
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TickSnapshot> {
        // The snapshot is replaced whole: a panic elsewhere cannot leave it half-written.
        self.tick.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stalled_for(&self) -> Option<Duration> {
        let last = self.engine_alive_ns.load(Ordering::Relaxed);
        let now = procfs::monotonic_ns();
        (last > 0).then(|| Duration::from_nanos(now.saturating_sub(last)))
    }

    /// `Ok` while the engine loops; why not otherwise.
    pub fn health(&self) -> Result<(), String> {
        match self.stalled_for() {
            None => Err("the engine has not started".into()),
            Some(d) if d > STALL => Err(format!("the engine has not looped for {d:?}")),
            Some(_) => Ok(()),
        }
    }

    /// `Ok` once the pipelines are loaded and a report was built.
    pub fn readiness(&self) -> Result<(), String> {
        self.health()?;
        let t = self.lock();
        if !t.pipelines_loaded {
            return Err("the kernel pipelines are not loaded (see the agent's log)".into());
        }
        if t.ticks == 0 {
            return Err("no report built yet".into());
        }
        Ok(())
    }

    pub fn render(self: &Arc<Self>) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self.clone()));
        // The agent's own CPU and memory as every Prometheus client names them
        // (process_cpu_seconds_total, process_resident_memory_bytes, ...), and
        // resourcewatch_agent_build_info.
        resourcewatch_runtime::telemetry::register(
            &mut registry,
            "resourcewatch_agent",
            resourcewatch_proto::PROTOCOL_VERSION,
        );
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut s, &registry);
        s
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Vec<(&'static str, String)>, f64)],
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    if let [(labels, v)] = rows
        && labels.is_empty()
    {
        return ConstGauge::new(*v).encode(family);
    }
    for (labels, v) in rows {
        ConstGauge::new(*v).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Vec<(&'static str, String)>, u64)],
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    if let [(labels, v)] = rows
        && labels.is_empty()
    {
        return ConstCounter::new(*v).encode(family);
    }
    for (labels, v) in rows {
        ConstCounter::new(*v).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for AgentMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let t = self.lock().clone();
        let none = Vec::new;
        let one = |v: f64| vec![(none(), v)];
        gauge(
            &mut e,
            // Not `_up`: Prometheus' own `up` says whether the scrape worked.
            "resourcewatch_agent_engine_healthy",
            "1 while the engine loops (the same test as /healthz)",
            &one(f64::from(u8::from(self.health().is_ok()))),
        )?;
        gauge(
            &mut e,
            "resourcewatch_agent_pipelines_loaded",
            "1 when the kernel pipelines are loaded and attached",
            &one(f64::from(u8::from(t.pipelines_loaded))),
        )?;
        gauge(
            &mut e,
            "resourcewatch_agent_operator_connected",
            "1 while a stream to the operator is open",
            &one(f64::from(u8::from(self.connected.load(Ordering::Relaxed)))),
        )?;
        gauge(
            &mut e,
            "resourcewatch_agent_tick_duration_seconds",
            "Time the last report took to build (epoch close, sample drain, frame)",
            &one(t.tick_seconds),
        )?;
        gauge(
            &mut e,
            "resourcewatch_agent_targets",
            "Targeted containers, by state (resolved to a cgroup on this node, or not yet)",
            &[
                (
                    vec![("state", "resolved".into())],
                    t.targets_resolved as f64,
                ),
                (
                    vec![("state", "unresolved".into())],
                    t.targets_unresolved as f64,
                ),
            ],
        )?;
        gauge(
            &mut e,
            "resourcewatch_agent_leaks_reported",
            "Leaking series in the last report",
            &one(t.leaks_reported as f64),
        )?;
        self.encode_counters(&mut e, t.ticks)?;
        encode_kernel(&mut e, &t)?;
        encode_reader(&mut e)
    }
}

/// The reader process's counters (`crate::reader`): requests, restarts, the time the
/// loader waited on it, and the files whose content was refused, by reason.
fn encode_reader(e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    use crate::reader::{Refusal, STATS};
    use std::sync::atomic::Ordering::Relaxed;
    let c = |v: u64| vec![(Vec::new(), v)];
    counter(
        e,
        "resourcewatch_agent_reader_requests",
        "Files and maps sent to the reader process to parse",
        &c(STATS.requests.load(Relaxed)),
    )?;
    counter(
        e,
        "resourcewatch_agent_reader_starts",
        "Reader processes started (one per crash, missed deadline or budget exceeded, and after a large answer)",
        &c(STATS.restarts.load(Relaxed)),
    )?;
    let refusals: Vec<_> = Refusal::ALL
        .iter()
        .map(|r| (vec![("reason", r.reason().into())], STATS.refusals(*r)))
        .collect();
    counter(
        e,
        "resourcewatch_agent_reader_refusals",
        "Workload files whose content was not used, by reason (their frames are named by the file alone)",
        &refusals,
    )?;
    let mut family = e.encode_descriptor(
        "resourcewatch_agent_reader_busy_seconds",
        "Time the loader spent waiting on the reader process",
        None,
        MetricType::Counter,
    )?;
    ConstCounter::new(STATS.busy_ns.load(Relaxed) as f64 / 1e9)
        .encode(family.encode_family(&Vec::<(&str, String)>::new())?)?;
    Ok(())
}

impl AgentMetrics {
    /// The agent's own counters; `reports`: the reports built.
    fn encode_counters(&self, e: &mut DescriptorEncoder, reports: u64) -> std::fmt::Result {
        let load = |a: &std::sync::atomic::AtomicU64| vec![(Vec::new(), a.load(Ordering::Relaxed))];
        counter(
            e,
            "resourcewatch_agent_reports",
            "Reports built",
            &[(Vec::new(), reports)],
        )?;
        counter(
            e,
            "resourcewatch_agent_configs_applied",
            "Configuration snapshots applied",
            &load(&self.configs_applied),
        )?;
        counter(
            e,
            "resourcewatch_agent_configs_rejected",
            "Configuration snapshots refused (NACK)",
            &load(&self.configs_rejected),
        )?;
        counter(
            e,
            "resourcewatch_agent_oom_kills_observed",
            "OOM kills the kernel made on this node (any process), seen by this agent",
            &load(&self.oom_kills),
        )?;
        counter(
            e,
            "resourcewatch_agent_stream_failures",
            "Streams to the operator that failed or were closed",
            &load(&self.stream_failures),
        )
    }
}

/// The kernel side's counters: samples, full maps, and each program's runs and time.
fn encode_kernel(e: &mut DescriptorEncoder, t: &TickSnapshot) -> Result<(), std::fmt::Error> {
    let c = |v: u64| vec![(Vec::new(), v)];
    let k = &t.kernel;
    for (name, help, v) in [
        (
            "resourcewatch_agent_kernel_memory_samples",
            "rss_stat samples the kernel streamed to the ring buffer",
            k.samples,
        ),
        (
            "resourcewatch_agent_kernel_memory_samples_lost",
            "rss_stat samples lost to a full ring buffer",
            k.samples_lost,
        ),
        (
            "resourcewatch_agent_kernel_switch_ins_unseen",
            "Tasks switched out whose switch-in the kernel did not report (credited from the scheduler's bookkeeping)",
            k.switch_ins_unseen,
        ),
        (
            "resourcewatch_agent_kernel_cpu_sync_failures",
            "Per-CPU epoch syncs that failed (that CPU's running part credited late)",
            k.cpu_sync_failures,
        ),
        (
            "resourcewatch_agent_kernel_targets_spilled",
            "Tracked processes whose probe window in the slot table was full (kept in the spill map; read by syscalls, slower)",
            k.targets_spilled,
        ),
    ] {
        counter(e, name, help, &c(v))?;
    }
    counter(
        e,
        "resourcewatch_agent_kernel_map_full",
        "Updates refused by a full map, by map",
        &[
            (vec![("map", "proc_mem".into())], k.proc_mem_full),
            (vec![("map", "targets".into())], k.targets_full),
            (vec![("map", "alloc_ptrs".into())], k.alloc_ptrs_full),
        ],
    )?;
    let runs: Vec<_> = t
        .programs
        .iter()
        .map(|p| (vec![("program", p.name.clone())], p.run_cnt))
        .collect();
    counter(
        e,
        "resourcewatch_agent_bpf_program_runs",
        "Runs of each eBPF program (counted while kernel.bpf_stats_enabled=1)",
        &runs,
    )?;
    let secs: Vec<_> = t
        .programs
        .iter()
        .map(|p| {
            (
                vec![("program", p.name.clone())],
                p.run_time_ns as f64 / 1e9,
            )
        })
        .collect();
    // A float counter: seconds.
    let mut family = e.encode_descriptor(
        "resourcewatch_agent_bpf_program_run_seconds",
        "Kernel time spent in each eBPF program (counted while kernel.bpf_stats_enabled=1)",
        None,
        MetricType::Counter,
    )?;
    for (labels, v) in &secs {
        ConstCounter::new(*v).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

pub fn router(metrics: Arc<AgentMetrics>) -> Router {
    Router::new()
        .route("/metrics", get(serve_metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(metrics)
}

/// Only to a client that presented the scrapers' certificate (the handshake verified it
/// against the agents' CA). The agents' own certificate is refused too: any node holds
/// it, and a node should not read another's counters.
async fn serve_metrics(
    State(m): State<Arc<AgentMetrics>>,
    ConnectInfo(peer): ConnectInfo<resourcewatch_runtime::https::Peer>,
) -> Response {
    let name = resourcewatch_proto::METRICS_CLIENT_CERT_NAME;
    if peer.certificates.is_empty() {
        return (
            StatusCode::UNAUTHORIZED,
            format!("present the {name} client certificate (the Secret of that name)\n"),
        )
            .into_response();
    }
    if !peer.presents(name) {
        return (
            StatusCode::FORBIDDEN,
            format!("/metrics is served to the {name} certificate only\n"),
        )
            .into_response();
    }
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.render(),
    )
        .into_response()
}

fn answer(r: Result<(), String>, ok: &'static str) -> (StatusCode, String) {
    match r {
        Ok(()) => (StatusCode::OK, ok.into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

async fn healthz(State(m): State<Arc<AgentMetrics>>) -> impl IntoResponse {
    answer(m.health(), "ok")
}

async fn readyz(State(m): State<Arc<AgentMetrics>>) -> impl IntoResponse {
    answer(m.readiness(), "ready")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_follows_the_engine_loop() {
        let m = AgentMetrics::default();
        assert!(m.health().is_err(), "not started");
        m.engine_alive();
        assert!(m.health().is_ok());
        m.engine_alive_ns.store(
            procfs::monotonic_ns() - STALL.as_nanos() as u64 - 1_000_000_000,
            Ordering::Relaxed,
        );
        let err = m.health().expect_err("stalled");
        assert!(err.contains("has not looped"), "{err}");
    }

    #[test]
    fn ready_only_with_pipelines_and_a_report() {
        let m = AgentMetrics::default();
        m.engine_alive();
        assert!(
            m.readiness()
                .expect_err("no pipelines")
                .contains("not loaded")
        );
        m.record_tick(TickSnapshot {
            pipelines_loaded: true,
            ..Default::default()
        });
        assert!(m.readiness().expect_err("no tick").contains("no report"));
        m.record_tick(TickSnapshot {
            pipelines_loaded: true,
            ticks: 1,
            ..Default::default()
        });
        assert!(m.readiness().is_ok());
    }

    #[test]
    fn the_exposition_names_every_series() {
        let m = Arc::new(AgentMetrics::default());
        m.engine_alive();
        m.record_tick(TickSnapshot {
            pipelines_loaded: true,
            ticks: 7,
            kernel: KernelStats {
                samples: 1234,
                samples_lost: 5,
                ..Default::default()
            },
            programs: vec![ProgramStats {
                name: "rw_sched_switch".into(),
                run_cnt: 1000,
                run_time_ns: 90_000,
            }],
            targets_resolved: 3,
            ..Default::default()
        });
        let text = m.render();
        for line in [
            "resourcewatch_agent_engine_healthy 1.0",
            "resourcewatch_agent_pipelines_loaded 1.0",
            "resourcewatch_agent_reports_total 7",
            "resourcewatch_agent_kernel_memory_samples_lost_total 5",
            "resourcewatch_agent_targets{state=\"resolved\"} 3.0",
            "resourcewatch_agent_bpf_program_runs_total{program=\"rw_sched_switch\"} 1000",
            "resourcewatch_agent_bpf_program_run_seconds_total{program=\"rw_sched_switch\"} 0.00009",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing from:\n{text}"
            );
        }
        for name in [
            "resourcewatch_agent_reader_refusals_total{reason=\"deadline\"} ",
            "resourcewatch_agent_reader_refusals_total{reason=\"over_budget\"} ",
            "resourcewatch_agent_reader_busy_seconds_total",
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "resourcewatch_agent_build_info{",
        ] {
            assert!(text.contains(name), "{name:?} missing from:\n{text}");
        }
        assert!(!text.contains("percent"), "ratios, not percent:\n{text}");
        assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
    }
}
