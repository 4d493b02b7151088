//! Who may turn a ResourceWatch into evictions.
//!
//! Creating a watch must not be enough to evict: its author must be allowed to evict pods
//! in that namespace themselves (`create pods/eviction`). Only admission knows the
//! author, so the operator serves a mutating admission webhook for ResourceWatches: on
//! every create and update of a `Restart` watch it asks the API server (a
//! SubjectAccessReview of the requesting user) and, when allowed, writes
//! [`AUTHORIZATION_ANNOTATION`]: the author and an HMAC (key in the operator's CA
//! Secret) over the author, the namespace, the name and every field that decides what
//! may be evicted (`selector`, `leakDetection`, `remediation`). An update by someone who
//! may not evict keeps the old author only if none of those fields changed.
//!
//! The operator never trusts the annotation's text: before any eviction it checks the
//! HMAC against the watch as stored, and reviews the recorded author's rights again (a
//! revoked right stops evictions). A watch applied while the webhook was unreachable
//! (its failure policy is `Ignore`), or with a copied or edited annotation, simply
//! carries no valid authorization and says so in its `Remediation` condition.

use base64::Engine as _;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::{
    Api, Client,
    api::PostParams,
    core::{
        DynamicObject,
        admission::{AdmissionRequest, AdmissionResponse, Operation},
    },
};
use resourcewatch_crds::{
    AUTHORIZATION_ANNOTATION, RemediationAction, ResourceWatch, ResourceWatchSpec,
};
use ring::hmac;
use serde::{Deserialize, Serialize};

/// Who applied a watch, as admission saw them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Author {
    pub user: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

/// The annotation's value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    #[serde(flatten)]
    author: Author,
    sig: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthzError {
    #[error(
        "no authorization recorded: apply the watch again as someone allowed to create pods/eviction in this namespace"
    )]
    Missing,
    #[error(
        "the recorded authorization does not match this watch (copied, edited, or its selector/leakDetection/remediation changed since): apply it again as someone allowed to evict"
    )]
    BadSignature,
}

/// Signs and verifies authorization records. The key is the operator's, from its CA
/// Secret, shared by its replicas.
#[derive(Clone)]
pub struct Signer {
    key: hmac::Key,
}

impl Signer {
    pub fn new(secret: &[u8]) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
        }
    }

    /// What the signature covers.
    fn message(ns: &str, name: &str, spec: &ResourceWatchSpec, author: &Author) -> Vec<u8> {
        // serde_json writes struct fields in declaration order and maps sorted
        // (BTreeMap): the same spec always gives the same bytes.
        serde_json::to_vec(&serde_json::json!({
            "namespace": ns,
            "name": name,
            "selector": spec.selector,
            "leakDetection": spec.leak_detection,
            "remediation": spec.remediation,
            "author": author,
        }))
        .unwrap_or_default()
    }

    pub fn sign(&self, ns: &str, name: &str, spec: &ResourceWatchSpec, author: &Author) -> String {
        let tag = hmac::sign(&self.key, &Self::message(ns, name, spec, author));
        let record = Record {
            author: author.clone(),
            sig: base64::engine::general_purpose::STANDARD.encode(tag.as_ref()),
        };
        serde_json::to_string(&record).unwrap_or_default()
    }

    /// The author of a watch, if its annotation is a valid record for it as it is now.
    pub fn verify(
        &self,
        ns: &str,
        name: &str,
        spec: &ResourceWatchSpec,
        annotation: Option<&str>,
    ) -> Result<Author, AuthzError> {
        let raw = annotation.ok_or(AuthzError::Missing)?;
        let record: Record = serde_json::from_str(raw).map_err(|_| AuthzError::BadSignature)?;
        let sig = base64::engine::general_purpose::STANDARD
            .decode(&record.sig)
            .map_err(|_| AuthzError::BadSignature)?;
        hmac::verify(
            &self.key,
            &Self::message(ns, name, spec, &record.author),
            &sig,
        )
        .map_err(|_| AuthzError::BadSignature)?;
        Ok(record.author)
    }

    pub fn verify_watch(&self, rw: &ResourceWatch) -> Result<Author, AuthzError> {
        self.verify(
            rw.metadata.namespace.as_deref().unwrap_or_default(),
            rw.metadata.name.as_deref().unwrap_or_default(),
            &rw.spec,
            rw.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(AUTHORIZATION_ANNOTATION))
                .map(String::as_str),
        )
    }
}

/// Whether someone may evict pods in a namespace.
#[tonic::async_trait]
pub trait AccessReviewer: Send + Sync + 'static {
    async fn may_evict(&self, who: &Author, namespace: &str) -> Result<bool, String>;
}

