//! Which node an agent's stream speaks for.
//!
//! Every agent sends, as gRPC metadata (`authorization: Bearer <token>`), the projected
//! ServiceAccount token kubelet mounts into its pod (audience [`AGENT_AUDIENCE`]). The
//! operator has the API server review it (TokenReview) and accepts the stream only when
//! the token is the agent ServiceAccount's, is bound to a pod that exists with the same
//! UID, and that pod is scheduled on the node the Hello claims. A token of node A that
//! claims node B is refused with `PERMISSION_DENIED` before the hub sees the stream, so it
//! can never replace B's stream. The shared client certificate is only the transport:
//! anyone holding it still has to present a node's token.
//!
//! Kubernetes versions differ in what the review returns: from 1.30 the token's extra
//! fields name the node (`authentication.kubernetes.io/node-name`), before that only the
//! pod (`pod-name`, `pod-uid`). Both are handled; the pod is always read back, so the
//! node check does not depend on the version (tests below run on recorded reviews of
//! both shapes).

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use base64::Engine as _;
use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus},
    core::v1::Pod,
};
use kube::{Api, Client, api::PostParams};

/// The audience agents request for their token and the operator requires.
pub const AGENT_AUDIENCE: &str = "resourcewatch-operator";

const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";

/// An authenticated agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentIdentity {
    pub node: String,
    /// The agent pod the token is bound to.
    pub pod: String,
    /// When the token stops being valid: the stream ends then, and the agent reconnects
    /// with the token kubelet has refreshed meanwhile.
    pub expires: Option<SystemTime>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error(
        "no bearer token: the agent must send its projected ServiceAccount token (audience {AGENT_AUDIENCE})"
    )]
    NoToken,
    #[error("the token was not accepted by the API server: {0}")]
    Rejected(String),
    #[error("the token is {0}'s, not the agent ServiceAccount's")]
    WrongServiceAccount(String),
    #[error("the token is not bound to a pod (a projected token of the agent pod is required)")]
    NotPodBound,
    #[error("the token's pod {0} no longer exists (or was replaced)")]
    PodGone(String),
    #[error("the token's pod {pod} runs on node {actual:?}, not on {claimed}")]
    NodeMismatch {
        pod: String,
        actual: Option<String>,
        claimed: String,
    },
    #[error("the token could not be checked now: {0}")]
    Unavailable(String),
}

impl AuthError {
    /// The `tonic::Status` an agent gets: who you are is `UNAUTHENTICATED`, what you may
    /// speak for is `PERMISSION_DENIED`, a failed check is `UNAVAILABLE` (retry).
    pub fn status(&self) -> tonic::Status {
        match self {
            AuthError::NoToken | AuthError::Rejected(_) => {
                tonic::Status::unauthenticated(self.to_string())
            }
            AuthError::WrongServiceAccount(_)
            | AuthError::NotPodBound
            | AuthError::PodGone(_)
            | AuthError::NodeMismatch { .. } => tonic::Status::permission_denied(self.to_string()),
            AuthError::Unavailable(_) => tonic::Status::unavailable(self.to_string()),
        }
    }

    pub fn metric_label(&self) -> &'static str {
        match self {
            AuthError::NoToken => "no_token",
            AuthError::Rejected(_) => "rejected",
            AuthError::WrongServiceAccount(_) => "wrong_service_account",
            AuthError::NotPodBound => "not_pod_bound",
            AuthError::PodGone(_) => "pod_gone",
            AuthError::NodeMismatch { .. } => "node_mismatch",
            AuthError::Unavailable(_) => "unavailable",
        }
    }
}

/// Decides which node a token speaks for. The operator uses [`TokenReviewer`]; protocol
/// tests use a fixed table.
#[tonic::async_trait]
pub trait Authenticator: Send + Sync + 'static {
    /// `token` is the presented bearer token, never empty ([`authenticate`] checks that).
    async fn verify(&self, token: &str, claimed_node: &str) -> Result<AgentIdentity, AuthError>;
}

/// Who a stream's bearer token speaks for: NoToken for none or an empty one, else what
/// `auth` verifies.
pub async fn authenticate(
    auth: &dyn Authenticator,
    token: Option<&str>,
    claimed_node: &str,
) -> Result<AgentIdentity, AuthError> {
    let token = token.filter(|t| !t.is_empty()).ok_or(AuthError::NoToken)?;
    auth.verify(token, claimed_node).await
}

/// The pod a reviewed token is bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundPod {
    pub name: String,
    pub uid: String,
    /// Only from Kubernetes 1.30 on.
    pub node: Option<String>,
}

