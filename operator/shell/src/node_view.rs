//! The node view: each `ClusterResourceWatch` becomes a node scope on the hub (its nodes
//! report at least its K at its cadence) and a status built from what the agents' HashPipe
//! sketches saw, node-wide: every namespace's pods and the hosts' own processes.
//!
//! The status itself is the core's (`resourcewatch_operator_core::node_view::compute`, pure and unit-tested); [`run`] is
//! the controller around it (one [`Context`], leader-only writes, like the ResourceWatch
//! controller).

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, Resource, ResourceExt,
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use resourcewatch_crds::{ClusterResourceWatch, ClusterResourceWatchStatus};
pub use resourcewatch_operator_core::node_view::{
    Inputs, PodIndex, PodInfo, ViewSettings, compute, same_content,
};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;

use crate::{
    Error, Result,
    hub::{Hub, NodeScope},
    metrics::Metrics,
    pods::{CachedPod, selected_pod},
    status_write::apply_status,
};

/// The pods scheduled to `nodes`, by UID: only their processes can be in the view, so the
/// rest of the cluster's pods are not indexed at each reconcile.
pub fn pod_index(pods: &[Arc<CachedPod>], nodes: &BTreeSet<String>) -> PodIndex {
    pods.iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some_and(|n| nodes.contains(n))
        })
        .map(|p| {
            let s = selected_pod(p);
            (
                s.uid,
                PodInfo {
                    namespace: p.namespace().unwrap_or_default(),
                    name: s.name,
                    containers: s.containers,
                },
            )
        })
        .collect()
}

/// The node view controller's state.
pub struct Context {
    pub client: Client,
    pub hub: Arc<Hub>,
    pub metrics: Arc<Metrics>,
    pub nodes: Store<Node>,
    pub pods: Store<CachedPod>,
    pub views: Store<ClusterResourceWatch>,
    pub leader: watch::Receiver<bool>,
    pub write_timeout: Duration,
}

pub async fn reconcile(crw: Arc<ClusterResourceWatch>, ctx: Arc<Context>) -> Result<Action> {
    use tracing::Instrument;
    let span = tracing::info_span!("reconcile", clusterwatch = %crw.name_any());
    ctx.metrics
        .timed(reconcile_inner(&crw, &ctx))
        .instrument(span)
        .await
}

async fn reconcile_inner(crw: &ClusterResourceWatch, ctx: &Context) -> Result<Action> {
    if !*ctx.leader.borrow() {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    // Until the node and pod watches have listed once, a selector matches nothing and
    // every process reads as a pod nobody knows.
    for ready in [
        tokio::time::timeout(Duration::from_millis(1), ctx.nodes.wait_until_ready()).await,
        tokio::time::timeout(Duration::from_millis(1), ctx.pods.wait_until_ready()).await,
    ] {
        if ready.is_err() {
            return Ok(Action::requeue(Duration::from_millis(500)));
        }
    }
    forget_deleted(ctx);
    let name = crw.name_any();
    let settings = ViewSettings::from_spec(&crw.spec);
    let selected: BTreeSet<String> = match &settings {
        Ok(s) => ctx
            .nodes
            .state()
            .iter()
            .filter(|n| s.nodes.matches(n.labels()))
            .map(|n| n.name_any())
            .collect(),
        Err(_) => BTreeSet::new(),
    };
    match &settings {
        Ok(s) => ctx.hub.set_node_scope(
            &name,
            NodeScope {
                nodes: selected.clone(),
                top_k: s.top_k,
                interval: s.interval,
            },
        ),
        Err(_) => ctx.hub.remove_node_scope(&name),
    }
    let views = ctx.hub.view(&selected);
    let pods = pod_index(&ctx.pods.state(), &selected);
    let now = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())?.to_string();
    let status = compute(&Inputs {
        generation: crw.meta().generation,
        settings: &settings,
        selected: &selected,
        nodes: &views,
        pods: &pods,
        old: crw.status.as_ref(),
        now: &now,
    });
    let requeue = settings
        .as_ref()
        .map_or(Duration::from_secs(60), |s| s.interval);
    if crw
        .status
        .as_ref()
        .is_some_and(|old| same_content(old, &status))
    {
        ctx.metrics.status_skipped.inc();
        return Ok(Action::requeue(requeue));
    }
    write_status(ctx, &name, &status).await?;
    Ok(Action::requeue(requeue))
}

