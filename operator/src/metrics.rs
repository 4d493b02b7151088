//! Prometheus metrics, served on `/metrics` beside `/healthz` and `/readyz`.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

type Labels = Vec<(&'static str, String)>;

pub struct Metrics {
    registry: Registry,
    pub reconciliations: Family<Labels, Counter>,
    pub reconcile_seconds: Histogram,
    /// Status writes by result (`ok`, `error`, `timeout`).
    pub status_writes: Family<Labels, Counter>,
    pub status_skipped: Counter,
    pub events: Family<Labels, Counter>,
    pub agents_connected: Gauge,
    pub reports: Counter,
    pub config_pushes: Counter,
    pub config_nacks: Counter,
    pub protocol_errors: Family<Labels, Counter>,
    pub leader: Gauge,
    /// Remediation decisions and outcomes, by reason.
    pub remediations: Family<Labels, Counter>,
    pub watches: Gauge,
    /// Agent streams refused by identity checks, by reason (no_token, node_mismatch, ...).
    pub agent_auth_failures: Family<Labels, Counter>,
    /// Report entries dropped before they reached the hub, by reason (not_on_node, ...).
    pub report_entries_dropped: Family<Labels, Counter>,
    /// Admission reviews of ResourceWatches, by result (authorized, not_authorized, ...).
    pub admission_reviews: Family<Labels, Counter>,
    /// Set once the controller runs: `/readyz` answers 200 from then on.
    pub ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("resourcewatch_operator");
        let m = Self {
            reconciliations: Family::default(),
            reconcile_seconds: Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0]),
            status_writes: Family::default(),
            status_skipped: Counter::default(),
            events: Family::default(),
            agents_connected: Gauge::default(),
            reports: Counter::default(),
            config_pushes: Counter::default(),
            config_nacks: Counter::default(),
            protocol_errors: Family::default(),
            leader: Gauge::default(),
            remediations: Family::default(),
            watches: Gauge::default(),
            agent_auth_failures: Family::default(),
            report_entries_dropped: Family::default(),
            admission_reviews: Family::default(),
            ready: AtomicBool::new(false),
            registry: Registry::default(),
        };
        registry.register(
            "reconciliations",
            "Reconciliations by result",
            m.reconciliations.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time per reconciliation",
            m.reconcile_seconds.clone(),
        );
        registry.register(
            "status_writes",
            "Status writes by result (ok, error, timeout)",
            m.status_writes.clone(),
        );
        registry.register(
            "status_writes_skipped",
            "Reconciliations that found nothing new to write",
            m.status_skipped.clone(),
        );
        registry.register(
            "events",
            "Kubernetes Events published, by reason",
            m.events.clone(),
        );
        registry.register(
            "agents_connected",
            "Node agents holding a stream",
            m.agents_connected.clone(),
        );
        registry.register(
            "agent_reports",
            "Reports received from agents",
            m.reports.clone(),
        );
        registry.register(
            "config_pushes",
            "Configuration snapshots sent to agents",
            m.config_pushes.clone(),
        );
        registry.register(
            "config_nacks",
            "Configuration snapshots agents refused",
            m.config_nacks.clone(),
        );
        registry.register(
            "protocol_errors",
            "Agent streams ended for a protocol error, by kind",
            m.protocol_errors.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease",
            m.leader.clone(),
        );
        registry.register("remediations", "Pre-OOM remediation outcomes, by reason (Evicted, PodDisruptionBudget, Cooldown, DryRun, ...)", m.remediations.clone());
        registry.register("watches", "ResourceWatch objects known", m.watches.clone());
        registry.register(
            "agent_auth_failures",
            "Agent streams refused because the token did not prove the claimed node, by reason",
            m.agent_auth_failures.clone(),
        );
        registry.register(
            "report_entries_dropped",
            "Report entries dropped before use (another node's pods, duplicates, NaN, over a cap), by reason",
            m.report_entries_dropped.clone(),
        );
        registry.register(
            "admission_reviews",
            "ResourceWatch admission reviews, by result",
            m.admission_reviews.clone(),
        );
        Self { registry, ..m }
    }
}

impl Metrics {
    pub fn protocol_error(&self, kind: &'static str) {
        self.protocol_errors
            .get_or_create(&vec![("kind", kind.to_string())])
            .inc();
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

    pub fn remediation(&self, reason: &str) {
        self.remediations
            .get_or_create(&vec![("reason", reason.to_string())])
            .inc();
    }

    pub fn labelled(family: &Family<Labels, Counter>, key: &'static str, value: &str, n: u64) {
        family
            .get_or_create(&vec![(key, value.to_string())])
            .inc_by(n);
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

pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(serve_metrics))
        .route("/healthz", get(|| async { "ok" }))
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

async fn readyz(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    if m.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}
