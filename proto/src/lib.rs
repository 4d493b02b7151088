//! The gRPC contract between the operator and the node agents (filled in by the operator issue).
