//! The agent hub: which pods each watch targets, the configuration each node must run,
//! and what each node's agent last said. Kube-free and transport-free, so the reconciler
//! and the gRPC layer are tested against it directly.
//!
//! Versions: every configuration a node is sent carries a version from one counter seeded
//! with the wall clock at start (microseconds), so versions only grow, also across an
//! operator restart, and an agent can tell a stale snapshot from a new one.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use resourcewatch_operator_core::nodes;
pub use resourcewatch_operator_core::nodes::{
    NodeScope, NodeView, ProfileOrder, TargetPod, WatchKey, WatchTargets,
};
use resourcewatch_proto as pb;
use tokio::sync::{mpsc, oneshot, watch};

/// Sketch geometry and report cadence for nodes no watch constrains.
#[derive(Clone, Debug)]
pub struct HubOptions {
    pub sketch_depth: u32,
    pub sketch_width: u32,
    /// Report cadence of a node no watch targets (its node Top-K still matters).
    pub idle_report_interval: Duration,
    /// A node whose agent has not reported for this long after the operator started or
    /// after its stream ended counts as missing (`Degraded`, `AgentLost`). Shorter would
    /// turn every operator restart and agent rollout into Events.
    pub agent_grace: Duration,
}

impl Default for HubOptions {
    fn default() -> Self {
        Self {
            sketch_depth: 4,
            sketch_width: 1024,
            idle_report_interval: Duration::from_secs(30),
            agent_grace: Duration::from_secs(20),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HubError {
    #[error("hello: node_name is empty")]
    NoNodeName,
    #[error(
        "the agent speaks protocol versions {0}..={1}, this operator {min}..={max}: upgrade the older of the two (docs/operations.md, Upgrades and version skew)",
        min = resourcewatch_proto::MIN_PROTOCOL_VERSION,
        max = resourcewatch_proto::PROTOCOL_VERSION
    )]
    Protocol(u32, u32),
    #[error("node {0}: no session")]
    NoSession(String),
    #[error("node {node}: ack for version {version}, which was never sent to it")]
    UnknownVersion { node: String, version: u64 },
    #[error("node {node}: a profile result for request {id:?}, which it was not sent")]
    UnaskedProfile { node: String, id: String },
}

struct NodeState {
    config: pb::NodeConfig,
    config_tx: watch::Sender<pb::NodeConfig>,
    session: Option<SessionState>,
    /// When the node last stopped reporting (stream end), or the hub's start.
    lost_at: Instant,
    acked: Option<u64>,
    nack: Option<(u64, String)>,
    sent: BTreeSet<u64>,
    capabilities: Option<pb::Capabilities>,
    last_report: Option<LastReport>,
}

/// A node's latest report, and the report interval its agent was configured with when
/// it sent it.
struct LastReport {
    at: Instant,
    report: Arc<pb::Report>,
    interval: Duration,
}

impl LastReport {
    /// Whether it still stands for the node at `now`: within three intervals (at least
    /// 5 s), of the interval it was made under or the node's current one, whichever is
    /// longer. A node moved from the idle 30 s cadence to a watch's 5 s one keeps its
    /// last report until its first one at the new cadence, instead of reading as not
    /// reporting (and showing no process) in between.
    fn fresh(&self, now: Instant, current: Duration) -> bool {
        let fresh_for = self
            .interval
            .max(current)
            .saturating_mul(3)
            .max(Duration::from_secs(5));
        now.duration_since(self.at) < fresh_for
    }
}

struct SessionState {
    id: u64,
    /// Dropping it ends the session (a newer stream from the same node replaced it).
    _kill: oneshot::Sender<()>,
}

pub struct Hub {
    opts: HubOptions,
    inner: Mutex<Inner>,
    next_version: AtomicU64,
    next_session: AtomicU64,
    started: Instant,
    /// Bumped when a node connects, disconnects or refuses a configuration, so the
    /// controller re-reconciles without waiting for its next interval.
    changed: watch::Sender<u64>,
    /// Watches for the controller to reconcile at once: a confident leak in a fresh
    /// report (a remediation decision must not wait for the watch's next interval: at
    /// 8 MiB/s a 128Mi container lives about 16 s), or a profile result to store.
    /// Bounded; when full, a trigger is dropped and the periodic reconcile acts instead.
    trigger_tx: mpsc::Sender<WatchKey>,
    trigger_rx: Mutex<Option<mpsc::Receiver<WatchKey>>>,
    /// Watches with a pod a node reported for the first time: their new pod's first row
    /// is written at its next reconcile, which the controller gathers like a pod's change
    /// (controller::watches). Bounded like `trigger_tx`.
    first_tx: mpsc::Sender<WatchKey>,
    first_rx: Mutex<Option<mpsc::Receiver<WatchKey>>>,
    /// How many pod changes were put into a node's configuration in place (tests).
    #[cfg(test)]
    edited_in_place: AtomicU64,
}

#[derive(Default)]
struct Inner {
    watches: BTreeMap<WatchKey, WatchTargets>,
    /// The watches with a pod (or a profile order) on each node: a change of one watch
    /// recomputes only its nodes' configurations, not every node's (at 20,000 pods and
    /// 500 watches the full recomputation per changed watch was most of the operator's CPU).
    by_node: BTreeMap<String, BTreeSet<WatchKey>>,
    /// ClusterResourceWatches, by name.
    scopes: BTreeMap<String, NodeScope>,
    nodes: BTreeMap<String, NodeState>,
    /// Profile results not yet taken by their watch's reconcile, by request id. Bounded:
    /// only requests a node was sent are kept, at most MAX_PROFILES_PER_NODE per node.
    profiles: BTreeMap<String, pb::ProfileResult>,
}

/// A connected agent's handle: its configuration feed, and a signal when replaced.
pub struct Session {
    pub id: u64,
    pub node: String,
    /// The protocol version chosen for this stream (what its NodeConfigs say).
    pub protocol: u32,
    pub config: watch::Receiver<pb::NodeConfig>,
    pub replaced: oneshot::Receiver<()>,
}

impl Hub {
    pub fn new(opts: HubOptions) -> Self {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(1);
        let (trigger_tx, trigger_rx) = mpsc::channel(TRIGGER_CAPACITY);
        let (first_tx, first_rx) = mpsc::channel(TRIGGER_CAPACITY);
        Self {
            opts,
            inner: Mutex::new(Inner::default()),
            next_version: AtomicU64::new(seed),
            next_session: AtomicU64::new(1),
            started: Instant::now(),
            changed: watch::channel(0).0,
            trigger_tx,
            trigger_rx: Mutex::new(Some(trigger_rx)),
            first_tx,
            first_rx: Mutex::new(Some(first_rx)),
            #[cfg(test)]
            edited_in_place: AtomicU64::new(0),
        }
    }

