//! Leader election with a `coordination.k8s.io/v1` Lease, so two replicas never both
//! serve agents and write status. The Lease is taken when free or expired, renewed every
//! `renew` while held, and released on shutdown so the next replica takes over at once.
//! Writes carry the Lease's resourceVersion: of two replicas racing, one gets a 409.
//!
//! Hand-made: kube itself has no leader election, and kube-lease-manager 0.13.1 (kube 5)
//! keeps reporting leadership while its renewals go unanswered, so a leader cut off from
//! the API server would lead beside the standby that took the expired Lease. Both are
//! measured by `e2e/tests/lease.rs` (`make e2e-api`).

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::{ObjectReference, Service},
        discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice},
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference},
};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};
use tokio::sync::{mpsc, watch};

/// The operator Service's one EndpointSlice, which names the leader's pod address and no
/// other: agents (and Prometheus) reach the leader only, while every replica stays Ready
/// (a standby is ready to take over, and a rollout of two replicas completes).
///
/// Why a slice of ours and not a label the Service selects: labelling its own pod needed
/// `pods: patch` in this namespace, and a token that may patch pods may change the agent
/// DaemonSet's pod images, i.e. run any image with the agent's privileges on every node.
/// Writing this one slice may at worst point the operator's Service somewhere else, where
/// agents and scrapers, which verify the operator's certificate against its CA, refuse to
/// talk.
pub struct ServiceEndpoint {
    slices: Api<EndpointSlice>,
    services: Api<Service>,
    leases: Api<Lease>,
    /// The election's Lease, whose holder is the one replica that may publish.
    lease_name: String,
    /// The Service's name, which is also the slice's.
    service: String,
    namespace: String,
    pod: ThisPod,
    /// (port name as in the Service, container port)
    ports: Vec<(String, u16)>,
}

/// This replica as the slice names it (from the downward API).
#[derive(Clone, Debug)]
pub struct ThisPod {
    pub name: String,
    pub uid: Option<String>,
    pub node: Option<String>,
    /// None outside a pod (the API tests, a developer's shell): nothing is published.
    pub ip: Option<IpAddr>,
}

/// The `endpointslice.kubernetes.io/managed-by` value: the EndpointSlice controller leaves
/// slices managed by others alone.
pub const SLICE_MANAGER: &str = "operator.resourcewatch.io";
const FIELD_MANAGER: &str = "resourcewatch-operator";

impl ServiceEndpoint {
    pub fn new(
        client: Client,
        namespace: &str,
        service: &str,
        lease_name: &str,
        pod: ThisPod,
        ports: Vec<(String, u16)>,
    ) -> Self {
        Self {
            slices: Api::namespaced(client.clone(), namespace),
            services: Api::namespaced(client.clone(), namespace),
            leases: Api::namespaced(client, namespace),
            lease_name: lease_name.to_owned(),
            service: service.to_owned(),
            namespace: namespace.to_owned(),
            pod,
            ports,
        }
    }

