//! The agent protocol end to end in one process: the operator's real tonic server over
//! mTLS, and clients built from the same proto. Node identity (a token must prove the
//! node a stream claims), versions, ACK/NACK, reconnects, replaced streams, bad messages,
//! oversized messages and bad certificates. Tokens come from a fixed table here; the
//! TokenReview path is tested on the real API server (e2e/tests/api.rs).

use std::{net::SocketAddr, sync::Arc, time::Duration};

use resourcewatch_operator::{
    grpc::AgentService,
    hub::{Hub, HubOptions, TargetPod, WatchKey, WatchTargets},
    identity::StaticTokens,
    metrics::Metrics,
    tls::{Leaf, Pki},
};
use resourcewatch_proto::{
    self as pb, agent_control_client::AgentControlClient, agent_control_server::AgentControlServer,
    agent_message::Msg, operator_message,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{
    Code, Streaming,
    transport::{
        Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig,
    },
};

const SERVER_NAME: &str = "resourcewatch-operator.test.svc";

struct Fixture {
    addr: SocketAddr,
    pki: Pki,
    client_leaf: Leaf,
    hub: Arc<Hub>,
    leader: watch::Sender<bool>,
    _shutdown: watch::Sender<bool>,
}

async fn start() -> Fixture {
    let pki = Pki::generate().expect("CA");
    let server_leaf = pki.server(&[SERVER_NAME.into()]).expect("server cert");
    let client_leaf = pki.agent().expect("agent cert");
    let hub = Arc::new(Hub::new(HubOptions::default()));
    let (leader, leader_rx) = watch::channel(true);
    let (shutdown, shutdown_rx) = watch::channel(false);
    let svc = AgentService {
        hub: hub.clone(),
        metrics: Arc::new(Metrics::default()),
        auth: Arc::new(StaticTokens(
            ["n1", "n2", "n3"]
                .into_iter()
                .map(|n| (format!("token-{n}"), n.to_string()))
                .collect(),
        )),
        leader: leader_rx,
        shutdown: shutdown_rx,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&server_leaf.cert, &server_leaf.key))
        .client_ca_root(Certificate::from_pem(&pki.ca_cert));
    let server = Server::builder()
        .tls_config(tls)
        .expect("tls")
        .add_service(AgentControlServer::new(svc).max_decoding_message_size(pb::MAX_MESSAGE_BYTES))
        .serve_with_incoming(TcpListenerStream::new(listener));
    tokio::spawn(server);
    Fixture {
        addr,
        pki,
        client_leaf,
        hub,
        leader,
        _shutdown: shutdown,
    }
}

impl Fixture {
    async fn channel_with(
        &self,
        identity: Option<&Leaf>,
        ca: &str,
    ) -> Result<Channel, tonic::transport::Error> {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .domain_name(SERVER_NAME);
        if let Some(l) = identity {
            tls = tls.identity(Identity::from_pem(&l.cert, &l.key));
        }
        Endpoint::from_shared(format!("https://{}", self.addr))
            .expect("endpoint")
            .tls_config(tls)?
            .connect()
            .await
    }

    async fn channel(&self) -> Channel {
        self.channel_with(Some(&self.client_leaf), &self.pki.ca_cert)
            .await
            .expect("connect")
    }

    /// Opens a stream as the node its Hello names (with that node's token) and sends
    /// `first`; returns the sender and the operator's stream.
    async fn open(
        &self,
        first: Msg,
    ) -> (
        mpsc::Sender<pb::AgentMessage>,
        Result<Streaming<pb::OperatorMessage>, tonic::Status>,
    ) {
        let node = match &first {
            Msg::Hello(h) => h.node_name.clone(),
            _ => "n1".into(),
        };
        let token = format!("token-{node}");
        self.open_as(first, &node, Some(&token)).await
    }

