//! The operator's core: every decision it makes, with no kube, tokio or tonic among its
//! dependencies (the compiler refuses them here), so each is unit-tested as a function.
//! The shell (the `resourcewatch-operator` crate) gathers the inputs from the API server
//! and the agents and carries out what is decided.
//!
//! - [`spec`]: a watch's settings, checked beyond the schema, and the admin's floors;
//! - [`status`]: aggregation of the agents' reports into a watch's status and its Events;
//!   [`cluster`]: a ClusterResourceWatch's node-wide status;
//! - [`decide`]: one reconcile, `assess` then `decide(inputs, assessment) -> Plan`;
//! - [`remediation`]: the gates and rails of one restart decision; [`ledger`] their record;
//! - [`profile`]: CPU profiles asked for on a watch, from request to result;
//! - [`nodes`]: what is asked of each node and known of it; [`validate`]: reports checked
//!   and bounded; [`model`]: condition types and reasons as enums.

pub mod decide;
#[doc(hidden)]
pub mod fuzzing;
pub mod ledger;
pub mod model;
pub mod node_view;
pub mod nodes;
pub mod oom;
pub mod profile;
pub mod remediation;
pub mod spec;
pub mod status;
pub mod validate;
