//! Simulated node agents: the real protocol, real mTLS (the operator's agent Secret), and
//! made-up measurements. The API tests use one or two; the load tool runs hundreds.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Context;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use resourcewatch_proto::{
    self as pb, agent_control_client::AgentControlClient, agent_message::Msg, operator_message,
};
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// The agents' certificate, as the operator writes it into its Secret.
#[derive(Clone)]
pub struct AgentTls {
    pub ca: String,
    pub cert: String,
    pub key: String,
    /// The node's token (`harness::agent_token`); set per node with [`AgentTls::for_node`].
    pub token: Option<String>,
}

impl AgentTls {
    pub async fn from_secret(client: &Client, ns: &str, name: &str) -> anyhow::Result<Self> {
        let s = Api::<Secret>::namespaced(client.clone(), ns)
            .get(name)
            .await
            .with_context(|| format!("reading Secret {ns}/{name}"))?;
        let data = s.data.unwrap_or_default();
        let get = |k: &str| {
            data.get(k)
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .with_context(|| format!("Secret {ns}/{name} has no {k}"))
        };
        Ok(Self {
            ca: get("ca.crt")?,
            cert: get("tls.crt")?,
            key: get("tls.key")?,
            token: None,
        })
    }

    /// The same transport credentials with a node's token.
    pub fn for_node(&self, token: String) -> Self {
        Self {
            token: Some(token),
            ..self.clone()
        }
    }
}

/// What a simulated pod's one container does.
#[derive(Clone, Debug, Default)]
pub struct PodPlan {
    pub cpu_percent: f64,
    pub rss_bytes: u64,
    pub limit_bytes: u64,
    /// (growth bytes/s, confidence, time to OOM seconds)
    pub leak: Option<(f64, u32, f64)>,
}

pub type Planner = Arc<dyn Fn(&pb::TargetPod) -> PodPlan + Send + Sync>;

#[derive(Default)]
pub struct SimStats {
    pub sessions: AtomicU64,
    pub configs: AtomicU64,
    pub reports: AtomicU64,
    pub errors: AtomicU64,
    pub last_version: AtomicU64,
    /// The protocol version the operator chose, as its last NodeConfig said.
    pub protocol: AtomicU64,
    pub last_error: Mutex<String>,
    pub targets: Mutex<Vec<pb::TargetPod>>,
}

pub struct SimAgent {
    pub node: String,
    pub stats: Arc<SimStats>,
    endpoints: Arc<Mutex<Vec<String>>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl SimAgent {
    /// Connects (and reconnects) until stopped, speaking this build's protocol versions.
    pub fn spawn(
        endpoint: String,
        server_name: String,
        tls: AgentTls,
        node: String,
        planner: Planner,
    ) -> Self {
        Self::spawn_offering(
            endpoint,
            server_name,
            tls,
            node,
            planner,
            pb::SPOKEN_PROTOCOL_VERSIONS,
        )
    }

    /// As [`Self::spawn`], offering the protocol versions `offered` (min, max) in its
    /// Hello as an agent of another release would (min 0: an agent from before
    /// negotiation); a snapshot of a version outside them is refused (NACK), as the
    /// agent does.
    pub fn spawn_offering(
        endpoint: String,
        server_name: String,
        tls: AgentTls,
        node: String,
        planner: Planner,
        offered: (u32, u32),
    ) -> Self {
        let stats = Arc::new(SimStats::default());
        let endpoints = Arc::new(Mutex::new(vec![endpoint]));
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(
            endpoints.clone(),
            server_name,
            tls,
            Behaviour {
                node: node.clone(),
                planner,
                offered,
            },
            stats.clone(),
            stop_rx,
        ));
        Self {
            node,
            stats,
            endpoints,
            stop,
            task,
        }
    }

    /// From the next session on, the agent tries its endpoints in turn after each failed
    /// or ended session: what a Service in front of several operator replicas gives it
    /// (a standby refuses sessions, a dead replica connections).
    pub fn add_endpoint(&self, endpoint: String) {
        if let Ok(mut e) = self.endpoints.lock() {
            e.push(endpoint);
        }
    }

    /// Ends the stream the way a dying agent does (no goodbye).
    pub async fn stop(self) {
        self.stop.send_replace(true);
        let _ = self.task.await;
    }
}

/// Who a simulated agent is and how it answers.
struct Behaviour {
    node: String,
    planner: Planner,
    /// The protocol versions its Hello offers (min, max).
    offered: (u32, u32),
}

