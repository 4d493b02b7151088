//! The resourcewatch operator's shell: it reconciles `ResourceWatch` objects into per-node
//! agent configuration, serves the agents' gRPC streams, and writes each watch's status,
//! Events and evictions. What it decides is the core's (`resourcewatch-operator-core`,
//! re-exported below under the same module names); every module here talks to something:
//! the API server ([`controller`], [`node_view`], [`pods`], [`status_write`], [`ledger`],
//! [`profile_store`],
//! [`triggers`], [`identity`], [`metricsauth`], [`tls`], [`leader`]), the agents ([`grpc`],
//! [`hub`]), Prometheus ([`metrics`]).

pub use resourcewatch_operator_core::{
    decide, model, nodes, profile, remediation, spec, status, validate,
};

pub mod controller;
pub mod grpc;
pub mod hub;
pub mod identity;
pub mod leader;
pub mod ledger;
pub mod metrics;
pub mod metricsauth;
pub mod node_view;
pub mod otlp;
pub mod pods;
pub mod profile_store;
pub mod status_write;
pub mod tls;
pub mod triggers;

/// The field manager of every status write.
pub const FIELD_MANAGER: &str = "resourcewatch-operator";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API")]
    Kube(#[from] kube::Error),
    #[error("{0} timed out")]
    Timeout(&'static str),
    #[error("a ResourceWatch without a namespace")]
    NotNamespaced,
    #[error("certificates")]
    Certificate(#[from] rcgen::Error),
    /// The CA Secret exists without a CA in it.
    #[error("Secret {0} lacks ca.crt or ca.key; delete it to have a new CA generated")]
    BrokenCa(String),
    /// Other writers kept changing the object between our reads and writes.
    #[error("could not write {0}: it kept changing under us")]
    Contended(String),
    #[error("the clock")]
    Clock(#[from] jiff::Error),
    #[error("encoding")]
    Encode(#[from] serde_json::Error),
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Timeout(_) => "timeout",
            Error::NotNamespaced => "not_namespaced",
            Error::Certificate(_) | Error::BrokenCa(_) => "tls",
            Error::Contended(_) => "contended",
            Error::Clock(_) | Error::Encode(_) => "internal",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
