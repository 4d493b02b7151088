//! The rails' one source of truth: a small record per workload (Deployment, StatefulSet,
//! DaemonSet, ReplicaSet), owned by the operator and kept in a ConfigMap in its own
//! namespace, where tenants cannot write. It holds the workload's recent restarts and at
//! most one pending restart, whatever watches select the workload, and survives operator
//! restarts. Writes carry the resourceVersion read: two reconciles deciding at once for
//! one workload cannot both record an intent (the second gets a conflict and decides
//! again, seeing the first's).
//!
//! The watches' `status.remediations` is only a log for people: nothing read back from it
//! can allow an eviction. It can only refuse one: a ledger that is missing while the
//! status (or this process's memory) shows restarts of the workload within the window
//! was deleted, and the rails it held are not known (see [`LedgerStore::read`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// A workload, e.g. `team-a/Deployment/api`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Workload {
    pub namespace: String,
    /// `Deployment/api`
    pub kind_name: String,
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.kind_name)
    }
}

impl Workload {
    /// The ConfigMap's name: a DNS label whatever the workload's name.
    pub fn record_name(&self) -> String {
        let d = ring::digest::digest(&ring::digest::SHA256, self.to_string().as_bytes());
        let hex: String = d.as_ref()[..10]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("resourcewatch-ledger-{hex}")
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Restart {
    pub pod: String,
    pub pod_uid: String,
    /// Seconds since the epoch.
    pub at: i64,
    /// The watch that decided it, `namespace/name`.
    pub by: String,
}

/// A restart decided and recorded, not yet confirmed done.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Intent {
    pub pod: String,
    pub pod_uid: String,
    pub at: i64,
    /// After this the intent is void: the predicted OOM would have happened by then.
    pub expires: i64,
    pub by: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ledger {
    #[serde(default)]
    pub restarts: Vec<Restart>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Intent>,
}

/// Restarts older than this are forgotten (longer than any sensible `window`; the
/// operator's floor for `window` is far below).
pub const KEEP_SECONDS: i64 = 7 * 86_400;
pub const KEEP_RESTARTS: usize = 50;

impl Ledger {
    /// The pending intent, unless it has expired.
    pub fn live_pending(&self, now: i64) -> Option<&Intent> {
        self.pending.as_ref().filter(|p| p.expires > now)
    }

    pub fn prune(&mut self, now: i64) {
        self.restarts.retain(|r| now - r.at < KEEP_SECONDS);
        let n = self.restarts.len();
        if n > KEEP_RESTARTS {
            self.restarts.drain(..n - KEEP_RESTARTS);
        }
    }
}

/// A ledger as read, with the version a write must match (None: no record yet).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Versioned {
    pub ledger: Ledger,
    pub resource_version: Option<String>,
    /// Why this ledger cannot be trusted (then nothing may be evicted from the workload,
    /// and nothing written over the record); None when it can.
    pub problem: Option<LedgerProblem>,
}

/// A ledger that cannot be trusted, and why (the text is for people).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LedgerProblem {
    /// Missing although restarts of the workload within its window are known.
    Lost(String),
    /// There, but not a ledger this operator can read.
    Unreadable(String),
    /// Its writes keep losing to another writer (see [`Contention`]).
    Contended(String),
}

impl LedgerProblem {
    pub fn reason(&self) -> crate::model::RemediationReason {
        match self {
            LedgerProblem::Lost(_) => crate::model::RemediationReason::LedgerLost,
            LedgerProblem::Unreadable(_) => crate::model::RemediationReason::LedgerUnreadable,
            LedgerProblem::Contended(_) => crate::model::RemediationReason::LedgerConflict,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            LedgerProblem::Lost(m) | LedgerProblem::Unreadable(m) | LedgerProblem::Contended(m) => {
                m
            }
        }
    }
}

