//! `resourcewatch-agent run`: the agent in a cluster. It dials the operator, holds one
//! stream, applies each configuration snapshot (ACK/NACK), and streams a report per
//! interval.
//!
//! Two halves: the *engine*, an OS thread that owns the kernel pipelines (aya objects and
//! their mmaps stay on one thread, and a slow network never delays an epoch close), and
//! the *session*, async, which reconnects with backoff. They meet in four channels:
//! configurations in, acknowledgements out, the latest report (older unsent reports
//! are worthless, so only the newest is kept), and profile results (profiles.rs).

pub mod kills;
pub mod metrics;
pub mod profiles;
pub mod report;
pub mod resolve;

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc as std_mpsc,
    },
    time::{Duration, Instant},
};

use resourcewatch_proto::{
    self as pb, agent_control_client::AgentControlClient, agent_message, operator_message,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::{
    capabilities::{self, CheckId},
    cgroup_resolver::CgroupLayout,
    hashpipe::Geometry,
    pipelines::{PipelineError, PipelineOptions, Pipelines},
    procfs,
    snapshot::FrameBuilder,
};

pub struct RunOptions {
    pub node_name: String,
    /// `https://host:port` of the operator's gRPC Service.
    pub operator: String,
    /// The name the operator's certificate is checked against.
    pub server_name: String,
    /// `ca.crt`, `tls.crt`, `tls.key` (the operator's agent Secret, mounted).
    pub tls_dir: PathBuf,
    /// The projected ServiceAccount token (audience `resourcewatch-operator`) that proves
    /// this node to the operator; re-read at every connect, since kubelet rotates it.
    pub token_path: PathBuf,
    /// Where `/metrics`, `/healthz` and `/readyz` are served over HTTPS (None: not
    /// served). `/metrics` only to the client certificate
    /// [`pb::METRICS_CLIENT_CERT_NAME`]; the probes to anyone (kubelet presents none).
    pub metrics_addr: Option<SocketAddr>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("reading the token {path}")]
    Token {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reading {path}")]
    Tls {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("operator address {0:?}: {1}")]
    Address(String, String),
    #[error("connecting to the operator")]
    Connect(#[from] tonic::transport::Error),
    #[error("operator")]
    Status(#[from] tonic::Status),
    #[error("the operator did not answer within {0:?} ({1})")]
    Timeout(Duration, &'static str),
    #[error("the engine stopped")]
    EngineGone,
    #[error("the stream to the operator closed")]
    StreamClosed,
    #[error("the /metrics listener")]
    MetricsListener(#[source] resourcewatch_runtime::https::Error),
    #[error("starting the agent's {what}")]
    Start {
        what: &'static str,
        source: std::io::Error,
    },
}

/// What the Hello tells the operator this node can do: each flag from its typed check (a
/// name match once claimed BTF on every node: no check's name contained "btf", and `all`
/// of nothing is true).
pub fn hello_capabilities(caps: &capabilities::CapabilityReport) -> pb::Capabilities {
    pb::Capabilities {
        kernel_release: caps.kernel_release.clone(),
        cgroup_mode: caps.cgroup_version.clone().unwrap_or_default(),
        btf: caps.holds(CheckId::Btf),
        sched_switch: caps.holds(CheckId::SchedSwitch),
        rss_stat: caps.holds(CheckId::RssStat),
        uprobes: caps.holds(CheckId::Uprobes),
        ring_buffer: caps.holds(CheckId::RingBuffer),
        missing: caps
            .missing()
            .iter()
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect(),
    }
}

/// Runs until SIGTERM/SIGINT.
pub fn run(opts: RunOptions) -> Result<(), RunError> {
    let stop = Arc::new(AtomicBool::new(false));
    let (config_tx, config_rx) = std_mpsc::channel::<pb::NodeConfig>();
    let (ack_tx, ack_rx) = mpsc::unbounded_channel::<pb::ConfigAck>();
    let (report_tx, report_rx) = watch::channel::<Option<pb::Report>>(None);
    let (profile_tx, profile_rx) = mpsc::unbounded_channel::<pb::ProfileResult>();
    let applied = Arc::new(AtomicU64::new(0));
    let metrics = Arc::new(metrics::AgentMetrics::default());
    let caps = capabilities::probe();
    let hello_caps = hello_capabilities(&caps);
    // Every line of this agent names its node (in JSON: span.node).
    let span = tracing::info_span!("agent", node = %opts.node_name);
    let engine = {
        let stop = stop.clone();
        let applied = applied.clone();
        let metrics = metrics.clone();
        let span = span.clone();
        let node = opts.node_name.clone();
        std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || {
                let _entered = span.enter();
                let profiles = profiles::Runner::new(profile_tx, &node);
                let pipes = Pipelines::load(PipelineOptions::default());
                Engine::new(ack_tx, report_tx, applied, metrics, profiles, pipes)
                    .run(config_rx, &stop)
            })
            .map_err(|source| RunError::Start {
                what: "engine thread",
                source,
            })?
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| RunError::Start {
            what: "async runtime",
            source,
        })?;
    let _entered = span.enter();
    let result = rt.block_on(async {
        if let Some(addr) = opts.metrics_addr {
            // HTTPS with the agent's own certificate (issued for AGENT_CERT_NAME), taken
            // from the mounted Secret at every connection so a reissued one is served.
            let listener = resourcewatch_runtime::https::TlsListener::bind(
                addr,
                Arc::new(resourcewatch_runtime::https::SecretDir::new(&opts.tls_dir)),
            )
            .await
            .map_err(RunError::MetricsListener)?;
            let router = metrics::router(metrics.clone());
            tokio::spawn(async move {
                let service =
                    router.into_make_service_with_connect_info::<resourcewatch_runtime::https::Peer>();
                if let Err(e) = axum::serve(listener, service).await {
                    tracing::error!(error = %e, "the metrics server stopped");
                }
            });
            tracing::info!(%addr, "serving /metrics (to the metrics client certificate), /healthz, /readyz over HTTPS");
        }
        let channels = Channels {
            configs: config_tx,
            acks: ack_rx,
            reports: report_rx,
            profiles: profile_rx,
        };
        session_loop(&opts, hello_caps, channels, applied, &metrics).await
    });
    stop.store(true, Ordering::SeqCst);
    let _ = engine.join();
    result
}

/// The session's ends of the channels to the engine; they outlive each stream.
struct Channels {
    configs: std_mpsc::Sender<pb::NodeConfig>,
    acks: mpsc::UnboundedReceiver<pb::ConfigAck>,
    reports: watch::Receiver<Option<pb::Report>>,
    profiles: mpsc::UnboundedReceiver<pb::ProfileResult>,
}

const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// After a stream that had lived (`LIVED`) ends, retries stay at most this far apart for
/// `FAILOVER_WINDOW`: the operator is handing over (a rollout, a failover within the 15 s
/// Lease, then the Service moving to the new leader's pod), and an agent that had backed
/// off to 4-5 s reached the new leader up to 9 s after it was ready (the e2e failover
/// test). While no replica serves, the attempts are refused by the Service's rules or by
/// a standby before any TokenReview, so 1 a second per agent is cheap.
const FAILOVER_BACKOFF: Duration = Duration::from_secs(1);
const FAILOVER_WINDOW: Duration = Duration::from_secs(30);
const LIVED: Duration = Duration::from_secs(30);

/// The wait before the next attempt, after waiting `prev`, `since_lost` after the last
/// stream that had lived ended (None: no such stream yet, the agent is starting).
fn next_backoff(prev: Duration, since_lost: Option<Duration>) -> Duration {
    let cap = match since_lost {
        Some(t) if t < FAILOVER_WINDOW => FAILOVER_BACKOFF,
        _ => MAX_BACKOFF,
    };
    (prev * 2).min(cap)
}
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const SESSION_TIMEOUT: Duration = Duration::from_secs(15);

async fn session_loop(
    opts: &RunOptions,
    caps: pb::Capabilities,
    mut ch: Channels,
    applied: Arc<AtomicU64>,
    metrics: &metrics::AgentMetrics,
) -> Result<(), RunError> {
    let mut backoff = Duration::from_millis(500);
    let mut lost_at: Option<Instant> = None;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|source| RunError::Start {
            what: "SIGTERM handler",
            source,
        })?;
    loop {
        let started = Instant::now();
        let hello = pb::Hello {
            node_name: opts.node_name.clone(),
            agent_version: env!("CARGO_PKG_VERSION").into(),
            protocol_version: pb::PROTOCOL_VERSION,
            min_protocol_version: pb::MIN_PROTOCOL_VERSION,
            last_applied_version: applied.load(Ordering::SeqCst),
            capabilities: Some(caps.clone()),
        };
        let session = session(opts, hello, &mut ch, metrics);
        let outcome = tokio::select! {
            r = session => r,
            _ = term.recv() => return Ok(()),
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        metrics.connected.store(false, Ordering::Relaxed);
        metrics.stream_failures.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Ok(()) => tracing::warn!("the operator closed the stream"),
            Err(RunError::EngineGone) => return Err(RunError::EngineGone),
            Err(e) => {
                tracing::warn!(error = %resourcewatch_runtime::error_chain(&e), "stream to the operator failed")
            }
        }
        // A stream that lived a while resets the backoff: this is a new failure.
        if started.elapsed() > LIVED {
            backoff = Duration::from_millis(500);
            lost_at = Some(Instant::now());
        }
        let jitter = Duration::from_millis(procfs::monotonic_ns() % 500);
        tracing::info!(retry_in = ?(backoff + jitter), "reconnecting");
        tokio::select! {
            _ = tokio::time::sleep(backoff + jitter) => {}
            _ = term.recv() => return Ok(()),
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
        // Capped at 5 s (1 s just after a lost stream): 1,000 agents retrying every 5 s
        // against a Service with no ready endpoint are refused by the node's own rules,
        // not by the operator.
        backoff = next_backoff(backoff, lost_at.map(|t| t.elapsed()));
    }
}

fn read(dir: &Path, name: &str) -> Result<String, RunError> {
    let path = dir.join(name);
    std::fs::read_to_string(&path).map_err(|source| RunError::Tls { path, source })
}

/// An mTLS channel to the operator; certificates are re-read at every connect, so a
/// rotated Secret is picked up by the next reconnect.
pub async fn connect(
    operator: &str,
    server_name: &str,
    tls_dir: &Path,
) -> Result<tonic::transport::Channel, RunError> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(tls_dir, "ca.crt")?))
        .identity(Identity::from_pem(
            read(tls_dir, "tls.crt")?,
            read(tls_dir, "tls.key")?,
        ))
        .domain_name(server_name);
    let endpoint = Endpoint::from_shared(operator.to_owned())
        .map_err(|e| RunError::Address(operator.into(), e.to_string()))?
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        // A leader that stops answering (frozen, partitioned, its node gone) sends no
        // reset: only an unanswered ping ends the stream, within 10 s here, so the agent
        // is back through the Service about when a standby takes the 15 s Lease.
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5));
    Ok(endpoint.connect().await?)
}

