//! Who may read `/metrics`: it lists every namespace's findings (pods, containers, times
//! to OOM), so it is served over TLS and only to a bearer token the API server
//! authenticates (TokenReview) and authorizes for `get` on the non-resource URL
//! `/metrics` (SubjectAccessReview), as controller-runtime's secure metrics do. The
//! ClusterRole `resourcewatch-metrics-reader` grants that; bind it to Prometheus.
//!
//! Answers are cached for a short while by a hash of the token (a scrape every 15 s must
//! not cost two API calls), and at most [`MAX_REVIEWS`] reviews run at once: a flood of
//! made-up tokens costs the API server and this process a bounded amount, and is answered
//! 429 beyond it. Anyone on the pod network can send such a flood, so it must not reach
//! the scrapers that were allowed: allowed tokens are kept apart from denied ones (a full
//! cache of denied answers is emptied; a full cache of allowed ones drops its oldest),
//! and a token allowed before is reviewed again on a budget of its own
//! ([`MAX_KNOWN_REVIEWS`]), which made-up tokens never use.

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

/// Reviews of tokens not allowed before, in flight at once; more wait up to
/// [`REVIEW_WAIT`], then get 429.
pub const MAX_REVIEWS: usize = 4;
/// Reviews of tokens allowed before (a scraper's token whose answer expired), at once.
pub const MAX_KNOWN_REVIEWS: usize = 2;
const REVIEW_WAIT: Duration = Duration::from_secs(2);
/// How long an answer is reused for the same token.
const ALLOWED_TTL: Duration = Duration::from_secs(60);
const DENIED_TTL: Duration = Duration::from_secs(10);
/// Denied answers cached at most; emptied when full (made-up tokens cannot grow it).
const MAX_CACHED: usize = 1024;
/// Allowed tokens remembered at most (scrapers: a handful); the oldest goes when full.
const MAX_ALLOWED: usize = 256;
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
    known_reviews: Semaphore,
    /// Denied answers (401, 403), by token hash.
    cache: Mutex<HashMap<[u8; 32], (Instant, Answer)>>,
    /// When each token allowed was last reviewed, by hash; kept past `ALLOWED_TTL` so
    /// that its next review takes the known budget.
    allowed: Mutex<HashMap<[u8; 32], Instant>>,
}

impl MetricsAuth {
    pub fn new(client: Client) -> Arc<Self> {
        Arc::new(Self {
            client,
            timeout: Duration::from_secs(5),
            reviews: Semaphore::new(MAX_REVIEWS),
            known_reviews: Semaphore::new(MAX_KNOWN_REVIEWS),
            cache: Mutex::new(HashMap::new()),
            allowed: Mutex::new(HashMap::new()),
        })
    }

    fn cached(&self, key: &[u8; 32]) -> Option<Answer> {
        if self
            .allowed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .is_some_and(|at| at.elapsed() < ALLOWED_TTL)
        {
            return Some(Answer::Allowed);
        }
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let (at, answer) = cache.get(key)?;
        (at.elapsed() < DENIED_TTL).then_some(*answer)
    }

    /// The review budget for this token: its own for one allowed before.
    fn budget(&self, key: &[u8; 32]) -> &Semaphore {
        if self
            .allowed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(key)
        {
            &self.known_reviews
        } else {
            &self.reviews
        }
    }

    fn remember(&self, key: [u8; 32], answer: Answer) {
        let now = Instant::now();
        let mut allowed = self.allowed.lock().unwrap_or_else(|e| e.into_inner());
        if answer == Answer::Allowed {
            if allowed.len() >= MAX_ALLOWED && !allowed.contains_key(&key) {
                let oldest = allowed.iter().min_by_key(|(_, at)| **at).map(|(k, _)| *k);
                if let Some(k) = oldest {
                    allowed.remove(&k);
                }
            }
            allowed.insert(key, now);
            return;
        }
        // Allowed no more (a token revoked, a binding removed).
        allowed.remove(&key);
        drop(allowed);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(key, (now, answer));
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
    #[error("{review}")]
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
            "a bearer token is required (docs/operations.md, Metrics and alerts)",
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
            let Ok(Ok(_permit)) =
                tokio::time::timeout(REVIEW_WAIT, auth.budget(&key).acquire()).await
            else {
                return (StatusCode::TOO_MANY_REQUESTS, "too many reviews at once").into_response();
            };
            match auth.review(token).await {
                Ok(a) => {
                    auth.remember(key, a);
                    a
                }
                Err(e) => {
                    tracing::warn!(error = %resourcewatch_runtime::error_chain(&e), "could not review a /metrics client");
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

#[cfg(test)]
mod tests {
    use super::*;

    fn auth() -> Arc<MetricsAuth> {
        // Never contacted: these tests exercise the cache and budgets only.
        let config = kube::Config::new("https://127.0.0.1:9".parse().expect("url"));
        MetricsAuth::new(Client::try_from(config).expect("client"))
    }

    #[tokio::test]
    async fn a_spray_of_denied_tokens_neither_flushes_nor_starves_an_allowed_scraper() {
        let auth = auth();
        let scraper = [7u8; 32];
        auth.remember(scraper, Answer::Allowed);
        for i in 0..10_000u32 {
            let mut junk = [0u8; 32];
            junk[..4].copy_from_slice(&i.to_le_bytes());
            junk[31] = 1;
            auth.remember(junk, Answer::Unauthenticated);
        }
        assert_eq!(auth.cached(&scraper), Some(Answer::Allowed));
        // Every review permit for unknown tokens is held by the spray ...
        let _held: Vec<_> = (0..MAX_REVIEWS)
            .map(|_| auth.reviews.try_acquire().expect("permit"))
            .collect();
        assert!(auth.budget(&[9u8; 32]).try_acquire().is_err());
        // ... and the scraper's next review still has its own.
        assert!(auth.budget(&scraper).try_acquire().is_ok());
    }

    #[tokio::test]
    async fn allowed_tokens_past_the_bound_drop_the_oldest_and_a_denial_revokes() {
        let auth = auth();
        let key = |i: usize| {
            let mut k = [0u8; 32];
            k[..8].copy_from_slice(&(i as u64).to_le_bytes());
            k
        };
        for i in 0..=MAX_ALLOWED {
            auth.remember(key(i), Answer::Allowed);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(auth.cached(&key(0)), None, "the oldest went");
        assert_eq!(auth.cached(&key(1)), Some(Answer::Allowed));
        assert_eq!(auth.cached(&key(MAX_ALLOWED)), Some(Answer::Allowed));
        auth.remember([5u8; 32], Answer::Forbidden);
        assert_eq!(auth.cached(&[5u8; 32]), Some(Answer::Forbidden));
        assert!(std::ptr::eq(auth.budget(&[5u8; 32]), &auth.reviews));
    }
}