/// Lost write races per ledger. One conflict is two watches deciding for a workload at
/// once: the loser reads again and decides again. A run of them, each within
/// [`Contention::RUN_GAP`] of the last, means something else keeps rewriting the record
/// (another operator instance, a person, a tool): the rails it holds are then not this
/// operator's to trust, so from [`Contention::BLOCK_AFTER`] conflicts on the workload is
/// not restarted until [`Contention::HOLD`] passes without one.
/// A lost race counts only once a read shows who won: a version this operator wrote
/// (another of its watches deciding for the same workload) does not count.
#[derive(Debug, Default)]
pub struct Contention {
    runs: std::collections::HashMap<String, Run>,
    /// The last resourceVersion this process wrote, per ledger.
    ours: std::collections::HashMap<String, String>,
    /// Ledgers whose last write lost and whose winner is not known yet.
    lost: std::collections::HashSet<String>,
}

#[derive(Clone, Copy, Debug)]
struct Run {
    conflicts: u32,
    last: i64,
}

impl Contention {
    pub const BLOCK_AFTER: u32 = 3;
    pub const RUN_GAP: i64 = 60;
    pub const HOLD: i64 = 30;
    /// Ledgers tracked at most (a run is forgotten after [`Self::RUN_GAP`] anyway).
    const CAP: usize = 4096;

    pub fn lost_race(&mut self, name: &str) {
        if self.lost.len() < Self::CAP {
            self.lost.insert(name.to_owned());
        }
    }

    /// A read of the ledger at `resource_version` (None: it is gone): counts the race
    /// lost before it if someone else won it.
    pub fn observed(&mut self, name: &str, resource_version: Option<&str>, now: i64) {
        if self.lost.remove(name)
            && resource_version.is_some()
            && self.ours.get(name).map(String::as_str) != resource_version
        {
            self.conflict(name, now);
        }
    }

    fn conflict(&mut self, name: &str, now: i64) {
        if self.runs.len() >= Self::CAP {
            self.runs.retain(|_, r| now - r.last < Self::RUN_GAP);
        }
        let run = self.runs.entry(name.to_owned()).or_insert(Run {
            conflicts: 0,
            last: now,
        });
        if now - run.last >= Self::RUN_GAP {
            run.conflicts = 0;
        }
        run.conflicts += 1;
        run.last = now;
    }

    pub fn written(&mut self, name: &str, resource_version: &str) {
        self.runs.remove(name);
        self.lost.remove(name);
        if self.ours.len() >= Self::CAP && !self.ours.contains_key(name) {
            self.ours.clear();
        }
        self.ours
            .insert(name.to_owned(), resource_version.to_owned());
    }

    /// `(conflicts in the run, seconds since the last)` while the ledger is blocked.
    pub fn blocked(&self, name: &str, now: i64) -> Option<(u32, i64)> {
        let run = self.runs.get(name)?;
        (run.conflicts >= Self::BLOCK_AFTER && now - run.last < Self::HOLD)
            .then_some((run.conflicts, now - run.last))
    }
}

/// What else is known of a workload's restarts when its ledger is read: the newest
/// restart the watch's own status records, and how long a restart still counts (the
/// watch's `window`, or its `cooldown` when longer).
#[derive(Clone, Copy, Debug, Default)]
pub struct Known {
    pub last_restart_in_status: Option<i64>,
    pub counts_for: i64,
    pub now: i64,
}

const KEY: &str = "ledger.json";

/// Reads and writes ledgers in the operator's namespace.
#[derive(Clone)]
pub struct LedgerStore {
    api: Api<ConfigMap>,
    timeout: std::time::Duration,
    /// The newest restart (or intent) each ledger held when this process last read or
    /// wrote it, by record name: a ledger that disappears after holding one is noticed
    /// even when no watch's status recorded it (another watch's restart).
    seen: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, i64>>>,
    contention: std::sync::Arc<std::sync::Mutex<Contention>>,
}

/// A write lost the race: read again and decide again.
#[derive(Debug)]
pub struct Conflict;