/// The session's request: the agent's stream of messages, with its node's name and its
/// pod-bound token (read again at each session: the kubelet rotates it).
fn session_request(
    opts: &RunOptions,
    messages: ReceiverStream<pb::AgentMessage>,
) -> Result<tonic::Request<ReceiverStream<pb::AgentMessage>>, RunError> {
    let token = std::fs::read_to_string(&opts.token_path).map_err(|source| RunError::Token {
        path: opts.token_path.clone(),
        source,
    })?;
    let mut req = tonic::Request::new(messages);
    let node = opts
        .node_name
        .parse()
        .map_err(|_| RunError::Address(opts.node_name.clone(), "not ASCII".into()))?;
    req.metadata_mut().insert(pb::NODE_METADATA, node);
    let bearer = format!("Bearer {}", token.trim())
        .parse()
        .map_err(|_| RunError::Token {
            path: opts.token_path.clone(),
            source: std::io::Error::other("not a token"),
        })?;
    req.metadata_mut()
        .insert(pb::AUTHORIZATION_METADATA, bearer);
    Ok(req)
}

async fn session(
    opts: &RunOptions,
    hello: pb::Hello,
    ch: &mut Channels,
    metrics: &metrics::AgentMetrics,
) -> Result<(), RunError> {
    let Channels {
        configs: config_tx,
        acks: ack_rx,
        reports: report_rx,
        profiles: profile_rx,
    } = ch;
    // Bounded as a whole: `connect_timeout` covers the TCP connect only, and a frozen
    // operator's kernel still completes that; its TLS handshake then does not finish
    // while the operator is frozen, though a new leader is already serving (the failover
    // e2e test freezes one).
    let channel = tokio::time::timeout(
        CONNECT_TIMEOUT,
        connect(&opts.operator, &opts.server_name, &opts.tls_dir),
    )
    .await
    .map_err(|_| RunError::Timeout(CONNECT_TIMEOUT, "TLS handshake"))??;
    let client = AgentControlClient::new(channel);
    let mut client = client.max_encoding_message_size(pb::MAX_MESSAGE_BYTES);
    let (tx, rx) = mpsc::channel::<pb::AgentMessage>(8);
    let send = |m| pb::AgentMessage { msg: Some(m) };
    // The receiver is still ours here: only a dropped stream could refuse the Hello.
    tx.send(send(agent_message::Msg::Hello(hello)))
        .await
        .map_err(|_| RunError::StreamClosed)?;
    let req = session_request(opts, ReceiverStream::new(rx))?;
    // The operator answers after the API server has reviewed the token (its own
    // timeout is 10 s).
    let mut inbound = tokio::time::timeout(SESSION_TIMEOUT, client.session(req))
        .await
        .map_err(|_| RunError::Timeout(SESSION_TIMEOUT, "opening the session"))??
        .into_inner();
    tracing::info!(operator = %opts.operator, "connected");
    metrics.connected.store(true, Ordering::Relaxed);
    // Acks of an earlier stream are for versions this stream's operator may not know.
    while ack_rx.try_recv().is_ok() {}
    report_rx.mark_unchanged();
    loop {
        tokio::select! {
            m = inbound.message() => match m? {
                Some(pb::OperatorMessage { msg: Some(operator_message::Msg::Config(c)) }) => {
                    tracing::info!(version = c.version, targets = c.targets.len(), "configuration received");
                    crate::tenant::set_watched(
                        c.targets.iter().map(|p| (p.uid.as_str(), p.namespace.as_str())),
                    );
                    config_tx.send(c).map_err(|_| RunError::EngineGone)?;
                }
                Some(_) => tracing::warn!("ignoring an empty message from the operator"),
                None => return Ok(()),
            },
            ack = ack_rx.recv() => {
                let ack = ack.ok_or(RunError::EngineGone)?;
                if tx.send(send(agent_message::Msg::Ack(ack))).await.is_err() {
                    return Ok(());
                }
            }
            result = profile_rx.recv() => {
                let result = result.ok_or(RunError::EngineGone)?;
                tracing::info!(id = %result.id, "sending a profile result");
                if tx.send(send(agent_message::Msg::Profile(result))).await.is_err() {
                    return Ok(());
                }
            }
            changed = report_rx.changed() => {
                changed.map_err(|_| RunError::EngineGone)?;
                let r = report_rx.borrow_and_update().clone().map(fit);
                if let Some(r) = r
                    && tx.send(send(agent_message::Msg::Report(r))).await.is_err()
                {
                    return Ok(());
                }
            }
        }
    }
}

