//! Status writes to the API server: server-side apply of a custom resource's status
//! subresource, for the ResourceWatch and ClusterResourceWatch controllers alike.

use std::time::Duration;

use kube::{
    Api,
    api::{Patch, PatchParams},
};

use crate::{Error, FIELD_MANAGER, Result, metrics::Metrics};

/// Writes `status` by server-side apply under the operator's field manager, bounded by
/// `timeout`, counting the outcome in `resourcewatch_operator_status_writes_total`.
pub async fn apply_status<K>(
    api: &Api<K>,
    name: &str,
    status: &impl serde::Serialize,
    metrics: &Metrics,
    timeout: Duration,
) -> Result<()>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    match tokio::time::timeout(timeout, api.patch_status(name, &pp, &Patch::Apply(&patch))).await {
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
