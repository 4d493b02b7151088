//! The resourcewatch node agent: loads the kernel pipelines, reads them, and predicts leaks.

pub mod bpf;
pub mod capabilities;
pub mod cgroup_resolver;
pub mod cluster;
pub mod hashpipe;
pub mod leak;
pub mod pipelines;
pub mod procfs;
pub mod profile;
pub mod snapshot;
pub mod stacks;
pub mod top;
