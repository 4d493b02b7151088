//! Workload generators used by tests and benchmarks.