/// SubjectAccessReviews against the API server.
pub struct SubjectAccessReviewer {
    pub client: Client,
    pub timeout: std::time::Duration,
}

#[tonic::async_trait]
impl AccessReviewer for SubjectAccessReviewer {
    async fn may_evict(&self, who: &Author, namespace: &str) -> Result<bool, String> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(who.user.clone()),
                uid: (!who.uid.is_empty()).then(|| who.uid.clone()),
                groups: (!who.groups.is_empty()).then(|| who.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(namespace.into()),
                    verb: Some("create".into()),
                    group: Some(String::new()),
                    resource: Some("pods".into()),
                    subresource: Some("eviction".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer =
            tokio::time::timeout(self.timeout, api.create(&PostParams::default(), &review))
                .await
                .map_err(|_| "SubjectAccessReview timed out".to_string())?
                .map_err(|e| format!("SubjectAccessReview: {e}"))?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}

/// What admission decided, for the metric and the tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Not a `Restart` watch (or a dry run): nothing to record.
    NotApplicable,
    Authorized,
    /// The author's earlier authorization stays: nothing it covers changed.
    Kept,
    NotAuthorized,
    /// The review could not be made: the watch is admitted without an authorization.
    ReviewFailed,
}

impl Admission {
    pub fn metric_label(self) -> &'static str {
        match self {
            Admission::NotApplicable => "not_applicable",
            Admission::Authorized => "authorized",
            Admission::Kept => "kept",
            Admission::NotAuthorized => "not_authorized",
            Admission::ReviewFailed => "review_failed",
        }
    }
}

/// The webhook: never refuses a watch (monitoring is everyone's), only records or removes
/// the authorization to evict, and warns the user when it is missing.
pub async fn admit(
    req: &AdmissionRequest<DynamicObject>,
    signer: &Signer,
    reviewer: &dyn AccessReviewer,
) -> (AdmissionResponse, Admission) {
    let resp = AdmissionResponse::from(req);
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return (resp, Admission::NotApplicable);
    }
    let Some(obj) = &req.object else {
        return (resp, Admission::NotApplicable);
    };
    let before = serde_json::to_value(obj).unwrap_or_default();
    // An object the types cannot read is the schema's to refuse, not ours.
    let Ok(rw) = serde_json::from_value::<ResourceWatch>(before.clone()) else {
        return (resp, Admission::NotApplicable);
    };
    let ns = req.namespace.clone().unwrap_or_default();
    let name = if req.name.is_empty() {
        rw.metadata.name.clone().unwrap_or_default()
    } else {
        req.name.clone()
    };
    let wants_evictions =
        rw.spec.remediation.action == RemediationAction::Restart && !rw.spec.remediation.dry_run;
    let mut after = before.clone();
    let (value, outcome, warning) = if !wants_evictions {
        (None, Admission::NotApplicable, None)
    } else {
        let author = Author {
            user: req.user_info.username.clone().unwrap_or_default(),
            uid: req.user_info.uid.clone().unwrap_or_default(),
            groups: req.user_info.groups.clone().unwrap_or_default(),
        };
        let kept = || {
            let old = req.old_object.as_ref().and_then(|o| {
                serde_json::from_value::<ResourceWatch>(serde_json::to_value(o).ok()?).ok()
            })?;
            let old_note = old
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(AUTHORIZATION_ANNOTATION))?
                .clone();
            signer
                .verify(&ns, &name, &rw.spec, Some(&old_note))
                .ok()
                .map(|_| old_note)
        };
        match reviewer.may_evict(&author, &ns).await {
            Ok(true) => (
                Some(signer.sign(&ns, &name, &rw.spec, &author)),
                Admission::Authorized,
                None,
            ),
            Ok(false) => match kept() {
                Some(old) => (Some(old), Admission::Kept, None),
                None => (
                    None,
                    Admission::NotAuthorized,
                    Some(format!(
                        "resourcewatch: {} may not create pods/eviction in {ns}: this Restart watch will not evict (it reports only)",
                        author.user
                    )),
                ),
            },
            Err(e) => {
                tracing::warn!(error = %e, "admission: could not review the author");
                (
                    kept(),
                    Admission::ReviewFailed,
                    Some(format!(
                        "resourcewatch: could not check your right to evict pods ({e}); apply again to enable restarts"
                    )),
                )
            }
        }
    };
    let meta = &mut after["metadata"];
    match &value {
        Some(v) => {
            if !meta["annotations"].is_object() {
                meta["annotations"] = serde_json::json!({});
            }
            meta["annotations"][AUTHORIZATION_ANNOTATION] = serde_json::Value::String(v.clone());
        }
        None => {
            if let Some(a) = meta["annotations"].as_object_mut() {
                a.remove(AUTHORIZATION_ANNOTATION);
            }
        }
    }
    let mut resp = resp;
    if after != before {
        match resp.clone().with_patch(json_patch::diff(&before, &after)) {
            Ok(r) => resp = r,
            Err(e) => tracing::warn!(error = %e, "admission: patch not serialisable"),
        }
    }
    if let Some(w) = warning {
        resp.warnings = Some(vec![w]);
    }
    (resp, outcome)
}

