//! The rails' one source of truth, as data: a small record per workload (Deployment,
//! StatefulSet, DaemonSet, ReplicaSet) holding its recent restarts and at most one pending
//! restart, whatever watches select it. The operator keeps each in a ConfigMap of its own
//! namespace (the shell's `ledger` store); what a record means, and when it cannot be
//! trusted, is decided here.

use serde::{Deserialize, Serialize};

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