/// The kernel side: pipelines, targets, frames. Runs on its own thread.
struct Engine {
    acks: mpsc::UnboundedSender<pb::ConfigAck>,
    reports: watch::Sender<Option<pb::Report>>,
    applied: Arc<AtomicU64>,
    pipes: Result<Pipelines, PipelineError>,
    builder: Option<FrameBuilder>,
    layout: Option<CgroupLayout>,
    config: pb::NodeConfig,
    resolved: Vec<resolve::ResolvedContainer>,
    unresolved: BTreeSet<String>,
    self_cpu: Option<u64>,
    metrics: Arc<metrics::AgentMetrics>,
    profiles: profiles::Runner,
    /// OOM kills seen, repeated in every report for `OOM_KILL_RESEND_SECS` (a report
    /// made while the stream is down is replaced by the next one, unsent); watched pods'
    /// kills are never pushed out by others' (`kills`).
    oom_kills: kills::Kills,
}

/// Before the first configuration arrives.
const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_secs(10);

impl Engine {
    fn new(
        acks: mpsc::UnboundedSender<pb::ConfigAck>,
        reports: watch::Sender<Option<pb::Report>>,
        applied: Arc<AtomicU64>,
        metrics: Arc<metrics::AgentMetrics>,
        profiles: profiles::Runner,
        pipes: Result<Pipelines, PipelineError>,
    ) -> Self {
        let layout = pipes.as_ref().ok().map(|p| p.cgroup_layout().clone());
        if let Err(e) = &pipes {
            tracing::error!(error = %resourcewatch_runtime::error_chain(e), "kernel pipelines unavailable: reporting health only");
        }
        Self {
            acks,
            reports,
            applied,
            builder: pipes
                .as_ref()
                .ok()
                .map(|_| FrameBuilder::new(10, layout.clone())),
            pipes,
            layout,
            config: pb::NodeConfig {
                top_k: 10,
                report_interval_ms: DEFAULT_REPORT_INTERVAL.as_millis() as u64,
                ..Default::default()
            },
            resolved: Vec::new(),
            unresolved: BTreeSet::new(),
            self_cpu: None,
            metrics,
            profiles,
            oom_kills: kills::Kills::default(),
        }
    }

