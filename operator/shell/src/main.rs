//! `resourcewatch-operator`: the controller, the agents' gRPC endpoint (mTLS), leader
//! election and `/metrics`, until SIGTERM, then a drain bounded by `--drain-timeout`.

use std::{net::SocketAddr, process::ExitCode, sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::Parser;
use kube::{Client, runtime::events::Reporter};
use resourcewatch_operator::{
    controller::{self, RemediationContext},
    grpc::AgentService,
    hub::{Hub, HubOptions},
    identity::TokenReviewer,
    leader::{self, LeaderElection, ServiceEndpoint, ThisPod},
    ledger::LedgerStore,
    metrics::{self, Metrics},
    spec::{Floors, parse_duration},
    tls,
};
use resourcewatch_proto::agent_control_server::AgentControlServer;
use tokio::sync::watch;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

#[derive(Parser)]
#[command(
    name = "resourcewatch-operator",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Args {
    /// Without one, the operator runs.
    #[command(subcommand)]
    command: Option<Command>,
    /// Namespace of the operator's Secrets and Lease (the downward API's metadata.namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "resourcewatch-system")]
    namespace: String,
    /// This replica's identity in the Lease and in Events (metadata.name).
    #[arg(long, env = "POD_NAME", default_value = "resourcewatch-operator")]
    pod_name: String,
    /// This pod's address (status.podIP), which the leader publishes as the operator
    /// Service's one endpoint. Unset outside a pod: nothing is published.
    #[arg(long, env = "POD_IP")]
    pod_ip: Option<std::net::IpAddr>,
    /// This pod's UID (metadata.uid), in the endpoint's targetRef.
    #[arg(long, env = "POD_UID")]
    pod_uid: Option<String>,
    /// This pod's node (spec.nodeName), in the endpoint.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Log lines as text or JSON (the filter is RESOURCEWATCH_LOG, e.g. info,kube=warn).
    #[arg(long, env = "RESOURCEWATCH_LOG_FORMAT", default_value = "text")]
    log_format: resourcewatch_runtime::logging::Format,
    /// Where agents connect (gRPC over mTLS).
    #[arg(long, default_value = "0.0.0.0:9443")]
    grpc_addr: SocketAddr,
    /// /metrics, /healthz, /readyz: HTTPS, /metrics only for a bearer token allowed to
    /// `get` the non-resource URL /metrics (ClusterRole resourcewatch-metrics-reader).
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Serve plain HTTP with /metrics open to anyone who connects: only on a loopback
    /// address (local runs and tests), refused elsewhere.
    #[arg(long, default_value_t = false)]
    insecure_metrics: bool,
    /// Secret holding the CA (created at first start when absent).
    #[arg(long, default_value = "resourcewatch-ca")]
    ca_secret: String,
    /// Secret the agents mount: CA and their certificate (kept in sync).
    #[arg(long, default_value = "resourcewatch-agent-tls")]
    agent_secret: String,
    /// Secret with the client certificate the agents serve their /metrics to (for
    /// Prometheus: the PodMonitor's tlsConfig reads it).
    #[arg(long, default_value = "resourcewatch-metrics-client")]
    metrics_client_secret: String,
    #[arg(long, default_value = "resourcewatch-operator")]
    lease_name: String,
    /// The Service agents and scrapers reach this operator through: its serving
    /// certificate names `<service>.<namespace>.svc` and `<service>`.
    #[arg(long, default_value = resourcewatch_proto::OPERATOR_SERVICE)]
    service_name: String,
    /// ConfigMap publishing the CA certificate (never its key) for scrapers and `helm test`.
    #[arg(long, default_value = "resourcewatch-ca-bundle")]
    ca_bundle_configmap: String,
    /// The ClusterRole a namespace admin binds to grant this operator evictions there:
    /// named in the condition that says it is missing.
    #[arg(long, default_value = "resourcewatch-evictor")]
    evictor_cluster_role: String,
    /// How long a node may go without a report before it counts as lost.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    agent_grace: Duration,
    /// HashPipe geometry pushed to every agent.
    #[arg(long, default_value_t = 4)]
    sketch_depth: u32,
    #[arg(long, default_value_t = 1024)]
    sketch_width: u32,
    /// Cluster-wide master switch for `remediation.action: Restart`: while off, such watches
    /// only report (`WouldRestart`), whatever they ask. Off by default.
    #[arg(
        long,
        env = "RESOURCEWATCH_ENABLE_REMEDIATION",
        default_value_t = false
    )]
    enable_remediation: bool,
    /// The agents' ServiceAccount (in --namespace): a stream is accepted only with a token
    /// of it, bound to the agent pod of the node the stream claims.
    #[arg(long, default_value = "resourcewatch-agent")]
    agent_service_account: String,
    /// Floor: a Restart watch's leakDetection.minConfidence must be at least this.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u8).range(0..=100))]
    remediation_min_confidence: u8,
    /// Floor: a Restart watch's cooldown must be at least this.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    remediation_min_cooldown: Duration,
    /// Floor: a Restart watch's window must be at least this.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    remediation_min_window: Duration,
    /// Ceiling: a Restart watch's maxRestarts may be at most this.
    #[arg(long, default_value_t = 10)]
    remediation_max_restarts: u32,
    /// Time allowed for in-flight work after SIGTERM.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    drain_timeout: Duration,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Exits 0 when the operator's leader answers /readyz over HTTPS with a certificate of
    /// the published CA for the operator's Service name (what `helm test` runs, from the
    /// operator's image in a pod of the release's namespace).
    CheckReady {
        /// The operator Service's IP: kubelet's variable for the Service (no cluster DNS
        /// needed).
        #[arg(long, env = "RESOURCEWATCH_OPERATOR_SERVICE_HOST")]
        host: std::net::IpAddr,
        #[arg(
            long,
            env = "RESOURCEWATCH_OPERATOR_SERVICE_PORT_METRICS",
            default_value_t = 8080
        )]
        port: u16,
        /// The CA certificate (the ConfigMap resourcewatch-ca-bundle's ca.crt).
        #[arg(long, default_value = "/etc/resourcewatch/ca/ca.crt")]
        ca: std::path::PathBuf,
        /// The operator Service's name (`--service-name`), which its certificate carries.
        #[arg(long, default_value = resourcewatch_proto::OPERATOR_SERVICE)]
        server_name: String,
    },
}

