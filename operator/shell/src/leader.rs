//! Leader election with a `coordination.k8s.io/v1` Lease, so two replicas never both
//! serve agents and write status. The Lease is taken when free or expired, renewed every
//! `renew` while held, and released on shutdown so the next replica takes over at once.
//! Writes carry the Lease's resourceVersion: of two replicas racing, one gets a 409.
//!
//! Hand-made: kube itself has no leader election, and kube-lease-manager 0.13.1 (kube 5)
//! keeps reporting leadership while its renewals go unanswered, so a leader cut off from
//! the API server would lead beside the standby that took the expired Lease. Both are
//! measured by `e2e/tests/lease.rs` (`make e2e-api`).

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
use tokio::sync::{mpsc, watch};

/// The label the leader puts on its own pod; the operator's Service selects it.
pub const LEADER_LABEL: &str = "resourcewatch.io/leader";

/// The `resourcewatch.io/leader=true` label on this replica's own pod, which the
/// operator's Service selects: agents (and Prometheus) reach the leader only, while every
/// replica stays Ready (a standby is ready to take over, and a rollout of two replicas
/// completes).
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
    /// How often the leader renews, and the longest a standby waits between looks. The
    /// leader steps down by itself once `lease_duration - renew` has passed without a
    /// renewal, before a standby may take the Lease (client-go: retryPeriod 2 s, lease 15 s).
    pub renew: Duration,
}

/// What one look at the Lease found.
#[derive(Debug, PartialEq, Eq)]
enum Look {
    /// This replica holds it (now renewed). `from`: the holder it was taken from, whose
    /// pod may still carry the leader label (a frozen or partitioned process cannot remove
    /// it, and the Service would keep routing agents there).
    Held { from: Option<String> },
    /// Another replica holds it until `expires_in` from now.
    Busy { expires_in: Duration },
}

impl LeaderElection {
    pub fn new(client: Client, namespace: &str, lease_name: &str, identity: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            lease_name: lease_name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew: Duration::from_secs(2),
        }
    }

    /// Runs until `shutdown`; `leader` follows whether this replica holds the Lease.
    /// `taken_from` receives the identity (pod name) of each holder the Lease was taken
    /// from while it had not released it.
    pub async fn run(
        self,
        leader: watch::Sender<bool>,
        taken_from: mpsc::UnboundedSender<String>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut last_renewed: Option<Instant> = None;
        loop {
            // Stopped (SIGSTOP, a frozen cgroup, a paused VM) past the point where another
            // replica may hold the Lease: not the leader any more, before any request.
            if last_renewed.is_some_and(|t| t.elapsed() > self.lease_duration - self.renew)
                && leader.send_if_modified(|l| std::mem::replace(l, false))
            {
                tracing::warn!("stepped down: the Lease was not renewed in time");
            }
            let started = Instant::now();
            let mut wait = self.renew;
            // Each look is bounded: the API server's client has no read timeout, and a
            // partition that swallows a request (no reset) would hold a leader here for as
            // long as it lasts, past the time a standby takes the Lease. A leader waits until
            // it must step down; a standby at most the Lease's duration.
            let deadline = match last_renewed {
                Some(t) => (self.lease_duration - self.renew)
                    .saturating_sub(t.elapsed())
                    .max(Duration::from_millis(100)),
                None => self.lease_duration,
            };
            let look = tokio::time::timeout(deadline, self.try_acquire_or_renew())
                .await
                .unwrap_or(Err(LookError::NoAnswer(deadline)));
            match look {
                Ok(Look::Held { from }) => {
                    last_renewed = Some(started);
                    if !*leader.borrow() {
                        tracing::info!(identity = %self.identity, previous = ?from, "became the leader");
                    }
                    if let Some(from) = from {
                        let _ = taken_from.send(from);
                    }
                    leader.send_if_modified(|l| !std::mem::replace(l, true));
                }
                Ok(Look::Busy { expires_in }) => {
                    last_renewed = None;
                    if leader.send_if_modified(|l| std::mem::replace(l, false)) {
                        tracing::warn!("lost the leadership to another replica");
                    }
                    // Look again just after it expires (a crashed holder never renews),
                    // not up to `renew` later.
                    wait = wait.min(expires_in + Duration::from_millis(50));
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
                _ = tokio::time::sleep(wait) => {}
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

    async fn try_acquire_or_renew(&self) -> Result<Look, LookError> {
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
                Ok(_) => Ok(Look::Held { from: None }),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Look::Busy {
                    expires_in: self.renew,
                }),
                Err(e) => Err(e.into()),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let expires_in = remaining(spec, jiff::Timestamp::now());
        let mine = holder == self.identity;
        if !(mine || holder.is_empty() || expires_in.is_none()) {
            return Ok(Look::Busy {
                expires_in: expires_in.unwrap_or_default(),
            });
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
            Ok(_) => Ok(Look::Held {
                from: (!mine && !holder.is_empty()).then_some(holder),
            }),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Look::Busy {
                expires_in: self.renew,
            }),
            Err(e) => Err(e.into()),
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

/// Why a look at the Lease found nothing.
#[derive(Debug, thiserror::Error)]
enum LookError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("the API server did not answer within {0:?}")]
    NoAnswer(Duration),
}

/// How long the Lease still runs after `now`, by its holder's last renewal and its own
/// duration; `None` once expired (or never renewed: a released Lease).
fn remaining(spec: &LeaseSpec, now: jiff::Timestamp) -> Option<Duration> {
    let renewed = spec.renew_time.as_ref()?.0;
    let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(1) as u64);
    let age = now.duration_since(renewed).as_secs_f64().max(0.0);
    let left = duration.as_secs_f64() - age;
    (left > 0.0).then(|| Duration::from_secs_f64(left))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spec(renewed: &str, seconds: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some("operator-a".into()),
            lease_duration_seconds: Some(seconds),
            renew_time: Some(MicroTime(renewed.parse().unwrap())),
            ..Default::default()
        }
    }

    #[test]
    fn a_lease_runs_for_its_own_duration_from_its_last_renewal() {
        let now: jiff::Timestamp = "2026-11-25T10:00:10Z".parse().unwrap();
        let left = remaining(&spec("2026-11-25T10:00:00Z", 15), now).unwrap();
        assert_eq!(left, Duration::from_secs(5));
        assert_eq!(remaining(&spec("2026-11-25T10:00:00Z", 10), now), None);
        // A holder's clock ahead of ours: at most the whole duration, never more.
        let ahead = remaining(&spec("2026-11-25T10:00:20Z", 15), now).unwrap();
        assert_eq!(ahead, Duration::from_secs(15));
    }

    #[test]
    fn a_released_lease_is_free_at_once() {
        let mut released = spec("2026-11-25T10:00:00Z", 15);
        released.renew_time = None;
        let now: jiff::Timestamp = "2026-11-25T10:00:01Z".parse().unwrap();
        assert_eq!(remaining(&released, now), None);
    }
}
