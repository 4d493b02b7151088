//! resourcewatch installed for real (config/, images, operator Deployment, agent DaemonSet)
//! on a real node, with real workloads: Top-K of the selected pods, agent and operator
//! loss, and a leak predicted before the kernel's OOM kill. Run by `make e2e`
//! (e2e/run-cluster-tests.sh), which builds, installs and tears down. One module per
//! topic; the helpers they share are here.
//!
//! Each test has its own namespace and waits on conditions with deadlines.

mod failover;
mod node_view;
mod nodes;
mod oom;
mod otlp;
mod profiles;
mod sites;
mod status;

use std::{process::Command, time::Duration};

use k8s_openapi::api::{apps::v1::DaemonSet, core::v1::Pod, events::v1::Event};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use resourcewatch_crds::{ConditionReason, ConditionStatus, ResourceWatch, ResourceWatchStatus};
use resourcewatch_e2e::harness::{self, leak_sim_pod, wait_for};

#[allow(unused_imports)]
use failover::*;
#[allow(unused_imports)]
use node_view::*;
#[allow(unused_imports)]
use nodes::*;
#[allow(unused_imports)]
use oom::*;
#[allow(unused_imports)]
use otlp::*;
#[allow(unused_imports)]
use profiles::*;
#[allow(unused_imports)]
use sites::*;
#[allow(unused_imports)]
use status::*;

pub(crate) const SYSTEM: &str = "resourcewatch-system";

pub(crate) fn kubectl(args: &[&str]) -> (bool, String) {
    let out = Command::new(harness::kubectl())
        .args(args)
        .output()
        .expect("kubectl runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

pub(crate) async fn wait_running(client: &Client, ns: &str, names: &[&str]) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for name in names {
        wait_for(
            &format!("pod {name} Running"),
            Duration::from_secs(90),
            || {
                let pods = pods.clone();
                async move {
                    let p = pods.get(name).await?;
                    Ok(
                        (p.status.and_then(|s| s.phase).as_deref() == Some("Running"))
                            .then_some(()),
                    )
                }
            },
        )
        .await
        .expect("pod runs");
    }
}

pub(crate) async fn status_where(
    rws: &Api<ResourceWatch>,
    name: &str,
    what: &str,
    secs: u64,
    pred: impl Fn(&ResourceWatchStatus) -> bool,
) -> ResourceWatchStatus {
    let pred = &pred;
    let r = wait_for(what, Duration::from_secs(secs), || async move {
        let s = rws.get(name).await?.status.unwrap_or_default();
        Ok(pred(&s).then_some(s))
    })
    .await;
    match r {
        Ok(s) => s,
        Err(e) => {
            let last = rws.get(name).await.ok().and_then(|r| r.status);
            panic!("{e:#}\nlast status: {last:#?}")
        }
    }
}

pub(crate) async fn event_count(client: &Client, ns: &str, reason: &str) -> usize {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .count()
        })
        .unwrap_or(0)
}

pub(crate) fn condition(
    s: &ResourceWatchStatus,
    t: &str,
) -> Option<(ConditionStatus, ConditionReason)> {
    s.conditions
        .iter()
        .find(|c| c.type_ == t)
        .map(|c| (c.status, c.reason))
}
