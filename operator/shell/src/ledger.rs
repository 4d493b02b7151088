//! The ledgers' store, the rails' one source of truth: one record per workload (its data
//! and what it means are the core's `ledger`), in a ConfigMap of the operator's own
//! namespace, where tenants cannot write; it survives operator restarts. Writes carry the
//! resourceVersion read: two reconciles deciding at once for one workload cannot both
//! record an intent (the second gets a conflict and decides again, seeing the first's).
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
pub use resourcewatch_operator_core::ledger::*;

use crate::{Error, Result};

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
                serde_json::to_string(ledger)?,
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