    /// The kernel's sample stream read now, between reports: an OOM kill's victim is
    /// named while its cgroup is still there (a runtime removes it when the container
    /// exits), and the ring never fills between two reports. The watched containers'
    /// charges are read too, once a second (`FrameBuilder::observe_charges`).
    fn drain_samples(&mut self) {
        if let (Ok(pipes), Some(builder)) = (&mut self.pipes, &mut self.builder) {
            pipes.drain_samples(|s| builder.observe_sample(s));
            builder.observe_charges(procfs::monotonic_ns());
        }
    }

    fn run(mut self, configs: std_mpsc::Receiver<pb::NodeConfig>, stop: &AtomicBool) {
        if let Ok(p) = &self.pipes {
            p.close_cpu_epoch();
        }
        let mut last = Instant::now();
        while !stop.load(Ordering::SeqCst) {
            self.metrics.engine_alive();
            let interval = Duration::from_millis(self.config.report_interval_ms.max(1000));
            let deadline = last + interval;
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(200));
            match configs.recv_timeout(wait) {
                Ok(c) => {
                    let ack = self.apply(c);
                    let counter = if ack.accepted {
                        &self.metrics.configs_applied
                    } else {
                        &self.metrics.configs_rejected
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    let _ = self.acks.send(ack);
                    continue;
                }
                Err(std_mpsc::RecvTimeoutError::Disconnected) => break,
                Err(std_mpsc::RecvTimeoutError::Timeout) => {}
            }
            if Instant::now() < deadline {
                self.drain_samples();
                continue;
            }
            let elapsed = last.elapsed();
            last = Instant::now();
            let r = self.tick(elapsed);
            self.record(&r, last.elapsed());
            self.reports.send_replace(Some(r));
        }
    }