/// Node scopes of ClusterResourceWatches that are gone.
fn forget_deleted(ctx: &Context) {
    let live: BTreeSet<String> = ctx.views.state().iter().map(|v| v.name_any()).collect();
    for name in ctx.hub.node_scope_names() {
        if !live.contains(&name) {
            ctx.hub.remove_node_scope(&name);
        }
    }
}

async fn write_status(
    ctx: &Context,
    name: &str,
    status: &ClusterResourceWatchStatus,
) -> Result<()> {
    apply_status::<ClusterResourceWatch>(
        &ctx.client,
        None,
        name,
        status,
        &ctx.metrics,
        ctx.write_timeout,
    )
    .await
}

pub fn error_policy(crw: Arc<ClusterResourceWatch>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(view = %crw.name_any(), error = %resourcewatch_runtime::error_chain(error), "node view reconcile failed");
    ctx.metrics.reconciled("error_policy");
    Action::requeue(Duration::from_secs(10))
}

/// Runs the node view controller until `shutdown`, on the pod store the ResourceWatch
/// controller keeps (one pod watch for both).
pub async fn run(
    client: Client,
    hub: Arc<Hub>,
    pods: Store<CachedPod>,
    metrics: Arc<Metrics>,
    leader: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
) {
    let (nodes, nodes_writer) = reflector::store();
    let node_stream = reflector::reflector(
        nodes_writer,
        watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .modify(|n| n.managed_fields_mut().clear()),
    )
    .default_backoff()
    .touched_objects();
    let controller = Controller::new(
        Api::<ClusterResourceWatch>::all(client.clone()),
        watcher::Config::default().any_semantic(),
    );
    let views = controller.store();
    let mapper = views.clone();
    // A node's labels decide which views select it: any node change reconciles them all.
    let controller = controller.watches_stream(node_stream, move |_: Node| {
        mapper
            .state()
            .into_iter()
            .map(|v| ObjectRef::from_obj(&*v))
            .collect::<Vec<_>>()
    });
    let hub_changes = WatchStream::new(hub.subscribe_changes()).map(|_| ());
    let leader_changes = WatchStream::new(leader.clone()).map(|_| ());
    let ctx = Arc::new(Context {
        client,
        hub,
        metrics,
        nodes,
        pods,
        views,
        leader,
        write_timeout: Duration::from_secs(10),
    });
    let mut shutdown_signal = shutdown;
    controller
        .reconcile_all_on(futures::stream::select(hub_changes, leader_changes))
        .graceful_shutdown_on(async move {
            let _ = shutdown_signal.wait_for(|s| *s).await;
        })
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %resourcewatch_runtime::error_chain(&e), "node view controller");
            }
        })
        .await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn only_pods_of_the_selected_nodes_are_indexed_with_their_containers() {
        let pod = |uid: &str, node: &str| -> Arc<CachedPod> {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("p-{uid}"), "namespace": "shop", "uid": uid},
                    "spec": {"nodeName": node, "containers": [{"name": "app"}]},
                    "status": {"containerStatuses": [{
                        "name": "app", "containerID": format!("containerd://cid-{uid}"),
                        "image": "i", "imageID": "", "ready": true, "restartCount": 0
                    }]}
                }))
                .unwrap(),
            )
        };
        let nodes: BTreeSet<String> = ["n1".to_owned()].into();
        let index = pod_index(&[pod("a", "n1"), pod("b", "n2")], &nodes);
        assert_eq!(index.len(), 1);
        let a = &index["a"];
        assert_eq!((a.namespace.as_str(), a.name.as_str()), ("shop", "p-a"));
        assert_eq!(a.containers.get("cid-a").map(String::as_str), Some("app"));
    }
}
