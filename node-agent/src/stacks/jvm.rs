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
    ffi::CString,
    io::{Read, Write},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::net::UnixStream,
    },
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use super::perfmap::PerfMap;

/// How often a captured JVM is asked for a new perf map (methods compiled since, code
/// moved by recompilation).
const EVERY: Duration = Duration::from_secs(5);
/// How long the JVM has to start its attach listener after SIGQUIT.
const LISTENER_WAIT: Duration = Duration::from_secs(5);
/// How long a request may take once connected.
const ANSWER_WAIT: Duration = Duration::from_secs(10);
/// Processes remembered (cleared whole when passed).
const MAX_PROCESSES: usize = 1024;
/// Requests at once, for the whole agent (each holds a thread and three descriptors); a
/// JVM met while all are busy is asked on a later sample.
const MAX_IN_FLIGHT: usize = 4;
/// The most bytes of an answer read (a success is "0\n" and a line or two).
pub const MAX_ANSWER: usize = 4096;

/// Requests running now.
static IN_FLIGHT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Attach requests in flight per tenant (its pod's namespace: `tenant::of_pid`): one
/// tenant's JVMs that never answer hold at most this many of the `MAX_IN_FLIGHT`.
const MAX_IN_FLIGHT_PER_TENANT: usize = 1;

fn in_flight_by_tenant() -> &'static std::sync::Mutex<HashMap<String, usize>> {
    static BY: std::sync::OnceLock<std::sync::Mutex<HashMap<String, usize>>> =
        std::sync::OnceLock::new();
    BY.get_or_init(Default::default)
}

/// One of the `MAX_IN_FLIGHT` attach requests, held by a tenant; given back when dropped.
struct Slot {
    tenant: String,
}

impl Slot {
    fn take(pid: u32) -> Option<Self> {
        let tenant = crate::tenant::of_pid(pid);
        let mut by = in_flight_by_tenant()
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if by.get(&tenant).copied().unwrap_or(0) >= MAX_IN_FLIGHT_PER_TENANT {
            return None;
        }
        IN_FLIGHT
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_IN_FLIGHT).then_some(n + 1)
            })
            .ok()?;
        *by.entry(tenant.clone()).or_default() += 1;
        Some(Self { tenant })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
        let mut by = in_flight_by_tenant()
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = by.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                by.remove(&self.tenant);
            }
        }
    }
}

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
    #[error("no attach listener now (not signalled: no time left to wait for one)")]
    NotListening,
    #[error("the process exited or its PID was reused")]
    Gone,
    #[error("the JVM answered {0:?}")]
    Refused(String),
    #[error("the JVM's answer was not read: {0}")]
    Unread(&'static str),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The JVM's /tmp and the names of its attach files there, resolved inside its root: a
/// container's symlink (an emptyDir /tmp is writable by all) cannot point the agent,
/// which runs as root with CAP_DAC_OVERRIDE, at the node's own files.
struct AttachDir {
    tmp: OwnedFd,
    socket: CString,
    trigger: CString,
}

impl AttachDir {
    fn open(pid: u32, nspid: u32) -> Result<Self, AttachError> {
        let tmp = crate::procfs::open_in_root(pid, "tmp", libc::O_PATH | libc::O_DIRECTORY)?;
        let name = |s: String| {
            CString::new(s).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
        };
        Ok(Self {
            tmp,
            socket: name(format!(".java_pid{nspid}"))?,
            trigger: name(format!(".attach_pid{nspid}"))?,
        })
    }

    /// Connects to the JVM's attach socket, if one listens; None when there is no socket
    /// or nothing listens on it (a stale one from an earlier JVM).
    fn connect(&self) -> Result<Option<UnixStream>, AttachError> {
        // The socket itself, not a symlink: an O_PATH descriptor, connected to through
        // /proc/self/fd, so the path is never looked up again.
        // SAFETY: a valid directory descriptor and a NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                self.tmp.as_raw_fd(),
                self.socket.as_ptr(),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::ENOENT) {
                Ok(None)
            } else {
                Err(e.into())
            };
        }
        // SAFETY: the kernel just returned this descriptor to us alone.
        let path_fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and a stat buffer we own.
        if unsafe { libc::fstat(path_fd.as_raw_fd(), &mut st) } != 0
            || st.st_mode & libc::S_IFMT != libc::S_IFSOCK
        {
            return Ok(None);
        }
        // SAFETY: socket(2) with constant arguments.
        let sock = unsafe {
            libc::socket(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if sock < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        // SAFETY: the kernel just returned this descriptor to us alone.
        let sock = unsafe { OwnedFd::from_raw_fd(sock) };
        let path = format!("/proc/self/fd/{}", path_fd.as_raw_fd());
        // SAFETY: sockaddr_un is plain data; the path fits (checked) and stays NUL-ended.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        if path.len() >= addr.sun_path.len() {
            return Ok(None);
        }
        for (d, s) in addr.sun_path.iter_mut().zip(path.bytes()) {
            *d = s as libc::c_char;
        }
        // Non-blocking: a JVM that is stopped, with its listen queue full, answers EAGAIN
        // instead of holding this thread.
        // SAFETY: a valid socket and an address of the size passed.
        let rc = unsafe {
            libc::connect(
                sock.as_raw_fd(),
                &addr as *const libc::sockaddr_un as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ECONNREFUSED | libc::EAGAIN | libc::ENOENT) => Ok(None),
                _ => Err(e.into()),
            };
        }
        let stream = UnixStream::from(sock);
        stream.set_nonblocking(false)?;
        Ok(Some(stream))
    }

    /// Creates the trigger file (root-owned, which HotSpot accepts), never through a
    /// symlink; one left behind is replaced.
    fn create_trigger(&self) -> Result<(), AttachError> {
        for _ in 0..2 {
            // SAFETY: a valid directory descriptor and a NUL-terminated name.
            let fd = unsafe {
                libc::openat(
                    self.tmp.as_raw_fd(),
                    self.trigger.as_ptr(),
                    libc::O_WRONLY
                        | libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_NOFOLLOW
                        | libc::O_CLOEXEC,
                    0o600,
                )
            };
            if fd >= 0 {
                // SAFETY: ours alone; closed at once.
                drop(unsafe { OwnedFd::from_raw_fd(fd) });
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(e.into());
            }
            self.remove_trigger();
        }
        Err(std::io::Error::from_raw_os_error(libc::EEXIST).into())
    }

    fn remove_trigger(&self) {
        // SAFETY: a valid directory descriptor and a NUL-terminated name; unlinkat does not
        // follow a symlink, it removes it.
        unsafe { libc::unlinkat(self.tmp.as_raw_fd(), self.trigger.as_ptr(), 0) };
    }
}