    fn apply(&mut self, c: pb::NodeConfig) -> pb::ConfigAck {
        let version = c.version;
        let nack = move |reason: String| pb::ConfigAck {
            version,
            accepted: false,
            reason,
        };
        if let Err(why) = spoken(&c) {
            return nack(why);
        }
        if c.version == self.config.version && c.version != 0 {
            // A reconnect resent what runs already (a profile result the old stream lost
            // is sent again).
            self.start_profiles();
            return pb::ConfigAck {
                version: c.version,
                accepted: true,
                reason: self.unresolved_reason(),
            };
        }
        let geometry = match checked(&c) {
            Ok(g) => g,
            Err(why) => return nack(why),
        };
        let reload = match self.reload_for(geometry) {
            Ok(reload) => reload,
            Err(why) => return nack(why),
        };
        let mut builder = self
            .builder
            .take()
            .unwrap_or_else(|| FrameBuilder::new(c.top_k as usize, self.layout.clone()));
        builder.k = c.top_k as usize;
        builder.leak_min_confidence = c
            .leak
            .as_ref()
            .map_or(60, |l| l.min_confidence.min(100) as u8);
        self.builder = Some(builder);
        self.config = c;
        self.applied.store(self.config.version, Ordering::SeqCst);
        if let Err(e) = self.retarget() {
            return nack(e);
        }
        if reload && let Ok(p) = &self.pipes {
            p.close_cpu_epoch();
        }
        self.start_profiles();
        pb::ConfigAck {
            version: self.config.version,
            accepted: true,
            reason: self.unresolved_reason(),
        }
    }

    /// Whether the pipelines were reloaded for a new sketch `geometry` (they run with the
    /// old one otherwise); why not, when they cannot run.
    fn reload_for(&mut self, geometry: Geometry) -> Result<bool, String> {
        let reload = match &self.pipes {
            Ok(p) => p.options().cpu != geometry,
            Err(e) => {
                return Err(format!(
                    "kernel pipelines unavailable: {}",
                    resourcewatch_runtime::error_chain(e)
                ));
            }
        };
        if reload {
            // Detach the old programs before loading the new ones: both attached at once
            // would count every event twice meanwhile.
            drop(std::mem::replace(
                &mut self.pipes,
                Err(PipelineError::Unloaded),
            ));
            self.pipes = Pipelines::load(PipelineOptions {
                cpu: geometry,
                mem: geometry,
                ..Default::default()
            });
            self.builder = None;
            self.resolved.clear();
            if let Err(e) = &self.pipes {
                return Err(format!(
                    "reloading the pipelines with a new sketch: {}",
                    resourcewatch_runtime::error_chain(e)
                ));
            }
        }
        Ok(reload)
    }

