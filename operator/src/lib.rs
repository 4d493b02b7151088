//! The resourcewatch operator: reconciles `ResourceWatch` objects into per-node agent
//! configuration, serves the agents' gRPC streams, and aggregates their reports into each
//! watch's status and Events.
//!
//! Kube-free parts ([`hub`], [`spec`], [`status`]) hold the logic and are unit-tested
//! without a cluster; [`controller`], [`leader`] and [`tls`] talk to the API server;
//! [`grpc`] is the transport.

pub mod controller;
pub mod decide;
pub mod grpc;
pub mod hub;
pub mod identity;
pub mod leader;
pub mod ledger;
pub mod metrics;
pub mod metricsauth;
pub mod model;
pub mod nodeview;
pub mod profile;
pub mod remediation;
pub mod spec;
pub mod status;
pub mod tls;
pub mod triggers;
pub mod validate;

/// The field manager of every status write.
pub const FIELD_MANAGER: &str = "resourcewatch-operator";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0} timed out")]
    Timeout(&'static str),
    #[error("a ResourceWatch without a namespace")]
    NotNamespaced,
    #[error("certificates: {0}")]
    Tls(String),
    #[error("internal: {0}")]
    Internal(String),
}

impl From<rcgen::Error> for Error {
    fn from(e: rcgen::Error) -> Self {
        Error::Tls(e.to_string())
    }
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Timeout(_) => "timeout",
            Error::NotNamespaced => "not_namespaced",
            Error::Tls(_) => "tls",
            Error::Internal(_) => "internal",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
