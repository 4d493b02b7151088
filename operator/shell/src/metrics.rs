//! Prometheus metrics, served on `/metrics` beside `/healthz` and `/readyz`.
//!
//! Two kinds: the operator's own (`resourcewatch_operator_*`: reconciliations, agents,
//! remediation counters, ...) and what the watches found (`resourcewatch_*`, one series
//! per container or process a watch's status lists, see [`WatchSeries`]). The second kind
//! is rendered at scrape time from the leader's latest computed statuses, so a container
//! that stops leaking, or a deleted watch, leaves no stale series behind.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric, text::encode},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::Histogram,
    },
    registry::Registry,
};
use resourcewatch_crds::ResourceWatchStatus;

use crate::hub::WatchKey;

type Labels = Vec<(&'static str, String)>;

pub struct Metrics {
    registry: Registry,
    pub reconciliations: Family<Labels, Counter>,
    pub reconcile_seconds: Histogram,
    /// Status writes by result (`ok`, `error`, `timeout`).
    pub status_writes: Family<Labels, Counter>,
    pub status_skipped: Counter,
    pub events: Family<Labels, Counter>,
    /// Events given up on: refused for good, out of tries, or with the retry queue full.
    pub events_dropped: Family<Labels, Counter>,
    pub agents_connected: Gauge,
    pub reports: Counter,
    pub config_pushes: Counter,
    pub config_nacks: Counter,
    pub protocol_errors: Family<Labels, Counter>,
    pub leader: Gauge,
    /// Remediation decisions and outcomes, by reason.
    pub remediations: Family<Labels, Counter>,
    pub otlp_exports: Family<Labels, Counter>,
    /// CPU profile requests by the state a status write gave them.
    pub profiles: Family<Labels, Counter>,
    pub watches: Gauge,
    /// Agent streams refused by identity checks, by reason (no_token, node_mismatch, ...).
    pub agent_auth_failures: Family<Labels, Counter>,
    /// Report entries dropped before they reached the hub, by reason (not_on_node, ...).
    pub report_entries_dropped: Family<Labels, Counter>,
    /// Requests this operator sent the API server, by verb and resource (what the API
    /// server's own metrics cannot attribute to one client).
    pub api_requests: Family<Labels, Counter>,
    /// The API server's answers by status code, and `error` for a request whose
    /// connection failed: what the API-errors alert watches. A request the operator stops
    /// waiting for (its own time-outs) is dropped before an answer and counted nowhere.
    pub api_responses: Family<Labels, Counter>,
    /// Set once the controller runs: `/readyz` answers 200 from then on.
    pub ready: AtomicBool,
    /// The long-running tasks, for `/healthz` and `/readyz`.
    pub tasks: Tasks,
    /// What each watch found, for the `resourcewatch_*` series.
    pub findings: Arc<WatchSeries>,
    /// OOM kills of watched containers, by namespace, watch, whether a leak was listed
    /// before (at the watch's minConfidence) and scope (`resourcewatch_oom_kills_total`).
    pub oom_kills: Family<Labels, Counter>,
    /// How long before each predicted kill the first warning came, by the watch's
    /// namespace.
    pub oom_warning_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    /// The watches (namespace, name) whose kill counters exist: their series go when the
    /// watch does (a tenant recreating watches under new names would grow them forever).
    oom_watches: std::sync::Mutex<std::collections::BTreeSet<(String, String)>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut root = Registry::default();
        let findings = Arc::new(WatchSeries::default());
        root.register_collector(Box::new(findings.clone()));
        let oom_kills = Family::<Labels, Counter>::default();
        let oom_warning_seconds: Family<Labels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(|| {
                Histogram::new([
                    5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0,
                ])
            });
        // Named like the findings (resourcewatch_*), not the operator's own series: they
        // are about the cluster's workloads.
        root.register(
            "resourcewatch_oom_kills",
            "OOM kills of watched containers seen in the kernel, by namespace, resourcewatch (the watch), predicted (a leak was listed at the watch's minConfidence before the kill) and scope (Cgroup: a memory limit; System: the node's memory); each kill once per watch",
            oom_kills.clone(),
        );
        root.register(
            "resourcewatch_oom_kill_warning_lead_seconds",
            "How long before a predicted OOM kill its first warning came, by the watch's namespace",
            oom_warning_seconds.clone(),
        );
        // process_* and resourcewatch_operator_build_info, named as the agents' are.
        resourcewatch_runtime::telemetry::register(
            &mut root,
            "resourcewatch_operator",
            resourcewatch_proto::PROTOCOL_VERSION,
        );
        let registry = root.sub_registry_with_prefix("resourcewatch_operator");
        let m = Self {
            reconciliations: Family::default(),
            reconcile_seconds: Histogram::new([
                0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0,
            ]),
            status_writes: Family::default(),
            status_skipped: Counter::default(),
            events: Family::default(),
            events_dropped: Family::default(),
            agents_connected: Gauge::default(),
            reports: Counter::default(),
            config_pushes: Counter::default(),
            config_nacks: Counter::default(),
            protocol_errors: Family::default(),
            leader: Gauge::default(),
            remediations: Family::default(),
            otlp_exports: Family::default(),
            profiles: Family::default(),
            watches: Gauge::default(),
            agent_auth_failures: Family::default(),
            report_entries_dropped: Family::default(),
            api_requests: Family::default(),
            api_responses: Family::default(),
            ready: AtomicBool::new(false),
            tasks: Tasks::default(),
            findings,
            oom_kills,
            oom_watches: Default::default(),
            oom_warning_seconds,
            registry: Registry::default(),
        };

        m.register(registry);
        Self {
            registry: root,
            ..m
        }
    }
}