/// `check-ready`: one GET of /readyz; the answer is printed either way.
fn check_ready(
    host: std::net::IpAddr,
    port: u16,
    ca: &std::path::Path,
    server_name: &str,
) -> ExitCode {
    let ca_pem = match std::fs::read_to_string(ca) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("check-ready: reading the CA {}: {e}", ca.display());
            return ExitCode::FAILURE;
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("check-ready: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let addr = SocketAddr::new(host, port);
    let req = resourcewatch_runtime::https::Get {
        server_name,
        ca_pem: &ca_pem,
        identity: None,
        token: None,
        path: "/readyz",
    };
    let answer = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(10),
            resourcewatch_runtime::https::get(addr, &req),
        )
        .await
    });
    match answer {
        Ok(Ok((200, body))) if body.contains("leader") => {
            println!("https://{addr}/readyz: 200 {}", body.trim());
            ExitCode::SUCCESS
        }
        Ok(Ok((code, body))) => {
            eprintln!(
                "check-ready: https://{addr}/readyz answered {code} {}",
                body.trim()
            );
            ExitCode::FAILURE
        }
        Ok(Err(e)) => {
            eprintln!("check-ready: https://{addr}/readyz: {e}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("check-ready: https://{addr}/readyz: no answer within 10 s");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    // glibc gives threads that allocate at once arenas of their own (up to eight per
    // core), each growing in 64 MiB heaps it keeps: under resourcewatch-scale the operator
    // held eight such heaps fully resident beside its main heap. Two arenas, one per
    // runtime worker of a 2-core request, so freed memory is reused across threads.
    // SAFETY: mallopt only tunes the allocator; called before any thread starts.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
    let args = Args::parse();
    if let Some(Command::CheckReady {
        host,
        port,
        ca,
        server_name,
    }) = &args.command
    {
        return check_ready(*host, *port, ca, server_name);
    }
    if let Err(e) =
        resourcewatch_runtime::logging::init(args.log_format, "info,kube=warn,tower=warn,h2=warn")
    {
        eprintln!("resourcewatch-operator: {e}");
        return ExitCode::from(64);
    }
    if !args.sketch_width.is_power_of_two() || !(1..=8).contains(&args.sketch_depth) {
        eprintln!(
            "resourcewatch-operator: --sketch-width must be a power of two and --sketch-depth 1-8"
        );
        return ExitCode::from(64);
    }
    if args.insecure_metrics && !args.metrics_addr.ip().is_loopback() {
        eprintln!(
            "resourcewatch-operator: --insecure-metrics serves the watches' findings to anyone: only on a loopback --metrics-addr"
        );
        return ExitCode::from(64);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("resourcewatch-operator: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("resourcewatch-operator: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let mut config = kube::Config::infer()
        .await
        .context("no Kubernetes configuration (in-cluster or KUBECONFIG)")?;
    let metrics = Arc::new(Metrics::default());
    let client = counted_client(config.clone(), &metrics)?;
    // Evictions must see a PodDisruptionBudget's 429 at once, not retry it.
    config.default_retry = false;
    let eviction_client = counted_client(config, &metrics)?;
    let (pki, leaf) = certificates(&client, &args).await?;
    let (shutdown_tx, shutdown) = watch::channel(false);
    let parts = Parts {
        client,
        metrics,
        shutdown,
    };
    let hub = Arc::new(Hub::new(HubOptions {
        sketch_depth: args.sketch_depth,
        sketch_width: args.sketch_width,
        agent_grace: args.agent_grace,
        ..Default::default()
    }));
    let (leader, election_task) = leadership(&args, &parts).await;
    let metrics_task = serve_metrics(&args, &parts, &leaf).await?;
    let grpc_task = serve_agents(&args, &parts, hub.clone(), leader.clone(), &pki, &leaf)?;
    tracing::info!(grpc = %args.grpc_addr, metrics = %args.metrics_addr, remediation = args.enable_remediation, "serving");
    let settings = controller_settings(&args, &parts, eviction_client);
    let Parts {
        client,
        metrics,
        shutdown,
    } = parts;
    // The cache of pods: the ResourceWatch controller keeps it, the node view reads it.
    let (pods, pods_writer) = kube::runtime::reflector::store();
    let node_view_task = metrics.spawn_task(
        "node-view",
        resourcewatch_operator::node_view::run(
            client.clone(),
            hub.clone(),
            pods.clone(),
            metrics.clone(),
            leader.clone(),
            shutdown.clone(),
        ),
    );
    let controller_task = metrics.spawn_task(
        "controller",
        controller::run(
            client,
            hub,
            metrics.clone(),
            leader,
            shutdown,
            settings,
            (pods, pods_writer),
        ),
    );

    wait_for_signal().await;
    tracing::info!("shutting down");
    metrics.tasks.shutting_down();
    shutdown_tx.send_replace(true);
    let drain = async {
        let _ = controller_task.await;
        let _ = node_view_task.await;
        let _ = grpc_task.await;
        let _ = election_task.await;
        let _ = metrics_task.await;
    };
    if tokio::time::timeout(args.drain_timeout, drain)
        .await
        .is_err()
    {
        tracing::warn!("drain timed out");
    }
    Ok(())
}

/// What every part of the operator shares.
struct Parts {
    client: Client,
    metrics: Arc<Metrics>,
    /// Turns true on SIGTERM.
    shutdown: watch::Receiver<bool>,
}

/// The operator's CA (created once, kept in a Secret), the agents' and the metrics
/// scraper's certificates, the CA bundle agents and scrapers trust, and this replica's
/// serving certificate.
async fn certificates(client: &Client, args: &Args) -> anyhow::Result<(tls::Pki, tls::Leaf)> {
    let ns = &args.namespace;
    let pki = tls::ensure_ca(client, ns, &args.ca_secret)
        .await
        .context("CA Secret")?;
    tls::ensure_leaf_secret(client, ns, &args.agent_secret, &pki, tls::LeafKind::Agent)
        .await
        .context("agent certificate Secret")?;
    tls::ensure_leaf_secret(
        client,
        ns,
        &args.metrics_client_secret,
        &pki,
        tls::LeafKind::MetricsClient,
    )
    .await
    .context("metrics client certificate Secret")?;
    tls::ensure_ca_bundle(client, ns, &args.ca_bundle_configmap, &pki.ca_cert)
        .await
        .context("CA bundle ConfigMap")?;
    let server_name = resourcewatch_proto::operator_server_name(&args.service_name, ns);
    let leaf = pki.server(&[
        server_name,
        args.service_name.clone(),
        "localhost".into(),
        "127.0.0.1".into(),
    ])?;
    Ok((pki, leaf))
}

/// Runs the leader election, and keeps the operator Service's endpoint on this pod while
/// it leads (see leader::ServiceEndpoint).
async fn leadership(
    args: &Args,
    parts: &Parts,
) -> (
    watch::Receiver<bool>,
    tokio::task::JoinHandle<impl Sized + use<>>,
) {
    let (client, metrics) = (&parts.client, &parts.metrics);
    let (leader_tx, leader) = watch::channel(false);
    let election = LeaderElection::new(
        client.clone(),
        &args.namespace,
        &args.lease_name,
        &args.pod_name,
    );
    let leader_metric = metrics.clone();
    let mut leader_watch = leader.clone();
    let endpoint = ServiceEndpoint::new(
        client.clone(),
        &args.namespace,
        &args.service_name,
        &args.lease_name,
        ThisPod {
            name: args.pod_name.clone(),
            uid: args.pod_uid.clone(),
            node: args.node_name.clone(),
            ip: args.pod_ip,
        },
        vec![
            ("grpc".into(), args.grpc_addr.port()),
            ("metrics".into(), args.metrics_addr.port()),
        ],
    );
    metrics.spawn_task("service endpoint", async move {
        // First as a standby: a restarted container has its previous life's address,
        // which the slice may still name.
        loop {
            let leading = *leader_watch.borrow_and_update();
            leader_metric.leader.set(i64::from(leading));
            if leading {
                endpoint.publish().await;
            } else {
                endpoint.withdraw().await;
                // A standby exports no findings: the new leader's are the current ones.
                leader_metric.findings.clear();
            }
            // While leading, applied again every REASSERT; otherwise on the next change.
            let changed = if leading {
                tokio::time::timeout(leader::REASSERT, leader_watch.changed())
                    .await
                    .unwrap_or(Ok(()))
            } else {
                leader_watch.changed().await
            };
            if changed.is_err() {
                break;
            }
        }
    });
    // The new leader's apply replaced the address of a holder that could not withdraw
    // (it crashed, froze or lost the API server); logged for whoever reads the story.
    let (taken_tx, mut taken_from) = tokio::sync::mpsc::unbounded_channel::<String>();
    metrics.spawn_task("previous leader", async move {
        while let Some(pod) = taken_from.recv().await {
            tracing::info!(%pod, "took the Lease from a holder that had not released it");
        }
    });
    let task = metrics.spawn_task(
        "leader election",
        election.run(leader_tx, taken_tx, parts.shutdown.clone()),
    );
    (leader, task)
}

/// `/metrics`, `/healthz` and `/readyz` over HTTPS (scrapers authorised by TokenReview
/// and SubjectAccessReview), or plain HTTP on loopback with `--insecure-metrics`.
async fn serve_metrics(
    args: &Args,
    parts: &Parts,
    leaf: &tls::Leaf,
) -> anyhow::Result<tokio::task::JoinHandle<impl Sized + use<>>> {
    let metrics = &parts.metrics;
    let mut metrics_shutdown = parts.shutdown.clone();
    let until_shutdown = async move {
        let _ = metrics_shutdown.wait_for(|s| *s).await;
    };
    if args.insecure_metrics {
        let listener = tokio::net::TcpListener::bind(args.metrics_addr)
            .await
            .with_context(|| format!("binding {}", args.metrics_addr))?;
        let router = metrics::router(metrics.clone(), None);
        return Ok(metrics.spawn_task("metrics server", async move {
            axum::serve(listener, router.into_make_service())
                .with_graceful_shutdown(until_shutdown)
                .await
        }));
    }
    let tls = resourcewatch_runtime::https::server_config(&leaf.cert, &leaf.key, None)
        .context("the metrics listener's certificate")?;
    let listener = resourcewatch_runtime::https::TlsListener::bind(
        args.metrics_addr,
        Arc::new(resourcewatch_runtime::https::Fixed(Arc::new(tls))),
    )
    .await
    .context("metrics listener")?;
    let auth = resourcewatch_operator::metricsauth::MetricsAuth::new(parts.client.clone());
    let router = metrics::router(metrics.clone(), Some(auth));
    Ok(metrics.spawn_task("metrics server", async move {
        axum::serve(listener, router.into_make_service())
            .with_graceful_shutdown(until_shutdown)
            .await
    }))
}

/// The agents' gRPC endpoint: mutual TLS with the operator's CA, each agent's token
/// reviewed.
fn serve_agents(
    args: &Args,
    parts: &Parts,
    hub: Arc<Hub>,
    leader: watch::Receiver<bool>,
    pki: &tls::Pki,
    leaf: &tls::Leaf,
) -> anyhow::Result<tokio::task::JoinHandle<impl Sized + use<>>> {
    let service = AgentService {
        hub,
        metrics: parts.metrics.clone(),
        auth: Arc::new(TokenReviewer::new(
            parts.client.clone(),
            args.namespace.clone(),
            args.agent_service_account.clone(),
            Duration::from_secs(10),
        )),
        leader,
        shutdown: parts.shutdown.clone(),
    };
    let tls_config = ServerTlsConfig::new()
        .identity(Identity::from_pem(&leaf.cert, &leaf.key))
        .client_ca_root(Certificate::from_pem(&pki.ca_cert));
    let mut grpc_shutdown = parts.shutdown.clone();
    // One node's agent cannot make the operator decode more than MAX_MESSAGE_BYTES at a
    // time: one stream per connection, messages capped.
    let grpc = Server::builder()
        .tls_config(tls_config)
        .context("TLS configuration")?
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .max_concurrent_streams(4)
        .concurrency_limit_per_connection(4)
        .add_service(
            AgentControlServer::new(service)
                .max_decoding_message_size(resourcewatch_proto::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(resourcewatch_proto::MAX_MESSAGE_BYTES),
        )
        .serve_with_shutdown(args.grpc_addr, async move {
            let _ = grpc_shutdown.wait_for(|s| *s).await;
        });
    Ok(parts.metrics.spawn_task("agents' endpoint", grpc))
}

/// The controller's Event identity, and remediation's switch, floors and ledgers.
fn controller_settings(
    args: &Args,
    parts: &Parts,
    eviction_client: Client,
) -> controller::Settings {
    controller::Settings {
        reporter: Reporter {
            controller: resourcewatch_operator::FIELD_MANAGER.into(),
            instance: Some(args.pod_name.clone()),
        },
        eviction_client,
        otlp: resourcewatch_operator::otlp::Exporter::new(
            parts.client.clone(),
            &args.namespace,
            parts.metrics.clone(),
        ),
        remediation: RemediationContext {
            enabled: args.enable_remediation,
            floors: Floors {
                min_confidence: args.remediation_min_confidence,
                min_cooldown: args.remediation_min_cooldown,
                min_window: args.remediation_min_window,
                max_restarts: args.remediation_max_restarts,
            },
            ledgers: LedgerStore::new(
                parts.client.clone(),
                &args.namespace,
                Duration::from_secs(10),
            ),
            evict_rights: Default::default(),
            evictor_role: args.evictor_cluster_role.clone(),
        },
    }
}

/// A client whose every request is counted in `resourcewatch_operator_api_requests_total`
/// and every answer (or its absence) in `resourcewatch_operator_api_responses_total`.
fn counted_client(config: kube::Config, metrics: &Arc<Metrics>) -> anyhow::Result<Client> {
    let m = metrics.clone();
    let count = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        m.api_request(req.method(), req.uri());
        req
    });
    let m = metrics.clone();
    let answers = tower::util::MapResultLayer::new(
        move |r: Result<http::Response<Box<kube::client::DynBody>>, tower::BoxError>| {
            m.api_response(r.as_ref().ok().map(http::Response::status));
            r
        },
    );
    Ok(kube::client::ClientBuilder::try_from(config)
        .context("Kubernetes client")?
        .with_layer(&count)
        .with_layer(&answers)
        .build())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