/// The webhook's HTTP routes: `POST /mutate` takes an `AdmissionReview`.
pub fn router(
    signer: Signer,
    reviewer: std::sync::Arc<dyn AccessReviewer>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
) -> axum::Router {
    use axum::{Json, routing::post};
    use kube::core::admission::AdmissionReview;
    axum::Router::new().route(
        "/mutate",
        post(move |Json(review): Json<AdmissionReview<DynamicObject>>| {
            let signer = signer.clone();
            let reviewer = reviewer.clone();
            let metrics = metrics.clone();
            async move {
                let req: AdmissionRequest<DynamicObject> = match review.try_into() {
                    Ok(r) => r,
                    Err(e) => {
                        return Json(AdmissionResponse::invalid(format!("{e}")).into_review());
                    }
                };
                let (resp, outcome) = admit(&req, &signer, reviewer.as_ref()).await;
                crate::metrics::Metrics::labelled(
                    &metrics.admission_reviews,
                    "result",
                    outcome.metric_label(),
                    1,
                );
                tracing::info!(
                    namespace = req.namespace.as_deref().unwrap_or(""),
                    name = %req.name,
                    user = req.user_info.username.as_deref().unwrap_or(""),
                    result = outcome.metric_label(),
                    "admission"
                );
                Json(resp.into_review())
            }
        }),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn spec(json: serde_json::Value) -> ResourceWatchSpec {
        serde_json::from_value(json).unwrap()
    }

    fn alice() -> Author {
        Author {
            user: "alice".into(),
            uid: "u-1".into(),
            groups: vec!["dev".into()],
        }
    }

    #[test]
    fn a_signature_covers_the_author_and_what_decides_evictions() {
        let s = Signer::new(b"k1");
        let sp = spec(
            serde_json::json!({"selector": {"matchLabels": {"app": "api"}}, "remediation": {"action": "Restart"}}),
        );
        let note = s.sign("ns", "w", &sp, &alice());
        assert_eq!(s.verify("ns", "w", &sp, Some(&note)), Ok(alice()));
        // Fields that do not widen what is evicted may change freely.
        let mut k = sp.clone();
        k.top_k = 50;
        k.interval = "1m".into();
        assert!(s.verify("ns", "w", &k, Some(&note)).is_ok());
        // Anything that does, may not.
        for changed in [
            spec(serde_json::json!({"remediation": {"action": "Restart"}})),
            spec(
                serde_json::json!({"selector": {"matchLabels": {"app": "api"}}, "remediation": {"action": "Restart", "minTimeToOOM": "1h"}}),
            ),
            spec(
                serde_json::json!({"selector": {"matchLabels": {"app": "api"}}, "remediation": {"action": "Restart"}, "leakDetection": {"minConfidence": 10}}),
            ),
        ] {
            assert_eq!(
                s.verify("ns", "w", &changed, Some(&note)),
                Err(AuthzError::BadSignature)
            );
        }
        // Another watch, another namespace, another key, an edited author: invalid.
        assert!(s.verify("ns", "other", &sp, Some(&note)).is_err());
        assert!(s.verify("ns2", "w", &sp, Some(&note)).is_err());
        assert!(
            Signer::new(b"k2")
                .verify("ns", "w", &sp, Some(&note))
                .is_err()
        );
        let forged = note.replace("alice", "admin");
        assert!(s.verify("ns", "w", &sp, Some(&forged)).is_err());
        assert_eq!(s.verify("ns", "w", &sp, None), Err(AuthzError::Missing));
        assert_eq!(
            s.verify("ns", "w", &sp, Some("{}")),
            Err(AuthzError::BadSignature)
        );
    }

    struct Table(BTreeMap<&'static str, Result<bool, String>>);

    #[tonic::async_trait]
    impl AccessReviewer for Table {
        async fn may_evict(&self, who: &Author, _ns: &str) -> Result<bool, String> {
            self.0.get(who.user.as_str()).cloned().unwrap_or(Ok(false))
        }
    }

    fn request(
        op: &str,
        user: &str,
        obj: serde_json::Value,
        old: Option<serde_json::Value>,
    ) -> AdmissionRequest<DynamicObject> {
        let review: kube::core::admission::AdmissionReview<DynamicObject> =
            serde_json::from_value(serde_json::json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {
                    "uid": "r-1",
                    "kind": {"group": "resourcewatch.io", "version": "v1alpha1", "kind": "ResourceWatch"},
                    "resource": {"group": "resourcewatch.io", "version": "v1alpha1", "resource": "resourcewatches"},
                    "namespace": "ns", "name": "w", "operation": op,
                    "userInfo": {"username": user, "uid": "x", "groups": ["system:authenticated"]},
                    "object": obj, "oldObject": old
                }
            }))
            .unwrap();
        review.try_into().unwrap()
    }

    fn watch(remediation: serde_json::Value, note: Option<&str>) -> serde_json::Value {
        let mut v = serde_json::json!({
            "apiVersion": "resourcewatch.io/v1alpha1", "kind": "ResourceWatch",
            "metadata": {"name": "w", "namespace": "ns"},
            "spec": {"selector": {"matchLabels": {"app": "api"}}, "remediation": remediation}
        });
        if let Some(n) = note {
            v["metadata"]["annotations"] = serde_json::json!({ AUTHORIZATION_ANNOTATION: n });
        }
        v
    }

    fn patched(req: &AdmissionRequest<DynamicObject>, resp: &AdmissionResponse) -> ResourceWatch {
        let mut v = serde_json::to_value(req.object.as_ref().unwrap()).unwrap();
        if let Some(p) = &resp.patch {
            let patch: json_patch::Patch = serde_json::from_slice(p).unwrap();
            json_patch::patch(&mut v, &patch).unwrap();
        }
        serde_json::from_value(v).unwrap()
    }

    #[tokio::test]
    async fn admission_records_only_authors_who_may_evict() {
        let signer = Signer::new(b"key");
        let reviewer = Table(
            [
                ("admin", Ok(true)),
                ("dev", Ok(false)),
                ("flaky", Err("timeout".to_string())),
            ]
            .into(),
        );
        let restart = serde_json::json!({"action": "Restart"});
        // An admin's watch is signed for them.
        let req = request("CREATE", "admin", watch(restart.clone(), None), None);
        let (resp, outcome) = admit(&req, &signer, &reviewer).await;
        assert!(resp.allowed);
        assert_eq!(outcome, Admission::Authorized);
        let signed = patched(&req, &resp);
        assert_eq!(signer.verify_watch(&signed).unwrap().user, "admin");
        let note = signed.metadata.annotations.as_ref().unwrap()[AUTHORIZATION_ANNOTATION].clone();

        // A developer who cannot evict: admitted, no authorization, and a warning. A note
        // they copied in themselves is removed.
        let req = request(
            "CREATE",
            "dev",
            watch(
                restart.clone(),
                Some("{\"user\":\"admin\",\"sig\":\"AAAA\"}"),
            ),
            None,
        );
        let (resp, outcome) = admit(&req, &signer, &reviewer).await;
        assert!(resp.allowed, "monitoring is never refused");
        assert_eq!(outcome, Admission::NotAuthorized);
        assert!(resp.warnings.as_ref().unwrap()[0].contains("may not create pods/eviction"));
        let w = patched(&req, &resp);
        assert_eq!(signer.verify_watch(&w), Err(AuthzError::Missing));

        // The developer edits the admin's watch: topK keeps the admin's authorization;
        // widening the selector drops it.
        let mut edited = watch(restart.clone(), Some(&note));
        edited["spec"]["topK"] = 30.into();
        let req = request(
            "UPDATE",
            "dev",
            edited,
            Some(watch(restart.clone(), Some(&note))),
        );
        let (resp, outcome) = admit(&req, &signer, &reviewer).await;
        assert_eq!(outcome, Admission::Kept);
        assert_eq!(
            signer.verify_watch(&patched(&req, &resp)).unwrap().user,
            "admin"
        );
        let mut widened = watch(restart.clone(), Some(&note));
        widened["spec"]["selector"] = serde_json::json!({});
        let req = request(
            "UPDATE",
            "dev",
            widened,
            Some(watch(restart.clone(), Some(&note))),
        );
        let (resp, outcome) = admit(&req, &signer, &reviewer).await;
        assert_eq!(outcome, Admission::NotAuthorized);
        assert!(signer.verify_watch(&patched(&req, &resp)).is_err());

        // A failed review admits without authorization; Alert and dry runs need none.
        let req = request("CREATE", "flaky", watch(restart, None), None);
        let (resp, outcome) = admit(&req, &signer, &reviewer).await;
        assert_eq!(outcome, Admission::ReviewFailed);
        assert!(resp.allowed && resp.warnings.is_some());
        let req = request(
            "CREATE",
            "dev",
            watch(serde_json::json!({"action": "Alert"}), None),
            None,
        );
        assert_eq!(
            admit(&req, &signer, &reviewer).await.1,
            Admission::NotApplicable
        );
    }
}