/// Asks JVM `pid` to write its perf map now; blocks for up to `LISTENER_WAIT` +
/// `ANSWER_WAIT`. `start` is the process's start time (PIDs are reused): the signal goes
/// through a pidfd opened while that process still had the PID.
pub fn request_perf_map(pid: u32, start: u64) -> Result<(), AttachError> {
    // The whole request, from here to the end of the answer: a process that only looks
    // like a JVM (anything can map a file named libjvm.so) and answers a byte at a time
    // holds one of `MAX_IN_FLIGHT` threads for this long at most.
    request_perf_map_by(
        pid,
        start,
        Instant::now() + LISTENER_WAIT + ANSWER_WAIT,
        true,
    )
}

/// [`request_perf_map`], given up at `deadline`; without `signal`, only through a listener
/// already there ([`AttachError::NotListening`] if none): a JVM signalled with no time left
/// to wait for its listener would print a thread dump and be given up on.
fn request_perf_map_by(
    pid: u32,
    start: u64,
    deadline: Instant,
    signal: bool,
) -> Result<(), AttachError> {
    // Its maps parsed by the reader (`crate::reader`); this thread may wait for them.
    let jvm = crate::reader::loader()
        .maps(pid, crate::reader::DEADLINE)
        .is_some_and(|maps| {
            maps.iter()
                .any(|m| m.path.rsplit('/').next() == Some("libjvm.so"))
        });
    if !jvm {
        return Err(AttachError::NotJvm);
    }
    let nspid = super::perfmap::namespace_pid(pid).unwrap_or(pid);
    let dir = AttachDir::open(pid, nspid)?;
    let stream = match dir.connect()? {
        Some(s) => s,
        None if !signal => return Err(AttachError::NotListening),
        None => {
            if !catches_sigquit(pid) {
                return Err(AttachError::NoQuitHandler);
            }
            dir.create_trigger()?;
            let signalled = send_sigquit(pid, start);
            let listening_by = deadline.min(Instant::now() + LISTENER_WAIT);
            let mut stream = None;
            while signalled.is_ok() && stream.is_none() && Instant::now() < listening_by {
                std::thread::sleep(Duration::from_millis(50));
                stream = dir.connect().ok().flatten();
            }
            dir.remove_trigger();
            signalled?;
            stream.ok_or(AttachError::NoListener)?
        }
    };
    let answer = exchange(stream, b"1\0jcmd\0Compiler.perfmap\0\0\0", deadline)?;
    read_reply(pid, &answer, deadline)
}