impl Metrics {
    /// Registers the operator's own series (`resourcewatch_operator_*`).
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "reconciliations",
            "Reconciliations by result",
            self.reconciliations.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time per reconciliation",
            self.reconcile_seconds.clone(),
        );
        registry.register(
            "status_writes",
            "Status writes by result (ok, error, timeout)",
            self.status_writes.clone(),
        );
        registry.register(
            "status_writes_skipped",
            "Reconciliations that found nothing new to write",
            self.status_skipped.clone(),
        );
        registry.register(
            "events",
            "Kubernetes Events published, by reason",
            self.events.clone(),
        );
        registry.register(
            "events_dropped",
            "Events not published (refused for good, or still failing after their tries), by reason",
            self.events_dropped.clone(),
        );
        registry.register(
            "agents_connected",
            "Node agents holding a stream",
            self.agents_connected.clone(),
        );
        registry.register(
            "agent_reports",
            "Reports received from agents",
            self.reports.clone(),
        );
        registry.register(
            "config_pushes",
            "Configuration snapshots sent to agents",
            self.config_pushes.clone(),
        );
        registry.register(
            "config_nacks",
            "Configuration snapshots agents refused",
            self.config_nacks.clone(),
        );
        registry.register(
            "protocol_errors",
            "Agent streams ended for a protocol error, by kind",
            self.protocol_errors.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease",
            self.leader.clone(),
        );
        registry.register("profiles", "CPU profile requests (the resourcewatch.io/profile annotation) by the state each reached: Pending when taken, then Succeeded, Failed or Expired; Refused", self.profiles.clone());
        registry.register("otlp_exports", "Profiles sent to the OTLP collector the Secret resourcewatch-otlp names, by result (sent, partial: the collector kept part (its partial_success), failed: unreachable or timed out after the retries, refused by the collector, misconfigured: the Secret, unreadable: the profile)", self.otlp_exports.clone());
        registry.register("remediations", "Remediation decisions recorded in status, by the watch's namespace and reason (Decided, Evicted, PodDisruptionBudget, Gone, DryRun, Cooldown, MaxRestarts, NotAuthorized, NamespaceNotOptedIn, ...), each once; LedgerConflict when another watch decided first", self.remediations.clone());
        self.register_api(registry);
    }

    /// The series of the operator's requests to the API server and of agents' streams.
    fn register_api(&self, registry: &mut Registry) {
        registry.register(
            "api_requests",
            "Requests sent to the Kubernetes API server, by verb (get, list, watch, create, update, patch, delete) and resource (with subresource)",
            self.api_requests.clone(),
        );
        registry.register(
            "api_responses",
            "Answers of the Kubernetes API server, by status code (code=\"error\": the connection failed; a request the operator gave up waiting for is not counted)",
            self.api_responses.clone(),
        );
        registry.register(
            "watches",
            "ResourceWatch objects known",
            self.watches.clone(),
        );
        registry.register(
            "agent_auth_failures",
            "Agent streams refused because the token did not prove the claimed node, by reason",
            self.agent_auth_failures.clone(),
        );
        registry.register(
            "report_entries_dropped",
            "Report entries dropped before use (another node's pods, duplicates, NaN, over a cap), by reason",
            self.report_entries_dropped.clone(),
        );
    }

    /// Spawns a long-running task whose end before shutdown fails `/healthz` and `/readyz`.
    pub fn spawn_task<F>(
        self: &Arc<Self>,
        name: &'static str,
        task: F,
    ) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        /// Marks the task ended when dropped: after it returns, and also when it panics
        /// (the unwinding drops it): a panicking task must not leave /healthz at 200.
        struct Ended(Arc<Metrics>, &'static str);
        impl Drop for Ended {
            fn drop(&mut self) {
                self.0.tasks.ended(self.1);
            }
        }
        let ended = Ended(self.clone(), name);
        tokio::spawn(async move {
            let _ended = ended;
            task.await
        })
    }

    pub fn protocol_error(&self, kind: &'static str) {
        self.protocol_errors
            .get_or_create(&vec![("kind", kind.to_string())])
            .inc();
    }

    /// Runs one reconciliation, observing its duration and counting its result.
    pub async fn timed<T>(
        &self,
        reconcile: impl std::future::Future<Output = crate::Result<T>>,
    ) -> crate::Result<T> {
        let started = std::time::Instant::now();
        let result = reconcile.await;
        self.reconcile_seconds
            .observe(started.elapsed().as_secs_f64());
        self.reconciled(if result.is_ok() { "ok" } else { "error" });
        result
    }

    pub fn reconciled(&self, result: &'static str) {
        self.reconciliations
            .get_or_create(&vec![("result", result.to_string())])
            .inc();
    }

    pub fn status_write(&self, result: &'static str) {
        self.status_writes
            .get_or_create(&vec![("result", result.to_string())])
            .inc();
    }

    pub fn otlp_export(&self, result: &'static str) {
        self.otlp_exports
            .get_or_create(&vec![("result", result.to_string())])
            .inc();
    }

    /// A remediation record of a watch in `namespace` (each decision once).
    pub fn remediation(&self, namespace: &str, reason: &str) {
        self.remediations
            .get_or_create(&vec![
                ("namespace", namespace.to_string()),
                ("reason", reason.to_string()),
            ])
            .inc();
    }

    pub fn labelled(family: &Family<Labels, Counter>, key: &'static str, value: &str, n: u64) {
        family
            .get_or_create(&vec![(key, value.to_string())])
            .inc_by(n);
    }

    /// Counts one request to the API server (see [`api_request_labels`]).
    pub fn api_request(&self, method: &http::Method, uri: &http::Uri) {
        let (verb, resource) = api_request_labels(method, uri);
        self.api_requests
            .get_or_create(&vec![("verb", verb.to_string()), ("resource", resource)])
            .inc();
    }

    /// Counts one answer of the API server (`None`: no answer came).
    pub fn api_response(&self, status: Option<http::StatusCode>) {
        let code = status.map_or_else(|| "error".to_string(), |s| s.as_u16().to_string());
        self.api_responses
            .get_or_create(&vec![("code", code)])
            .inc();
    }

    fn oom_labels(namespace: &str, watch: &str, predicted: bool, scope: &str) -> Labels {
        vec![
            ("namespace", namespace.to_owned()),
            ("resourcewatch", watch.to_owned()),
            ("predicted", predicted.to_string()),
            ("scope", scope.to_owned()),
        ]
    }

    /// A watch's kill counters, at 0 until its first kill: `increase()` over a series
    /// that appears at 1 sees nothing, and the unpredicted-kill alert would miss a
    /// watch's first kill.
    pub fn oom_series(&self, namespace: &str, watch: &str) {
        self.oom_watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((namespace.to_owned(), watch.to_owned()));
        for predicted in [false, true] {
            for scope in ["Cgroup", "System"] {
                let _ = self
                    .oom_kills
                    .get_or_create(&Self::oom_labels(namespace, watch, predicted, scope));
            }
        }
    }

    /// Removes the kill counters of every watch `live` does not keep.
    pub fn retain_oom_series(&self, live: impl Fn(&str, &str) -> bool) {
        let mut watches = self.oom_watches.lock().unwrap_or_else(|e| e.into_inner());
        watches.retain(|(namespace, watch)| {
            if live(namespace, watch) {
                return true;
            }
            for predicted in [false, true] {
                for scope in ["Cgroup", "System"] {
                    self.oom_kills
                        .remove(&Self::oom_labels(namespace, watch, predicted, scope));
                }
            }
            false
        });
    }

    /// A kill a status now holds that the stored one did not.
    pub fn oom_kill(&self, namespace: &str, watch: &str, k: &resourcewatch_crds::OomKillEntry) {
        self.oom_kills
            .get_or_create(&Self::oom_labels(
                namespace,
                watch,
                k.predicted,
                &format!("{:?}", k.scope),
            ))
            .inc();
        if let Some(s) = k.warned_seconds_before {
            self.oom_warning_seconds
                .get_or_create(&vec![("namespace", namespace.to_owned())])
                .observe(s);
        }
    }

    pub fn event(&self, reason: &str) {
        self.events
            .get_or_create(&vec![("reason", reason.to_string())])
            .inc();
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut s, &self.registry);
        s
    }
}

