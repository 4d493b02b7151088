//! A CPU profile's result as the ConfigMap the controller writes (the request's lifecycle
//! is the core's `profile`): `profile.folded` (text), `profile.svg` (text, when it fit),
//! `profile.pb.gz` (binary), owned by the watch so that deleting the watch deletes it.

use std::collections::BTreeMap;

use k8s_openapi::{ByteString, api::core::v1::ConfigMap};
use kube::{Resource, ResourceExt};
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