    /// The stream of watches to reconcile now: a report shows a leak in one of their
    /// containers at or above their `minConfidence`, or a profile they asked for has its
    /// result. There is one consumer: the first call takes it, later calls get `None`.
    pub fn take_reconcile_triggers(&self) -> Option<mpsc::Receiver<WatchKey>> {
        self.trigger_rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// The stream of watches a node has just reported a pod of for the first time. One
    /// consumer, as [`Hub::take_reconcile_triggers`].
    pub fn take_first_report_triggers(&self) -> Option<mpsc::Receiver<WatchKey>> {
        self.first_rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    pub fn options(&self) -> &HubOptions {
        &self.opts
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notified (value bumped) when some node's connection state changes.
    pub fn subscribe_changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn notify(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Sets what a watch targets; nodes whose configuration changes get a new version.
    pub fn set_watch(&self, key: WatchKey, mut targets: WatchTargets) {
        targets.sort_pods();
        let mut inner = self.lock();
        if inner.watches.get(&key) == Some(&targets) {
            return;
        }
        let before = inner.watches.get(&key).map(nodes_of).unwrap_or_default();
        let after = nodes_of(&targets);
        index(&mut inner.by_node, &key, &before, &after);
        let touched = changed_nodes(inner.watches.get(&key), &targets);
        inner.watches.insert(key, targets);
        self.recompute(&mut inner, touched);
    }

    /// One pod of a watch changed: `pod` is its target now (`None`: the watch no longer
    /// targets it: deleted, finished, its labels moved out). The nodes it left or joined
    /// get their configurations at once, without waiting for the watch's reconcile, which
    /// for a watch of thousands of pods is gathered longer (controller::watches). A watch
    /// the hub does not hold (not reconciled yet, or its spec invalid) is left to its
    /// reconcile.
    pub fn update_pod(&self, key: &WatchKey, uid: &str, pod: Option<TargetPod>) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let Some(w) = inner.watches.get_mut(key) else {
            return;
        };
        let new_node = pod.as_ref().map(|p| p.node.clone());
        let change = w.put_pod(uid, pod);
        if change.touched.is_empty() {
            return;
        }
        let old_node = change.old.as_ref().map(|p| p.node.as_str());
        let w = &inner.watches[key];
        let mut rebuild = BTreeSet::new();
        for node in change.touched {
            if w.is_on(&node) {
                inner
                    .by_node
                    .entry(node.clone())
                    .or_default()
                    .insert(key.clone());
            } else if let Some(keys) = inner.by_node.get_mut(&node) {
                keys.remove(key);
                if keys.is_empty() {
                    inner.by_node.remove(&node);
                }
            }
            // The watch's own pods on the node before and after this pod's change.
            let after = w.pods_on(&node).len();
            let before = after + usize::from(old_node == Some(node.as_str()))
                - usize::from(new_node.as_deref() == Some(node.as_str()));
            let edited = before > 0
                && after > 0
                && self.edit_target(
                    &inner.by_node,
                    &inner.watches,
                    &mut inner.nodes,
                    (key, &node, uid),
                );
            if !edited {
                rebuild.insert(node);
            }
        }
        self.recompute(inner, rebuild);
    }

    /// Puts one pod's change into `node`'s configuration in place, when that is all that
    /// changes there: the watch `key` had pods on the node before and still has (so the
    /// K, cadence and leak settings merged from the node's watches are the same, and so
    /// are its profiles), and no other watch on the node targets the pod (its target is
    /// this watch's copy). `false`: the caller rebuilds the node's configuration.
    /// Rebuilding a node's whole configuration for each pod's change, and comparing it
    /// with the one sent, was most of `Hub::update_pod`'s cost (11 % of the operator's CPU
    /// at 2,000 pods: e2e/scale/profiles/2026-11-29-ci-scale-head.txt).
    fn edit_target(
        &self,
        by_node: &BTreeMap<String, BTreeSet<WatchKey>>,
        watches: &BTreeMap<WatchKey, WatchTargets>,
        nodes: &mut BTreeMap<String, NodeState>,
        (key, node, uid): (&WatchKey, &str, &str),
    ) -> bool {
        let Some(pods) = watches.get(key).map(|w| w.pods_on(node)) else {
            return false;
        };
        let shared = by_node.get(node).into_iter().flatten().any(|k| {
            k != key
                && watches.get(k).is_some_and(|o| {
                    o.pods_on(node)
                        .binary_search_by(|p| p.uid.as_str().cmp(uid))
                        .is_ok()
                })
        });
        let Some(n) = nodes.get_mut(node) else {
            return false;
        };
        if shared || n.config.targets.is_empty() {
            return false;
        }
        let now = pods
            .binary_search_by(|p| p.uid.as_str().cmp(uid))
            .ok()
            .map(|i| nodes::target_pod(&pods[i]));
        let targets = &mut n.config.targets;
        match (targets.binary_search_by(|t| t.uid.as_str().cmp(uid)), now) {
            (Ok(i), Some(t)) if targets[i] == t => return true,
            (Ok(i), Some(t)) => targets[i] = t,
            (Ok(i), None) => {
                targets.remove(i);
            }
            (Err(i), Some(t)) => targets.insert(i, t),
            (Err(_), None) => return true,
        }
        #[cfg(test)]
        self.edited_in_place.fetch_add(1, Ordering::Relaxed);
        n.config.version = self.next_version();
        n.sent.insert(n.config.version);
        n.config_tx.send_replace(n.config.clone());
        true
    }

    /// How many pods a watch targets, and its interval; `None` for a watch the hub does
    /// not hold.
    pub fn watch_size(&self, key: &WatchKey) -> Option<(usize, Duration)> {
        self.lock()
            .watches
            .get(key)
            .map(|w| (w.pods.len(), w.interval))
    }

    pub fn remove_watch(&self, key: &WatchKey) {
        let mut inner = self.lock();
        if let Some(old) = inner.watches.remove(key) {
            let before = nodes_of(&old);
            index(&mut inner.by_node, key, &before, &BTreeSet::new());
            self.recompute(&mut inner, before);
        }
    }

    /// Sets what a ClusterResourceWatch asks of its nodes; nodes whose configuration
    /// changes get a new version.
    pub fn set_node_scope(&self, name: &str, scope: NodeScope) {
        let mut inner = self.lock();
        if inner.scopes.get(name) == Some(&scope) {
            return;
        }
        let mut touched = scope.nodes.clone();
        if let Some(old) = inner.scopes.insert(name.to_owned(), scope) {
            touched.extend(old.nodes);
        }
        self.recompute(&mut inner, touched);
    }

    pub fn remove_node_scope(&self, name: &str) {
        let mut inner = self.lock();
        if let Some(old) = inner.scopes.remove(name) {
            self.recompute(&mut inner, old.nodes);
        }
    }

    pub fn node_scope_names(&self) -> Vec<String> {
        self.lock().scopes.keys().cloned().collect()
    }

    pub fn watch_keys(&self) -> Vec<WatchKey> {
        self.lock().watches.keys().cloned().collect()
    }

    /// The configuration `node` must run (see [`nodes::desired`]).
    fn desired_for(&self, inner: &Inner, node: &str) -> Option<pb::NodeConfig> {
        let watches = inner
            .by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|k| inner.watches.get(k));
        nodes::desired(node, watches, inner.scopes.values(), &self.idle_config())
    }

    /// The configuration of a node no watch targets: its agent still reports the node's
    /// Top-K, at a relaxed cadence.
    fn idle_config(&self) -> pb::NodeConfig {
        pb::NodeConfig {
            version: 0,
            top_k: 10,
            sketch_depth: self.opts.sketch_depth,
            sketch_width: self.opts.sketch_width,
            report_interval_ms: self.opts.idle_report_interval.as_millis() as u64,
            leak: Some(pb::LeakSettings {
                enabled: false,
                min_confidence: 60,
                horizon_secs: 0,
            }),
            targets: Vec::new(),
            profiles: Vec::new(),
            // Set per stream, to the version negotiated with its agent (grpc.rs).
            protocol_version: 0,
        }
    }

    /// Brings the configurations of `names` up to date; a node whose configuration
    /// changes gets a new version.
    fn recompute(&self, inner: &mut Inner, names: BTreeSet<String>) {
        // Whether some node stopped asking for a profile (its result is then never taken).
        let mut dropped_profiles = false;
        for name in &names {
            let desired = self.desired_for(inner, name);
            let targeted = desired.is_some();
            let body = desired.unwrap_or_else(|| self.idle_config());
            match inner.nodes.get_mut(name) {
                Some(n) => {
                    if same_body(&n.config, &body) {
                        continue;
                    }
                    dropped_profiles |= n
                        .config
                        .profiles
                        .iter()
                        .any(|p| !body.profiles.iter().any(|q| q.id == p.id));
                    let c = pb::NodeConfig {
                        version: self.next_version(),
                        ..body
                    };
                    n.sent.insert(c.version);
                    n.config = c.clone();
                    n.config_tx.send_replace(c);
                }
                None if targeted => {
                    let c = pb::NodeConfig {
                        version: self.next_version(),
                        ..body
                    };
                    let state = self.new_node(c);
                    inner.nodes.insert(name.clone(), state);
                }
                None => {}
            }
        }
        // Forget nodes nothing targets and no agent is connected from. Only the nodes
        // recomputed can have stopped being targeted (a node whose agent left is swept
        // by the next connect): walking all 1,000 nodes for each pod's change cost 7 % of
        // the operator's CPU.
        let now = Instant::now();
        for name in &names {
            self.forget_if_unused(inner, name, now);
        }
        if !dropped_profiles || inner.profiles.is_empty() {
            return;
        }
        // Results of requests no node runs any more (failed at their deadline, or the
        // watch went away) are never taken.
        let asked: BTreeSet<&String> = inner
            .nodes
            .values()
            .flat_map(|n| n.config.profiles.iter().map(|p| &p.id))
            .collect();
        let keep: BTreeSet<String> = asked.into_iter().cloned().collect();
        inner.profiles.retain(|id, _| keep.contains(id));
    }

    /// Drops `name`'s state when nothing targets it and no agent has been connected from
    /// it for the agent grace: a node targeted again soon after its agent left keeps the
    /// time it was lost, so it is `missing` only once the grace has passed.
    fn forget_if_unused(&self, inner: &mut Inner, name: &str, now: Instant) {
        // `lost_at` is the operator's start for a node no agent ever connected from.
        let gone = inner.nodes.get(name).is_some_and(|n| {
            let left_lately =
                n.lost_at != self.started && now.duration_since(n.lost_at) <= self.opts.agent_grace;
            n.session.is_none() && !left_lately
        });
        let unused = gone
            && !inner.by_node.contains_key(name)
            && !inner.scopes.values().any(|s| s.nodes.contains(name));
        if unused {
            inner.nodes.remove(name);
        }
    }

    fn new_node(&self, c: pb::NodeConfig) -> NodeState {
        let mut sent = BTreeSet::new();
        sent.insert(c.version);
        NodeState {
            config_tx: watch::channel(c.clone()).0,
            config: c,
            session: None,
            lost_at: self.started,
            acked: None,
            nack: None,
            sent,
            capabilities: None,
            last_report: None,
        }
    }

    fn next_version(&self) -> u64 {
        self.next_version.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// A new stream from an agent. A previous stream from the same node is ended.
    pub fn connect(&self, hello: &pb::Hello) -> Result<Session, HubError> {
        if hello.node_name.is_empty() {
            return Err(HubError::NoNodeName);
        }
        let Some(protocol) = resourcewatch_proto::negotiate(
            resourcewatch_proto::SPOKEN_PROTOCOL_VERSIONS,
            hello.min_protocol_version,
            hello.protocol_version,
        ) else {
            return Err(HubError::Protocol(
                hello.min_protocol_version,
                hello.protocol_version,
            ));
        };
        let mut inner = self.lock();
        // Nodes whose agents left, that nothing targets, forgotten once their grace has
        // passed: here, as connects are rare (an agent's start), not per pod change.
        let now = Instant::now();
        let names: Vec<String> = inner
            .nodes
            .iter()
            .filter(|(_, n)| n.session.is_none())
            .map(|(name, _)| name.clone())
            .collect();
        for name in names {
            self.forget_if_unused(&mut inner, &name, now);
        }
        if !inner.nodes.contains_key(&hello.node_name) {
            let body = self
                .desired_for(&inner, &hello.node_name)
                .unwrap_or_else(|| self.idle_config());
            let c = pb::NodeConfig {
                version: self.next_version(),
                ..body
            };
            let state = self.new_node(c);
            inner.nodes.insert(hello.node_name.clone(), state);
        }
        let n = inner
            .nodes
            .get_mut(&hello.node_name)
            .ok_or_else(|| HubError::NoSession(hello.node_name.clone()))?;
        let (kill, replaced) = oneshot::channel();
        let id = self.next_session.fetch_add(1, Ordering::SeqCst);
        n.session = Some(SessionState { id, _kill: kill });
        n.capabilities = hello.capabilities.clone().map(|mut c| {
            crate::validate::capabilities(&mut c);
            c
        });
        n.nack = None;
        // The receiver starts "unseen", so the session sends the full snapshot first.
        let mut config = n.config_tx.subscribe();
        config.mark_changed();
        drop(inner);
        self.notify();
        Ok(Session {
            id,
            node: hello.node_name.clone(),
            protocol,
            config,
            replaced,
        })
    }

    /// The stream of a session ended (agent gone, network, or replaced).
    pub fn disconnect(&self, node: &str, session: u64) {
        let mut inner = self.lock();
        if let Some(n) = inner.nodes.get_mut(node)
            && n.session.as_ref().is_some_and(|s| s.id == session)
        {
            n.session = None;
            n.lost_at = Instant::now();
            n.last_report = None;
            drop(inner);
            self.notify();
        }
    }

    pub fn ack(&self, node: &str, session: u64, ack: &pb::ConfigAck) -> Result<(), HubError> {
        let mut inner = self.lock();
        let n = session_node(&mut inner.nodes, node, session)?;
        if !n.sent.contains(&ack.version) {
            return Err(HubError::UnknownVersion {
                node: node.into(),
                version: ack.version,
            });
        }
        let changed = if ack.accepted {
            n.acked = Some(n.acked.map_or(ack.version, |a| a.max(ack.version)));
            n.nack.take().is_some()
        } else {
            let mut reason = ack.reason.clone();
            crate::validate::truncate(&mut reason, crate::validate::MAX_TEXT);
            n.nack = Some((ack.version, reason));
            true
        };
        drop(inner);
        if changed {
            self.notify();
        }
        Ok(())
    }

    /// Stores a node's report, cleaned first ([`crate::validate::report`]): it may speak
    /// only for the containers this node was asked to track. Returns what was dropped.
    pub fn report(
        &self,
        node: &str,
        session: u64,
        mut report: pb::Report,
    ) -> Result<crate::validate::Dropped, HubError> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let n = session_node(&mut inner.nodes, node, session)?;
        let dropped =
            crate::validate::report(&mut report, &crate::validate::NodeTargets::new(&n.config));
        let first = n.last_report.is_none();
        let leaking = leaking_watches(&inner.watches, &report);
        let before = n.last_report.as_ref().map(|l| &*l.report);
        let first_reported = first_reported(&inner.by_node, &inner.watches, node, before, &report);
        n.last_report = Some(LastReport {
            at: Instant::now(),
            report: Arc::new(report),
            interval: Duration::from_millis(n.config.report_interval_ms),
        });
        drop(guard);
        if first {
            self.notify();
        }
        for key in leaking {
            // Full: the controller is behind; its periodic reconcile covers this watch.
            let _ = self.trigger_tx.try_send(key);
        }
        for key in first_reported {
            // Full: the row waits for the watch's interval, as it did before.
            let _ = self.first_tx.try_send(key);
        }
        Ok(dropped)
    }

    /// Stores a node's profile result for its watch's next reconcile, which is triggered
    /// now. A result for a request this node was not sent (or no longer is) is refused.
    pub fn profile_result(
        &self,
        node: &str,
        session: u64,
        mut result: pb::ProfileResult,
    ) -> Result<(), HubError> {
        let mut inner = self.lock();
        let n = session_node(&mut inner.nodes, node, session)?;
        if !n.config.profiles.iter().any(|p| p.id == result.id) {
            return Err(HubError::UnaskedProfile {
                node: node.into(),
                id: result.id,
            });
        }
        // The agent bounds its outputs; a result over the bound loses its flame graph
        // first, then everything but the summary.
        let size = |r: &pb::ProfileResult| r.folded.len() + r.pprof.len() + r.svg.len();
        if size(&result) > resourcewatch_proto::MAX_PROFILE_BYTES {
            result.svg.clear();
        }
        if size(&result) > resourcewatch_proto::MAX_PROFILE_BYTES {
            result.folded.clear();
            result.pprof.clear();
            result.error = "the profile's outputs exceeded their bound".into();
        }
        let owner = inner
            .watches
            .iter()
            .find(|(_, w)| w.profile.as_ref().is_some_and(|p| p.id == result.id))
            .map(|(k, _)| k.clone());
        inner.profiles.insert(result.id.clone(), result);
        drop(inner);
        if let Some(key) = owner {
            // Full: the controller is behind; the watch's periodic reconcile takes it.
            let _ = self.trigger_tx.try_send(key);
        }
        Ok(())
    }

    /// The result of a profile request, as the node sent it (bounded, see
    /// [`Hub::profile_result`]); kept until [`Hub::forget_profile_result`], so a
    /// reconcile whose status write fails finds it again.
    pub fn profile_result_of(&self, id: &str) -> Option<pb::ProfileResult> {
        self.lock().profiles.get(id).cloned()
    }

    /// Drops a result once a status naming its outcome is written.
    pub fn forget_profile_result(&self, id: &str) {
        self.lock().profiles.remove(id);
    }

    /// The current configuration of a node (tests, diagnostics).
    pub fn config(&self, node: &str) -> Option<pb::NodeConfig> {
        self.lock().nodes.get(node).map(|n| n.config.clone())
    }

    /// The state of the named nodes, known or not.
    pub fn view(&self, nodes: &BTreeSet<String>) -> Vec<NodeView> {
        let inner = self.lock();
        let now = Instant::now();
        nodes
            .iter()
            .map(|name| match inner.nodes.get(name) {
                None => NodeView {
                    name: name.clone(),
                    missing: now.duration_since(self.started) > self.opts.agent_grace,
                    ..Default::default()
                },
                Some(n) => {
                    let interval = Duration::from_millis(n.config.report_interval_ms);
                    let reporting = n.session.is_some()
                        && n.last_report
                            .as_ref()
                            .is_some_and(|r| r.fresh(now, interval));
                    let lost_since = match (&n.session, &n.last_report) {
                        (Some(_), Some(r)) => r.at,
                        _ => n.lost_at,
                    };
                    NodeView {
                        name: name.clone(),
                        connected: n.session.is_some(),
                        reporting,
                        missing: !reporting
                            && now.duration_since(lost_since.max(self.started))
                                > self.opts.agent_grace,
                        config_version: Some(n.config.version),
                        acked_version: n.acked,
                        nack: n.nack.clone(),
                        capabilities: n.capabilities.clone(),
                        last_report: reporting
                            .then(|| n.last_report.as_ref().map(|r| r.report.clone()))
                            .flatten(),
                    }
                }
            })
            .collect()
    }

    pub fn connected_agents(&self) -> usize {
        self.lock()
            .nodes
            .values()
            .filter(|n| n.session.is_some())
            .count()
    }
}

const TRIGGER_CAPACITY: usize = 256;

/// The watches that target a container this report shows leaking at or above the
/// watch's own confidence floor.
/// The nodes a watch has a pod or a profile order on.
fn nodes_of(w: &WatchTargets) -> BTreeSet<String> {
    w.by_node()
        .map(|(node, _)| node.to_owned())
        .chain(w.profile.as_ref().map(|o| o.node.clone()))
        .collect()
}

/// The nodes whose configuration a watch's change can alter: where its pods (or its
/// profile order) differ, or all of its nodes when what it asks of them (K, cadence, leak
/// settings) changed. One pod more in a watch of 2,000 pods on 1,000 nodes is one node to
/// recompute, not 1,000.
fn changed_nodes(old: Option<&WatchTargets>, new: &WatchTargets) -> BTreeSet<String> {
    let Some(old) = old else {
        return nodes_of(new);
    };
    let asks = |w: &WatchTargets| {
        (
            w.top_k,
            w.interval,
            w.leaks_enabled,
            w.min_confidence,
            w.horizon,
        )
    };
    if asks(old) != asks(new) {
        return nodes_of(old).union(&nodes_of(new)).cloned().collect();
    }
    // Both sorted (`WatchTargets::sort_pods`): one walk over the two node orders.
    let (mut a, mut b) = (old.by_node().peekable(), new.by_node().peekable());
    let mut out = BTreeSet::new();
    loop {
        let differs = match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(&(n, _)), None) => {
                a.next();
                Some(n)
            }
            (None, Some(&(n, _))) => {
                b.next();
                Some(n)
            }
            (Some(&(na, pa)), Some(&(nb, pb))) => match na.cmp(nb) {
                std::cmp::Ordering::Less => {
                    a.next();
                    Some(na)
                }
                std::cmp::Ordering::Greater => {
                    b.next();
                    Some(nb)
                }
                std::cmp::Ordering::Equal => {
                    a.next();
                    b.next();
                    (pa != pb).then_some(na)
                }
            },
        };
        out.extend(differs.map(str::to_owned));
    }
    if old.profile != new.profile {
        out.extend(
            old.profile
                .iter()
                .chain(new.profile.iter())
                .map(|o| o.node.clone()),
        );
    }
    out
}

/// Moves `key` in the node index from the nodes `before` to the nodes `after`.
fn index(
    by_node: &mut BTreeMap<String, BTreeSet<WatchKey>>,
    key: &WatchKey,
    before: &BTreeSet<String>,
    after: &BTreeSet<String>,
) {
    for n in before.difference(after) {
        if let Some(keys) = by_node.get_mut(n) {
            keys.remove(key);
            if keys.is_empty() {
                by_node.remove(n);
            }
        }
    }
    for n in after.difference(before) {
        by_node.entry(n.clone()).or_default().insert(key.clone());
    }
}

/// The watches targeting a pod on `node` that this report shows and the node's report
/// `before` it did not (a new pod's first figures, or every pod of a node's first report).
fn first_reported(
    by_node: &BTreeMap<String, BTreeSet<WatchKey>>,
    watches: &BTreeMap<WatchKey, WatchTargets>,
    node: &str,
    before: Option<&pb::Report>,
    report: &pb::Report,
) -> Vec<WatchKey> {
    let Some(keys) = by_node.get(node) else {
        return Vec::new();
    };
    let mut known: Vec<&str> = before
        .into_iter()
        .flat_map(|r| r.containers.iter().map(|c| c.pod_uid.as_str()))
        .collect();
    known.sort_unstable();
    let mut new: Vec<&str> = report
        .containers
        .iter()
        .map(|c| c.pod_uid.as_str())
        .filter(|u| known.binary_search(u).is_err())
        .collect();
    if new.is_empty() {
        return Vec::new();
    }
    new.sort_unstable();
    new.dedup();
    keys.iter()
        .filter(|k| {
            watches.get(*k).is_some_and(|w| {
                // A node's pods of one watch are in UID order (`WatchTargets::sort_pods`).
                let on = w.pods_on(node);
                new.iter()
                    .any(|u| on.binary_search_by(|p| p.uid.as_str().cmp(u)).is_ok())
            })
        })
        .cloned()
        .collect()
}

fn leaking_watches(
    watches: &BTreeMap<WatchKey, WatchTargets>,
    report: &pb::Report,
) -> Vec<WatchKey> {
    // Most reports carry no leak: skip the walk over every watch.
    if report.leaks.is_empty() {
        return Vec::new();
    }
    watches
        .iter()
        .filter(|(_, w)| {
            w.remediates
                && w.leaks_enabled
                && report.leaks.iter().any(|l| {
                    l.confidence >= u32::from(w.min_confidence)
                        && w.pods.iter().any(|p| {
                            p.uid == l.pod_uid
                                && p.containers.iter().any(|(_, id)| *id == l.container_id)
                        })
                })
        })
        .map(|(k, _)| k.clone())
        .collect()
}

/// The node's state, if `session` is its current stream (a replaced stream speaks no more).
fn session_node<'a>(
    nodes: &'a mut BTreeMap<String, NodeState>,
    node: &str,
    session: u64,
) -> Result<&'a mut NodeState, HubError> {
    nodes
        .get_mut(node)
        .filter(|n| n.session.as_ref().is_some_and(|s| s.id == session))
        .ok_or_else(|| HubError::NoSession(node.into()))
}