impl LedgerStore {
    pub fn new(client: Client, namespace: &str, timeout: std::time::Duration) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            timeout,
            seen: Default::default(),
            contention: Default::default(),
        }
    }

    fn remember(&self, w: &Workload, ledger: &Ledger) {
        let newest = ledger
            .restarts
            .iter()
            .map(|r| r.at)
            .chain(ledger.pending.iter().map(|p| p.at))
            .max();
        if let Some(t) = newest {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            let e = seen.entry(w.record_name()).or_insert(t);
            *e = (*e).max(t);
        }
    }

    /// Reads a workload's ledger, failing closed: a record that cannot be parsed, or one
    /// that is missing although restarts of the workload within `known.counts_for` are
    /// known (from the watch's status or this process's memory), comes back with a
    /// `problem`, and then nothing is evicted from the workload or written over it. Such
    /// a block ends when those restarts age out of the window, or when a cluster admin
    /// deletes the unreadable record.
    pub async fn read(&self, w: &Workload, known: Known) -> Result<Versioned> {
        let name = w.record_name();
        let got = tokio::time::timeout(self.timeout, self.api.get_opt(&name))
            .await
            .map_err(|_| Error::Timeout("ledger read"))??;
        let ns = self.api.namespace().unwrap_or_default().to_owned();
        Ok(match got {
            None => {
                self.contention
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .observed(&name, None, known.now);
                let remembered = self
                    .seen
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&name)
                    .copied();
                let last = remembered.max(known.last_restart_in_status);
                let problem = last.filter(|t| known.now - t < known.counts_for).map(|t| {
                    LedgerProblem::Lost(format!(
                        "the ledger of {w} (ConfigMap {ns}/{name}) is gone although it recorded a restart (or the intent of one) {}s ago: its rails are unknown, so it is not restarted until {}s after that",
                        known.now - t,
                        known.counts_for
                    ))
                });
                Versioned {
                    problem,
                    ..Default::default()
                }
            }
            Some(cm) => {
                let parsed = cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get(KEY))
                    .ok_or_else(|| format!("no {KEY}"))
                    .and_then(|j| serde_json::from_str::<Ledger>(j).map_err(|e| e.to_string()));
                let contended = {
                    let mut c = self.contention.lock().unwrap_or_else(|e| e.into_inner());
                    c.observed(&name, cm.metadata.resource_version.as_deref(), known.now);
                    c.blocked(&name, known.now)
                };
                match parsed {
                    Ok(ledger) => {
                        self.remember(w, &ledger);
                        Versioned {
                            ledger,
                            resource_version: cm.metadata.resource_version,
                            problem: contended.map(|(n, ago)| {
                                LedgerProblem::Contended(format!(
                                    "writes to the ledger of {w} (ConfigMap {ns}/{name}) lost {n} races in a row to another writer, the last {ago}s ago: its rails are not this operator's alone, so it is not restarted until {}s pass without one",
                                    Contention::HOLD
                                ))
                            }),
                        }
                    }
                    Err(e) => Versioned {
                        resource_version: cm.metadata.resource_version,
                        problem: Some(LedgerProblem::Unreadable(format!(
                            "the ledger of {w} (ConfigMap {ns}/{name}) is unreadable ({e}): a cluster admin repairs or deletes it"
                        ))),
                        ..Default::default()
                    },
                }
            }
        })
    }

    pub async fn write(
        &self,
        w: &Workload,
        ledger: &Ledger,
        resource_version: Option<&str>,
    ) -> Result<std::result::Result<String, Conflict>> {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(w.record_name()),
                resource_version: resource_version.map(str::to_owned),
                labels: Some(BTreeMap::from([
                    ("app.kubernetes.io/part-of".into(), "resourcewatch".into()),
                    ("resourcewatch.io/ledger".into(), "true".into()),
                ])),
                annotations: Some(BTreeMap::from([(
                    "resourcewatch.io/workload".into(),
                    w.to_string(),
                )])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                KEY.into(),
                serde_json::to_string(ledger).map_err(|e| Error::Internal(e.to_string()))?,
            )])),
            ..Default::default()
        };
        let pp = PostParams::default();
        let call = async {
            match resource_version {
                None => self.api.create(&pp, &cm).await,
                Some(_) => self.api.replace(&w.record_name(), &pp, &cm).await,
            }
        };
        match tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| Error::Timeout("ledger write"))?
        {
            Ok(cm) => {
                self.remember(w, ledger);
                let rv = cm.metadata.resource_version.unwrap_or_default();
                self.contention
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .written(&w.record_name(), &rv);
                Ok(Ok(rv))
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                self.contention
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .lost_race(&w.record_name());
                Ok(Err(Conflict))
            }
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_names_are_dns_labels_and_distinct() {
        let a = Workload {
            namespace: "ns".into(),
            kind_name: "Deployment/api".into(),
        };
        let b = Workload {
            namespace: "ns".into(),
            kind_name: "StatefulSet/api".into(),
        };
        assert_ne!(a.record_name(), b.record_name());
        assert!(a.record_name().len() <= 63);
        assert!(
            a.record_name()
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        );
    }

    /// A race lost, then a read at `rv`.
    fn lose(c: &mut Contention, rv: &str, now: i64) {
        c.lost_race("a");
        c.observed("a", Some(rv), now);
    }

    #[test]
    fn a_run_of_races_lost_to_another_writer_blocks_for_a_while() {
        let mut c = Contention::default();
        c.written("a", "10");
        lose(&mut c, "11", 100);
        lose(&mut c, "12", 101);
        assert_eq!(
            c.blocked("a", 101),
            None,
            "two races are two deciders at once"
        );
        lose(&mut c, "13", 102);
        assert_eq!(c.blocked("a", 110), Some((3, 8)));
        assert_eq!(c.blocked("b", 110), None, "per ledger");
        assert_eq!(
            c.blocked("a", 102 + Contention::HOLD),
            None,
            "the hold ends"
        );
        // A run is consecutive: races far apart start it again.
        let mut c = Contention::default();
        for (i, t) in [0, Contention::RUN_GAP, 2 * Contention::RUN_GAP]
            .into_iter()
            .enumerate()
        {
            lose(&mut c, &i.to_string(), t);
        }
        assert_eq!(c.blocked("a", 2 * Contention::RUN_GAP), None);
        // A successful write ends the run.
        let mut c = Contention::default();
        for (i, t) in [0, 1, 2].into_iter().enumerate() {
            lose(&mut c, &i.to_string(), t);
        }
        c.written("a", "9");
        assert_eq!(c.blocked("a", 3), None);
    }

    #[test]
    fn races_lost_to_this_operators_own_writes_do_not_count() {
        // Four watches of one workload decide at once, again and again: each time one
        // wins (its version is ours) and three lose to it.
        let mut c = Contention::default();
        for round in 0..5 {
            let rv = format!("{}", 100 + round);
            c.written("a", &rv);
            for _ in 0..3 {
                lose(&mut c, &rv, round);
            }
        }
        assert_eq!(c.blocked("a", 5), None);
        // A race whose winner is not known yet (the ledger is gone) does not count either.
        c.lost_race("a");
        c.observed("a", None, 6);
        assert_eq!(c.blocked("a", 6), None);
    }

    #[test]
    fn expired_intents_are_not_pending_and_history_is_bounded() {
        let mut l = Ledger {
            pending: Some(Intent {
                expires: 100,
                ..Default::default()
            }),
            restarts: (0..80)
                .map(|i| Restart {
                    at: 1_000_000 + i,
                    ..Default::default()
                })
                .collect(),
        };
        assert!(l.live_pending(99).is_some());
        assert!(l.live_pending(100).is_none());
        l.restarts.push(Restart {
            at: 0,
            ..Default::default()
        });
        l.prune(1_000_100);
        assert_eq!(l.restarts.len(), KEEP_RESTARTS);
        assert!(l.restarts.iter().all(|r| r.at > 0), "old ones go first");
    }
}
