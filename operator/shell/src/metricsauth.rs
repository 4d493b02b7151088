//! Who may read `/metrics`: it lists every namespace's findings (pods, containers, times
//! to OOM), so it is served over TLS and only to a bearer token the API server
//! authenticates (TokenReview) and authorizes for `get` on the non-resource URL
//! `/metrics` (SubjectAccessReview), as controller-runtime's secure metrics do. The
//! ClusterRole `resourcewatch-metrics-reader` grants that; bind it to Prometheus.
//!
//! Answers are cached for a short while by a hash of the token (a scrape every 15 s must
//! not cost two API calls), and at most [`MAX_REVIEWS`] reviews run at once: a flood of
//! made-up tokens costs the API server and this process a bounded amount, and is answered
//! 429 beyond it.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    extract::{Request, State},
    http::{StatusCode, header::AUTHORIZATION},
    middleware::Next,
    response::{IntoResponse, Response},
};
use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{Api, Client, api::PostParams};
use tokio::sync::Semaphore;

/// Reviews in flight at once; more wait up to [`REVIEW_WAIT`], then get 429.
pub const MAX_REVIEWS: usize = 4;
const REVIEW_WAIT: Duration = Duration::from_secs(2);
/// How long an answer is reused for the same token.
const ALLOWED_TTL: Duration = Duration::from_secs(60);
const DENIED_TTL: Duration = Duration::from_secs(10);
/// Cached answers at most; the cache is emptied when full (made-up tokens cannot grow it).
const MAX_CACHED: usize = 1024;
/// A bearer token longer than this is not one the API server issues.
const MAX_TOKEN: usize = 16 << 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Allowed,
    /// Not authenticated: 401.
    Unauthenticated,
    /// Authenticated, not allowed: 403.
    Forbidden,
}

pub struct MetricsAuth {
    client: Client,
    timeout: Duration,
    reviews: Semaphore,
    cache: Mutex<HashMap<[u8; 32], (Instant, Answer)>>,
}

impl MetricsAuth {
    pub fn new(client: Client) -> Arc<Self> {
        Arc::new(Self {
            client,
            timeout: Duration::from_secs(5),
            reviews: Semaphore::new(MAX_REVIEWS),
            cache: Mutex::new(HashMap::new()),
        })
    }

    fn cached(&self, key: &[u8; 32]) -> Option<Answer> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let (at, answer) = cache.get(key)?;
        let ttl = if *answer == Answer::Allowed {
            ALLOWED_TTL
        } else {
            DENIED_TTL
        };
        (at.elapsed() < ttl).then_some(*answer)
    }

    fn remember(&self, key: [u8; 32], answer: Answer) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(key, (Instant::now(), answer));
    }

    /// The API server's answer for this token; Err when it could not be asked.
    async fn review(&self, token: &str) -> Result<Answer, ReviewError> {
        let tr = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        let pp = PostParams::default();
        let reviewed = tokio::time::timeout(
            self.timeout,
            Api::<TokenReview>::all(self.client.clone()).create(&pp, &tr),
        )
        .await
        .map_err(|_| ReviewError::Timeout("TokenReview"))?
        .map_err(|source| ReviewError::Api {
            review: "TokenReview",
            source,
        })?;
        let Some(status) = reviewed.status.filter(|s| s.authenticated == Some(true)) else {
            return Ok(Answer::Unauthenticated);
        };
        let user = status.user.unwrap_or_default();
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                uid: user.uid,
                groups: user.groups,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let decided = tokio::time::timeout(
            self.timeout,
            Api::<SubjectAccessReview>::all(self.client.clone()).create(&pp, &sar),
        )
        .await
        .map_err(|_| ReviewError::Timeout("SubjectAccessReview"))?
        .map_err(|source| ReviewError::Api {
            review: "SubjectAccessReview",
            source,
        })?;
        Ok(if decided.status.is_some_and(|s| s.allowed) {
            Answer::Allowed
        } else {
            Answer::Forbidden
        })
    }
}

/// Why a scraper's token could not be reviewed.
#[derive(Debug, thiserror::Error)]
enum ReviewError {
    #[error("{0} timed out")]
    Timeout(&'static str),
    #[error("{review}: {source}")]
    Api {
        review: &'static str,
        source: kube::Error,
    },
}

/// The middleware in front of `/metrics`.
pub async fn require(State(auth): State<Arc<MetricsAuth>>, req: Request, next: Next) -> Response {
    let token = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.len() <= MAX_TOKEN);
    let Some(token) = token else {
        return (
            StatusCode::UNAUTHORIZED,
            "a bearer token is required (README, Metrics)",
        )
            .into_response();
    };
    let key: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
        .as_ref()
        .try_into()
        .unwrap_or([0; 32]);
    let answer = match auth.cached(&key) {
        Some(a) => a,
        None => {
            let Ok(Ok(_permit)) = tokio::time::timeout(REVIEW_WAIT, auth.reviews.acquire()).await
            else {
                return (StatusCode::TOO_MANY_REQUESTS, "too many reviews at once").into_response();
            };
            match auth.review(token).await {
                Ok(a) => {
                    auth.remember(key, a);
                    a
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not review a /metrics client");
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "could not review the token",
                    )
                        .into_response();
                }
            }
        }
    };
    match answer {
        Answer::Allowed => next.run(req).await,
        Answer::Unauthenticated => {
            (StatusCode::UNAUTHORIZED, "the token is not valid").into_response()
        }
        Answer::Forbidden => (
            StatusCode::FORBIDDEN,
            "not allowed to get /metrics (bind the ClusterRole resourcewatch-metrics-reader, or <fullnameOverride>-metrics-reader)",
        )
            .into_response(),
    }
}
