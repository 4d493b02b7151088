//! Status writes to the API server: server-side apply of a custom resource's status
//! subresource, for the ResourceWatch and ClusterResourceWatch controllers alike.

use std::time::Duration;

use kube::{
    Client, Resource,
    api::{Patch, PatchParams},
};
use serde::Serialize;

use crate::{Error, FIELD_MANAGER, Result, metrics::Metrics};

/// The apply configuration: the status under the object's type. Serialized as it stands,
/// not through a `serde_json::Value` tree built first.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusApply<'a, S> {
    api_version: &'a str,
    kind: &'a str,
    status: &'a S,
}

/// Writes `status` of the `K` named `name` (in `namespace`, for a namespaced kind) by
/// server-side apply under the operator's field manager, bounded by `timeout`, counting
/// the outcome in `resourcewatch_operator_status_writes_total`.
///
/// The API server answers with the whole object; it is read as text and not decoded
/// (`Api::patch_status` decodes it into `K`, a status with every row, then drops it:
/// with a status written per interval for each of 500 watches, that decoding and the
/// patch's `Value` tree were a tenth of the operator's CPU at the CI scale).
pub async fn apply_status<K>(
    client: &Client,
    namespace: Option<&str>,
    name: &str,
    status: &impl Serialize,
    metrics: &Metrics,
    timeout: Duration,
) -> Result<()>
where
    K: Resource<DynamicType = ()>,
{
    let (api_version, kind) = (K::api_version(&()), K::kind(&()));
    let patch = StatusApply {
        api_version: &api_version,
        kind: &kind,
        status,
    };
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let mut req = kube::core::Request::new(K::url_path(&(), namespace))
        .patch_subresource("status", name, &pp, &Patch::Apply(&patch))
        .map_err(|e| Error::Kube(kube::Error::BuildRequest(e)))?;
    req.extensions_mut().insert("patch_status");
    match tokio::time::timeout(timeout, client.request_text(req)).await {
        Ok(Ok(_)) => {
            metrics.status_write("ok");
            Ok(())
        }
        Ok(Err(e)) => {
            metrics.status_write("error");
            Err(Error::Kube(e))
        }
        Err(_) => {
            metrics.status_write("timeout");
            Err(Error::Timeout("status write"))
        }
    }
}
