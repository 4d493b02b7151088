//! The contract between the resourcewatch operator and its node agents
//! (`proto/resourcewatch/v1alpha1/agent.proto`): its messages, and the constants both
//! sides must agree on (protocol versions, message and report bounds). Kept in its own
//! crate so the operator does not link aya and the agent does not link the controller.
//! The gRPC client and server are generated only with the `grpc` feature.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1alpha1 {
    include!(concat!(env!("OUT_DIR"), "/resourcewatch.v1alpha1.rs"));
}

pub use v1alpha1::*;

pub mod pprof;

/// The newest protocol version this build speaks. Bumped only for a change that peers
/// of the previous version cannot understand.
pub const PROTOCOL_VERSION: u32 = 1;

/// The oldest protocol version this build still speaks: after a bump, the previous
/// version stays for one release, so an operator serves agents one release older and one
/// newer (the agent offers its range, the operator picks: [`negotiate`]).
pub const MIN_PROTOCOL_VERSION: u32 = 1;

/// The highest version both ranges contain, or `None`. Versions start at 1: a range
/// with a 0 (a field left unset) is no range.
pub fn negotiate(ours: (u32, u32), theirs_min: u32, theirs_max: u32) -> Option<u32> {
    let (lo, hi) = (ours.0.max(theirs_min), ours.1.min(theirs_max));
    (theirs_min > 0 && lo <= hi).then_some(hi)
}

/// This build's range, for [`negotiate`].
pub const SPOKEN_PROTOCOL_VERSIONS: (u32, u32) = (MIN_PROTOCOL_VERSION, PROTOCOL_VERSION);

/// The largest message either side accepts (and the agent trims its reports to): a
/// node with 200 targeted containers at K = 100 fits; one node cannot make the operator
/// decode more than this per message (tonic's default is 4 MiB, and tiny repeated
/// entries expand about a hundredfold in memory).
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;

/// K of Top-K as the API allows it: the CRDs' `topK` (their schemas' bounds are checked
/// against these in resourcewatch-crds' tests), the operator's spec check (for a cluster
/// still serving an older CRD) and the agent's check of a NodeConfig all use these.
pub const TOP_K_MIN: u32 = 1;
pub const TOP_K_MAX: u32 = 100;

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

/// The operator Service's name unless the installation renames it (the chart's
/// `fullnameOverride`: operator `--service-name`, agent `--operator-service`).
pub const OPERATOR_SERVICE: &str = "resourcewatch-operator";

/// The DNS name the operator's serving certificate is issued for and agents verify,
/// whatever address they dial (in the e2e cluster there is no DNS: agents dial the
/// Service's ClusterIP from its environment variables).
pub fn operator_server_name(service: &str, namespace: &str) -> String {
    format!("{service}.{namespace}.svc")
}

/// The most profile requests a node runs per snapshot (and at once).
pub const MAX_PROFILES_PER_NODE: usize = 2;

/// How long an agent repeats an OOM kill in its reports (`Report.oom_kills`).
pub const OOM_KILL_RESEND_SECS: u64 = 600;
/// OOM kills in one report at most (the newest), and verdicts per kill at most.
pub const MAX_OOM_KILLS_PER_REPORT: usize = 32;
pub const MAX_PREDICTIONS_PER_KILL: usize = 64;

/// The most bytes of a ProfileResult's outputs (folded + pprof + svg): under the message
/// limit, and under what one ConfigMap holds (1 MiB) with room for its metadata.
pub const MAX_PROFILE_BYTES: usize = 768 << 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_common_version_is_chosen_and_disjoint_ranges_are_refused() {
        // An operator that speaks 3 and 4 (it bumped to 4 one release ago).
        let op = (3, 4);
        assert_eq!(negotiate(op, 3, 4), Some(4), "same release");
        assert_eq!(negotiate(op, 3, 3), Some(3), "an agent of N-1");
        assert_eq!(
            negotiate(op, 2, 3),
            Some(3),
            "an agent of N-1 that speaks N-2"
        );
        assert_eq!(
            negotiate(op, 4, 5),
            Some(4),
            "an agent of N+1 still speaks 4"
        );
        assert_eq!(negotiate(op, 5, 5), None, "an N+1 agent that offers only 5");
        assert_eq!(negotiate(op, 1, 2), None, "two releases behind");
        assert_eq!(
            negotiate(op, 0, 4),
            None,
            "no minimum: a Hello missing a field"
        );
        assert_eq!(negotiate(op, 0, 0), None, "no version at all");
        assert_eq!(negotiate(op, 5, 4), None, "an empty range");
        assert_eq!(
            negotiate(
                SPOKEN_PROTOCOL_VERSIONS,
                MIN_PROTOCOL_VERSION,
                PROTOCOL_VERSION
            ),
            Some(PROTOCOL_VERSION)
        );
    }

    /// A Hello as an agent a release newer encodes it: a field this build does not know.
    #[derive(Clone, PartialEq, prost::Message)]
    struct NewerHello {
        #[prost(string, tag = "1")]
        node_name: String,
        #[prost(uint32, tag = "3")]
        protocol_version: u32,
        #[prost(uint32, tag = "6")]
        min_protocol_version: u32,
        #[prost(string, tag = "99")]
        something_new: String,
    }

    #[test]
    fn fields_of_a_newer_release_are_skipped() {
        use prost::Message;
        let newer = NewerHello {
            node_name: "n1".into(),
            protocol_version: PROTOCOL_VERSION + 1,
            min_protocol_version: PROTOCOL_VERSION,
            something_new: "ignored".into(),
        };
        let h = Hello::decode(newer.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(h.node_name, "n1");
        assert_eq!(
            negotiate(
                SPOKEN_PROTOCOL_VERSIONS,
                h.min_protocol_version,
                h.protocol_version
            ),
            Some(PROTOCOL_VERSION)
        );
    }
}
