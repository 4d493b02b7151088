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

/// An error with its causes, as one line (`a: b: c`): what logs, nacks and the CLI show.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
