//! The rails' one source of truth: a small record per workload (Deployment, StatefulSet,
//! DaemonSet, ReplicaSet), owned by the operator and kept in a ConfigMap in its own
//! namespace, where tenants cannot write. It holds the workload's recent restarts and at
//! most one pending restart, whatever watches select the workload, and survives operator
//! restarts. Writes carry the resourceVersion read: two reconciles deciding at once for
//! one workload cannot both record an intent (the second gets a conflict and decides
//! again, seeing the first's).
//!
//! The watches' `status.remediations` is only a log for people; nothing reads it back to
//! decide, so writing into status cannot trigger an eviction.

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
}

const KEY: &str = "ledger.json";

/// Reads and writes ledgers in the operator's namespace.
#[derive(Clone)]
pub struct LedgerStore {
    api: Api<ConfigMap>,
    timeout: std::time::Duration,
}

/// A write lost the race: read again and decide again.
#[derive(Debug)]
pub struct Conflict;

impl LedgerStore {
    pub fn new(client: Client, namespace: &str, timeout: std::time::Duration) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            timeout,
        }
    }

    pub async fn read(&self, w: &Workload) -> Result<Versioned> {
        let got = tokio::time::timeout(self.timeout, self.api.get_opt(&w.record_name()))
            .await
            .map_err(|_| Error::Timeout("ledger read"))??;
        Ok(match got {
            None => Versioned::default(),
            Some(cm) => Versioned {
                // A record the operator cannot read is treated as empty but its version is
                // kept, so the next write replaces it rather than failing forever.
                ledger: cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get(KEY))
                    .and_then(|j| serde_json::from_str(j).ok())
                    .unwrap_or_default(),
                resource_version: cm.metadata.resource_version,
            },
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
            Ok(cm) => Ok(Ok(cm.metadata.resource_version.unwrap_or_default())),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Err(Conflict)),
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
