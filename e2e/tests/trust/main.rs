//! Remediation a cluster admin can turn on, against the real kube-apiserver: the operator
//! binary running as its own ServiceAccount (a token the API server issued, the RBAC of
//! config/rbac/: no eviction right until a namespace admin binds one), simulated agents on
//! the real protocol with real ServiceAccount tokens (TokenRequest bound to an agent pod),
//! users impersonated with the built-in `edit` and `admin` roles, and Deployments whose
//! pods the real ReplicaSet controller makes (bound to simulated nodes: no kubelet runs
//! them, so an eviction shows as the pod's deletionTimestamp).
//!
//! Run by `make e2e-api` (e2e/run-api-tests.sh).

mod agents;
mod grants;
mod metrics;
mod rails;
mod reports;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::api::{
    core::v1::{ConfigMap, Namespace, Pod},
    events::v1::Event,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use resourcewatch_crds::{ConditionStatus, RemediationOutcome, RemediationReason, ResourceWatch};
use resourcewatch_e2e::{
    harness::{self, TestNamespace, wait_for},
    operator::OperatorProcess,
    sim::{AgentTls, PodPlan, SimAgent},
};
use resourcewatch_proto::{
    self as pb, agent_control_client::AgentControlClient, agent_message::Msg,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

#[allow(unused_imports)]
use agents::*;
#[allow(unused_imports)]
use grants::*;
#[allow(unused_imports)]
use metrics::*;
#[allow(unused_imports)]
use rails::*;
#[allow(unused_imports)]
use reports::*;

pub(crate) const MIB: u64 = 1 << 20;

pub(crate) struct Env {
    client: Client,
    ns: TestNamespace,
    op: OperatorProcess,
    tls: AgentTls,
}

impl Env {
    async fn new(prefix: &str, opted_in: bool, switch: bool) -> Self {
        let client = harness::client().await.expect("a cluster (KUBECONFIG)");
        harness::install_crd(&client).await.expect("CRD");
        let ns = TestNamespace::create(&client, prefix)
            .await
            .expect("namespace");
        let mut args = vec!["--agent-grace", "4s"];
        if switch {
            args.push("--enable-remediation");
        }
        let mut op = OperatorProcess::start_as_service_account(&client, &ns.name, "op", &args)
            .await
            .expect("operator starts");
        if opted_in {
            // The opt-in label, a RemediationPolicy, the evictor role bound to this
            // test's operator (its ServiceAccount lives in the test namespace).
            ns.opt_in_for(&ns.name).await.expect("opt in");
        }
        op.wait_ready().await.expect("operator ready");
        let tls = AgentTls::from_secret(&client, &ns.name, "resourcewatch-agent-tls")
            .await
            .expect("agent secret");
        Self {
            client,
            ns,
            op,
            tls,
        }
    }

    fn n(&self) -> &str {
        &self.ns.name
    }

    async fn node(&self, name: &str) -> (String, String) {
        let node = format!("{name}-{}", self.n());
        harness::fake_node(&self.client, &node).await.expect("node");
        let token = harness::agent_token(&self.client, self.n(), &node)
            .await
            .expect("token");
        (node, token)
    }

    fn agent(
        &self,
        node: &str,
        token: &str,
        plan: Arc<dyn Fn(&str) -> PodPlan + Send + Sync>,
    ) -> SimAgent {
        self.agent_offering(node, token, plan, pb::SPOKEN_PROTOCOL_VERSIONS)
    }

    /// An agent of another release: it offers the protocol versions `offered`.
    fn agent_offering(
        &self,
        node: &str,
        token: &str,
        plan: Arc<dyn Fn(&str) -> PodPlan + Send + Sync>,
        offered: (u32, u32),
    ) -> SimAgent {
        SimAgent::spawn_offering(
            format!("https://{}", self.op.grpc),
            resourcewatch_proto::operator_server_name(
                resourcewatch_proto::OPERATOR_SERVICE,
                self.n(),
            ),
            self.tls.for_node(token.to_owned()),
            node.to_owned(),
            Arc::new(move |p: &pb::TargetPod| plan(&p.name)),
            offered,
        )
    }

    async fn watch(
        &self,
        client: &Client,
        name: &str,
        selector: serde_json::Value,
    ) -> Result<ResourceWatch, kube::Error> {
        let rw: ResourceWatch = serde_json::from_value(serde_json::json!({
            "apiVersion": "resourcewatch.io/v1alpha1", "kind": "ResourceWatch",
            "metadata": {"name": name},
            "spec": {"selector": selector, "interval": "5s",
                     "remediation": {"action": "Restart", "minTimeToOOM": "60s", "cooldown": "10m",
                                     "window": "1h", "maxRestarts": 2}}
        }))
        .expect("rw");
        Api::<ResourceWatch>::namespaced(client.clone(), self.n())
            .create(&PostParams::default(), &rw)
            .await
    }

    async fn status(&self, name: &str) -> resourcewatch_crds::ResourceWatchStatus {
        Api::<ResourceWatch>::namespaced(self.client.clone(), self.n())
            .get(name)
            .await
            .ok()
            .and_then(|w| w.status)
            .unwrap_or_default()
    }

    async fn evicted(&self) -> Vec<String> {
        Api::<Pod>::namespaced(self.client.clone(), self.n())
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .map(|p| p.name_any())
            .collect()
    }

    async fn events(&self, reason: &str) -> Vec<Event> {
        harness::events(&self.client, self.n(), reason).await
    }

    /// Waits for a first eviction (a pod with a deletionTimestamp) and returns them.
    async fn wait_evicted(&self, what: &str) -> Vec<String> {
        wait_for(what, Duration::from_secs(40), || async {
            let e = self.evicted().await;
            Ok((!e.is_empty()).then_some(e))
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", self.op.log_text()))
    }

    async fn condition(&self, watch: &str, want: ConditionStatus, reason: &str) {
        let what = format!("{watch}: Remediation={want:?} {reason}");
        wait_for(&what, Duration::from_secs(40), || async {
            Ok(self
                .status(watch)
                .await
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Remediation" && c.status == want && c.reason == reason))
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\noperator log:\n{}", self.op.log_text()));
    }

    /// Pods on simulated nodes never finish a graceful deletion (no kubelet): remove them
    /// at once so the namespace can go.
    async fn end(self) {
        harness::delete_pods_now(&self.client, self.n()).await;
        drop(self.op);
        self.ns.delete().await;
    }
}

pub(crate) fn labels(app: &str) -> BTreeMap<String, String> {
    [("app".to_string(), app.to_string())].into()
}

/// A container leaking towards its limit: OOM predicted in 20 s at confidence 95.
pub(crate) fn leaking() -> PodPlan {
    PodPlan {
        cpu_percent: 5.0,
        rss_bytes: 100 * MIB,
        limit_bytes: 128 * MIB,
        leak: Some((2e6, 95, 20.0)),
    }
}

pub(crate) fn flat() -> PodPlan {
    PodPlan {
        cpu_percent: 1.0,
        rss_bytes: 20 * MIB,
        limit_bytes: 128 * MIB,
        leak: None,
    }
}

/// Opens a stream the way a forger would: any claimed node, any token.
pub(crate) async fn raw_session(
    env: &Env,
    claimed: &str,
    token: &str,
    first: Msg,
) -> (
    tokio::sync::mpsc::Sender<pb::AgentMessage>,
    Result<tonic::Streaming<pb::OperatorMessage>, tonic::Status>,
) {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&env.tls.ca))
        .identity(Identity::from_pem(&env.tls.cert, &env.tls.key))
        .domain_name(resourcewatch_proto::operator_server_name(
            resourcewatch_proto::OPERATOR_SERVICE,
            env.n(),
        ));
    let channel = Endpoint::from_shared(format!("https://{}", env.op.grpc))
        .expect("endpoint")
        .tls_config(tls)
        .expect("tls")
        .connect()
        .await
        .expect("connect");
    let mut client = AgentControlClient::new(channel).max_encoding_message_size(64 << 20);
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tx.send(pb::AgentMessage { msg: Some(first) })
        .await
        .expect("queue");
    let mut req = tonic::Request::new(ReceiverStream::new(rx));
    req.metadata_mut()
        .insert(pb::NODE_METADATA, claimed.parse().expect("ascii"));
    req.metadata_mut().insert(
        pb::AUTHORIZATION_METADATA,
        format!("Bearer {token}").parse().expect("ascii"),
    );
    let resp = client.session(req).await.map(|r| r.into_inner());
    (tx, resp)
}

pub(crate) fn hello(node: &str) -> Msg {
    Msg::Hello(pb::Hello {
        node_name: node.into(),
        agent_version: "forger".into(),
        protocol_version: pb::PROTOCOL_VERSION,
        min_protocol_version: pb::MIN_PROTOCOL_VERSION,
        ..Default::default()
    })
}
