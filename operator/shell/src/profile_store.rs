//! A CPU profile's result as the ConfigMap the controller writes (the request's lifecycle
//! is the core's `profile`): `profile.folded` (text), `profile.svg` (text, when it fit),
//! `profile.pb.gz` (binary), owned by the watch so that deleting the watch deletes it;
//! stored and deleted here, never over an object the watch does not own.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{ByteString, api::core::v1::ConfigMap};
use kube::{Api, Client, Resource, ResourceExt, api::PostParams};
use resourcewatch_crds::{ProfileStatus, ResourceWatch};
use resourcewatch_operator_core::profile::{config_map_name, cut};
use resourcewatch_proto as pb;

/// The ConfigMap of a result.
pub fn config_map(rw: &ResourceWatch, p: &ProfileStatus, r: &pb::ProfileResult) -> ConfigMap {
    let mut data = BTreeMap::new();
    data.insert("profile.folded".to_owned(), r.folded.clone());
    if let Ok(svg) = String::from_utf8(r.svg.clone())
        && !svg.is_empty()
    {
        data.insert("profile.svg".to_owned(), svg);
    }
    let mut binary = BTreeMap::new();
    if !r.pprof.is_empty() {
        binary.insert("profile.pb.gz".to_owned(), ByteString(r.pprof.clone()));
    }
    let mut cm = ConfigMap {
        data: Some(data),
        binary_data: Some(binary),
        ..Default::default()
    };
    cm.metadata.name = Some(config_map_name(&rw.name_any()));
    cm.metadata.namespace = rw.namespace();
    cm.metadata.owner_references = rw.controller_owner_ref(&()).map(|o| vec![o]);
    cm.metadata.labels = Some(
        [
            ("app.kubernetes.io/managed-by", "resourcewatch-operator"),
            ("resourcewatch.io/watch", rw.name_any().as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), cut(v, 63)))
        .collect(),
    );
    cm.metadata.annotations = Some(
        [
            ("resourcewatch.io/profile-id", p.id.clone()),
            ("resourcewatch.io/profiled-pod", p.pod.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
    );
    cm
}

/// Why a result was not stored.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the result could not be stored in ConfigMap {name}: timed out")]
    Timeout { name: String },
    #[error("the result could not be stored in ConfigMap {name}")]
    Api { name: String, source: kube::Error },
    #[error(
        "the result could not be stored: a ConfigMap {0} exists that this watch does not own; it is left as it is (rename or delete it)"
    )]
    NotOwned(String),
}

/// Writes the result's ConfigMap, replacing the watch's previous one, never an object it
/// does not own: a ConfigMap of that name that is not controlled by this watch (by UID)
/// is left alone and the request fails saying so. Ok: the ConfigMap's name.
pub async fn store(
    client: &Client,
    timeout: Duration,
    rw: &ResourceWatch,
    p: &ProfileStatus,
    r: &pb::ProfileResult,
) -> Result<String, StoreError> {
    let cm = config_map(rw, p, r);
    let name = config_map_name(&rw.name_any());
    let ns = rw.namespace().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let failed = |e: StoreError| {
        tracing::warn!(configmap = %name, error = %resourcewatch_runtime::error_chain(&e), "could not store a profile");
        e
    };
    let api_error = |source| {
        failed(StoreError::Api {
            name: name.clone(),
            source,
        })
    };
    let timed_out = || failed(StoreError::Timeout { name: name.clone() });
    let existing = tokio::time::timeout(timeout, api.get_opt(&name))
        .await
        .map_err(|_| timed_out())?
        .map_err(api_error)?;
    let write = match existing {
        None => tokio::time::timeout(timeout, api.create(&PostParams::default(), &cm)).await,
        Some(old) if owned_by(&old, rw) => {
            // The replacement names the version read: a ConfigMap swapped meanwhile for
            // someone else's is a conflict, not overwritten.
            let mut cm = cm;
            cm.metadata.resource_version = old.metadata.resource_version.clone();
            tokio::time::timeout(timeout, api.replace(&name, &PostParams::default(), &cm)).await
        }
        Some(_) => return Err(failed(StoreError::NotOwned(name.clone()))),
    };
    match write {
        Ok(Ok(_)) => Ok(name.clone()),
        Ok(Err(e)) => Err(api_error(e)),
        Err(_) => Err(timed_out()),
    }
}

/// Whether `cm` is controlled by this watch (same UID, not merely the same name).
fn owned_by(cm: &ConfigMap, rw: &ResourceWatch) -> bool {
    let uid = rw.uid().unwrap_or_default();
    !uid.is_empty()
        && cm
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && o.uid == uid && o.kind == "ResourceWatch")
}

/// Deletes the watch's expired result, only if the watch owns it (with the UID read as
/// a precondition, so an object put there meanwhile is not deleted). A failure is
/// logged: the next reconcile ages the result again and retries.
pub async fn delete(client: &Client, timeout: Duration, rw: &ResourceWatch) {
    let ns = rw.namespace().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let name = config_map_name(&rw.name_any());
    let Ok(Ok(Some(cm))) = tokio::time::timeout(timeout, api.get_opt(&name)).await else {
        return;
    };
    if !owned_by(&cm, rw) {
        tracing::info!(configmap = %name, "an expired profile's ConfigMap is not the watch's: left alone");
        return;
    }
    let dp = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: cm.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&name, &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(e) => {
            tracing::warn!(configmap = %name, error = %e, "could not delete an expired profile")
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn result() -> pb::ProfileResult {
        pb::ProfileResult {
            id: "w-1".into(),
            samples: 990,
            duration_seconds: 10.0,
            frequency_hz: 99,
            folded: "burn;main;outer;middle;burn_here 960\n".into(),
            pprof: vec![1, 2, 3],
            svg: b"<svg/>".to_vec(),
            ..Default::default()
        }
    }

    fn pending() -> ProfileStatus {
        serde_json::from_value(serde_json::json!({
            "id": "w-1", "request": "api-1", "pod": "api-1", "state": "Pending",
            "durationSeconds": 10, "frequencyHz": 99, "requestedAt": "2026-11-27T00:00:00Z"
        }))
        .unwrap()
    }

    #[test]
    fn the_config_map_is_owned_by_the_watch_and_holds_the_three_formats() {
        let rw: ResourceWatch = serde_json::from_value(serde_json::json!({
            "apiVersion": "resourcewatch.io/v1alpha1", "kind": "ResourceWatch",
            "metadata": {"name": "w", "namespace": "shop", "uid": "rw-uid"},
            "spec": {"selector": {}}
        }))
        .unwrap();
        let cm = config_map(&rw, &pending(), &result());
        assert_eq!(cm.metadata.name.as_deref(), Some("w-profile"));
        assert_eq!(cm.metadata.namespace.as_deref(), Some("shop"));
        let owner = &cm.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("ResourceWatch", "rw-uid")
        );
        let data = cm.data.as_ref().unwrap();
        assert!(data["profile.folded"].contains("burn_here 960"));
        assert_eq!(data["profile.svg"], "<svg/>");
        assert_eq!(
            cm.binary_data.as_ref().unwrap()["profile.pb.gz"].0,
            [1, 2, 3]
        );
    }
}