    fn start_profiles(&mut self) {
        let root = self
            .pipes
            .as_ref()
            .ok()
            .and(self.layout.as_ref())
            .map(|l| l.root().to_path_buf());
        self.profiles.apply(&self.config.profiles, root.as_deref());
    }

    /// What `/metrics` shows of this tick.
    fn record(&self, r: &pb::Report, took: Duration) {
        let pipes = self.pipes.as_ref().ok();
        self.metrics.record_tick(metrics::TickSnapshot {
            pipelines_loaded: pipes.is_some(),
            ticks: self.metrics.next_tick(),
            tick_seconds: took.as_secs_f64(),
            kernel: pipes.map(|p| p.kernel_stats()).unwrap_or_default(),
            programs: pipes.map(|p| p.program_stats()).unwrap_or_default(),
            targets_resolved: self.resolved.len(),
            targets_unresolved: self.unresolved.len(),
            leaks_reported: r.leaks.len(),
        });
    }

    fn unresolved_reason(&self) -> String {
        if self.unresolved.is_empty() {
            String::new()
        } else {
            format!(
                "{} container(s) not found on this node yet",
                self.unresolved.len()
            )
        }
    }

    /// Finds the targeted containers' cgroups and programs the exact-tracking maps when
    /// the set changed (containers start, restart with new ids, go away).
    fn retarget(&mut self) -> Result<(), String> {
        let Some(layout) = &self.layout else {
            return Ok(());
        };
        let wanted: BTreeSet<String> = self
            .config
            .targets
            .iter()
            .flat_map(|p| p.containers.iter())
            .map(|c| c.container_id.clone())
            .filter(|id| !id.is_empty())
            .collect();
        let (found, missing) = resolve::resolve(layout.root(), &wanted);
        self.unresolved = missing;
        if found == self.resolved {
            return Ok(());
        }
        let ids: Vec<u64> = found.iter().map(|c| c.cgroup_id).collect();
        if let Ok(p) = &mut self.pipes {
            p.set_targets(&[], &ids).map_err(|e| {
                format!(
                    "programming targets: {}",
                    resourcewatch_runtime::error_chain(&e)
                )
            })?;
        }
        if let Some(b) = &mut self.builder {
            b.watched_cgroups = found
                .iter()
                .map(|c| (c.cgroup_id, c.cgroup_path.clone()))
                .collect();
        }
        tracing::info!(
            found = found.len(),
            missing = self.unresolved.len(),
            "targets programmed"
        );
        self.resolved = found;
        Ok(())
    }

    fn tick(&mut self, elapsed: Duration) -> pb::Report {
        if let Err(e) = self.retarget() {
            tracing::warn!(error = %e, "retargeting failed");
        }
        let pid = std::process::id();
        let cpu_now = procfs::cpu_ns(pid);
        let agent_cpu = match (self.self_cpu, cpu_now) {
            (Some(a), Some(b)) => {
                (b.saturating_sub(a)) as f64 * 100.0 / elapsed.as_nanos().max(1) as f64
            }
            _ => 0.0,
        };
        self.self_cpu = cpu_now;
        let agent_rss = procfs::resident_pages(pid).unwrap_or(0) * procfs::page_size();
        let (Ok(pipes), Some(builder)) = (&mut self.pipes, &mut self.builder) else {
            return pb::Report {
                config_version: self.config.version,
                timestamp_unix_ms: (procfs::realtime_ns() / 1_000_000) as i64,
                interval_ms: elapsed.as_millis() as u64,
                health: Some(pb::Health {
                    agent_cpu_percent: agent_cpu,
                    agent_rss_bytes: agent_rss,
                    ..Default::default()
                }),
                ..Default::default()
            };
        };
        let epoch = pipes.close_cpu_epoch();
        pipes.drain_samples(|s| builder.observe_sample(s));
        let frame = builder.build(pipes, &epoch);
        let now = Instant::now();
        for k in &frame.oom_kills {
            self.metrics.oom_kills.fetch_add(1, Ordering::Relaxed);
            let kill = report::oom_kill(k);
            let watched = self.resolved.iter().any(|c| {
                (!kill.container_id.is_empty() && c.container_id == kill.container_id)
                    || (!kill.pod_uid.is_empty() && c.pod_uid == kill.pod_uid)
            });
            self.oom_kills.push(now, kill, watched);
        }
        let resend = Duration::from_secs(pb::OOM_KILL_RESEND_SECS);
        self.oom_kills
            .trim(now, resend, pb::MAX_OOM_KILLS_PER_REPORT);
        let mut r = report::build(report::ReportInputs {
            frame: &frame,
            config: &self.config,
            containers: &self.resolved,
            unresolved: self.unresolved.iter().cloned().collect(),
            cgroup_root: self.layout.as_ref().map(|l| l.root()),
            agent_cpu_percent: (agent_cpu * 100.0).round() / 100.0,
            agent_rss_bytes: agent_rss,
        });
        r.oom_kills = self.oom_kills.report();
        r
    }
}

