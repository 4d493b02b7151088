//! The resourcewatch operator (filled in by the operator issue).
