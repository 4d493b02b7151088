//! Perf maps of JVMs, asked for by the agent: HotSpot's attach mechanism runs
//! `Compiler.perfmap` (OpenJDK 17+) in the JVM, which writes `/tmp/perf-<pid>.map` in its
//! own container, and `perfmap` names JIT-compiled Java methods from it. What `jcmd PID
//! Compiler.perfmap` does, without a JDK on the node or in the pod, and again while a
//! capture runs, since the map is a snapshot of what is compiled when it is asked for.
//!
//! The protocol (as jattach and async-profiler speak it): if the JVM's socket
//! `/tmp/.java_pid<pid>` is not there, create `/tmp/.attach_pid<pid>` and send SIGQUIT, on
//! which the JVM starts its attach listener instead of printing a thread dump; connect to
//! the socket and send `1\0jcmd\0Compiler.perfmap\0\0\0`; the answer starts with `0` when
//! it ran. Paths are the process's own (its PID in its namespace, its /tmp, reached through
//! `/proc/PID/root`). The JVM accepts root or its own user as the peer.
//!
//! Safety rails: SIGQUIT is sent only to a process that maps `libjvm.so` and catches
//! SIGQUIT (`SigCgt` in /proc/PID/status): a JVM run with `-Xrs` does not, and SIGQUIT
//! would kill it. A JVM run with `-XX:+DisableAttachMechanism` never opens the socket: the
//! request gives up after `LISTENER_WAIT` (one SIGQUIT, which such a JVM answers with a
//! thread dump on its stdout) and is not repeated for that process. Off with the agent's
//! `--no-jvm-perf-maps`.

use std::{
    collections::HashMap,
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU8, Ordering},
    },
    time::{Duration, Instant},
};

/// How often a captured JVM is asked for a new perf map (methods compiled since, code
/// moved by recompilation).
const EVERY: Duration = Duration::from_secs(5);
/// How long the JVM has to start its attach listener after SIGQUIT.
const LISTENER_WAIT: Duration = Duration::from_secs(5);
/// How long a request may take once connected.
const ANSWER_WAIT: Duration = Duration::from_secs(10);
/// Processes remembered (cleared whole when passed).
const MAX_PROCESSES: usize = 1024;

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns asking JVMs for perf maps on or off for this agent (on by default).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("not a JVM (no libjvm.so mapped)")]
    NotJvm,
    #[error("the JVM does not catch SIGQUIT (-Xrs?): not attaching")]
    NoQuitHandler,
    #[error("no attach listener after SIGQUIT (-XX:+DisableAttachMechanism?)")]
    NoListener,
    #[error("the JVM answered {0:?}")]
    Refused(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Asks JVM `pid` to write its perf map now; blocks for up to `LISTENER_WAIT` +
/// `ANSWER_WAIT`.
pub fn request_perf_map(pid: u32) -> Result<(), AttachError> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    if !maps.contains("/libjvm.so") {
        return Err(AttachError::NotJvm);
    }
    let nspid = ns_pid(pid).unwrap_or(pid);
    let tmp = PathBuf::from(format!("/proc/{pid}/root/tmp"));
    let socket = tmp.join(format!(".java_pid{nspid}"));
    if !socket.exists() {
        if !catches_sigquit(pid) {
            return Err(AttachError::NoQuitHandler);
        }
        let trigger = tmp.join(format!(".attach_pid{nspid}"));
        std::fs::write(&trigger, b"")?;
        // SAFETY: kill(2) with a PID and a signal; no memory is shared.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGQUIT) };
        let start = Instant::now();
        while !socket.exists() && start.elapsed() < LISTENER_WAIT {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_file(&trigger);
        if !socket.exists() {
            return Err(AttachError::NoListener);
        }
    }
    let mut s = UnixStream::connect(&socket)?;
    s.set_read_timeout(Some(ANSWER_WAIT))?;
    s.set_write_timeout(Some(ANSWER_WAIT))?;
    s.write_all(b"1\0jcmd\0Compiler.perfmap\0\0\0")?;
    let mut answer = String::new();
    s.take(4096).read_to_string(&mut answer)?;
    if answer.starts_with('0') {
        Ok(())
    } else {
        Err(AttachError::Refused(
            answer.trim().chars().take(200).collect(),
        ))
    }
}

/// The PID `pid` has in its own namespace (the last of `NSpid`).
fn ns_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// Whether `pid` has a handler for SIGQUIT (bit 2 of `SigCgt`).
fn catches_sigquit(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let hex = s
                .lines()
                .find_map(|l| l.strip_prefix("SigCgt:"))?
                .trim()
                .to_owned();
            u64::from_str_radix(&hex, 16).ok()
        })
        .is_some_and(|mask| mask & (1 << (libc::SIGQUIT - 1)) != 0)
}

