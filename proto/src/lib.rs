//! The gRPC contract between the resourcewatch operator and its node agents
//! (`proto/resourcewatch/v1alpha1/agent.proto`). Kept in its own crate so the operator
//! does not link aya and the agent does not link the controller. Beside it, what else
//! both binaries must agree on: how they log ([`logging`]).

pub mod logging;
pub mod telemetry;

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1alpha1 {
    tonic::include_proto!("resourcewatch.v1alpha1");
}

pub use v1alpha1::*;

/// Bumped only for a change that peers of the previous version cannot understand.
pub const PROTOCOL_VERSION: u32 = 1;

/// The largest message either side accepts (and the agent trims its reports to): a
/// node with 200 targeted containers at K = 100 fits; one node cannot make the operator
/// decode more than this per message (tonic's default is 4 MiB, and tiny repeated
/// entries expand about a hundredfold in memory).
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;

/// The metadata key of the agent's credentials: `Bearer <projected ServiceAccount token>`.
pub const AUTHORIZATION_METADATA: &str = "authorization";

/// The metadata key naming the node a stream speaks for (the Hello must say the same):
/// the operator checks the token against it before reading any message.
pub const NODE_METADATA: &str = "resourcewatch-node";

/// The name every agent's certificate carries: the operator accepts no other client
/// certificate on its agents' endpoint, and scrapers of an agent's `/metrics` verify it.
pub const AGENT_CERT_NAME: &str = "resourcewatch-agent";

/// The name of the client certificate an agent's `/metrics` is served to (the
/// `resourcewatch-metrics-client` Secret the operator issues); no other, the agents' own
/// included.
pub const METRICS_CLIENT_CERT_NAME: &str = "resourcewatch-metrics-client";

/// The DNS name the operator's serving certificate is issued for and agents verify,
/// whatever address they dial (in the e2e cluster there is no DNS: agents dial the
/// Service's ClusterIP from its environment variables).
pub fn operator_server_name(namespace: &str) -> String {
    format!("resourcewatch-operator.{namespace}.svc")
}

/// The most profile requests a node runs per snapshot (and at once).
pub const MAX_PROFILES_PER_NODE: usize = 2;

/// The most bytes of a ProfileResult's outputs (folded + pprof + svg): under the message
/// limit, and under what one ConfigMap holds (1 MiB) with room for its metadata.
pub const MAX_PROFILE_BYTES: usize = 768 << 10;