/// Checks a TokenReview's answer: authenticated, for our audience, the agent
/// ServiceAccount, bound to a pod.
pub fn check_review(
    status: &TokenReviewStatus,
    namespace: &str,
    service_account: &str,
) -> Result<BoundPod, AuthError> {
    if status.authenticated != Some(true) {
        return Err(AuthError::Rejected(
            status
                .error
                .clone()
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "not authenticated".into()),
        ));
    }
    // An empty list means "the API server's own audiences"; we always ask for ours, and
    // a server that answers with a list must include it.
    if let Some(a) = &status.audiences
        && !a.is_empty()
        && !a.iter().any(|a| a == AGENT_AUDIENCE)
    {
        return Err(AuthError::Rejected(format!(
            "the token is not for audience {AGENT_AUDIENCE}"
        )));
    }
    let user = status.user.clone().unwrap_or_default();
    let username = user.username.unwrap_or_default();
    let want = format!("system:serviceaccount:{namespace}:{service_account}");
    if username != want {
        return Err(AuthError::WrongServiceAccount(username));
    }
    let extra = user.extra.unwrap_or_default();
    let one = |k: &str| extra.get(k).and_then(|v| v.first()).cloned();
    let (Some(name), Some(uid)) = (one(EXTRA_POD_NAME), one(EXTRA_POD_UID)) else {
        return Err(AuthError::NotPodBound);
    };
    Ok(BoundPod {
        name,
        uid,
        node: one(EXTRA_NODE_NAME),
    })
}

/// Checks the pod a token is bound to against the node the agent claims.
pub fn check_pod(pod: Option<&Pod>, bound: &BoundPod, claimed: &str) -> Result<(), AuthError> {
    let mismatch = |actual: Option<String>| AuthError::NodeMismatch {
        pod: bound.name.clone(),
        actual,
        claimed: claimed.into(),
    };
    if let Some(n) = &bound.node
        && n != claimed
    {
        return Err(mismatch(Some(n.clone())));
    }
    let Some(pod) = pod.filter(|p| {
        p.metadata.uid.as_deref() == Some(bound.uid.as_str())
            && p.metadata.deletion_timestamp.is_none()
    }) else {
        return Err(AuthError::PodGone(bound.name.clone()));
    };
    let actual = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    if actual.as_deref() != Some(claimed) {
        return Err(mismatch(actual));
    }
    Ok(())
}

/// The `exp` claim of a JWT, read without verifying it (the API server just did).
pub fn token_expiry(token: &str) -> Option<SystemTime> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?.as_u64()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(exp))
}

/// At most this many agents are reviewed at once (a TokenReview and a pod read each).
/// Every agent connects at once when an operator starts or takes over: 1,000 reviews at
/// once opened ~1,500 HTTP/1.1 connections to the API server (the client opens one per
/// request in flight), ~20 MiB of the operator's peak at 1,000 nodes, and asked the API
/// server for 2,000 requests in the same instant. With eight in flight, 1,000 agents were
/// all back 2.0 s (2.0-4.1) after an operator's restart and 5,000 in 16.1 s (e2e/SCALE.md;
/// 3.0 and 67.6 s unbounded); to a new leader after a failover 5,000 took 43.1 s (33.8 s
/// in one unbounded run): an agent that waits past the review's timeout retries later.
pub const REVIEWS_IN_FLIGHT: usize = 8;

/// Authenticates agents through the API server's TokenReview and the agent pod.
pub struct TokenReviewer {
    pub client: Client,
    /// The operator's namespace, where the agent DaemonSet runs.
    pub namespace: String,
    pub service_account: String,
    /// Each review (its wait for a turn included) is bounded by this.
    pub timeout: Duration,
    /// Turns to review: [`REVIEWS_IN_FLIGHT`] permits.
    pub in_flight: tokio::sync::Semaphore,
}

impl TokenReviewer {
    pub fn new(
        client: Client,
        namespace: String,
        service_account: String,
        timeout: Duration,
    ) -> Self {
        Self {
            client,
            namespace,
            service_account,
            timeout,
            in_flight: tokio::sync::Semaphore::new(REVIEWS_IN_FLIGHT),
        }
    }

    async fn review(&self, token: &str, claimed_node: &str) -> Result<AgentIdentity, AuthError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(vec![AGENT_AUDIENCE.to_owned()]),
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer =
            tokio::time::timeout(self.timeout, api.create(&PostParams::default(), &review))
                .await
                .map_err(|_| AuthError::Unavailable("TokenReview timed out".into()))?
                .map_err(|e| AuthError::Unavailable(format!("TokenReview: {e}")))?;
        let bound = check_review(
            &answer.status.unwrap_or_default(),
            &self.namespace,
            &self.service_account,
        )?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let pod = tokio::time::timeout(self.timeout, pods.get_opt(&bound.name))
            .await
            .map_err(|_| AuthError::Unavailable("reading the agent pod timed out".into()))?
            .map_err(|e| AuthError::Unavailable(format!("reading the agent pod: {e}")))?;
        check_pod(pod.as_ref(), &bound, claimed_node)?;
        Ok(AgentIdentity {
            node: claimed_node.to_owned(),
            pod: bound.name,
            expires: token_expiry(token),
        })
    }
}