async fn run(
    endpoints: Arc<Mutex<Vec<String>>>,
    server_name: String,
    tls: AgentTls,
    agent: Behaviour,
    stats: Arc<SimStats>,
    mut stop: watch::Receiver<bool>,
) {
    let Behaviour {
        node,
        planner,
        offered,
    } = agent;
    let mut next = 0usize;
    while !*stop.borrow() {
        let endpoint = endpoints
            .lock()
            .ok()
            .and_then(|e| e.get(next % e.len().max(1)).cloned())
            .unwrap_or_default();
        next += 1;
        let r = tokio::select! {
            r = session(&endpoint, &server_name, &tls, &node, &planner, offered, &stats) => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        if let Err(e) = r {
            stats.errors.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut l) = stats.last_error.lock() {
                *l = format!("{e:#}");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

async fn session(
    endpoint: &str,
    server_name: &str,
    tls: &AgentTls,
    node: &str,
    planner: &Planner,
    offered: (u32, u32),
    stats: &SimStats,
) -> anyhow::Result<()> {
    let tls_cfg = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&tls.ca))
        .identity(Identity::from_pem(&tls.cert, &tls.key))
        .domain_name(server_name);
    let channel = Endpoint::from_shared(endpoint.to_owned())?
        .tls_config(tls_cfg)?
        .connect_timeout(Duration::from_secs(5))
        // As the agent: an operator that stops answering ends the stream within 10 s.
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    let mut client = AgentControlClient::new(channel);
    let (tx, rx) = mpsc::channel(8);
    tx.send(pb::AgentMessage {
        msg: Some(Msg::Hello(pb::Hello {
            node_name: node.into(),
            agent_version: "sim".into(),
            min_protocol_version: offered.0,
            protocol_version: offered.1,
            last_applied_version: stats.last_version.load(Ordering::Relaxed),
            capabilities: Some(pb::Capabilities {
                kernel_release: "sim".into(),
                cgroup_mode: "v2".into(),
                btf: true,
                sched_switch: true,
                rss_stat: true,
                uprobes: true,
                ring_buffer: true,
                missing: vec![],
            }),
        })),
    })
    .await?;
    let mut req = tonic::Request::new(ReceiverStream::new(rx));
    req.metadata_mut().insert(pb::NODE_METADATA, node.parse()?);
    if let Some(t) = &tls.token {
        req.metadata_mut()
            .insert(pb::AUTHORIZATION_METADATA, format!("Bearer {t}").parse()?);
    }
    let mut inbound = client.session(req).await?.into_inner();
    stats.sessions.fetch_add(1, Ordering::Relaxed);
    let mut config: Option<pb::NodeConfig> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(3600));
    tick.reset();
    loop {
        tokio::select! {
            m = inbound.message() => {
                let Some(m) = m? else { return Ok(()) };
                if let Some(operator_message::Msg::Config(c)) = m.msg {
                    stats.configs.fetch_add(1, Ordering::Relaxed);
                    stats.last_version.store(c.version, Ordering::Relaxed);
                    let chosen = c.protocol_version;
                    stats.protocol.store(u64::from(chosen), Ordering::Relaxed);
                    if !(offered.0..=offered.1).contains(&chosen) {
                        let reason = format!("protocol version {chosen} is not spoken here");
                        tx.send(pb::AgentMessage { msg: Some(Msg::Ack(pb::ConfigAck { version: c.version, accepted: false, reason })) }).await?;
                        continue;
                    }
                    if let Ok(mut t) = stats.targets.lock() {
                        *t = c.targets.clone();
                    }
                    tx.send(pb::AgentMessage { msg: Some(Msg::Ack(pb::ConfigAck { version: c.version, accepted: true, reason: String::new() })) }).await?;
                    // As the real agent: a new configuration is reported on at the next
                    // tick of its period, which only a new period (or the first
                    // configuration) restarts. Reporting 0.2 s after every change made
                    // a new pod's first figure look a report period quicker than it is.
                    let period = Duration::from_millis(c.report_interval_ms.max(500));
                    if config.as_ref().is_none_or(|old| old.report_interval_ms != c.report_interval_ms) {
                        tick = tokio::time::interval_at(tokio::time::Instant::now() + Duration::from_millis(200), period);
                    }
                    config = Some(c);
                }
            }
            _ = tick.tick() => {
                let Some(c) = &config else { continue };
                tx.send(pb::AgentMessage { msg: Some(Msg::Report(report(c, planner))) }).await?;
                stats.reports.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A report as a real agent would send it for these targets.
pub fn report(c: &pb::NodeConfig, planner: &Planner) -> pb::Report {
    let mut containers = Vec::new();
    let mut leaks = Vec::new();
    for (i, pod) in c.targets.iter().enumerate() {
        let plan = planner(pod);
        for ctr in &pod.containers {
            let pid = 1000 + i as u32 * 10;
            containers.push(pb::ContainerReport {
                pod_uid: pod.uid.clone(),
                container_id: ctr.container_id.clone(),
                memory_bytes: plan.rss_bytes,
                memory_limit_bytes: plan.limit_bytes,
                cpu_percent: plan.cpu_percent,
                processes: vec![pb::Process {
                    pid,
                    command: format!("{}-main", pod.name.chars().take(8).collect::<String>()),
                    cpu_percent: plan.cpu_percent,
                    rss_bytes: plan.rss_bytes,
                    pod_uid: pod.uid.clone(),
                    container_id: ctr.container_id.clone(),
                }],
            });
            if let Some((growth, confidence, tto)) = plan.leak {
                leaks.push(pb::Leak {
                    pod_uid: pod.uid.clone(),
                    container_id: ctr.container_id.clone(),
                    pid: 0,
                    command: String::new(),
                    memory_bytes: plan.rss_bytes,
                    growth_bytes_per_second: growth,
                    r2: 0.99,
                    confidence,
                    limit_bytes: plan.limit_bytes,
                    time_to_oom_seconds: Some(tto),
                    time_to_oom_low_seconds: Some(tto * 0.9),
                    growing_seconds: tto,
                    growth_sites: Vec::new(),
                });
            }
        }
    }
    pb::Report {
        config_version: c.version,
        timestamp_unix_ms: 0,
        interval_ms: c.report_interval_ms,
        containers,
        node_top_cpu: vec![],
        node_top_memory: vec![],
        leaks,
        oom_kills: vec![],
        health: Some(pb::Health::default()),
    }
}