/// Trims a report to the operator's message limit: the heaviest processes of each
/// container stay, the tail goes (a node with hundreds of targeted containers at K = 100
/// can exceed it; the operator would refuse the whole message).
fn fit(mut r: pb::Report) -> pb::Report {
    use prost::Message;
    let limit = pb::MAX_MESSAGE_BYTES - 4096;
    let mut keep = r
        .containers
        .iter()
        .map(|c| c.processes.len())
        .max()
        .unwrap_or(0);
    while r.encoded_len() > limit && keep > 0 {
        keep /= 2;
        for c in &mut r.containers {
            c.processes.truncate(keep);
        }
    }
    if r.encoded_len() > limit {
        tracing::warn!(
            bytes = r.encoded_len(),
            "report over the limit even without processes"
        );
        r.leaks.truncate(100);
        r.containers.truncate(500);
    }
    r
}

/// `Err` when the operator chose a protocol version this agent does not speak (it
/// cannot know what the snapshot means): the snapshot is refused with the reason, which
/// the operator shows in the watch's status.
fn spoken(c: &pb::NodeConfig) -> Result<(), String> {
    let v = c.protocol_version;
    let (min, max) = pb::SPOKEN_PROTOCOL_VERSIONS;
    if (min..=max).contains(&v) {
        Ok(())
    } else {
        Err(format!(
            "the operator chose protocol version {v}; this agent speaks {min}..={max} \
             (upgrade the older of the two: docs/operations.md, Upgrades and version skew)"
        ))
    }
}
/// The snapshot's sketch, when its settings are in bounds (K, the report interval);
/// why not.
fn checked(c: &pb::NodeConfig) -> Result<Geometry, String> {
    let geometry =
        Geometry::new(c.sketch_depth, c.sketch_width).map_err(|e| format!("sketch: {e}"))?;
    if let Some(why) = top_k_refused(c.top_k) {
        return Err(why);
    }
    if c.report_interval_ms < 1000 {
        return Err(format!(
            "report interval {} ms is below the 1000 ms minimum",
            c.report_interval_ms
        ));
    }
    Ok(geometry)
}

