//! Leader election with a `coordination.k8s.io/v1` Lease, so two replicas never both
//! serve agents and write status. The Lease is taken when free or expired, renewed every
//! `renew` while held, and released on shutdown so the next replica takes over at once.
//! Writes carry the Lease's resourceVersion: of two replicas racing, one gets a 409.
//!
//! Hand-made (146 lines) because no maintained crate fits kube 5: kube-leader-election
//! 0.37 needs kube 0.96 and kube-lease-manager 0.12 kube 4 (checked November 2026); kube
//! itself has no leader election.

use std::time::{Duration, Instant};

use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::Pod,
    },
    apimachinery::pkg::apis::meta::v1::MicroTime,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};
use tokio::sync::watch;

/// The label the leader puts on its own pod; the operator's Service selects it.
pub const LEADER_LABEL: &str = "resourcewatch.io/leader";

/// The `resourcewatch.io/leader=true` label on this replica's own pod, which the
/// operator's Service selects: agents reach the leader only (the admission webhook has its
/// own Service, over every replica), while every replica stays Ready (a standby is ready
/// to take over, and a rollout of two replicas completes).
pub struct PodLabel {
    pods: Api<Pod>,
    name: String,
}

impl PodLabel {
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        Self {
            pods: Api::namespaced(client, namespace),
            name: name.to_owned(),
        }
    }

    pub async fn set(&self, leading: bool) {
        let value = if leading {
            serde_json::json!("true")
        } else {
            serde_json::Value::Null
        };
        let mut labels = serde_json::Map::new();
        labels.insert(LEADER_LABEL.to_owned(), value);
        let patch = serde_json::json!({"metadata": {"labels": labels}});
        // Retried: a leader nobody can reach is no leader. Not forever: the next change of
        // leadership sets it again.
        for attempt in 1..=5 {
            match self
                .pods
                .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return,
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    // Run outside a pod (the API tests, a developer's shell): no Service
                    // routes to it anyway.
                    tracing::debug!(pod = %self.name, "no such pod: not labelled");
                    return;
                }
                Err(e) => {
                    tracing::warn!(pod = %self.name, leading, attempt, error = %e, "could not label this pod");
                    tokio::time::sleep(Duration::from_secs(attempt)).await;
                }
            }
        }
    }
}

pub struct LeaderElection {
    pub api: Api<Lease>,
    pub lease_name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew: Duration,
}

impl LeaderElection {
    pub fn new(client: Client, namespace: &str, lease_name: &str, identity: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            lease_name: lease_name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew: Duration::from_secs(5),
        }
    }

    /// Runs until `shutdown`; `leader` follows whether this replica holds the Lease.
    pub async fn run(self, leader: watch::Sender<bool>, mut shutdown: watch::Receiver<bool>) {
        let mut last_renewed: Option<Instant> = None;
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    last_renewed = Some(Instant::now());
                    if !*leader.borrow() {
                        tracing::info!(identity = %self.identity, "became the leader");
                    }
                    leader.send_if_modified(|l| !std::mem::replace(l, true));
                }
                Ok(false) => {
                    last_renewed = None;
                    if leader.send_if_modified(|l| std::mem::replace(l, false)) {
                        tracing::warn!("lost the leadership to another replica");
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "lease renewal failed");
                    // Step down before the Lease can expire under us: another replica may
                    // take it from then on.
                    let expired =
                        last_renewed.is_none_or(|t| t.elapsed() > self.lease_duration - self.renew);
                    if expired && leader.send_if_modified(|l| std::mem::replace(l, false)) {
                        tracing::warn!("stepped down: the Lease could not be renewed in time");
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.renew) => {}
                _ = async { let _ = shutdown.wait_for(|s| *s).await; } => break,
            }
        }
        if *leader.borrow() {
            leader.send_replace(false);
            if let Err(e) = self.release().await {
                tracing::warn!(error = %e, "could not release the Lease; it expires by itself");
            }
        }
    }

    async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = MicroTime(jiff::Timestamp::now());
        let Some(mut lease) = self.api.get_opt(&self.lease_name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.lease_name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(self.lease_duration.as_secs() as i32),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(1) as u64);
        let expired = spec.renew_time.as_ref().is_none_or(|t| {
            let age = jiff::Timestamp::now().duration_since(t.0);
            age.as_secs_f64() > duration.as_secs_f64()
        });
        let mine = holder == self.identity;
        if !(mine || holder.is_empty() || expired) {
            return Ok(false);
        }
        if !mine {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            spec.holder_identity = Some(self.identity.clone());
        }
        spec.lease_duration_seconds = Some(self.lease_duration.as_secs() as i32);
        spec.renew_time = Some(now);
        match self
            .api
            .replace(&self.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.lease_name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        self.api
            .replace(&self.lease_name, &PostParams::default(), &lease)
            .await
            .map(|_| ())
    }
}
