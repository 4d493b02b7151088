//! The ResourceWatch API types (filled in by the operator issue).