/// Why K is refused, if it is: exactly what the API allows (the CRDs' topK) is accepted,
/// the bounds the operator checks too.
fn top_k_refused(k: u32) -> Option<String> {
    (!(pb::TOP_K_MIN..=pb::TOP_K_MAX).contains(&k))
        .then(|| format!("top_k {k} is outside {}..{}", pb::TOP_K_MIN, pb::TOP_K_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_is_accepted_exactly_where_the_api_allows_it() {
        assert!(top_k_refused(0).is_some());
        assert_eq!(top_k_refused(1), None);
        assert_eq!(top_k_refused(100), None);
        assert_eq!(
            top_k_refused(101).as_deref(),
            Some("top_k 101 is outside 1..100")
        );
    }
    use crate::capabilities::{CapabilityReport, Check};

    /// A NACK's reason names each cause once (the message leaves out what the error
    /// attaches as its source; the chain is printed by `error_chain`).
    #[test]
    fn a_nack_names_each_cause_once() {
        let (acks, _) = mpsc::unbounded_channel();
        let (reports, _) = watch::channel(None);
        let (results, _) = mpsc::unbounded_channel();
        let broken = PipelineError::Cgroup(crate::cgroup_resolver::CgroupError::Read {
            path: "/proc/self/mountinfo".into(),
            source: std::io::Error::from_raw_os_error(libc::EACCES),
        });
        let mut engine = Engine::new(
            acks,
            reports,
            Arc::default(),
            Arc::default(),
            profiles::Runner::new(results, "n1"),
            Err(broken),
        );
        let ack = engine.apply(pb::NodeConfig {
            version: 3,
            top_k: 10,
            report_interval_ms: 10_000,
            sketch_depth: 4,
            sketch_width: 1024,
            protocol_version: pb::PROTOCOL_VERSION,
            ..Default::default()
        });
        assert!(!ack.accepted);
        assert_eq!(
            ack.reason,
            "kernel pipelines unavailable: cgroups: cannot read /proc/self/mountinfo: \
             Permission denied (os error 13)"
        );
    }

    #[test]
    fn a_snapshot_of_a_protocol_version_this_agent_does_not_speak_is_refused() {
        // A snapshot that names no version (0) is not understood either.
        assert!(spoken(&pb::NodeConfig::default()).is_err());
        let chosen = |v| pb::NodeConfig {
            protocol_version: v,
            ..Default::default()
        };
        assert!(spoken(&chosen(pb::PROTOCOL_VERSION)).is_ok());
        let err = spoken(&chosen(pb::PROTOCOL_VERSION + 1)).expect_err("newer");
        assert!(err.contains("upgrade the older"), "{err}");
    }

    #[test]
    fn retries_stay_a_second_apart_while_the_operator_hands_over() {
        let waits = |since_lost: Option<Duration>| {
            let mut b = Duration::from_millis(500);
            let mut out = vec![b];
            for _ in 0..5 {
                b = next_backoff(b, since_lost);
                out.push(b);
            }
            out.iter().map(Duration::as_millis).collect::<Vec<_>>()
        };
        // Starting (no stream yet) or long after one was lost: exponential to 5 s.
        assert_eq!(waits(None), [500, 1000, 2000, 4000, 5000, 5000]);
        assert_eq!(
            waits(Some(FAILOVER_WINDOW)),
            [500, 1000, 2000, 4000, 5000, 5000]
        );
        // Just after a stream that had lived ended: a new leader is coming.
        assert_eq!(
            waits(Some(Duration::from_secs(3))),
            [500, 1000, 1000, 1000, 1000, 1000]
        );
    }

    fn report(failing: &[CheckId]) -> CapabilityReport {
        let ids = [
            (CheckId::Btf, "BTF"),
            (CheckId::SchedSwitch, "tracepoint sched_switch"),
            (CheckId::RssStat, "tracepoint rss_stat"),
            (CheckId::Uprobes, "uprobes"),
            (CheckId::RingBuffer, "BPF ring buffer"),
        ];
        CapabilityReport {
            kernel_release: "6.18.0".into(),
            cgroup_version: Some("v2".into()),
            checks: ids
                .iter()
                .map(|&(id, name)| Check {
                    id,
                    name: name.into(),
                    ok: !failing.contains(&id),
                    detail: if failing.contains(&id) {
                        "absent".into()
                    } else {
                        String::new()
                    },
                    required: id == CheckId::Btf,
                })
                .collect(),
        }
    }

    #[test]
    fn the_hello_claims_only_what_the_probe_found() {
        let all = hello_capabilities(&report(&[]));
        assert!(all.btf && all.sched_switch && all.rss_stat && all.uprobes && all.ring_buffer);
        assert!(all.missing.is_empty());

        // A node without BTF claims no BTF (checks are matched by id, not by name).
        let no_btf = hello_capabilities(&report(&[CheckId::Btf]));
        assert!(!no_btf.btf, "{no_btf:?}");
        assert!(no_btf.sched_switch && no_btf.rss_stat);
        assert_eq!(no_btf.missing, vec!["BTF: absent".to_owned()]);

        let no_ring = hello_capabilities(&report(&[CheckId::RingBuffer, CheckId::Uprobes]));
        assert!(!no_ring.ring_buffer && !no_ring.uprobes && no_ring.btf);

        // A check that did not run is not claimed.
        let mut partial = report(&[]);
        partial.checks.retain(|c| c.id != CheckId::RssStat);
        assert!(!hello_capabilities(&partial).rss_stat);
    }
}