    /// The same with any claimed node and token.
    async fn open_as(
        &self,
        first: Msg,
        node: &str,
        token: Option<&str>,
    ) -> (
        mpsc::Sender<pb::AgentMessage>,
        Result<Streaming<pb::OperatorMessage>, tonic::Status>,
    ) {
        let mut client =
            AgentControlClient::new(self.channel().await).max_encoding_message_size(64 << 20);
        let (tx, rx) = mpsc::channel(8);
        tx.send(pb::AgentMessage { msg: Some(first) })
            .await
            .expect("queue");
        let mut req = tonic::Request::new(ReceiverStream::new(rx));
        if !node.is_empty() {
            req.metadata_mut()
                .insert(pb::NODE_METADATA, node.parse().expect("ascii"));
        }
        if let Some(t) = token {
            req.metadata_mut().insert(
                pb::AUTHORIZATION_METADATA,
                format!("Bearer {t}").parse().expect("ascii"),
            );
        }
        let resp = client.session(req).await.map(|r| r.into_inner());
        (tx, resp)
    }

    fn target(&self, node: &str, uids: &[&str]) {
        self.hub.set_watch(
            WatchKey {
                namespace: "ns".into(),
                name: "w".into(),
            },
            WatchTargets {
                top_k: 7,
                interval: Duration::from_secs(10),
                leaks_enabled: true,
                min_confidence: 60,
                horizon: Duration::from_secs(3600),
                remediates: false,
                pods: uids
                    .iter()
                    .map(|u| TargetPod {
                        uid: (*u).into(),
                        namespace: "ns".into(),
                        name: format!("pod-{u}"),
                        node: node.into(),
                        containers: vec![("app".into(), format!("{u:0>64}"))],
                    })
                    .collect(),
                profile: None,
            },
        );
    }
}

fn hello(node: &str) -> Msg {
    Msg::Hello(pb::Hello {
        node_name: node.into(),
        agent_version: "test".into(),
        protocol_version: pb::PROTOCOL_VERSION,
        last_applied_version: 0,
        capabilities: None,
        min_protocol_version: pb::MIN_PROTOCOL_VERSION,
    })
}

async fn next_config(s: &mut Streaming<pb::OperatorMessage>) -> pb::NodeConfig {
    let m = tokio::time::timeout(Duration::from_secs(5), s.message())
        .await
        .expect("a configuration within 5s")
        .expect("stream ok")
        .expect("stream open");
    match m.msg {
        Some(operator_message::Msg::Config(c)) => c,
        other => panic!("expected a configuration, got {other:?}"),
    }
}

async fn ack(tx: &mpsc::Sender<pb::AgentMessage>, version: u64, accepted: bool, reason: &str) {
    tx.send(pb::AgentMessage {
        msg: Some(Msg::Ack(pb::ConfigAck {
            version,
            accepted,
            reason: reason.into(),
        })),
    })
    .await
    .expect("send ack");
}

async fn wait_until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..100 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting until {what}");
}

fn view(hub: &Hub, node: &str) -> resourcewatch_operator::hub::NodeView {
    hub.view(&[node.to_string()].into()).remove(0)
}

#[tokio::test]
async fn snapshot_on_connect_then_versioned_updates_with_ack_and_nack() {
    let f = start().await;
    f.target("n1", &["a"]);
    let (tx, resp) = f.open(hello("n1")).await;
    let mut rx = resp.expect("session accepted");
    let c1 = next_config(&mut rx).await;
    assert_eq!(c1.targets.len(), 1);
    assert_eq!(c1.top_k, 7);
    assert_eq!(c1.targets[0].containers[0].container_id.len(), 64);
    ack(&tx, c1.version, true, "").await;
    wait_until("the ack is recorded", || {
        view(&f.hub, "n1").acked_version == Some(c1.version)
    })
    .await;

    f.target("n1", &["a", "b"]);
    let c2 = next_config(&mut rx).await;
    assert!(c2.version > c1.version, "versions grow");
    assert_eq!(c2.targets.len(), 2);
    ack(
        &tx,
        c2.version,
        false,
        "sketch: width 3 is not a power of two",
    )
    .await;
    wait_until("the nack is recorded", || view(&f.hub, "n1").nack.is_some()).await;
    let v = view(&f.hub, "n1");
    assert_eq!(
        v.nack,
        Some((c2.version, "sketch: width 3 is not a power of two".into()))
    );
    assert_eq!(v.acked_version, Some(c1.version));

    tx.send(pb::AgentMessage {
        msg: Some(Msg::Report(pb::Report {
            config_version: c1.version,
            ..Default::default()
        })),
    })
    .await
    .expect("report");
    wait_until("the report is recorded", || view(&f.hub, "n1").reporting).await;
}