/// What the JVM's `answer` says, read by the reader process like every other thing a
/// workload writes: the bytes go to it in a memfd.
fn read_reply(pid: u32, answer: &[u8], deadline: Instant) -> Result<(), AttachError> {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    // SAFETY: a NUL-terminated name and close-on-exec.
    let fd = unsafe { libc::memfd_create(c"rw-attach-reply".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: the kernel just gave this descriptor to us alone.
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.write_all(answer)?;
    std::io::Seek::rewind(&mut f)?;
    let within = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_secs(1));
    let body = crate::reader::loader()
        .parse(pid, crate::reader::Kind::AttachReply, f, within)
        .map_err(|r| AttachError::Unread(r.reason()))?;
    let mut d = crate::reader::wire::Dec(&body);
    match d.u8() {
        Ok(0) => Ok(()),
        Ok(_) => Err(AttachError::Refused(
            String::from_utf8_lossy(d.bytes().unwrap_or_default()).into_owned(),
        )),
        Err(_) => Err(AttachError::Unread("malformed_answer")),
    }
}

/// What an attach answer says: HotSpot starts it with the command's result code, `0`
/// when it ran; anything else is the JVM's (or an impostor's) refusal, kept short.
pub fn reply(answer: &str) -> Result<(), AttachError> {
    if answer.starts_with('0') {
        Ok(())
    } else {
        Err(AttachError::Refused(
            answer.trim().chars().take(200).collect(),
        ))
    }
}

/// Sends `request` and reads the answer (at most `MAX_ANSWER` bytes, until the peer
/// closes) before `deadline`, whatever the peer does: each read and write waits only for
/// what is left of the time.
fn exchange(mut s: UnixStream, request: &[u8], deadline: Instant) -> Result<Vec<u8>, AttachError> {
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::TimedOut))
    };
    let mut sent = 0;
    while sent < request.len() {
        s.set_write_timeout(Some(left()?))?;
        match s.write(&request[sent..]) {
            Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        s.set_read_timeout(Some(left()?))?;
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                if answer.len() >= MAX_ANSWER {
                    answer.truncate(MAX_ANSWER);
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(answer)
}

/// SIGQUIT to `pid` if it is still the process that started at `start`: through a pidfd,
/// checked after it is opened, so a PID reused in between is never signalled.
fn send_sigquit(pid: u32, start: u64) -> Result<(), AttachError> {
    // SAFETY: pidfd_open(2) with a PID and no flags.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(AttachError::Gone);
    }
    // SAFETY: the kernel just returned this descriptor to us alone.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    if crate::procfs::start_ticks(pid) != Some(start) {
        return Err(AttachError::Gone);
    }
    // SAFETY: pidfd_send_signal(2) on our pidfd, no siginfo, no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGQUIT,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
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

/// What is known of a process (by PID and start time): not a JVM, a JVM that cannot be
/// attached to (never signalled again), or one last asked at `last`, with a request
/// running while `busy`.
#[derive(Clone, Copy)]
enum Jvm {
    No,
    Given,
    Asked { last: Option<Instant>, busy: bool },
}

/// Every process looked at, for the whole agent: the site pipeline and each profile share
/// it, so a JVM that cannot be attached to gets one SIGQUIT in its life, and no JVM has
/// two requests at once.
fn known() -> &'static Mutex<HashMap<(u32, u64), Jvm>> {
    static KNOWN: OnceLock<Mutex<HashMap<(u32, u64), Jvm>>> = OnceLock::new();
    KNOWN.get_or_init(Default::default)
}

/// The perf maps a capture's JVMs wrote while it ran, each answer laid over the ones
/// before (`PerfMap::overlaid`): code recompiled during the capture is named at both of
/// its addresses, the old one gone from the JVM's newest map.
type Answers = Arc<Mutex<HashMap<u32, Arc<PerfMap>>>>;