/// The Kubernetes verb and resource of a request, from its method and path, as the API
/// server's audit log names them: `GET` is `watch` with `watch=true`, `list` on a
/// collection and `get` on one object; the resource keeps its subresource
/// (`resourcewatches/status`). Paths outside `/api` and `/apis` (discovery) are `other`.
pub fn api_request_labels(method: &http::Method, uri: &http::Uri) -> (&'static str, String) {
    let parts: Vec<&str> = uri.path().trim_matches('/').split('/').collect();
    // /api/v1/... or /apis/GROUP/VERSION/...
    let rest = match parts.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return ("other", "other".into()),
    };
    let rest = match rest {
        ["namespaces", _ns, rest @ ..] if !rest.is_empty() => rest,
        other => other,
    };
    let (resource, named) = match rest {
        [] => return ("other", "other".into()),
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, sub, ..] => (format!("{resource}/{sub}"), true),
    };
    let watch = uri
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE if named => "delete",
        http::Method::DELETE => "deletecollection",
        _ => "other",
    };
    (verb, resource)
}

/// `/metrics` (behind `auth` when given: crate::metricsauth), `/healthz` and `/readyz`
/// (open: kubelet's probes send no token, and they tell nothing about the watches).
pub fn router(metrics: Arc<Metrics>, auth: Option<Arc<crate::metricsauth::MetricsAuth>>) -> Router {
    let scrape = Router::new().route("/metrics", get(serve_metrics));
    let scrape = match auth {
        Some(a) => scrape.layer(axum::middleware::from_fn_with_state(
            a,
            crate::metricsauth::require,
        )),
        None => scrape,
    };
    scrape
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(metrics)
}