#[tonic::async_trait]
impl Authenticator for TokenReviewer {
    async fn verify(&self, token: &str, claimed_node: &str) -> Result<AgentIdentity, AuthError> {
        // An agent that waits longer than a review may take is told the operator is
        // unavailable and retries with its backoff, as when the API server is slow.
        let _turn = tokio::time::timeout(self.timeout, self.in_flight.acquire())
            .await
            .map_err(|_| {
                AuthError::Unavailable(format!(
                    "no turn to review within {:?} ({REVIEWS_IN_FLIGHT} reviews in flight)",
                    self.timeout
                ))
            })?
            .map_err(|_| AuthError::Unavailable("reviews closed".into()))?;
        self.review(token, claimed_node).await
    }
}

/// A fixed table of token -> node, for in-process protocol tests and tools that run the
/// operator without a cluster. Never used by the operator binary.
pub struct StaticTokens(pub BTreeMap<String, String>);

#[tonic::async_trait]
impl Authenticator for StaticTokens {
    async fn verify(&self, token: &str, claimed_node: &str) -> Result<AgentIdentity, AuthError> {
        let node = self
            .0
            .get(token)
            .ok_or_else(|| AuthError::Rejected("unknown token".into()))?;
        if node != claimed_node {
            return Err(AuthError::NodeMismatch {
                pod: format!("agent-{node}"),
                actual: Some(node.clone()),
                claimed: claimed_node.into(),
            });
        }
        Ok(AgentIdentity {
            node: node.clone(),
            pod: format!("agent-{node}"),
            expires: None,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A TokenReview answer as Kubernetes 1.20.2 returns it for a pod-bound projected
    /// token (recorded on the e2e cluster): no node in `extra`.
    const REVIEW_1_20: &str = include_str!("../tests/fixtures/k8s-1.20/tokenreview-pod-bound.json");

    /// The same from Kubernetes 1.30 on (ServiceAccountTokenPodNodeInfo): the node too.
    /// Recorded on the e2e cluster's 1.37.2 (`tests/fixtures/record.sh`) for a token bound
    /// to the pod of `pod-running.json`, on node `vm`, in namespace `rw-fixtures`.
    const REVIEW_1_37: &str = include_str!("../tests/fixtures/k8s-1.37/tokenreview-pod-bound.json");
    const POD_1_37: &str = include_str!("../tests/fixtures/k8s-1.37/pod-running.json");

    fn status(json: &str) -> TokenReviewStatus {
        let r: TokenReview = serde_json::from_str(json).unwrap();
        r.status.unwrap()
    }

    fn agent_pod(node: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "resourcewatch-agent-x7k2p", "namespace": "resourcewatch-system",
                         "uid": "8b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"},
            "spec": {"nodeName": node, "containers": []}
        }))
        .unwrap()
    }

    const NS: &str = "resourcewatch-system";
    const SA: &str = "resourcewatch-agent";

    #[test]
    fn a_1_20_review_binds_the_stream_to_the_pods_node() {
        let bound = check_review(&status(REVIEW_1_20), NS, SA).unwrap();
        assert_eq!(bound.node, None, "1.20 does not name the node");
        let pod = agent_pod("worker-2");
        assert_eq!(check_pod(Some(&pod), &bound, "worker-2"), Ok(()));
        let e = check_pod(Some(&pod), &bound, "worker-1").unwrap_err();
        assert_eq!(
            e,
            AuthError::NodeMismatch {
                pod: "resourcewatch-agent-x7k2p".into(),
                actual: Some("worker-2".into()),
                claimed: "worker-1".into()
            }
        );
        assert_eq!(e.status().code(), tonic::Code::PermissionDenied);
    }

    #[test]
    fn a_1_37_review_is_checked_against_its_node_and_the_pod() {
        let bound = check_review(&status(REVIEW_1_37), "rw-fixtures", SA).unwrap();
        assert_eq!(bound.node.as_deref(), Some("vm"));
        let pod: Pod = serde_json::from_str(POD_1_37).unwrap();
        assert_eq!(
            bound.uid,
            pod.metadata.uid.clone().unwrap(),
            "bound to that pod"
        );
        assert!(check_pod(Some(&pod), &bound, "vm").is_ok());
        // Another node's claim is refused on the review's node alone, and the review's
        // node wins even if the pod read back were stale or forged.
        assert!(matches!(
            check_pod(Some(&pod), &bound, "worker-1"),
            Err(AuthError::NodeMismatch { .. })
        ));
        let mut forged = pod.clone();
        forged.spec.as_mut().unwrap().node_name = Some("worker-1".into());
        assert!(matches!(
            check_pod(Some(&forged), &bound, "worker-1"),
            Err(AuthError::NodeMismatch { .. })
        ));
        // The same review is not the agent's in another namespace.
        assert!(matches!(
            check_review(&status(REVIEW_1_37), NS, SA),
            Err(AuthError::WrongServiceAccount(_))
        ));
    }

    #[test]
    fn other_identities_and_gone_pods_are_refused() {
        let mut s = status(REVIEW_1_20);
        s.user.as_mut().unwrap().username = Some("system:serviceaccount:team-a:default".into());
        let e = check_review(&s, NS, SA).unwrap_err();
        assert!(matches!(e, AuthError::WrongServiceAccount(ref u) if u.contains("team-a")));
        assert_eq!(e.status().code(), tonic::Code::PermissionDenied);

        let mut s = status(REVIEW_1_20);
        s.user.as_mut().unwrap().extra = None;
        assert_eq!(check_review(&s, NS, SA), Err(AuthError::NotPodBound));

        let mut s = status(REVIEW_1_20);
        s.authenticated = Some(false);
        s.error = Some("token has expired".into());
        let e = check_review(&s, NS, SA).unwrap_err();
        assert_eq!(e, AuthError::Rejected("token has expired".into()));
        assert_eq!(e.status().code(), tonic::Code::Unauthenticated);

        let mut s = status(REVIEW_1_20);
        s.audiences = Some(vec!["https://kubernetes.default.svc".into()]);
        assert!(matches!(
            check_review(&s, NS, SA),
            Err(AuthError::Rejected(_))
        ));

        let bound = check_review(&status(REVIEW_1_20), NS, SA).unwrap();
        assert!(matches!(
            check_pod(None, &bound, "worker-2"),
            Err(AuthError::PodGone(_))
        ));
        let mut replaced = agent_pod("worker-2");
        replaced.metadata.uid = Some("another-uid".into());
        assert!(matches!(
            check_pod(Some(&replaced), &bound, "worker-2"),
            Err(AuthError::PodGone(_))
        ));
        assert_eq!(
            AuthError::NoToken.status().code(),
            tonic::Code::Unauthenticated
        );
    }

    #[test]
    fn the_expiry_is_read_from_the_token() {
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let token = format!(
            "{}.{}.sig",
            b64(r#"{"alg":"RS256"}"#),
            b64(r#"{"aud":["resourcewatch-operator"],"exp":1700003600,"iat":1700000000}"#)
        );
        assert_eq!(
            token_expiry(&token),
            Some(UNIX_EPOCH + Duration::from_secs(1_700_003_600))
        );
        assert_eq!(token_expiry("not-a-jwt"), None);
    }

    /// Agents connecting at once (an operator's start or takeover) are reviewed
    /// REVIEWS_IN_FLIGHT at a time: the API server never holds more of the operator's
    /// reviews than that, and the others wait their turn rather than fail.
    #[tokio::test]
    async fn agents_connecting_at_once_are_reviewed_a_few_at_a_time() {
        use http::{Request, Response};
        use kube::client::Body;
        let (svc, mut api) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let reviewer = std::sync::Arc::new(TokenReviewer::new(
            Client::new(svc, "default"),
            "ns".into(),
            "sa".into(),
            Duration::from_secs(60),
        ));
        let agents = 3 * REVIEWS_IN_FLIGHT;
        let mut connecting = tokio::task::JoinSet::new();
        for i in 0..agents {
            let r = reviewer.clone();
            connecting.spawn(async move { r.verify(&format!("token-{i}"), "node-1").await });
        }
        let mut answered = 0;
        while answered < agents {
            // Every request the API server holds unanswered, until none more come.
            let mut held = Vec::new();
            while let Ok(Some(req)) =
                tokio::time::timeout(Duration::from_millis(200), api.next_request()).await
            {
                held.push(req);
            }
            assert_eq!(
                held.len(),
                REVIEWS_IN_FLIGHT.min(agents - answered),
                "reviews in flight at once"
            );
            for (req, answer) in held {
                assert!(req.uri().path().ends_with("/tokenreviews"), "{}", req.uri());
                answer.send_response(
                    Response::builder()
                        .status(503)
                        .body(Body::from(br#"{"kind":"Status","code":503}"#.to_vec()))
                        .unwrap(),
                );
                answered += 1;
            }
        }
        while let Some(r) = connecting.join_next().await {
            assert!(
                matches!(r.expect("joined"), Err(AuthError::Unavailable(_))),
                "an unanswerable review leaves the agent to retry"
            );
        }
    }
}