#[tokio::test]
async fn a_reconnecting_agent_gets_the_full_snapshot_again() {
    let f = start().await;
    f.target("n1", &["a"]);
    let (tx, resp) = f.open(hello("n1")).await;
    let mut rx = resp.expect("session");
    let c1 = next_config(&mut rx).await;
    drop(tx);
    drop(rx);
    wait_until("the hub saw the stream end", || {
        f.hub.connected_agents() == 0
    })
    .await;
    let (_tx2, resp2) = f.open(hello("n1")).await;
    let c2 = next_config(&mut resp2.expect("second session")).await;
    assert_eq!(c2.version, c1.version, "same configuration, same version");
    assert_eq!(c2.targets, c1.targets, "the whole snapshot, not a delta");
}

#[tokio::test]
async fn a_newer_stream_from_the_same_node_ends_the_older_with_aborted() {
    let f = start().await;
    let (_tx1, resp1) = f.open(hello("n1")).await;
    let mut old = resp1.expect("first");
    let _ = next_config(&mut old).await;
    let (_tx2, resp2) = f.open(hello("n1")).await;
    let _ = next_config(&mut resp2.expect("second")).await;
    let end = tokio::time::timeout(Duration::from_secs(5), old.message())
        .await
        .expect("old stream ends");
    let status = end.expect_err("ends with a status");
    assert_eq!(status.code(), Code::Aborted, "{status}");
    assert_eq!(f.hub.connected_agents(), 1);
}

#[tokio::test]
async fn bad_first_messages_get_precise_codes() {
    let f = start().await;
    let (_tx, resp) = f.open(Msg::Ack(pb::ConfigAck::default())).await;
    let s = resp.err().or(None);
    // The server may answer before or after the response headers: accept the status from
    // either place.
    let code = match s {
        Some(s) => s.code(),
        None => Code::Ok,
    };
    assert_eq!(code, Code::InvalidArgument);

    let (_tx, resp) = f.open(hello("")).await;
    assert_eq!(resp.err().map(|s| s.code()), Some(Code::InvalidArgument));

    let (_tx, resp) = f
        .open(Msg::Hello(pb::Hello {
            node_name: "n1".into(),
            protocol_version: 99,
            ..Default::default()
        }))
        .await;
    let s = resp.expect_err("refused");
    assert_eq!(s.code(), Code::FailedPrecondition);
    assert!(s.message().contains("99"), "{s}");

    // An agent one release newer offers this operator's version too: served, and every
    // snapshot names the version chosen. One a release older names the versions it
    // speaks: served at the newest.
    for (min, max) in [
        (pb::PROTOCOL_VERSION, pb::PROTOCOL_VERSION + 1),
        (pb::MIN_PROTOCOL_VERSION, pb::PROTOCOL_VERSION),
    ] {
        let (_tx, resp) = f
            .open(Msg::Hello(pb::Hello {
                node_name: "n1".into(),
                min_protocol_version: min,
                protocol_version: max,
                ..Default::default()
            }))
            .await;
        let mut rx = resp.unwrap_or_else(|s| panic!("offering {min}..={max}: {s}"));
        let c = next_config(&mut rx).await;
        assert_eq!(c.protocol_version, pb::PROTOCOL_VERSION, "{min}..={max}");
    }
}

