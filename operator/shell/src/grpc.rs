//! The operator's end of the agent protocol: one long-lived bidirectional stream per node,
//! over mTLS. The transport is a thin shell over [`Hub`]; every protocol rule (identity,
//! first message, versions, replaced streams) maps to a precise `tonic::Status`.
//!
//! A stream is authenticated before any message of it is read: the agent's token (gRPC
//! metadata) must prove the node its Hello then claims ([`crate::identity`]). Until
//! then the hub does not know the stream exists, so a refused one cannot replace or
//! disturb the real agent's.

use std::{pin::Pin, sync::Arc, time::Duration};

use futures::Stream;
use resourcewatch_proto::{
    self as pb, agent_control_server::AgentControl, agent_message::Msg, operator_message,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::{
    hub::{Hub, HubError, Session},
    identity::{self, AgentIdentity, Authenticator},
    metrics::Metrics,
};

/// How long a new stream may take to say Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct AgentService {
    pub hub: Arc<Hub>,
    pub metrics: Arc<Metrics>,
    /// Proves which node a stream speaks for.
    pub auth: Arc<dyn Authenticator>,
    /// True while this replica holds the leader Lease: only the leader serves agents, so
    /// only one replica's view of the nodes feeds status.
    pub leader: watch::Receiver<bool>,
    /// Becomes true when the operator shuts down: streams end with UNAVAILABLE, so
    /// agents reconnect (to the next leader) at once.
    pub shutdown: watch::Receiver<bool>,
}

impl From<HubError> for Status {
    fn from(e: HubError) -> Self {
        match e {
            HubError::NoNodeName
            | HubError::UnknownVersion { .. }
            | HubError::UnaskedProfile { .. } => Status::invalid_argument(e.to_string()),
            HubError::Protocol(..) => Status::failed_precondition(e.to_string()),
            HubError::NoSession(_) => Status::aborted(e.to_string()),
        }
    }
}

type OutStream = Pin<Box<dyn Stream<Item = Result<pb::OperatorMessage, Status>> + Send>>;

#[tonic::async_trait]
impl AgentControl for AgentService {
    type SessionStream = OutStream;

