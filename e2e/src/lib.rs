//! Shared by the end-to-end tests and the load tool: a Kubernetes client for the test
//! cluster, condition waits with deadlines, the operator as a child process, and
//! simulated node agents speaking the real protocol over mTLS.

pub mod harness;
pub mod operator;
pub mod sim;
