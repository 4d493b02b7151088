//! CPU profiles the operator asks for (`NodeConfig.profiles`): each request id runs once,
//! on its own thread (a profile lasts up to a minute; the engine's epochs must not wait),
//! with its own loaded profiling program, and its result goes back on the stream.
//!
//! Requests repeat in every snapshot until the operator has the result, and a result can
//! be lost with a stream (an operator restart, a new leader). So finished results are
//! kept (the last few) and sent again whenever a snapshot still asks for them.

use std::{
    cell::RefCell,
    collections::{HashMap, VecDeque},
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use resourcewatch_proto as pb;
use tokio::sync::mpsc;

use super::resolve;
use crate::{
    cgroup_resolver, procfs,
    profile::{MAX_FREQUENCY_HZ, ProfileTarget, Profiler, Rendered},
    stacks::output::Label,
};

/// Request ids remembered as started (a snapshot holds at most MAX_PROFILES_PER_NODE).
const REMEMBERED: usize = 32;
/// Finished results kept for resending.
const KEPT: usize = 4;
/// The longest profile the agent runs, whatever it is asked.
const MAX_DURATION: Duration = Duration::from_secs(60);
/// Stack-trace map entries of a profile's program.
const STACK_ENTRIES: u32 = 4096;

pub struct Runner {
    results: mpsc::UnboundedSender<pb::ProfileResult>,
    /// This node's name: a label of every sample.
    node: String,
    started: VecDeque<String>,
    done: Arc<Mutex<VecDeque<pb::ProfileResult>>>,
    running: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Runner {
    pub fn new(results: mpsc::UnboundedSender<pb::ProfileResult>, node: &str) -> Self {
        Self {
            results,
            node: node.to_owned(),
            started: VecDeque::new(),
            done: Arc::new(Mutex::new(VecDeque::new())),
            running: Arc::new(AtomicUsize::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Starts the requests not seen before and resends the results of finished ones.
    /// `cgroup_root` is the hierarchy the containers are found in (None: the kernel
    /// pipelines are unavailable, and each request fails with that reason).
    pub fn apply(&mut self, requests: &[pb::ProfileRequest], cgroup_root: Option<&Path>) {
        for r in requests.iter().take(pb::MAX_PROFILES_PER_NODE) {
            if self.started.contains(&r.id) {
                let done = self.done.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(result) = done.iter().find(|d| d.id == r.id) {
                    let _ = self.results.send(result.clone());
                }
                continue;
            }
            self.started.push_back(r.id.clone());
            if self.started.len() > REMEMBERED {
                self.started.pop_front();
            }
            let cgroups = match cgroup_root {
                Some(root) => {
                    let wanted = r.container_ids.iter().cloned().collect();
                    let (found, _) = resolve::resolve(root, &wanted);
                    found.into_iter().map(|c| c.cgroup_id).collect()
                }
                None => Vec::new(),
            };
            if self.running.load(Ordering::SeqCst) >= pb::MAX_PROFILES_PER_NODE {
                self.finish(failed(r, "the node is already running its most profiles"));
                continue;
            }
            if cgroups.is_empty() {
                let why = if cgroup_root.is_none() {
                    "the kernel pipelines are unavailable on this node"
                } else {
                    "none of the pod's containers was found on this node"
                };
                self.finish(failed(r, why));
                continue;
            }
            self.spawn(r.clone(), cgroups);
        }
    }

    fn spawn(&self, r: pb::ProfileRequest, cgroups: Vec<u64>) {
        let node = self.node.clone();
        let (results, done, running, stop) = (
            self.results.clone(),
            self.done.clone(),
            self.running.clone(),
            self.stop.clone(),
        );
        running.fetch_add(1, Ordering::SeqCst);
        let id = r.id.clone();
        let spawned = std::thread::Builder::new()
            .name("profile".into())
            .spawn(move || {
                let result = run(&r, cgroups, &stop, &node);
                release_freed_memory();
                tracing::info!(id = %r.id, samples = result.samples, error = %result.error, "profile done");
                keep(&done, result.clone());
                let _ = results.send(result);
                running.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            self.running.fetch_sub(1, Ordering::SeqCst);
            let r = pb::ProfileRequest {
                id,
                ..Default::default()
            };
            self.finish(failed(&r, &format!("starting the profile thread: {e}")));
        }
    }

    fn finish(&self, result: pb::ProfileResult) {
        keep(&self.done, result.clone());
        let _ = self.results.send(result);
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        // A running profile ends at its next 50 ms check.
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Gives the memory a finished profile freed back to the kernel. Naming a profile's
/// stacks parses the binaries' symbol and unwind tables (a Node.js binary's are tens of
/// MiB), in this thread's own malloc arena; freed, glibc keeps that arena's pages, and
/// the container's memory limit counts them: the agent's RSS went from 18 to 89 MiB over
/// a C, a Java and a Node.js profile and stayed at 75 MiB after them, until a later
/// profile's BPF maps could not be allocated under the 192Mi limit (ENOMEM; the e2e
/// profile tests, docs/ci-runs/2026-11-30-agent-profile-memory.md).
fn release_freed_memory() {
    // SAFETY: malloc_trim only returns free memory of the allocator's arenas to the
    // kernel; it touches no memory in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn keep(done: &Mutex<VecDeque<pb::ProfileResult>>, result: pb::ProfileResult) {
    let mut done = done.lock().unwrap_or_else(|e| e.into_inner());
    done.retain(|d| d.id != result.id);
    done.push_back(result);
    while done.len() > KEPT {
        done.pop_front();
    }
}

fn failed(r: &pb::ProfileRequest, why: &str) -> pb::ProfileResult {
    pb::ProfileResult {
        id: r.id.clone(),
        error: why.to_owned(),
        ..Default::default()
    }
}

/// Samples, names and renders one request; its outputs bounded by MAX_PROFILE_BYTES.
fn run(
    r: &pb::ProfileRequest,
    cgroups: Vec<u64>,
    stop: &AtomicBool,
    node: &str,
) -> pb::ProfileResult {
    let hz = u64::from(r.frequency_hz).clamp(1, MAX_FREQUENCY_HZ);
    let duration = Duration::from_millis(r.duration_ms.into()).min(MAX_DURATION);
    let target = ProfileTarget {
        pids: Vec::new(),
        cgroups,
    };
    let profile =
        match Profiler::load(STACK_ENTRIES).and_then(|mut p| p.run(&target, hz, duration, stop)) {
            Ok(p) => p,
            Err(e) => {
                return failed(
                    r,
                    &format!("profiling: {}", resourcewatch_runtime::error_chain(&e)),
                );
            }
        };
    let rendered = Rendered::new(&profile, &profile.symbolizer());
    // Each process's container, from its cgroup, once per process.
    let containers: RefCell<HashMap<u32, Option<String>>> = RefCell::new(HashMap::new());
    let container_of = |tgid: u32| {
        containers
            .borrow_mut()
            .entry(tgid)
            .or_insert_with(|| {
                procfs::cgroup_text(tgid)?
                    .lines()
                    .find_map(|l| cgroup_resolver::attribute(l.splitn(3, ':').nth(2)?).container_id)
            })
            .clone()
    };
    let pprof = rendered.pprof(|s| labels(r, node, container_of(s.tgid).as_deref()));
    let (pprof, svg) = match (pprof, rendered.svg()) {
        (Ok(p), Ok(s)) => (p, s),
        (Err(e), _) | (_, Err(e)) => {
            return failed(
                r,
                &format!("rendering: {}", resourcewatch_runtime::error_chain(&e)),
            );
        }
    };
    let mut result = pb::ProfileResult {
        id: r.id.clone(),
        error: String::new(),
        samples: rendered.summary.samples,
        duration_seconds: rendered.summary.duration.as_secs_f64(),
        frequency_hz: hz as u32,
        lost: rendered.summary.lost,
        hottest: rendered
            .summary
            .hottest
            .iter()
            .map(|(name, samples)| pb::HotFunction {
                name: name.clone(),
                samples: *samples,
            })
            .collect(),
        folded: rendered.folded(),
        pprof,
        svg,
    };
    bound(&mut result, pb::MAX_PROFILE_BYTES);
    result
}

/// A cluster profile's sample labels beyond the process's: where it ran (namespace, pod,
/// container when the process's container is one of the request's, node).
fn labels(r: &pb::ProfileRequest, node: &str, container_id: Option<&str>) -> Vec<Label> {
    let mut out = Vec::new();
    if !r.namespace.is_empty() {
        out.push(Label::Text("namespace", r.namespace.clone()));
    }
    if !r.pod.is_empty() {
        out.push(Label::Text("pod", r.pod.clone()));
    }
    if let Some(name) = container_id.and_then(|id| r.container_names.get(id)) {
        out.push(Label::Text("container", name.clone()));
    }
    out.push(Label::Text("node", node.to_owned()));
    out
}

/// Keeps the outputs within `max` bytes: the flame graph goes first (the largest, and
/// rebuilt from the folded stacks by any flame graph tool), then the lightest stacks of
/// the folded text, then pprof.
fn bound(r: &mut pb::ProfileResult, max: usize) {
    let size = |r: &pb::ProfileResult| r.folded.len() + r.pprof.len() + r.svg.len();
    if size(r) <= max {
        return;
    }
    r.svg.clear();
    if size(r) <= max {
        return;
    }
    if r.pprof.len() >= max {
        r.pprof.clear();
    }
    let budget = max - r.pprof.len();
    // Heaviest stacks first: what is cut is what matters least.
    let mut lines: Vec<&str> = r.folded.lines().collect();
    lines.sort_by_key(|l| {
        std::cmp::Reverse(
            l.rsplit_once(' ')
                .and_then(|(_, n)| n.parse::<u64>().ok())
                .unwrap_or(0),
        )
    });
    let mut kept = String::new();
    for l in lines {
        if kept.len() + l.len() + 1 > budget {
            break;
        }
        kept.push_str(l);
        kept.push('\n');
    }
    r.folded = kept;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: &str) -> pb::ProfileRequest {
        pb::ProfileRequest {
            id: id.into(),
            pod_uid: "uid".into(),
            container_ids: vec!["nowhere".into()],
            duration_ms: 1000,
            frequency_hz: 99,
            ..Default::default()
        }
    }

    #[test]
    fn samples_are_labelled_with_their_pod_container_and_node() {
        let r = pb::ProfileRequest {
            namespace: "team-a".into(),
            pod: "api-7f9c".into(),
            container_names: [("cid-1".to_owned(), "app".to_owned())].into(),
            ..request("a")
        };
        let text = |k: &'static str, v: &str| Label::Text(k, v.to_owned());
        assert_eq!(
            labels(&r, "n1", Some("cid-1")),
            [
                text("namespace", "team-a"),
                text("pod", "api-7f9c"),
                text("container", "app"),
                text("node", "n1")
            ]
        );
        // A process of another container (a sidecar not asked for), or of none.
        assert_eq!(
            labels(&r, "n1", Some("cid-2")),
            [
                text("namespace", "team-a"),
                text("pod", "api-7f9c"),
                text("node", "n1")
            ]
        );
        assert_eq!(labels(&request("b"), "n1", None), [text("node", "n1")]);
    }

    #[test]
    fn a_request_runs_once_and_its_result_is_resent_while_asked() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut runner = Runner::new(tx, "n1");
        let root = std::env::temp_dir().join(format!("rw-profiles-{}", std::process::id()));
        std::fs::create_dir_all(&root).expect("a scratch directory");
        // The container is not on this node: the request fails at once, with the reason.
        runner.apply(&[request("a")], Some(&root));
        let r = rx.try_recv().expect("a result");
        assert_eq!(r.id, "a");
        assert!(r.error.contains("was found on this node"), "{}", r.error);
        // The next snapshot still asks: the same result again, not a second run.
        runner.apply(&[request("a")], Some(&root));
        assert_eq!(rx.try_recv().expect("resent").error, r.error);
        assert!(rx.try_recv().is_err());
        // Without pipelines the reason says so.
        runner.apply(&[request("b")], None);
        assert!(
            rx.try_recv()
                .expect("a result")
                .error
                .contains("unavailable")
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn outputs_over_the_bound_lose_the_flame_graph_then_the_lightest_stacks() {
        let mut r = pb::ProfileResult {
            folded: "a;light 1\na;heavy 100\na;middle 10\n".into(),
            pprof: vec![0; 10],
            svg: vec![0; 1000],
            ..Default::default()
        };
        bound(&mut r, 2000);
        assert_eq!(r.svg.len(), 1000, "within the bound: untouched");
        bound(&mut r, 100);
        assert!(r.svg.is_empty());
        assert_eq!(
            r.folded, "a;light 1\na;heavy 100\na;middle 10\n",
            "fits now"
        );
        bound(&mut r, 10 + 25);
        assert_eq!(r.folded, "a;heavy 100\na;middle 10\n");
        assert_eq!(r.pprof.len(), 10);
    }
}