#[tokio::test]
async fn protocol_violations_mid_stream_end_it_with_invalid_argument() {
    let f = start().await;
    let (tx, resp) = f.open(hello("n1")).await;
    let mut rx = resp.expect("session");
    let _ = next_config(&mut rx).await;
    ack(&tx, 12345, true, "").await;
    let end = tokio::time::timeout(Duration::from_secs(5), rx.message())
        .await
        .expect("ends");
    let s = end.expect_err("status");
    assert_eq!(s.code(), Code::InvalidArgument);
    assert!(s.message().contains("never sent"), "{s}");

    let (tx, resp) = f.open(hello("n2")).await;
    let mut rx = resp.expect("session");
    let _ = next_config(&mut rx).await;
    tx.send(pb::AgentMessage {
        msg: Some(hello("n2")),
    })
    .await
    .expect("send");
    let s = tokio::time::timeout(Duration::from_secs(5), rx.message())
        .await
        .expect("ends")
        .expect_err("status");
    assert_eq!(s.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn a_follower_refuses_agents_and_a_lost_leadership_ends_streams() {
    let f = start().await;
    let (_tx, resp) = f.open(hello("n1")).await;
    let mut rx = resp.expect("session");
    let _ = next_config(&mut rx).await;
    f.leader.send_replace(false);
    let s = tokio::time::timeout(Duration::from_secs(5), rx.message())
        .await
        .expect("ends")
        .expect_err("status");
    assert_eq!(s.code(), Code::Unavailable);
    let (_tx, resp) = f.open(hello("n1")).await;
    assert_eq!(resp.err().map(|s| s.code()), Some(Code::Unavailable));
}

/// A session opened over `ch` as n1's agent would: its Hello, its node metadata and its
/// valid token. Only the transport's identity can refuse it.
async fn session_as_n1(ch: Channel) -> Result<(), tonic::Status> {
    let mut c = AgentControlClient::new(ch);
    let (tx, rx) = mpsc::channel(1);
    tx.send(pb::AgentMessage {
        msg: Some(hello("n1")),
    })
    .await
    .expect("queue");
    let mut req = tonic::Request::new(ReceiverStream::new(rx));
    req.metadata_mut()
        .insert(pb::NODE_METADATA, "n1".parse().expect("metadata"));
    req.metadata_mut().insert(
        pb::AUTHORIZATION_METADATA,
        "Bearer token-n1".parse().expect("metadata"),
    );
    c.session(req).await.map(drop)
}

#[tokio::test]
async fn clients_without_a_certificate_from_our_ca_are_refused() {
    let f = start().await;
    // No client certificate at all.
    let refused = match f.channel_with(None, &f.pki.ca_cert).await {
        Err(_) => true,
        Ok(ch) => session_as_n1(ch).await.is_err(),
    };
    assert!(refused, "a client without a certificate got a session");
    // A certificate from another CA.
    let other = Pki::generate().expect("other CA");
    let stranger = other.agent().expect("cert");
    let refused = match f.channel_with(Some(&stranger), &f.pki.ca_cert).await {
        Err(_) => true,
        Ok(ch) => session_as_n1(ch).await.is_err(),
    };
    assert!(refused, "a certificate from another CA got a session");
    // Our CA's certificate for scrapers.
    let scraper = f.pki.metrics_client().expect("metrics client cert");
    let ch = f
        .channel_with(Some(&scraper), &f.pki.ca_cert)
        .await
        .expect("the transport accepts our CA's chain");
    let status = session_as_n1(ch)
        .await
        .expect_err("the scrapers' certificate opened a stream");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert_eq!(f.hub.connected_agents(), 0);
    // And the agent refuses a server whose certificate is not from the agent's CA.
    let refused = match f.channel_with(Some(&f.client_leaf), &other.ca_cert).await {
        Err(_) => true,
        Ok(ch) => session_as_n1(ch).await.is_err(),
    };
    assert!(refused, "the agent accepted a server of another CA");
}

#[tokio::test]
async fn a_stream_must_prove_its_node_and_a_refused_one_disturbs_nobody() {
    let f = start().await;
    f.target("n2", &["b"]);
    let (_tx, resp) = f.open(hello("n2")).await;
    let mut real = resp.expect("n2's own agent");
    let _ = next_config(&mut real).await;
    // n1's token claiming n2, in the metadata or only in the Hello.
    let (_t, resp) = f.open_as(hello("n2"), "n2", Some("token-n1")).await;
    let s = resp.expect_err("refused");
    assert_eq!(s.code(), Code::PermissionDenied, "{s}");
    let (_t, resp) = f.open_as(hello("n2"), "n1", Some("token-n1")).await;
    let s = resp.expect_err("refused");
    assert_eq!(s.code(), Code::PermissionDenied, "{s}");
    // No token, an unknown one.
    let (_t, resp) = f.open_as(hello("n2"), "n2", None).await;
    assert_eq!(resp.err().map(|s| s.code()), Some(Code::Unauthenticated));
    let (_t, resp) = f.open_as(hello("n2"), "n2", Some("forged")).await;
    assert_eq!(resp.err().map(|s| s.code()), Some(Code::Unauthenticated));
    // The real stream was never replaced.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), real.message())
            .await
            .is_err(),
        "the real agent's stream saw something"
    );
    assert_eq!(f.hub.connected_agents(), 1);
}

#[tokio::test]
async fn a_report_speaks_only_for_its_own_nodes_containers_and_is_bounded() {
    let f = start().await;
    f.target("n1", &["a"]);
    let other = WatchTargets {
        top_k: 7,
        interval: Duration::from_secs(10),
        leaks_enabled: true,
        min_confidence: 60,
        horizon: Duration::from_secs(3600),
        remediates: false,
        pods: vec![TargetPod {
            uid: "b".into(),
            namespace: "ns".into(),
            name: "pod-b".into(),
            node: "n2".into(),
            containers: vec![("app".into(), format!("{:0>64}", "b"))],
        }],
        profile: None,
    };
    f.hub.set_watch(
        WatchKey {
            namespace: "ns".into(),
            name: "w2".into(),
        },
        other,
    );
    let (tx, resp) = f.open(hello("n1")).await;
    let mut rx = resp.expect("session");
    let _ = next_config(&mut rx).await;
    let leak = |uid: &str| pb::Leak {
        pod_uid: uid.into(),
        container_id: format!("{uid:0>64}"),
        confidence: 100,
        time_to_oom_seconds: Some(5.0),
        ..Default::default()
    };
    tx.send(pb::AgentMessage {
        msg: Some(Msg::Report(pb::Report {
            leaks: vec![leak("a"), leak("b"), leak("zzz")],
            ..Default::default()
        })),
    })
    .await
    .expect("report");
    wait_until("the report is recorded", || view(&f.hub, "n1").reporting).await;
    let r = view(&f.hub, "n1").last_report.expect("report");
    let uids: Vec<&str> = r.leaks.iter().map(|l| l.pod_uid.as_str()).collect();
    assert_eq!(uids, ["a"], "n2's pod and an unknown one are dropped");

    // A message over the limit ends the stream; the operator stays up for the next.
    let huge = pb::Report {
        containers: vec![pb::ContainerReport::default(); (pb::MAX_MESSAGE_BYTES / 2) + 10],
        ..Default::default()
    };
    tx.send(pb::AgentMessage {
        msg: Some(Msg::Report(huge)),
    })
    .await
    .expect("send");
    let end = tokio::time::timeout(Duration::from_secs(5), rx.message())
        .await
        .expect("the stream ends");
    let s = end.expect_err("with a status");
    assert!(
        matches!(
            s.code(),
            Code::OutOfRange | Code::ResourceExhausted | Code::Internal
        ),
        "{s}"
    );
    let (_tx, resp) = f.open(hello("n1")).await;
    let _ = next_config(&mut resp.expect("a new session")).await;
}