/// What is known of a process: not a JVM, a JVM that cannot be attached to, or one asked
/// at `last` (with a request running while `busy`).
enum Jvm {
    No,
    Given,
    Asked {
        last: Option<Instant>,
        busy: Arc<AtomicU8>,
    },
}

/// Asks the JVMs whose samples arrive for perf maps, each at most every `EVERY`, each
/// request on its own thread (the JVM may take seconds to answer).
#[derive(Default)]
pub struct PerfMapRequests {
    known: HashMap<u32, Jvm>,
}

impl PerfMapRequests {
    /// Process `pid` was sampled: if it is a JVM not asked lately, ask it.
    pub fn seen(&mut self, pid: u32) {
        if !ENABLED.load(Ordering::Relaxed) {
            return;
        }
        if self.known.len() >= MAX_PROCESSES && !self.known.contains_key(&pid) {
            self.known.clear();
        }
        let entry = self.known.entry(pid).or_insert_with(|| {
            let jvm = std::fs::read_to_string(format!("/proc/{pid}/maps"))
                .is_ok_and(|m| m.contains("/libjvm.so"));
            if jvm {
                Jvm::Asked {
                    last: None,
                    busy: Arc::default(),
                }
            } else {
                Jvm::No
            }
        });
        let Jvm::Asked { last, busy } = entry else {
            return;
        };
        // 1: a request runs; 2: the last one could not attach (never asked again).
        match busy.load(Ordering::Acquire) {
            2 => {
                *entry = Jvm::Given;
                return;
            }
            1 => return,
            _ => {}
        }
        if last.is_some_and(|t| t.elapsed() < EVERY) {
            return;
        }
        *last = Some(Instant::now());
        busy.store(1, Ordering::Release);
        let busy = busy.clone();
        let spawned = std::thread::Builder::new()
            .name("jvm-perf-map".into())
            .spawn(move || {
                let outcome = request_perf_map(pid);
                let next = match &outcome {
                    Err(AttachError::NoQuitHandler | AttachError::NoListener) => 2,
                    _ => 0,
                };
                if let Err(e) = outcome {
                    tracing::debug!("asking JVM {pid} for its perf map: {e}");
                }
                busy.store(next, Ordering::Release);
            });
        if spawned.is_err() {
            entry_idle(self.known.get(&pid));
        }
    }

    /// Forgets every process (a capture ended: PIDs may be reused before the next).
    pub fn clear(&mut self) {
        self.known.clear();
    }
}

fn entry_idle(entry: Option<&Jvm>) {
    if let Some(Jvm::Asked { busy, .. }) = entry {
        busy.store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_that_is_not_a_jvm_is_never_signalled() {
        assert!(matches!(
            request_perf_map(std::process::id()),
            Err(AttachError::NotJvm)
        ));
        let mut r = PerfMapRequests::default();
        r.seen(std::process::id());
        assert!(matches!(r.known.get(&std::process::id()), Some(Jvm::No)));
    }

    #[test]
    fn this_process_catches_no_sigquit_and_its_namespace_pid_is_read() {
        assert!(!catches_sigquit(std::process::id()));
        assert!(ns_pid(std::process::id()).is_some());
    }
}