async fn serve_metrics(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.render(),
    )
}

/// 503 when one of the operator's tasks (controller, agents' endpoint, metrics, election)
/// stopped before shutdown: kubelet restarts the container.
async fn healthz(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    match m.tasks.stopped() {
        stopped if stopped.is_empty() => (StatusCode::OK, "ok".to_string()),
        stopped => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("stopped: {}", stopped.join(", ")),
        ),
    }
}

/// 200 once every task runs and the controller has started; the body says whether this
/// replica leads. (Only the leader serves agents: it writes its own address into the
/// Service's one EndpointSlice. A standby is ready to take over, so a rollout of two
/// replicas completes.)
async fn readyz(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    let stopped = m.tasks.stopped();
    if !stopped.is_empty() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("stopped: {}", stopped.join(", ")),
        );
    }
    if !m.ready.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "starting".to_string());
    }
    let role = if m.leader.get() == 1 {
        "leader"
    } else {
        "standby"
    };
    (StatusCode::OK, format!("ready ({role})"))
}

/// The operator's long-running tasks: each registers when spawned and is marked stopped
/// if it ends while the process is not shutting down.
#[derive(Debug, Default)]
pub struct Tasks {
    stopped: Mutex<Vec<&'static str>>,
    shutting_down: AtomicBool,
}