/// Asks the JVMs whose samples arrive for perf maps, each at most every `EVERY`, each
/// request on its own thread (the JVM may take seconds to answer).
#[derive(Default)]
pub struct PerfMapRequests {
    /// PIDs this capture has seen: a JVM's start time, None for any other process (its
    /// maps and stat read once per PID).
    seen: HashMap<u32, Seen>,
    /// The maps answered, kept only for a capture that asked ([`Self::keep_answers`]):
    /// a profile, named once it ends, by which time a warming JVM has freed code it ran.
    answers: Option<Answers>,
}

/// What a capture knows of a process it sampled.
enum Seen {
    /// Its maps were asked of the reader.
    Asking(std::sync::mpsc::Receiver<Option<std::sync::Arc<[super::maps::FileMapping]>>>),
    /// A JVM's start time; None for any other process.
    Known(Option<u64>),
}

impl PerfMapRequests {
    /// Process `pid` was sampled: if it is a JVM not asked lately, ask it.
    pub fn seen(&mut self, pid: u32) {
        if !ENABLED.load(Ordering::Relaxed) {
            return;
        }
        if self.seen.len() >= MAX_PROCESSES && !self.seen.contains_key(&pid) {
            self.seen.clear();
        }
        // Per sample this is one lookup: only a JVM goes on to the shared registry. A
        // process's maps are asked of the reader once and never waited for (a tenant's
        // maps can be megabytes): until they come, it is not asked.
        let seen = self
            .seen
            .entry(pid)
            .or_insert_with(|| Seen::Asking(crate::reader::loader().maps_async(pid)));
        if let Seen::Asking(rx) = seen {
            match rx.try_recv() {
                Err(std::sync::mpsc::TryRecvError::Empty) => return,
                Ok(maps) => {
                    let jvm = maps.is_some_and(|maps| {
                        maps.iter()
                            .any(|m| m.path.rsplit('/').next() == Some("libjvm.so"))
                    });
                    *seen = Seen::Known(jvm.then(|| crate::procfs::start_ticks(pid)).flatten());
                }
                Err(std::sync::mpsc::TryRecvError::Disconnected) => *seen = Seen::Known(None),
            }
        }
        let Seen::Known(Some(start)) = *seen else {
            return;
        };
        let key = (pid, start);
        let slot;
        {
            let mut known = known().lock().unwrap_or_else(|e| e.into_inner());
            if known.len() >= MAX_PROCESSES && !known.contains_key(&key) {
                known.clear();
            }
            let state = known.entry(key).or_insert(Jvm::Asked {
                last: None,
                busy: false,
            });
            match state {
                Jvm::Asked { last, busy }
                    if !*busy && !last.is_some_and(|t| t.elapsed() < EVERY) =>
                {
                    let Some(s) = Slot::take(pid) else {
                        return;
                    };
                    slot = s;
                    *last = Some(Instant::now());
                    *busy = true;
                }
                _ => return,
            }
        }
        let answers = self.answers.clone();
        let spawned = std::thread::Builder::new()
            .name("jvm-perf-map".into())
            .spawn(move || {
                let outcome = request_perf_map(pid, start);
                drop(slot);
                if let Err(e) = &outcome {
                    tracing::debug!("asking JVM {pid} for its perf map: {e}");
                }
                settle(key, &outcome);
                // After the request's slot and the JVM's state are given back: reading the
                // map cannot hold either.
                if outcome.is_ok()
                    && let Some(answers) = &answers
                {
                    keep_answer(answers, pid);
                }
            });
        if spawned.is_err() {
            known().lock().unwrap_or_else(|e| e.into_inner()).insert(
                key,
                Jvm::Asked {
                    last: Some(Instant::now()),
                    busy: false,
                },
            );
        }
    }