    async fn session(
        &self,
        request: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<OutStream>, Status> {
        self.may_open(&request)?;
        let (token, claimed) = self.credentials(&request)?;
        let identity = identity::authenticate(&*self.auth, token.as_deref(), &claimed)
            .await
            .map_err(|e| {
                Metrics::labelled(
                    &self.metrics.agent_auth_failures,
                    "reason",
                    e.metric_label(),
                    1,
                );
                tracing::warn!(node = %claimed, error = %e, "agent stream refused");
                e.status()
            })?;
        let mut inbound = request.into_inner();
        let hello = self.hello(&mut inbound, &identity).await?;
        let session = self.hub.connect(&hello).inspect_err(|e| {
            self.metrics.protocol_error(match e {
                HubError::Protocol(..) => "protocol_version",
                _ => "bad_hello",
            })
        })?;
        tracing::info!(node = %session.node, agent = %hello.agent_version, "agent connected");
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(run_session(self.clone(), identity, session, inbound, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

impl AgentService {
    /// Whether this replica takes streams now (it leads and is not shutting down), and
    /// from this peer: the transport already verified the chain to our CA, which also
    /// issues the scrapers' certificate, and that one opens no stream.
    fn may_open<T>(&self, request: &Request<T>) -> Result<(), Status> {
        if !*self.leader.borrow() {
            return Err(Status::unavailable(
                "this operator replica is not the leader",
            ));
        }
        if *self.shutdown.borrow() {
            return Err(Status::unavailable("the operator is shutting down"));
        }
        let agent_cert = request.peer_certs().is_some_and(|c| {
            c.first().is_some_and(|leaf| {
                resourcewatch_runtime::https::issued_for(leaf, resourcewatch_proto::AGENT_CERT_NAME)
            })
        });
        if !agent_cert {
            self.metrics.protocol_error("not_an_agent_certificate");
            return Err(Status::permission_denied(format!(
                "only the {} certificate opens a stream",
                resourcewatch_proto::AGENT_CERT_NAME
            )));
        }
        Ok(())
    }

    /// The stream's bearer token and the node it claims to be.
    fn credentials<T>(&self, request: &Request<T>) -> Result<(Option<String>, String), Status> {
        let token = request
            .metadata()
            .get(resourcewatch_proto::AUTHORIZATION_METADATA)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .map(str::to_owned);
        let claimed = request
            .metadata()
            .get(resourcewatch_proto::NODE_METADATA)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .unwrap_or_default();
        if claimed.is_empty() {
            self.metrics.protocol_error("no_node_metadata");
            return Err(Status::invalid_argument(format!(
                "the stream must carry the {} metadata",
                resourcewatch_proto::NODE_METADATA
            )));
        }
        Ok((token, claimed))
    }

    /// The stream's first message, a Hello from the node its token proved.
    async fn hello(
        &self,
        inbound: &mut Streaming<pb::AgentMessage>,
        identity: &AgentIdentity,
    ) -> Result<pb::Hello, Status> {
        let first = match tokio::time::timeout(HELLO_TIMEOUT, inbound.message()).await {
            Err(_) => return Err(Status::deadline_exceeded("no Hello within 10s")),
            Ok(Err(s)) => return Err(s),
            Ok(Ok(None)) => return Err(Status::invalid_argument("stream closed before Hello")),
            Ok(Ok(Some(m))) => m,
        };
        let Some(Msg::Hello(hello)) = first.msg else {
            self.metrics.protocol_error("no_hello");
            return Err(Status::invalid_argument(
                "the first message must be a Hello",
            ));
        };
        if hello.node_name != identity.node {
            Metrics::labelled(
                &self.metrics.agent_auth_failures,
                "reason",
                "hello_node_mismatch",
                1,
            );
            return Err(Status::permission_denied(format!(
                "the Hello claims node {:?} but the stream was authenticated for {}",
                hello.node_name, identity.node
            )));
        }
        Ok(hello)
    }
}

async fn run_session(
    svc: AgentService,
    identity: AgentIdentity,
    mut session: Session,
    mut inbound: Streaming<pb::AgentMessage>,
    tx: mpsc::Sender<Result<pb::OperatorMessage, Status>>,
) {
    let AgentService {
        hub,
        metrics,
        mut leader,
        mut shutdown,
        ..
    } = svc;
    let node = session.node.clone();
    metrics.agents_connected.inc();
    // The stream lives no longer than the token that opened it; the agent reconnects with
    // the one kubelet refreshed meanwhile.
    let token_left = identity
        .expires
        .and_then(|e| e.duration_since(std::time::SystemTime::now()).ok())
        .unwrap_or(Duration::MAX);
    let expiry = tokio::time::sleep(token_left.min(Duration::from_secs(365 * 86_400)));
    tokio::pin!(expiry);
    let end: Option<Status> = loop {
        tokio::select! {
            _ = &mut expiry => {
                break Some(Status::unauthenticated("the agent's token expired: reconnect with the refreshed one"));
            }
            changed = session.config.changed() => {
                if changed.is_err() {
                    break Some(Status::unavailable("the node's configuration was dropped"));
                }
                let mut c = session.config.borrow_and_update().clone();
                c.protocol_version = session.protocol;
                let msg = pb::OperatorMessage { msg: Some(operator_message::Msg::Config(c)) };
                if tx.send(Ok(msg)).await.is_err() {
                    break None;
                }
                metrics.config_pushes.inc();
            }
            _ = &mut session.replaced => {
                break Some(Status::aborted(format!("a newer stream from node {node} replaced this one")));
            }
            _ = async { let _ = leader.wait_for(|l| !l).await; } => {
                break Some(Status::unavailable("this operator replica lost the leadership"));
            }
            _ = async { let _ = shutdown.wait_for(|s| *s).await; } => {
                break Some(Status::unavailable("the operator is shutting down"));
            }
            msg = inbound.message() => match msg {
                Ok(Some(m)) => {
                    if let Err(s) = handle(&hub, &metrics, &session, m) {
                        break Some(s);
                    }
                }
                Ok(None) => break None,
                Err(s) => {
                    // A message over MAX_MESSAGE_BYTES lands here too: say so.
                    tracing::warn!(%node, error = %s, "agent stream failed");
                    break Some(s);
                }
            }
        }
    };
    if let Some(status) = end {
        tracing::info!(%node, reason = %status.message(), "ending agent stream");
        let _ = tx.send(Err(status)).await;
    }
    hub.disconnect(&node, session.id);
    metrics.agents_connected.dec();
    tracing::info!(%node, "agent disconnected");
}

fn handle(hub: &Hub, metrics: &Metrics, s: &Session, m: pb::AgentMessage) -> Result<(), Status> {
    match m.msg {
        Some(Msg::Hello(_)) => {
            metrics.protocol_error("hello_twice");
            Err(Status::invalid_argument("Hello sent twice on one stream"))
        }
        Some(Msg::Ack(ack)) => {
            if !ack.accepted {
                metrics.config_nacks.inc();
                tracing::warn!(node = %s.node, version = ack.version, reason = %ack.reason, "agent refused its configuration");
            }
            hub.ack(&s.node, s.id, &ack).map_err(|e| {
                metrics.protocol_error("unknown_version");
                Status::from(e)
            })
        }
        Some(Msg::Report(r)) => {
            metrics.reports.inc();
            let dropped = hub.report(&s.node, s.id, r).map_err(Status::from)?;
            for (why, n) in dropped {
                Metrics::labelled(
                    &metrics.report_entries_dropped,
                    "reason",
                    why.metric_label(),
                    n,
                );
            }
            Ok(())
        }
        Some(Msg::Profile(r)) => {
            let id = r.id.clone();
            match hub.profile_result(&s.node, s.id, r) {
                Ok(()) => tracing::info!(node = %s.node, %id, "profile result received"),
                // A result that crossed its request's deadline: late, not hostile.
                Err(e @ HubError::UnaskedProfile { .. }) => {
                    metrics.protocol_error("unasked_profile");
                    tracing::warn!(error = %e, "dropping a profile result");
                }
                Err(e) => return Err(Status::from(e)),
            }
            Ok(())
        }
        None => {
            metrics.protocol_error("empty");
            Err(Status::invalid_argument("empty AgentMessage"))
        }
    }
}