/// Whether two configurations ask the same of a node (their versions aside). Field by
/// field, naming every field so that a new one cannot be left out: cloning both to blank
/// their versions was an allocation per targeted pod of each node recomputed.
fn same_body(a: &pb::NodeConfig, b: &pb::NodeConfig) -> bool {
    let pb::NodeConfig {
        version: _,
        top_k,
        sketch_depth,
        sketch_width,
        report_interval_ms,
        leak,
        targets,
        profiles,
        protocol_version,
    } = a;
    *top_k == b.top_k
        && *sketch_depth == b.sketch_depth
        && *sketch_width == b.sketch_width
        && *report_interval_ms == b.report_interval_ms
        && *leak == b.leak
        && *targets == b.targets
        && *profiles == b.profiles
        && *protocol_version == b.protocol_version
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    fn pod(uid: &str, node: &str) -> TargetPod {
        TargetPod {
            uid: uid.into(),
            namespace: "ns".into(),
            name: format!("pod-{uid}"),
            node: node.into(),
            containers: vec![("app".into(), format!("cid-{uid}"))],
        }
    }

    fn targets(k: u32, interval_s: u64, pods: Vec<TargetPod>) -> WatchTargets {
        WatchTargets {
            top_k: k,
            interval: Duration::from_secs(interval_s),
            leaks_enabled: true,
            min_confidence: 60,
            horizon: Duration::from_secs(7200),
            remediates: false,
            pods,
            profile: None,
        }
    }

    fn key(name: &str) -> WatchKey {
        WatchKey {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn hello(node: &str) -> pb::Hello {
        pb::Hello {
            node_name: node.into(),
            protocol_version: resourcewatch_proto::PROTOCOL_VERSION,
            min_protocol_version: resourcewatch_proto::MIN_PROTOCOL_VERSION,
            ..Default::default()
        }
    }

    #[test]
    fn a_profile_goes_to_its_node_only_and_only_that_node_may_answer() {
        let hub = Hub::new(HubOptions::default());
        let order = ProfileOrder {
            id: "p1".into(),
            pod_uid: "1".into(),
            node: "n1".into(),
            container_ids: vec!["cid-1".into()],
            duration: Duration::from_secs(10),
            frequency_hz: 99,
            namespace: "ns".into(),
            pod: "p1".into(),
            container_names: [("cid-1".to_owned(), "app".to_owned())].into(),
        };
        let mut t = targets(5, 30, vec![pod("1", "n1"), pod("2", "n2")]);
        t.profile = Some(order);
        hub.set_watch(key("a"), t.clone());
        let n1 = hub.config("n1").unwrap();
        assert_eq!(n1.profiles.len(), 1);
        assert_eq!(
            (n1.profiles[0].duration_ms, n1.profiles[0].frequency_hz),
            (10_000, 99)
        );
        assert!(hub.config("n2").unwrap().profiles.is_empty());
        let s1 = hub.connect(&hello("n1")).unwrap();
        let s2 = hub.connect(&hello("n2")).unwrap();
        let mut triggers = hub.take_reconcile_triggers().unwrap();
        let result = pb::ProfileResult {
            id: "p1".into(),
            samples: 5,
            ..Default::default()
        };
        // Another node cannot answer for it.
        assert!(matches!(
            hub.profile_result("n2", s2.id, result.clone()),
            Err(HubError::UnaskedProfile { .. })
        ));
        assert!(hub.profile_result_of("p1").is_none());
        // Its node can; the watch is reconciled at once; the result stays until a status
        // naming it is written.
        hub.profile_result("n1", s1.id, result).unwrap();
        assert_eq!(triggers.try_recv().unwrap(), key("a"));
        assert_eq!(hub.profile_result_of("p1").unwrap().samples, 5);
        assert_eq!(hub.profile_result_of("p1").unwrap().samples, 5);
        hub.forget_profile_result("p1");
        assert!(hub.profile_result_of("p1").is_none());
        // Oversized outputs lose the flame graph first.
        let big = pb::ProfileResult {
            id: "p1".into(),
            folded: "x 1\n".into(),
            svg: vec![b'<'; resourcewatch_proto::MAX_PROFILE_BYTES],
            ..Default::default()
        };
        hub.profile_result("n1", s1.id, big).unwrap();
        let kept = hub.profile_result_of("p1").unwrap();
        hub.forget_profile_result("p1");
        assert!(kept.svg.is_empty() && kept.folded == "x 1\n" && kept.error.is_empty());
        // Once the request is no longer ordered, a late result is refused, and one not
        // not yet forgotten is dropped.
        let bare = || pb::ProfileResult {
            id: "p1".into(),
            ..Default::default()
        };
        hub.profile_result("n1", s1.id, bare()).unwrap();
        t.profile = None;
        hub.set_watch(key("a"), t);
        assert!(hub.config("n1").unwrap().profiles.is_empty());
        assert!(hub.profile_result_of("p1").is_none());
        assert!(hub.profile_result("n1", s1.id, bare()).is_err());
    }

    #[test]
    fn nodes_get_the_union_of_their_pods_and_the_strictest_settings() {
        let hub = Hub::new(HubOptions::default());
        hub.set_watch(
            key("a"),
            targets(5, 30, vec![pod("1", "n1"), pod("2", "n2")]),
        );
        hub.set_watch(
            key("b"),
            targets(20, 10, vec![pod("2", "n2"), pod("3", "n2")]),
        );
        let n1 = hub.config("n1").expect("n1 configured");
        let n2 = hub.config("n2").expect("n2 configured");
        assert_eq!(n1.targets.len(), 1);
        assert_eq!((n1.top_k, n1.report_interval_ms), (5, 15_000));
        let uids: Vec<&str> = n2.targets.iter().map(|t| t.uid.as_str()).collect();
        assert_eq!(uids, ["2", "3"], "pod 2 once, though two watches select it");
        assert_eq!((n2.top_k, n2.report_interval_ms), (20, 5_000));
        assert_eq!(n2.targets[0].containers[0].container_id, "cid-2");
    }

    #[test]
    fn a_node_scope_raises_k_and_cadence_on_its_nodes_only() {
        let hub = Hub::new(HubOptions::default());
        hub.set_watch(key("a"), targets(5, 30, vec![pod("1", "n1")]));
        let scope = |k, s, nodes: &[&str]| NodeScope {
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            top_k: k,
            interval: Duration::from_secs(s),
        };
        hub.set_node_scope("view", scope(25, 10, &["n1", "n3"]));
        let n1 = hub.config("n1").expect("n1");
        assert_eq!((n1.top_k, n1.report_interval_ms), (25, 5_000));
        assert_eq!(n1.targets.len(), 1, "the watch's targets stay");
        let n3 = hub
            .config("n3")
            .expect("a node only the view selects is configured");
        assert_eq!(
            (n3.top_k, n3.report_interval_ms, n3.targets.len()),
            (25, 5_000, 0)
        );
        assert!(n3.leak.is_some_and(|l| !l.enabled));
        // A slower view does not slow a watch's node down; removing it restores the watch's.
        hub.set_node_scope("view", scope(3, 120, &["n1"]));
        let n1 = hub.config("n1").expect("n1");
        assert_eq!((n1.top_k, n1.report_interval_ms), (5, 15_000));
        hub.remove_node_scope("view");
        assert_eq!(hub.config("n1").expect("n1").top_k, 5);
        assert!(
            hub.config("n3").is_none(),
            "nothing targets n3 and no agent is there"
        );
    }

    #[test]
    fn versions_grow_only_when_a_node_configuration_changes() {
        let hub = Hub::new(HubOptions::default());
        hub.set_watch(
            key("a"),
            targets(5, 30, vec![pod("1", "n1"), pod("2", "n2")]),
        );
        let (v1, v2) = (
            hub.config("n1").unwrap().version,
            hub.config("n2").unwrap().version,
        );
        hub.set_watch(
            key("a"),
            targets(5, 30, vec![pod("1", "n1"), pod("2", "n2")]),
        );
        assert_eq!(
            hub.config("n1").unwrap().version,
            v1,
            "same spec: no new version"
        );
        hub.set_watch(
            key("a"),
            targets(5, 30, vec![pod("1", "n1"), pod("3", "n2")]),
        );
        assert_eq!(hub.config("n1").unwrap().version, v1, "n1 unchanged");
        assert!(hub.config("n2").unwrap().version > v2, "n2 changed");
        hub.remove_watch(&key("a"));
        assert!(
            hub.config("n1").is_none(),
            "nothing targets n1 and no agent is there"
        );
    }

    #[test]
    fn a_change_of_one_watch_recomputes_its_nodes_from_every_watch_there() {
        let hub = Hub::new(HubOptions::default());
        let uids = |node: &str| -> Vec<String> {
            hub.config(node)
                .map(|c| c.targets.iter().map(|t| t.uid.clone()).collect())
                .unwrap_or_default()
        };
        hub.set_watch(
            key("a"),
            targets(5, 30, vec![pod("1", "n1"), pod("2", "n2")]),
        );
        hub.set_watch(key("b"), targets(20, 10, vec![pod("3", "n1")]));
        assert_eq!(uids("n1"), ["1", "3"]);
        let n3_before = hub.config("n3");
        // Pod 1 moves to n3: n1 keeps b's pod and b's K and cadence.
        hub.set_watch(
            key("a"),
            targets(5, 30, vec![pod("1", "n3"), pod("2", "n2")]),
        );
        assert_eq!(uids("n1"), ["3"]);
        assert_eq!(uids("n3"), ["1"]);
        assert!(n3_before.is_none());
        let n1 = hub.config("n1").expect("n1");
        assert_eq!((n1.top_k, n1.report_interval_ms), (20, 5000));
        // b goes: n1 has no watch and no agent, so it is forgotten; n2 and n3 stay.
        hub.remove_watch(&key("b"));
        assert!(hub.config("n1").is_none());
        assert_eq!(
            (uids("n2"), uids("n3")),
            (vec!["2".to_string()], vec!["1".to_string()])
        );
        // The same pod in two watches is one target.
        hub.set_watch(key("c"), targets(5, 30, vec![pod("2", "n2")]));
        assert_eq!(uids("n2"), ["2"]);
    }

    #[test]
    fn only_the_nodes_where_a_watch_changed_are_recomputed() {
        let set =
            |names: &[&str]| -> BTreeSet<String> { names.iter().map(|n| n.to_string()).collect() };
        // As set_watch keeps them: sorted by node.
        let sorted = |mut t: WatchTargets| {
            t.sort_pods();
            t
        };
        let old = sorted(targets(
            5,
            30,
            vec![pod("1", "n1"), pod("2", "n2"), pod("3", "n3")],
        ));
        assert_eq!(changed_nodes(None, &old), set(&["n1", "n2", "n3"]));
        let mut more = old.clone();
        more.pods.push(pod("4", "n2"));
        let more = sorted(more);
        assert_eq!(changed_nodes(Some(&old), &more), set(&["n2"]));
        assert_eq!(changed_nodes(Some(&more), &old), set(&["n2"]));
        let mut reordered = old.clone();
        reordered.pods.reverse();
        assert!(changed_nodes(Some(&old), &sorted(reordered)).is_empty());
        let moved = sorted(targets(
            5,
            30,
            vec![pod("1", "n4"), pod("2", "n2"), pod("3", "n3")],
        ));
        assert_eq!(changed_nodes(Some(&old), &moved), set(&["n1", "n4"]));
        let first_and_last = sorted(targets(
            5,
            30,
            vec![pod("0", "n0"), pod("2", "n2"), pod("9", "n9")],
        ));
        assert_eq!(
            changed_nodes(Some(&old), &first_and_last),
            set(&["n0", "n1", "n3", "n9"])
        );
        assert_eq!(
            old.pods_on("n2")
                .iter()
                .map(|p| p.uid.as_str())
                .collect::<Vec<_>>(),
            ["2"]
        );
        assert_eq!(more.pods_on("n2").len(), 2);
        assert!(old.pods_on("n0").is_empty() && old.pods_on("n9").is_empty());
        let larger_k = targets(9, 30, old.pods.clone());
        assert_eq!(
            changed_nodes(Some(&old), &larger_k),
            set(&["n1", "n2", "n3"])
        );
    }

    #[test]
    fn a_pod_moved_by_its_event_configures_its_nodes_as_a_full_set_would() {
        let (moved, full) = (
            Hub::new(HubOptions::default()),
            Hub::new(HubOptions::default()),
        );
        let start = vec![pod("1", "n1"), pod("2", "n2"), pod("3", "n2")];
        moved.set_watch(key("a"), targets(5, 30, start.clone()));
        // Another watch on n1 keeps that node targeted when "a" leaves it.
        moved.set_watch(key("b"), targets(3, 60, vec![pod("9", "n1")]));
        full.set_watch(key("b"), targets(3, 60, vec![pod("9", "n1")]));
        let versions = |h: &Hub| -> Vec<(String, u64)> {
            ["n1", "n2", "n3"]
                .iter()
                .filter_map(|n| Some((n.to_string(), h.config(n)?.version)))
                .collect()
        };
        let before = versions(&moved);
        // Unchanged: nothing is recomputed.
        moved.update_pod(&key("a"), "2", Some(pod("2", "n2")));
        assert_eq!(versions(&moved), before);
        // Pod 1 rescheduled from n1 to n3 (a new pod under the same UID, for the test),
        // pod 3 gone, pod 4 new on n2, a pod of a watch the hub does not hold ignored.
        moved.update_pod(&key("a"), "1", Some(pod("1", "n3")));
        moved.update_pod(&key("a"), "3", None);
        moved.update_pod(&key("a"), "4", Some(pod("4", "n2")));
        moved.update_pod(&key("unknown"), "5", Some(pod("5", "n1")));
        assert!(moved.watch_size(&key("unknown")).is_none());
        assert_eq!(
            moved.watch_size(&key("a")),
            Some((3, Duration::from_secs(30)))
        );
        full.set_watch(
            key("a"),
            targets(5, 30, vec![pod("1", "n3"), pod("2", "n2"), pod("4", "n2")]),
        );
        for n in ["n1", "n2", "n3"] {
            let (a, b) = (moved.config(n).unwrap(), full.config(n).unwrap());
            assert!(same_body(&a, &b), "{n}: {a:?} != {b:?}");
        }
        assert_eq!(
            moved.config("n1").unwrap().targets.len(),
            1,
            "only b's pod is left on n1"
        );
        let inner = moved.lock();
        assert_eq!(inner.by_node["n1"], BTreeSet::from([key("b")]));
        assert_eq!(inner.by_node["n3"], BTreeSet::from([key("a")]));
        let a = &inner.watches[&key("a")];
        let mut sorted = a.clone();
        sorted.sort_pods();
        assert_eq!(a.pods, sorted.pods, "the node order is kept");
        drop(inner);
        // The last pod of "a" on n3 goes: the node is no longer targeted by it.
        moved.update_pod(&key("a"), "1", None);
        assert!(!moved.lock().by_node.contains_key("n3"));
    }

    #[test]
    fn pods_changed_one_by_one_configure_every_node_as_a_full_rebuild_would() {
        // Three watches with different K and cadence over four nodes, pods sharing UIDs
        // across watches (a pod two watches target), containers starting and pods moving:
        // after each change, every node's configuration is what rebuilding all of them
        // from the watches' pods gives (the in-place edit must never drift from it).
        let hub = Hub::new(HubOptions::default());
        let watches = [(key("a"), 5, 30), (key("b"), 3, 10), (key("c"), 8, 60)];
        let mut model: BTreeMap<WatchKey, BTreeMap<String, TargetPod>> = BTreeMap::new();
        for (k, top_k, every) in &watches {
            let first = pod("1", "n1");
            hub.set_watch(k.clone(), targets(*top_k, *every, vec![first.clone()]));
            model
                .entry(k.clone())
                .or_default()
                .insert("1".into(), first);
        }
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut versions = BTreeMap::new();
        for step in 0..600 {
            let k = &watches[next(3) as usize].0;
            let uid = (1 + next(6)).to_string();
            let target = (next(5) != 0).then(|| {
                let mut p = pod(&uid, &format!("n{}", 1 + next(4)));
                p.containers[0].1 = format!("cid-{}", next(3));
                p
            });
            hub.update_pod(k, &uid, target.clone());
            let pods = model.entry(k.clone()).or_default();
            match target {
                Some(p) => pods.insert(uid, p),
                None => pods.remove(&uid),
            };
            let full = Hub::new(HubOptions::default());
            for (k2, k2_top, k2_every) in &watches {
                let pods = model[k2].values().cloned().collect();
                full.set_watch(k2.clone(), targets(*k2_top, *k2_every, pods));
            }
            for n in ["n1", "n2", "n3", "n4"] {
                match (hub.config(n), full.config(n)) {
                    (Some(a), Some(b)) => {
                        assert!(same_body(&a, &b), "step {step}, {n}: {a:?} != {b:?}");
                        let old = versions.insert(n, (a.version, a));
                        if let Some((v, before)) = old {
                            let (now, ref cfg) = versions[n];
                            assert_eq!(
                                now != v,
                                !same_body(&before, cfg),
                                "step {step}, {n}: a new version iff a new body"
                            );
                        }
                    }
                    (None, None) => {
                        versions.remove(n);
                    }
                    (a, b) => panic!("step {step}, {n}: {a:?} against {b:?}"),
                }
            }
        }
        let edited = hub.edited_in_place.load(Ordering::Relaxed);
        assert!(
            edited > 100,
            "{edited} changes edited in place: the test misses that path"
        );
    }

    #[tokio::test]
    async fn a_session_starts_with_the_full_snapshot_and_sees_updates() {
        let hub = Hub::new(HubOptions::default());
        hub.set_watch(key("a"), targets(5, 30, vec![pod("1", "n1")]));
        let mut s = hub.connect(&hello("n1")).expect("connects");
        assert!(s.config.has_changed().unwrap(), "snapshot pending at once");
        let first = s.config.borrow_and_update().clone();
        assert_eq!(first.targets.len(), 1);
        hub.set_watch(
            key("a"),
            targets(5, 30, vec![pod("1", "n1"), pod("2", "n1")]),
        );
        s.config.changed().await.expect("update");
        let second = s.config.borrow_and_update().clone();
        assert!(second.version > first.version);
        assert_eq!(second.targets.len(), 2);
        hub.ack(
            "n1",
            s.id,
            &pb::ConfigAck {
                version: second.version,
                accepted: true,
                reason: String::new(),
            },
        )
        .expect("ack");
        assert_eq!(
            hub.ack(
                "n1",
                s.id,
                &pb::ConfigAck {
                    version: 7,
                    accepted: true,
                    reason: String::new()
                }
            ),
            Err(HubError::UnknownVersion {
                node: "n1".into(),
                version: 7
            })
        );
    }

    #[test]
    fn a_confident_leak_of_a_targeted_container_triggers_its_watch_at_once() {
        let hub = Hub::new(HubOptions::default());
        let mut triggers = hub.take_reconcile_triggers().expect("first take");
        assert!(hub.take_reconcile_triggers().is_none(), "one consumer");
        let acting = |pods| WatchTargets {
            remediates: true,
            ..targets(5, 30, pods)
        };
        hub.set_watch(key("a"), acting(vec![pod("1", "n1")]));
        let mut strict = acting(vec![pod("1", "n1")]);
        strict.min_confidence = 90;
        hub.set_watch(key("strict"), strict);
        hub.set_watch(key("other"), acting(vec![pod("2", "n1")]));
        // Only reports: its interval's reconcile shows the leak.
        hub.set_watch(key("reports"), targets(5, 30, vec![pod("1", "n1")]));
        let s = hub.connect(&hello("n1")).expect("connects");
        let leak = |uid: &str, confidence| pb::Report {
            leaks: vec![pb::Leak {
                pod_uid: uid.into(),
                container_id: format!("cid-{uid}"),
                confidence,
                ..Default::default()
            }],
            ..Default::default()
        };
        // Below every floor, an untargeted pod, no leak at all: nothing.
        hub.report("n1", s.id, leak("1", 59)).expect("report");
        hub.report("n1", s.id, leak("9", 99)).expect("report");
        hub.report("n1", s.id, pb::Report::default())
            .expect("report");
        assert!(triggers.try_recv().is_err());
        // 70: the acting watch with floor 60 only; 95: both acting watches of pod 1, never
        // "other" or "reports".
        hub.report("n1", s.id, leak("1", 70)).expect("report");
        assert_eq!(triggers.try_recv().expect("triggered"), key("a"));
        assert!(triggers.try_recv().is_err());
        hub.report("n1", s.id, leak("1", 95)).expect("report");
        let mut got = vec![triggers.try_recv().unwrap(), triggers.try_recv().unwrap()];
        got.sort();
        assert_eq!(got, vec![key("a"), key("strict")]);
        assert!(triggers.try_recv().is_err());
    }

    #[test]
    fn a_pod_reported_for_the_first_time_triggers_the_watches_targeting_it() {
        let hub = Hub::new(HubOptions::default());
        let mut first = hub.take_first_report_triggers().expect("first take");
        assert!(hub.take_first_report_triggers().is_none(), "one consumer");
        hub.set_watch(
            key("a"),
            targets(5, 30, vec![pod("1", "n1"), pod("3", "n1")]),
        );
        hub.set_watch(key("b"), targets(5, 30, vec![pod("2", "n1")]));
        hub.set_watch(key("elsewhere"), targets(5, 30, vec![pod("4", "n2")]));
        let s = hub.connect(&hello("n1")).expect("connects");
        let shows = |uids: &[&str]| pb::Report {
            containers: uids
                .iter()
                .map(|u| pb::ContainerReport {
                    pod_uid: u.to_string(),
                    container_id: format!("cid-{u}"),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let got = |rx: &mut mpsc::Receiver<WatchKey>| {
            let mut v = Vec::new();
            while let Ok(k) = rx.try_recv() {
                v.push(k.name);
            }
            v.sort();
            v
        };
        // The node's first report: each watch with a pod in it, once.
        hub.report("n1", s.id, shows(&["1", "3"])).expect("report");
        assert_eq!(got(&mut first), ["a"]);
        // The same pods again: nothing. A pod shown for the first time: its watch only.
        hub.report("n1", s.id, shows(&["1", "3"])).expect("report");
        assert!(got(&mut first).is_empty());
        hub.report("n1", s.id, shows(&["1", "2", "3"]))
            .expect("report");
        assert_eq!(got(&mut first), ["b"]);
        // A pod the node was not asked to track is dropped from the report, triggers
        // nothing; one that left the report and comes back counts again.
        hub.report("n1", s.id, shows(&["1", "4"])).expect("report");
        assert!(got(&mut first).is_empty());
        hub.report("n1", s.id, shows(&["1", "3"])).expect("report");
        assert_eq!(got(&mut first), ["a"]);
    }

    #[test]
    fn a_second_stream_replaces_the_first_and_bad_hellos_are_refused() {
        let hub = Hub::new(HubOptions::default());
        let mut a = hub.connect(&hello("n1")).expect("first");
        let b = hub.connect(&hello("n1")).expect("second");
        assert!(
            a.replaced
                .try_recv()
                .is_err_and(|e| e == oneshot::error::TryRecvError::Closed)
        );
        hub.disconnect("n1", a.id);
        assert_eq!(
            hub.connected_agents(),
            1,
            "the old session ending leaves the new one"
        );
        hub.disconnect("n1", b.id);
        assert_eq!(hub.connected_agents(), 0);
        assert_eq!(hub.connect(&hello("")).err(), Some(HubError::NoNodeName));
        let mut old = hello("n1");
        (old.min_protocol_version, old.protocol_version) = (99, 99);
        assert!(matches!(hub.connect(&old), Err(HubError::Protocol(99, 99))));
        // A Hello without its minimum is no offer.
        let mut bare = hello("n1");
        bare.min_protocol_version = 0;
        assert!(matches!(hub.connect(&bare), Err(HubError::Protocol(0, _))));
        // One release newer: it offers this operator's version too, and gets it.
        let newer = pb::Hello {
            min_protocol_version: resourcewatch_proto::PROTOCOL_VERSION,
            protocol_version: resourcewatch_proto::PROTOCOL_VERSION + 1,
            ..hello("n2")
        };
        let s = hub.connect(&newer).expect("an agent one release newer");
        assert_eq!(s.protocol, resourcewatch_proto::PROTOCOL_VERSION);
        // Offering only newer versions: refused, the message naming both ranges.
        let ahead = pb::Hello {
            min_protocol_version: resourcewatch_proto::PROTOCOL_VERSION + 1,
            ..newer
        };
        let Err(err) = hub.connect(&ahead) else {
            panic!("no common version, yet connected")
        };
        assert!(err.to_string().contains("upgrade the older"), "{err}");
    }

    #[test]
    fn a_node_is_forgotten_once_untargeted_and_its_agent_gone_for_the_grace() {
        // Long enough that no stall of a loaded test machine passes it unseen.
        let grace = Duration::from_millis(300);
        let past = grace + Duration::from_millis(100);
        let hub = Hub::new(HubOptions {
            agent_grace: grace,
            ..Default::default()
        });
        let held = |hub: &Hub, n: &str| hub.lock().nodes.contains_key(n);
        // Past the operator's own start-up grace, so only a node's own loss time counts.
        std::thread::sleep(past);
        hub.set_watch(
            key("a"),
            targets(5, 30, vec![pod("1", "n1"), pod("2", "n2")]),
        );
        let s1 = hub.connect(&hello("n1")).expect("connects");
        // Untargeted while connected: kept (its agent still reports the node's Top-K).
        hub.update_pod(&key("a"), "1", None);
        assert!(held(&hub, "n1") && held(&hub, "n2"));
        // Its agent gone: kept through the grace (targeted again now, it is not missing
        // yet), then swept by the next agent's connect.
        hub.disconnect("n1", s1.id);
        hub.update_pod(&key("a"), "1", Some(pod("1", "n1")));
        let n1: BTreeSet<String> = ["n1".to_string()].into();
        assert!(!hub.view(&n1)[0].missing, "within the grace since it left");
        hub.update_pod(&key("a"), "1", None);
        assert!(held(&hub, "n1"));
        std::thread::sleep(past);
        let _s3 = hub.connect(&hello("n3")).expect("connects");
        assert!(!held(&hub, "n1"), "untargeted, and gone past the grace");
        // Gone while targeted: kept (it is missing) until untargeted past the grace.
        let s2 = hub.connect(&hello("n2")).expect("connects");
        hub.disconnect("n2", s2.id);
        std::thread::sleep(past);
        let n2: BTreeSet<String> = ["n2".to_string()].into();
        assert!(held(&hub, "n2") && hub.view(&n2)[0].missing);
        hub.remove_watch(&key("a"));
        assert!(!held(&hub, "n2"), "gone past the grace, then untargeted");
    }

    #[test]
    fn nodes_are_missing_only_after_the_grace() {
        let hub = Hub::new(HubOptions {
            agent_grace: Duration::from_millis(50),
            ..Default::default()
        });
        hub.set_watch(key("a"), targets(5, 30, vec![pod("1", "n1")]));
        let nodes: BTreeSet<String> = ["n1".to_string()].into();
        assert!(!hub.view(&nodes)[0].missing, "within the startup grace");
        std::thread::sleep(Duration::from_millis(80));
        assert!(hub.view(&nodes)[0].missing);
        let s = hub.connect(&hello("n1")).expect("connects");
        hub.report("n1", s.id, pb::Report::default())
            .expect("report");
        let v = &hub.view(&nodes)[0];
        assert!(v.reporting && !v.missing && v.last_report.is_some());
        hub.disconnect("n1", s.id);
        let v = &hub.view(&nodes)[0];
        assert!(!v.reporting && !v.missing, "just lost: still within grace");
        std::thread::sleep(Duration::from_millis(80));
        assert!(hub.view(&nodes)[0].missing);
    }

    /// A report made at a long interval stands until the agent reports at the new, shorter
    /// one: moved from the idle cadence to a watch's, the node does not read as silent.
    #[test]
    fn a_report_stays_fresh_for_the_interval_it_was_made_under() {
        let t0 = Instant::now();
        let r = LastReport {
            at: t0,
            report: Arc::default(),
            interval: Duration::from_secs(30),
        };
        let at = |s| t0 + Duration::from_secs(s);
        // Now at a 1 s cadence: 20 s later, still the node's latest word.
        assert!(r.fresh(at(20), Duration::from_secs(1)));
        assert!(r.fresh(at(89), Duration::from_secs(1)));
        assert!(!r.fresh(at(91), Duration::from_secs(1)));
        // Made at 1 s, now at 30 s: the longer one counts too.
        let r = LastReport {
            interval: Duration::from_secs(1),
            ..r
        };
        assert!(r.fresh(at(60), Duration::from_secs(30)));
        assert!(
            !r.fresh(at(6), Duration::from_secs(1)),
            "5 s at least, 3 intervals"
        );
    }
}