impl Tasks {
    /// Called when the task `name` ends: a failure unless the process is shutting down.
    fn ended(&self, name: &'static str) {
        if !self.shutting_down.load(Ordering::SeqCst) {
            tracing::error!(task = name, "a long-running task stopped");
            self.lock().push(name);
        }
    }

    pub fn shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    pub fn stopped(&self) -> Vec<&'static str> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<&'static str>> {
        self.stopped.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The latest status the leader computed for each watch, rendered as gauges on scrape.
///
/// Cardinality is bounded by the statuses' own caps: per watch at most 100 leaking
/// containers and K processes per Top-K list (K <= 100 by the CRD's schema), so at most
/// 300 series of each name per watch; the series of a watch go when it is deleted or when
/// this replica stops leading.
#[derive(Debug, Default)]
pub struct WatchSeries {
    statuses: Mutex<BTreeMap<WatchKey, ResourceWatchStatus>>,
}

impl WatchSeries {
    pub fn set(&self, key: &WatchKey, status: &ResourceWatchStatus) {
        self.lock().insert(key.clone(), status.clone());
    }

    /// Drops the watches `keep` says no to (deleted ones).
    pub fn retain(&self, mut keep: impl FnMut(&WatchKey) -> bool) {
        self.lock().retain(|k, _| keep(k));
    }

    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<WatchKey, ResourceWatchStatus>> {
        // A panic while holding the lock leaves a map that is still whole.
        self.statuses.lock().unwrap_or_else(|e| e.into_inner())
    }
}

type SeriesLabels = Vec<(&'static str, String)>;

/// One gauge family: name, help, and its (labels, value) rows.
struct GaugeFamily {
    name: &'static str,
    help: &'static str,
    rows: Vec<(SeriesLabels, f64)>,
}

impl GaugeFamily {
    fn new(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            rows: Vec::new(),
        }
    }

    fn encode(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if self.rows.is_empty() {
            return Ok(());
        }
        let mut family = encoder.encode_descriptor(
            self.name,
            self.help,
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (labels, value) in &self.rows {
            ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }
}

/// The `resourcewatch_*` families of every watch.
struct Families {
    matched: GaugeFamily,
    expected: GaugeFamily,
    reporting: GaugeFamily,
    confidence: GaugeFamily,
    growth: GaugeFamily,
    tto: GaugeFamily,
    tto_low: GaugeFamily,
    limit: GaugeFamily,
    top_cpu: GaugeFamily,
    top_memory: GaugeFamily,
}

impl Families {
    fn new() -> Self {
        Self {
            matched: GaugeFamily::new(
                "resourcewatch_matched_pods",
                "Pods a watch's selector matches",
            ),
            expected: GaugeFamily::new(
                "resourcewatch_expected_nodes",
                "Nodes running pods a watch selects",
            ),
            reporting: GaugeFamily::new(
                "resourcewatch_reporting_nodes",
                "Nodes whose agent reported for a watch within the grace period",
            ),
            confidence: GaugeFamily::new(
                "resourcewatch_leak_confidence_ratio",
                "Leak confidence, 0-1, of a container a watch lists as leaking (status: 0-100)",
            ),
            growth: GaugeFamily::new(
                "resourcewatch_leak_growth_bytes_per_second",
                "Memory growth rate of a leaking container",
            ),
            tto: GaugeFamily::new(
                "resourcewatch_time_to_oom_seconds",
                "Predicted time until a leaking container reaches its memory limit (absent when no OOM is predicted)",
            ),
            tto_low: GaugeFamily::new(
                "resourcewatch_time_to_oom_lower_bound_seconds",
                "Lower bound of the time to OOM (what remediation acts on)",
            ),
            limit: GaugeFamily::new(
                "resourcewatch_leak_memory_limit_bytes",
                "The memory limit a leaking container's time to OOM is computed against",
            ),
            top_cpu: GaugeFamily::new(
                "resourcewatch_top_cpu_cores",
                "CPU of the watch's Top-K processes, in cores, summed per container (the processes: the watch's status.topCPU)",
            ),
            top_memory: GaugeFamily::new(
                "resourcewatch_top_memory_bytes",
                "Resident memory of the watch's Top-K processes, summed per container (the processes: the watch's status.topMemory)",
            ),
        }
    }

    /// One watch's rows.
    fn add(&mut self, key: &WatchKey, st: &ResourceWatchStatus) {
        let watch: SeriesLabels = vec![
            ("namespace", key.namespace.clone()),
            ("resourcewatch", key.name.clone()),
        ];
        self.matched
            .rows
            .push((watch.clone(), f64::from(st.matched_pods)));
        self.expected
            .rows
            .push((watch.clone(), f64::from(st.expected_nodes)));
        self.reporting
            .rows
            .push((watch.clone(), f64::from(st.reporting_nodes)));
        for l in &st.leaks {
            let mut labels = watch.clone();
            labels.extend([
                ("pod", l.pod.clone()),
                ("container", l.container.clone()),
                ("node", l.node.clone()),
            ]);
            self.confidence
                .rows
                .push((labels.clone(), f64::from(l.confidence) / 100.0));
            self.growth
                .rows
                .push((labels.clone(), l.growth_bytes_per_second));
            if let Some(s) = l.time_to_oom_seconds {
                self.tto.rows.push((labels.clone(), s));
            }
            if let Some(s) = l.time_to_oom_lower_bound_seconds {
                self.tto_low.rows.push((labels.clone(), s));
            }
            if let Some(b) = l.limit_bytes {
                self.limit.rows.push((labels, b as f64));
            }
        }
        // Per container, not per process: a process's PID and command churn with
        // every restart and exec, and each new value would be a new series kept for
        // the retention period. Which processes they are is in the status (and
        // `kubectl get resourcewatch -o yaml`); PromQL's topk() ranks the containers.
        for (family, entries, scale) in [
            (&mut self.top_cpu, &st.top_cpu, 0.01),
            (&mut self.top_memory, &st.top_memory, 1.0),
        ] {
            let mut per_container: BTreeMap<(&str, &str, &str), f64> = BTreeMap::new();
            for e in entries {
                *per_container
                    .entry((&e.pod, &e.container, &e.process.node))
                    .or_default() += e.process.value * scale;
            }
            for ((pod, container, node), value) in per_container {
                let mut labels = watch.clone();
                labels.extend([
                    ("pod", pod.to_string()),
                    ("container", container.to_string()),
                    ("node", node.to_string()),
                ]);
                family.rows.push((labels, value));
            }
        }
    }

    fn encode(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in [
            &self.matched,
            &self.expected,
            &self.reporting,
            &self.confidence,
            &self.growth,
            &self.tto,
            &self.tto_low,
            &self.limit,
            &self.top_cpu,
            &self.top_memory,
        ] {
            family.encode(encoder)?;
        }
        Ok(())
    }
}

impl Collector for WatchSeries {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut families = Families::new();
        for (key, st) in self.lock().iter() {
            families.add(key, st);
        }
        families.encode(&mut encoder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_requests_are_named_by_verb_and_resource_as_the_audit_log_does() {
        let cases = [
            (
                "GET",
                "/api/v1/pods?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true",
                ("watch", "pods"),
            ),
            ("GET", "/api/v1/pods?limit=500", ("list", "pods")),
            ("GET", "/api/v1/namespaces", ("list", "namespaces")),
            ("GET", "/api/v1/namespaces/team-a", ("get", "namespaces")),
            (
                "GET",
                "/api/v1/namespaces/team-a/configmaps/ledger",
                ("get", "configmaps"),
            ),
            (
                "POST",
                "/api/v1/namespaces/team-a/pods/api-1/eviction",
                ("create", "pods/eviction"),
            ),
            (
                "PATCH",
                "/apis/resourcewatch.io/v1alpha1/namespaces/team-a/resourcewatches/w/status?fieldManager=x",
                ("patch", "resourcewatches/status"),
            ),
            (
                "PUT",
                "/apis/coordination.k8s.io/v1/namespaces/rw/leases/op",
                ("update", "leases"),
            ),
            (
                "POST",
                "/apis/events.k8s.io/v1/namespaces/team-a/events",
                ("create", "events"),
            ),
            (
                "POST",
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                ("create", "subjectaccessreviews"),
            ),
            (
                "DELETE",
                "/api/v1/namespaces/team-a/pods/api-1",
                ("delete", "pods"),
            ),
            (
                "DELETE",
                "/api/v1/namespaces/team-a/pods",
                ("deletecollection", "pods"),
            ),
            ("GET", "/version", ("other", "other")),
            ("GET", "/apis/resourcewatch.io/v1alpha1", ("other", "other")),
        ];
        for (method, uri, (verb, resource)) in cases {
            let got =
                api_request_labels(&method.parse().expect("method"), &uri.parse().expect("uri"));
            assert_eq!(got, (verb, resource.to_string()), "{method} {uri}");
        }
    }

    fn status() -> ResourceWatchStatus {
        serde_json::from_value(serde_json::json!({
            "matchedPods": 3, "expectedNodes": 2, "reportingNodes": 1,
            "topCPU": [{"pod": "api-1", "container": "app", "node": "n1", "pid": 42,
                        "command": "java", "value": 97.5},
                       {"pod": "api-1", "container": "app", "node": "n1", "pid": 43,
                        "command": "gc", "value": 50.0},
                       {"pod": "api-2", "container": "app", "node": "n2", "pid": 7,
                        "command": "java", "value": 10.0}],
            "topMemory": [{"pod": "api-2", "node": "n2", "pid": 7, "value": 1048576.0}],
            "leaks": [{"pod": "api-3", "container": "app", "node": "n1",
                       "growthBytesPerSecond": 1048576.0, "confidence": 88,
                       "timeToOOMSeconds": 245.5, "timeToOOMLowerBoundSeconds": 200.0,
                       "limitBytes": 268435456},
                      {"pod": "api-4", "container": "app", "node": "n2",
                       "growthBytesPerSecond": 1000.0, "confidence": 61}]
        }))
        .expect("status")
    }

    #[tokio::test]
    async fn a_task_that_returns_or_panics_fails_health_until_shutdown() {
        let m = Arc::new(Metrics::default());
        assert!(m.tasks.stopped().is_empty());
        let _ = m.spawn_task("returns", async {}).await;
        let panicked = m.spawn_task("panics", async { panic!("a bug") }).await;
        assert!(panicked.is_err());
        assert_eq!(m.tasks.stopped(), ["returns", "panics"]);
        let running = m.spawn_task("runs", std::future::pending::<()>());
        m.tasks.shutting_down();
        running.abort();
        let _ = running.await;
        assert_eq!(
            m.tasks.stopped(),
            ["returns", "panics"],
            "ends at shutdown are fine"
        );
    }

    #[test]
    fn profile_states_are_counted_under_their_name() {
        let m = Metrics::default();
        Metrics::labelled(&m.profiles, "state", "Succeeded", 1);
        assert!(
            m.render()
                .contains(r#"resourcewatch_operator_profiles_total{state="Succeeded"} 1"#),
            "{}",
            m.render()
        );
    }

    /// A deleted watch's kill counters go with it; another watch's stay.
    #[test]
    fn a_deleted_watchs_kill_series_are_removed() {
        let m = Metrics::default();
        m.oom_series("shop", "api");
        m.oom_series("shop", "old");
        m.retain_oom_series(|_, watch| watch == "api");
        let text = m.render();
        assert!(!text.contains(r#"resourcewatch="old""#), "{text}");
        assert_eq!(
            text.matches(r#"resourcewatch_oom_kills_total{namespace="shop",resourcewatch="api""#)
                .count(),
            4,
            "{text}"
        );
    }

    /// A watch's kill counters exist at 0 before its first kill (the unpredicted-kill
    /// alert's increase() sees the first one), then count each kill under its grade, and
    /// a predicted kill's warning time goes into the histogram.
    #[test]
    fn oom_kills_are_counted_from_zero_by_grade() {
        let m = Metrics::default();
        m.oom_series("shop", "api");
        let text = m.render();
        assert!(
            text.contains(r#"resourcewatch_oom_kills_total{namespace="shop",resourcewatch="api",predicted="false",scope="Cgroup"} 0"#),
            "{text}"
        );
        let kill = resourcewatch_crds::OomKillEntry {
            pod: "api-1".into(),
            container: "app".into(),
            node: "n1".into(),
            time: "2026-11-28T00:00:00.000Z".into(),
            pid: 7,
            command: String::new(),
            scope: resourcewatch_crds::OomScope::Cgroup,
            limit_bytes: None,
            memory_bytes: 0,
            predicted: true,
            warned_seconds_before: Some(42.0),
            eta_error_at_first_alert_seconds: None,
            eta_error_at_halfway_seconds: None,
            lower_bound_held: None,
        };
        m.oom_kill("shop", "api", &kill);
        let text = m.render();
        assert!(
            text.contains(r#"resourcewatch_oom_kills_total{namespace="shop",resourcewatch="api",predicted="true",scope="Cgroup"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"resourcewatch_oom_kill_warning_lead_seconds_bucket{le="60.0",namespace="shop"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn findings_are_series_of_the_latest_status() {
        let m = Metrics::default();
        let key = WatchKey {
            namespace: "shop".into(),
            name: "api".into(),
        };
        m.findings.set(&key, &status());
        let text = m.render();
        let leak = r#"namespace="shop",resourcewatch="api",pod="api-3",container="app",node="n1""#;
        for line in [
            format!("resourcewatch_time_to_oom_seconds{{{leak}}} 245.5"),
            format!("resourcewatch_time_to_oom_lower_bound_seconds{{{leak}}} 200.0"),
            format!("resourcewatch_leak_confidence_ratio{{{leak}}} 0.88"),
            format!("resourcewatch_leak_growth_bytes_per_second{{{leak}}} 1048576.0"),
            format!("resourcewatch_leak_memory_limit_bytes{{{leak}}} 268435456.0"),
            r#"resourcewatch_leak_confidence_ratio{namespace="shop",resourcewatch="api",pod="api-4",container="app",node="n2"} 0.61"#.into(),
            // Top-K per container: api-1's two processes are one series, in cores.
            r#"resourcewatch_top_cpu_cores{namespace="shop",resourcewatch="api",pod="api-1",container="app",node="n1"} 1.475"#.into(),
            r#"resourcewatch_top_cpu_cores{namespace="shop",resourcewatch="api",pod="api-2",container="app",node="n2"} 0.1"#.into(),
            r#"resourcewatch_top_memory_bytes{namespace="shop",resourcewatch="api",pod="api-2",container="",node="n2"} 1048576.0"#.into(),
            r#"resourcewatch_matched_pods{namespace="shop",resourcewatch="api"} 3.0"#.into(),
            r#"resourcewatch_reporting_nodes{namespace="shop",resourcewatch="api"} 1.0"#.into(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
        }
        // No time to OOM is predicted for api-4: no series rather than a made-up value.
        assert!(!text.contains(
            r#"resourcewatch_time_to_oom_seconds{namespace="shop",resourcewatch="api",pod="api-4""#
        ));
        // The operator's own series keep their prefix.
        assert!(
            text.contains("resourcewatch_operator_reconcile_duration_seconds"),
            "{text}"
        );
        // No label that churns with processes.
        assert!(
            !text.contains("command=") && !text.contains("rank=") && !text.contains("pid="),
            "{text}"
        );
        assert!(
            text.contains("resourcewatch_operator_build_info{")
                && text.contains("process_cpu_seconds_total "),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));

        m.findings.retain(|k| k.name != "api");
        let text = m.render();
        assert!(
            !text.contains("resourcewatch_time_to_oom_seconds"),
            "a deleted watch leaves no series"
        );
        m.findings.set(&key, &status());
        m.findings.clear();
        assert!(!m.render().contains("resourcewatch_leak_confidence_ratio"));
    }
}