    /// Forgets the PIDs this capture saw (what is known of each process stays), and the
    /// maps they answered.
    pub fn clear(&mut self) {
        self.seen.clear();
        if let Some(answers) = &self.answers {
            answers.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }

    /// Keeps the maps JVMs answer from now on, for [`Self::finish`].
    pub fn keep_answers(&mut self) {
        self.answers.get_or_insert_with(Default::default);
    }

    /// The capture ended: each JVM it sampled is asked once more, through the listener
    /// its earlier request started (never signalled now), after a request still running,
    /// each on its own thread and within the agent's `MAX_IN_FLIGHT`; the maps its JVMs
    /// answered during the capture come back by `within` at the latest, each laid over the
    /// ones before, and where a JVM did not answer in time, its file as it is now laid over
    /// them. Without [`Self::keep_answers`], nothing is kept or asked.
    pub fn finish(&mut self, within: Duration) -> HashMap<u32, Arc<PerfMap>> {
        let Some(answers) = self.answers.replace(Answers::default()) else {
            return HashMap::new();
        };
        // A thread still running past the deadline writes into `answers`, which this
        // capture no longer reads; the next capture has its own.
        let deadline = Instant::now() + within;
        let jvms: Vec<(u32, u64)> = self
            .seen
            .drain()
            .filter_map(|(pid, seen)| match seen {
                Seen::Known(Some(start)) => Some((pid, start)),
                _ => None,
            })
            .collect();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut asked = 0usize;
        for &(pid, start) in jvms.iter().filter(|_| ENABLED.load(Ordering::Relaxed)) {
            let Some(slot) = Slot::take(pid) else {
                // All taken, or this tenant's: the others may still be asked.
                continue;
            };
            let (tx, answers) = (tx.clone(), answers.clone());
            let spawned = std::thread::Builder::new()
                .name("jvm-perf-map".into())
                .spawn(move || {
                    let answered = last_request(pid, start, deadline);
                    drop(slot);
                    if answered {
                        keep_answer(&answers, pid);
                    }
                    let _ = tx.send((pid, answered));
                });
            if spawned.is_ok() {
                asked += 1;
            }
        }
        drop(tx);
        let mut answered = std::collections::HashSet::new();
        for _ in 0..asked {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((pid, true)) => {
                    answered.insert(pid);
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        for &(pid, _) in jvms.iter().filter(|(pid, _)| !answered.contains(pid)) {
            keep_answer(&answers, pid);
        }
        std::mem::take(&mut *answers.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Asks JVM `(pid, start)` for its map once more before `deadline`, after a request
/// running now, through its listener only; whether it answered.
fn last_request(pid: u32, start: u64, deadline: Instant) -> bool {
    let key = (pid, start);
    loop {
        if Instant::now() >= deadline {
            return false;
        }
        {
            let mut known = known().lock().unwrap_or_else(|e| e.into_inner());
            match known.get_mut(&key) {
                Some(Jvm::Asked { busy, .. }) if !*busy => {
                    *busy = true;
                    break;
                }
                Some(Jvm::Asked { .. }) => {}
                // Given up on, not a JVM, or never asked (forgotten, or a request that
                // could not start): nothing to ask.
                _ => return false,
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let outcome = request_perf_map_by(pid, start, deadline, false);
    if let Err(e) = &outcome {
        tracing::debug!("asking JVM {pid} for its perf map at the capture's end: {e}");
    }
    settle(key, &outcome);
    outcome.is_ok()
}

/// What a request's outcome says of the JVM from now on: given up on when it cannot be
/// attached to, forgotten when it is not a JVM (or gone), else asked now (its `busy` done).
fn settle(key: (u32, u64), outcome: &Result<(), AttachError>) {
    let next = match outcome {
        Err(AttachError::NoQuitHandler | AttachError::NoListener) => Jvm::Given,
        Err(AttachError::NotJvm | AttachError::Gone) => Jvm::No,
        _ => Jvm::Asked {
            last: Some(Instant::now()),
            busy: false,
        },
    };
    known()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, next);
}

/// Reads the map JVM `pid` wrote last and lays it over the ones it wrote before. Bounded
/// as the symboliser's cache is: all kept maps together stay under `CACHE_BUDGET` bytes
/// (past it the others are dropped; a map over it alone is not kept) and `MAX_PROCESSES`
/// JVMs; one map holds at most `MAX_ENTRIES` code objects (`PerfMap::parse`).
fn keep_answer(answers: &Answers, pid: u32) {
    // Parsed by the reader process; this thread waits for it.
    let Some(newer) = super::perfmap::read_map(pid) else {
        return;
    };
    let before = answers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&pid)
        .cloned();
    // Parsed outside the lock: up to 200,000 entries.
    let merged = match before {
        Some(before) => before.overlaid_map(&newer),
        None => newer,
    };
    let mut answers = answers.lock().unwrap_or_else(|e| e.into_inner());
    answers.remove(&pid);
    if merged.bytes() > super::perfmap::CACHE_BUDGET {
        return;
    }
    let others: usize = answers.values().map(|m| m.bytes()).sum();
    if others + merged.bytes() > super::perfmap::CACHE_BUDGET || answers.len() >= MAX_PROCESSES {
        answers.clear();
    }
    answers.insert(pid, Arc::new(merged));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that answers a byte at a time, each just before the per-read timeout the
    /// old code used, holds a request no longer than its deadline.
    #[test]
    fn a_slow_attach_peer_is_cut_at_the_deadline() {
        let (ours, mut theirs) = UnixStream::pair().expect("pair");
        let peer = std::thread::spawn(move || {
            let mut req = [0u8; 64];
            let _ = theirs.read(&mut req);
            while theirs.write_all(b"0").is_ok() {
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let start = Instant::now();
        let out = exchange(
            ours,
            b"1\0jcmd\0x\0\0\0",
            start + Duration::from_millis(800),
        );
        let took = start.elapsed();
        assert!(
            matches!(&out, Err(AttachError::Io(e)) if e.kind() == std::io::ErrorKind::TimedOut || e.kind() == std::io::ErrorKind::WouldBlock),
            "{out:?}"
        );
        assert!(took < Duration::from_secs(2), "held for {took:?}");
        peer.join().expect("peer");
    }

    /// The answer is read by the reader process: a success, a refusal with its first
    /// words, and bytes that are not text.
    #[test]
    fn an_attach_answer_is_read_by_the_reader() {
        let me = std::process::id();
        let by = Instant::now() + Duration::from_secs(20);
        assert!(read_reply(me, b"0\n", by).is_ok());
        match read_reply(me, b"-1\nCompiler.perfmap is not supported", by) {
            Err(AttachError::Refused(s)) => assert!(s.contains("not supported"), "{s}"),
            other => panic!("{other:?}"),
        }
        let junk: Vec<u8> = (0..MAX_ANSWER).map(|i| (i * 7 % 256) as u8).collect();
        match read_reply(me, &junk, by) {
            Err(AttachError::Refused(s)) => assert!(s.chars().count() <= 200, "{s:?}"),
            other => panic!("{other:?}"),
        }
    }

    /// An answer that never ends is read up to its bound, then the request ends.
    #[test]
    fn an_endless_answer_is_cut_at_its_bound() {
        let (ours, mut theirs) = UnixStream::pair().expect("pair");
        let peer = std::thread::spawn(move || {
            let mut req = [0u8; 64];
            let _ = theirs.read(&mut req);
            let chunk = [b'x'; 1024];
            while theirs.write_all(&chunk).is_ok() {}
        });
        let out = exchange(ours, b"1\0", Instant::now() + Duration::from_secs(5)).expect("answer");
        assert_eq!(out.len(), MAX_ANSWER);
        peer.join().expect("peer");
    }

    /// One tenant (a namespace) holds at most one attach request of the agent's few: its
    /// JVMs that never answer cannot take them all.
    #[test]
    fn one_tenant_holds_one_attach_slot() {
        let me = std::process::id();
        let first = Slot::take(me).expect("a free slot");
        assert!(Slot::take(me).is_none(), "a second for the same cgroup");
        drop(first);
        let again = Slot::take(me).expect("given back");
        drop(again);
    }

    #[test]
    fn a_process_that_is_not_a_jvm_is_never_signalled() {
        let me = std::process::id();
        let start = crate::procfs::start_ticks(me).expect("own start time");
        assert!(matches!(
            request_perf_map(me, start),
            Err(AttachError::NotJvm)
        ));
        let mut r = PerfMapRequests::default();
        // Its maps are asked of the reader at the first sample, read at a later one.
        let deadline = Instant::now() + Duration::from_secs(20);
        r.seen(me);
        while matches!(r.seen.get(&me), Some(Seen::Asking(_))) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            r.seen(me);
        }
        assert!(matches!(r.seen.get(&me), Some(Seen::Known(None))));
        let known = known().lock().expect("the registry lock");
        assert!(!known.contains_key(&(me, start)));
    }

    #[test]
    fn a_reused_pid_is_never_signalled() {
        let me = std::process::id();
        let start = crate::procfs::start_ticks(me).expect("own start time");
        assert!(matches!(
            send_sigquit(me, start + 1),
            Err(AttachError::Gone)
        ));
    }

    #[test]
    fn this_process_catches_no_sigquit_and_its_namespace_pid_is_read() {
        assert!(!catches_sigquit(std::process::id()));
        assert!(super::super::perfmap::namespace_pid(std::process::id()).is_some());
    }
}