    /// The slice naming `endpoints` (this pod's address, or none), owned by the Service
    /// so that deleting the Service deletes it.
    fn slice(
        &self,
        endpoints: Vec<Endpoint>,
        ip: IpAddr,
        owner: Option<&Service>,
    ) -> EndpointSlice {
        let labels = [
            ("kubernetes.io/service-name", self.service.as_str()),
            ("endpointslice.kubernetes.io/managed-by", SLICE_MANAGER),
            ("app.kubernetes.io/name", "resourcewatch-operator"),
            ("app.kubernetes.io/part-of", "resourcewatch"),
        ];
        let owner_references = owner.and_then(|svc| {
            Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Service".into(),
                name: svc.metadata.name.clone()?,
                uid: svc.metadata.uid.clone()?,
                ..Default::default()
            }])
        });
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some(self.service.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                owner_references,
                ..Default::default()
            },
            address_type: if ip.is_ipv4() { "IPv4" } else { "IPv6" }.into(),
            endpoints,
            ports: Some(
                self.ports
                    .iter()
                    .map(|(name, port)| EndpointPort {
                        name: Some(name.clone()),
                        port: Some(i32::from(*port)),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
        }
    }

    fn this_endpoint(&self, ip: IpAddr) -> Endpoint {
        Endpoint {
            addresses: vec![ip.to_string()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            node_name: self.pod.node.clone(),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                namespace: Some(self.namespace.clone()),
                name: Some(self.pod.name.clone()),
                uid: self.pod.uid.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Makes the slice name this pod only (server-side apply, forced: it replaces
    /// whichever replica led before, also one that crashed, froze or lost the API server
    /// and so could not withdraw). Retried: a leader nobody can reach is no leader. Not
    /// forever: the leader re-applies it every `REASSERT` (an identical apply writes nothing).
    pub async fn publish(&self) {
        let Some(ip) = self.pod.ip else {
            tracing::debug!(pod = %self.pod.name, "no pod address (not in a pod): no endpoint published");
            return;
        };
        for attempt in 1..=5u64 {
            if !self.lease_names_this_pod().await {
                return;
            }
            // Read each time: a Service deleted and created again has a new UID, and a
            // slice owned by the old one would be collected.
            let owner = match self.services.get_opt(&self.service).await {
                Ok(svc) => svc,
                Err(e) => {
                    tracing::warn!(service = %self.service, attempt, error = %e, "could not read the operator's Service");
                    None
                }
            };
            let slice = self.slice(vec![self.this_endpoint(ip)], ip, owner.as_ref());
            match self
                .slices
                .patch(
                    &self.service,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&slice),
                )
                .await
            {
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!(slice = %self.service, attempt, error = %e, "could not publish this pod as the Service's endpoint");
                    tokio::time::sleep(Duration::from_secs(attempt)).await;
                }
            }
        }
    }

    /// Whether the Lease still names this pod (true when it can't be read: the apply
    /// that follows fails the same way, and is retried). A replica continued after a
    /// freeze longer than the Lease still believes it leads until its election task has
    /// run; its apply, made first, replaced the new leader's address, and its withdrawal
    /// a moment later left the Service with no endpoint until the new leader's next
    /// `REASSERT` (e2e: the slice was empty 6 s after the frozen leader continued).
    async fn lease_names_this_pod(&self) -> bool {
        match self.leases.get_opt(&self.lease_name).await {
            Ok(Some(lease)) => {
                let holder = lease.spec.and_then(|s| s.holder_identity);
                if holder.as_deref() == Some(self.pod.name.as_str()) {
                    return true;
                }
                tracing::info!(holder = ?holder, "not publishing this pod as the Service's endpoint: the Lease names another replica");
                false
            }
            Ok(None) => false,
            Err(e) => {
                tracing::debug!(error = %e, "could not read the Lease before publishing");
                true
            }
        }
    }

    /// Empties the slice if, and only if, it still names this pod: a replica stepping down
    /// (or starting with the address of its previous life) must not remove the endpoint
    /// a new leader has published. The write carries the resourceVersion it read.
    pub async fn withdraw(&self) {
        let Some(ip) = self.pod.ip else { return };
        let address = ip.to_string();
        for attempt in 1..=5u64 {
            let current = match self.slices.get_opt(&self.service).await {
                Ok(Some(s)) => s,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(slice = %self.service, attempt, error = %e, "could not read the Service's endpoint");
                    tokio::time::sleep(Duration::from_secs(attempt)).await;
                    continue;
                }
            };
            if !current
                .endpoints
                .iter()
                .any(|e| e.addresses.contains(&address))
            {
                return;
            }
            let mut emptied = current;
            emptied
                .endpoints
                .retain(|e| !e.addresses.contains(&address));
            match self
                .slices
                .replace(&self.service, &PostParams::default(), &emptied)
                .await
            {
                Ok(_) => return,
                // Changed since it was read (a new leader published): look again.
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(kube::Error::Api(e)) if e.code == 404 => return,
                Err(e) => {
                    tracing::warn!(slice = %self.service, attempt, error = %e, "could not withdraw this pod from the Service's endpoint");
                    tokio::time::sleep(Duration::from_secs(attempt)).await;
                }
            }
        }
    }
}

/// How often a leader applies its endpoint again, so that a write that lost a race (a
/// frozen former leader's request delivered late) is undone within this time. An apply
/// that changes nothing writes nothing: two reads and a no-op patch every 10 s.
pub const REASSERT: Duration = Duration::from_secs(10);

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
    /// This replica holds it (now renewed). `from`: the holder it was taken from before it
    /// released it (it crashed, froze or lost the API server), logged.
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
