//! The reader: a process of its own that parses what workloads choose, so the worst a
//! hostile file can cost is its own stacks going unnamed.
//!
//! Any tenant can put any bytes in the files the agent reads (every executable file a
//! process whose memory grows maps, with no watch needed). Bounding each parser one case
//! at a time failed twice (a 36 KiB zstd section inflating to 1 GiB OOM-killed the agent;
//! 3,000 mapped files stalled every other watch on the node for 38 s). So parsing is not
//! done in the agent's process at all:
//!
//! - **What the reader does** (`serve`): it is this binary started again (`reader`
//!   subcommand) by the agent, inside the agent's container. It is given one descriptor
//!   at a time, opened by the agent inside the workload's root (`openat2` with
//!   `RESOLVE_IN_ROOT`, non-blocking, regular files only), parses it (a process's maps,
//!   an ELF file's CFI into unwind rules, its symbols) and answers plain, bounded data.
//! - **What it may do** (`serve::confine`): an address-space and data limit the kernel
//!   enforces (`RLIMIT_AS`, `RLIMIT_DATA`), `oom_score_adj` 1000 (a container-level OOM
//!   picks it, not the agent), no capabilities, `no_new_privs`, and a seccomp filter that
//!   allows reading and writing the descriptors it holds, memory management and exiting:
//!   no `open`, no sockets, no `exec`, no `ptrace`. A reader taken over by a file can
//!   only lie in its answers, which are decoded as hostile input too (`wire`).
//! - **What it can cost**: its own memory (the limits), one request's deadline of the
//!   loader's time, and that file's names. It is crash-only: on a crash, an exceeded
//!   budget or a missed deadline the agent kills it, starts another at the next request,
//!   refuses the file that caused it (its identity from `fstat`) for a cool-down, and
//!   counts the refusal by reason (`resourcewatch_agent_reader_refusals_total`).
//! - **The engine never waits on it**: requests go through the loader (`loader`), one
//!   thread of the agent that alone talks to the reader, takes one step of each tenant's
//!   jobs in turn (`Fair`: a namespace with thousands of files gets one file's turn at a
//!   time), and answers over channels. The reader is ended after `REST_AFTER` without a
//!   request. The unwinder walks with the tables ready; the naming thread asks for a
//!   stack's files together and waits for them under one deadline.

#[cfg(test)]
pub(crate) mod adversarial;
pub mod serve;
pub mod wire;

use std::{
    collections::{HashMap, VecDeque},
    fs::File,
    io::{Read, Write},
    os::{
        fd::{AsRawFd, BorrowedFd, OwnedFd},
        unix::{fs::MetadataExt, net::UnixStream, process::ExitStatusExt},
    },
    path::PathBuf,
    sync::{
        Arc, Condvar, LazyLock, Mutex,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use crate::stacks::{elf::Symbols, maps::FileMapping, unwind::Tables};

/// What the reader is asked to parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A `/proc/PID/maps`: its executable file mappings.
    Maps = 1,
    /// An ELF file's unwind rules.
    Tables = 2,
    /// An ELF file's function symbols.
    Symbols = 3,
    /// What CPython detection needs of an interpreter's file.
    Python = 4,
    /// A JVM's hsperfdata: its heap after the last young collection.
    Hsperf = 5,
    /// A runtime's perf map (its last 8 MiB): its JIT code's names.
    PerfMap = 6,
    /// A JVM's answer on its attach socket (at most 4 KiB, read by the agent into a
    /// memfd): whether the command ran, and the refusal's first words.
    AttachReply = 7,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Kind::Maps,
            2 => Kind::Tables,
            3 => Kind::Symbols,
            4 => Kind::Python,
            5 => Kind::Hsperf,
            6 => Kind::PerfMap,
            7 => Kind::AttachReply,
            _ => return None,
        })
    }
}

/// Why a file's content was not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The reader did not answer within the request's deadline, and was killed.
    Deadline,
    /// The reader ran out of its memory budget (the allocation failed, or the kernel
    /// refused it more).
    OverBudget,
    /// The reader died otherwise (a signal, a panic outside a request).
    Crashed,
    /// The reader made a system call its filter forbids (killed by SIGSYS).
    Forbidden,
    /// Its answer did not decode.
    Malformed,
    /// The file made the reader fail within its cool-down: not asked again yet.
    Cooling,
    /// The reader parsed it and found nothing usable (not ELF, over a bound).
    Unusable,
    /// The reader could not be started.
    Unavailable,
    /// The caller stopped waiting for the loader (its queue was long).
    Busy,
}

impl Refusal {
    pub const ALL: [Refusal; 9] = [
        Refusal::Deadline,
        Refusal::OverBudget,
        Refusal::Crashed,
        Refusal::Forbidden,
        Refusal::Malformed,
        Refusal::Cooling,
        Refusal::Unusable,
        Refusal::Unavailable,
        Refusal::Busy,
    ];

    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Deadline => "deadline",
            Refusal::OverBudget => "over_budget",
            Refusal::Crashed => "crashed",
            Refusal::Forbidden => "forbidden_syscall",
            Refusal::Malformed => "malformed_answer",
            Refusal::Cooling => "cooling_down",
            Refusal::Unusable => "unusable",
            Refusal::Unavailable => "unavailable",
            Refusal::Busy => "loader_busy",
        }
    }

    /// Whether the file's content was refused for what it did to the reader (a frame in
    /// it is named so, `[libfoo.so: unreadable (over_budget)]`), as opposed to a file
    /// with nothing usable in it or an answer not waited for.
    pub fn unreadable(self) -> bool {
        self.cools_down() || self == Refusal::Cooling
    }

    /// Whether the reader failed on the file (it is refused for a cool-down then), as
    /// opposed to an ordinary answer.
    fn cools_down(self) -> bool {
        matches!(
            self,
            Refusal::Deadline
                | Refusal::OverBudget
                | Refusal::Crashed
                | Refusal::Forbidden
                | Refusal::Malformed
        )
    }
}

/// The reader's counters, for the agent's /metrics.
pub struct Stats {
    pub requests: AtomicU64,
    pub restarts: AtomicU64,
    refusals: [AtomicU64; Refusal::ALL.len()],
    /// Time the loader spent waiting on the reader, ns.
    pub busy_ns: AtomicU64,
}

impl Stats {
    pub fn refusals(&self, r: Refusal) -> u64 {
        self.refusals[r as usize].load(Ordering::Relaxed)
    }
    fn refused(&self, r: Refusal) {
        self.refusals[r as usize].fetch_add(1, Ordering::Relaxed);
    }
}

pub static STATS: Stats = Stats {
    requests: AtomicU64::new(0),
    restarts: AtomicU64::new(0),
    refusals: [const { AtomicU64::new(0) }; Refusal::ALL.len()],
    busy_ns: AtomicU64::new(0),
};

/// A file as it was opened: what caches and refusals are keyed by, so that a path
/// showing another file in another root (a chrooted tenant's crafted copy) never shares
/// an entry with the file other tenants map, and a file rewritten in place is read anew.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
}

impl FileId {
    pub fn of(f: &File) -> Option<Self> {
        let m = f.metadata().ok()?;
        Some(Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime().saturating_mul(1_000_000_000) + m.mtime_nsec(),
        })
    }
}

/// The largest answer taken from the reader (`MAX_SYMBOLS` functions and
/// `MAX_NAME_BYTES` of names; `MAX_RULES` rules).
pub const MAX_ANSWER: usize = 18 << 20;
/// How long one request may take. The largest real file read here, OpenJDK 17's
/// libjvm.so (1.4 MiB of CFI, 57,000 symbols), took 0.91 s (rules) and 0.67 s (symbols)
/// in a debug build on this machine, idle; a debug build (the tests') gets more room on
/// a loaded CI machine.
pub const DEADLINE: Duration = if cfg!(debug_assertions) {
    Duration::from_secs(10)
} else {
    Duration::from_secs(3)
};
/// How long a file the reader failed on is refused.
pub const COOL_DOWN: Duration = Duration::from_secs(600);
/// The reader is restarted after an answer when its resident memory passed this (what it
/// holds after a large file stays with its allocator otherwise).
const RESTART_ABOVE_RSS: u64 = 24 << 20;
/// The reader is ended after this long without a request, so that an idle agent holds
/// none of it (the bench's reader at rest: 4.2 MiB; after a large answer, up to
/// `RESTART_ABOVE_RSS`).
const REST_AFTER: Duration = Duration::from_secs(30);
/// Exit code of a reader whose allocation failed (its allocator's budget, `serve`).
pub const EXIT_OVER_BUDGET: i32 = 75;

/// The reader process and the stream to it.
struct Child {
    proc: std::process::Child,
    sock: UnixStream,
}

/// One reader process, started on demand.
#[derive(Default)]
pub struct Reader {
    child: Option<Child>,
}

impl Reader {
    /// The reader process's PID, while one runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.proc.id())
    }

    /// Ends the reader, if one runs (not a failure: the next request starts another).
    pub fn rest(&mut self) {
        if self.child.is_some() {
            let _ = self.end(Some(Refusal::Unavailable));
        }
    }
}

/// The executable to start as the reader: this binary, unless it is a test harness.
fn reader_command() -> Option<std::process::Command> {
    if let Some(exe) = std::env::var_os("RESOURCEWATCH_READER_EXE") {
        let mut c = std::process::Command::new(exe);
        c.arg("reader");
        return Some(c);
    }
    let me = std::env::current_exe().ok()?;
    #[cfg(test)]
    {
        // This crate's own unit-test binary: libtest runs the one test that serves.
        let mut c = std::process::Command::new(me);
        c.args([
            "--exact",
            "reader::serve::tests::serve_when_asked",
            "--test-threads=1",
            "--nocapture",
            "-q",
        ])
        .env("RW_READER_SERVE", "1");
        Some(c)
    }
    #[cfg(not(test))]
    {
        let name = me.file_name()?.to_string_lossy().into_owned();
        let exe: PathBuf = if name.starts_with("resourcewatch-agent") {
            PathBuf::from("/proc/self/exe")
        } else {
            // An integration test or a benchmark: the agent built beside it
            // (target/<profile>/deps/<test> -> target/<profile>/resourcewatch-agent).
            let dir = me.parent()?;
            [dir, dir.parent()?]
                .iter()
                .map(|d| d.join("resourcewatch-agent"))
                .find(|p| p.is_file())?
        };
        let mut c = std::process::Command::new(exe);
        c.arg("reader");
        Some(c)
    }
}

impl Reader {
    fn spawn(&mut self) -> Result<&mut Child, Refusal> {
        if self.child.is_none() {
            let (ours, theirs) = UnixStream::pair().map_err(|_| Refusal::Unavailable)?;
            let mut cmd = reader_command().ok_or(Refusal::Unavailable)?;
            let theirs: OwnedFd = theirs.into();
            // No backtraces: a failed allocation's report would walk and name the
            // reader's own stack.
            cmd.env("RUST_BACKTRACE", "0")
                .stdin(std::process::Stdio::from(theirs))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::inherit());
            let proc = cmd.spawn().map_err(|e| {
                tracing::warn!("cannot start the reader process: {e}");
                Refusal::Unavailable
            })?;
            STATS.restarts.fetch_add(1, Ordering::Relaxed);
            self.child = Some(Child { proc, sock: ours });
        }
        self.child.as_mut().ok_or(Refusal::Unavailable)
    }

    /// Kills the reader and says how it had ended (or was ended).
    fn end(&mut self, killed_for: Option<Refusal>) -> Refusal {
        let Some(mut c) = self.child.take() else {
            return Refusal::Unavailable;
        };
        if killed_for.is_some() {
            let _ = c.proc.kill();
        }
        let status = c.proc.wait().ok();
        if let Some(r) = killed_for {
            return r;
        }
        match status {
            Some(s) if s.code() == Some(EXIT_OVER_BUDGET) => Refusal::OverBudget,
            Some(s) if s.signal() == Some(libc::SIGABRT) => Refusal::OverBudget,
            Some(s) if s.signal() == Some(libc::SIGSYS) => Refusal::Forbidden,
            _ => Refusal::Crashed,
        }
    }

    /// Asks the reader to parse the file open at `fd`; its answer, or why there is none.
    pub fn call(&mut self, kind: Kind, fd: BorrowedFd<'_>) -> Result<Vec<u8>, Refusal> {
        STATS.requests.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let out = self.call_inner(kind, fd);
        STATS
            .busy_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if let Err(r) = out {
            STATS.refused(r);
        }
        out
    }

    fn call_inner(&mut self, kind: Kind, fd: BorrowedFd<'_>) -> Result<Vec<u8>, Refusal> {
        let child = self.spawn()?;
        if send_with_fd(&child.sock, kind as u8, fd).is_err() {
            // Gone before the request: it died after its last answer.
            return Err(self.end(None));
        }
        let deadline = Instant::now() + DEADLINE;
        let mut head = [0u8; 5];
        match read_by(&child.sock, &mut head, deadline) {
            Ok(()) => {}
            Err(ReadErr::Late) => return Err(self.end(Some(Refusal::Deadline))),
            Err(ReadErr::Closed) => return Err(self.end(None)),
        }
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if len > MAX_ANSWER {
            return Err(self.end(Some(Refusal::Malformed)));
        }
        let mut body = vec![0u8; len];
        match read_by(&child.sock, &mut body, deadline) {
            Ok(()) => {}
            Err(ReadErr::Late) => return Err(self.end(Some(Refusal::Deadline))),
            Err(ReadErr::Closed) => return Err(self.end(None)),
        }
        let pid = child.proc.id();
        if crate::procfs::resident_pages(pid)
            .is_some_and(|p| p * crate::procfs::page_size() > RESTART_ABOVE_RSS)
        {
            // Not a failure: the next request starts a fresh, small reader.
            let _ = self.end(Some(Refusal::Unavailable));
        }
        match head[4] {
            0 => Ok(body),
            _ => Err(Refusal::Unusable),
        }
    }
}

enum ReadErr {
    Late,
    Closed,
}

/// Fills `buf` from `sock` by `deadline`, waiting in poll(2) between reads.
fn read_by(mut sock: &UnixStream, buf: &mut [u8], deadline: Instant) -> Result<(), ReadErr> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadErr::Late);
        }
        let mut pfd = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n == 0 {
            continue;
        }
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(ReadErr::Closed);
        }
        match sock.read(&mut buf[got..]) {
            Ok(0) => return Err(ReadErr::Closed),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Err(ReadErr::Closed),
        }
    }
    Ok(())
}

/// Sends a one-byte request carrying `fd` (SCM_RIGHTS).
fn send_with_fd(sock: &UnixStream, kind: u8, fd: BorrowedFd<'_>) -> std::io::Result<()> {
    let n = wire::with_fd_message(&mut [kind], |msg| {
        // SAFETY: the control buffer holds one cmsg of an int (`with_fd_message`);
        // MSG_NOSIGNAL: a dead reader is an error here, not a SIGPIPE for the agent.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>(), fd.as_raw_fd());
            libc::sendmsg(sock.as_raw_fd(), msg, libc::MSG_NOSIGNAL)
        }
    });
    if n != 1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Writes one answer (status 0: `body`; other: refused).
pub(crate) fn write_answer(mut out: impl Write, status: u8, body: &[u8]) -> std::io::Result<()> {
    let mut head = (body.len() as u32).to_le_bytes().to_vec();
    head.push(status);
    out.write_all(&head)?;
    out.write_all(body)
}

/// Byte-bounded cache of what the reader answered per file (None: nothing usable).
struct Cache<T> {
    files: HashMap<FileId, Option<Arc<T>>>,
    bytes: usize,
    max: usize,
}

impl<T> Cache<T> {
    fn new(max: usize) -> Self {
        Self {
            files: HashMap::new(),
            bytes: 0,
            max,
        }
    }
    fn get(&self, id: &FileId) -> Option<Option<Arc<T>>> {
        self.files.get(id).cloned()
    }
    fn put(&mut self, id: FileId, v: Option<Arc<T>>, bytes: usize) {
        if self.bytes + bytes > self.max || self.files.len() >= 65536 {
            // Cleared whole: the files of the processes being named now come back.
            self.files.clear();
            self.bytes = 0;
        }
        if bytes > self.max {
            self.files.insert(id, None);
            return;
        }
        self.bytes += bytes;
        self.files.insert(id, v);
    }
}

/// Symbol bytes kept for all files together.
pub const MAX_SYMBOL_BYTES: usize = 16 << 20;
/// Executable file mappings of one process looked at (a JVM: about 100).
pub const MAX_FILES_PER_PROCESS: usize = 512;

/// One job of the loader, a step (one reader request) at a time.
enum Job {
    /// A process's mappings, then its files' tables, one file a step.
    Process {
        pid: u32,
        answer: mpsc::Sender<crate::stacks::unwind::Loaded>,
        maps: Option<Vec<FileMapping>>,
        next: usize,
        modules: Vec<(std::ops::Range<u64>, u64, Option<Arc<Tables>>)>,
    },
    Symbols {
        pid: u32,
        path: Arc<str>,
        answer: mpsc::SyncSender<Result<Arc<Symbols>, Refusal>>,
    },
    Maps {
        pid: u32,
        answer: mpsc::SyncSender<Option<Arc<[FileMapping]>>>,
    },
    /// A file the caller opened (of process `pid`), parsed as `kind`.
    Parse {
        pid: u32,
        kind: Kind,
        file: File,
        answer: mpsc::SyncSender<Result<Vec<u8>, Refusal>>,
    },
    /// A JVM's heap: its hsperfdata file found in its /tmp (when `path` is None), read.
    Heap {
        pid: u32,
        path: Option<String>,
        answer: mpsc::SyncSender<(Option<String>, Option<crate::leak::jvm::Heap>)>,
    },
    /// Whether a process runs CPython: its maps, then its interpreter files (at most 4).
    Python {
        pid: u32,
        answer: mpsc::SyncSender<Option<crate::stacks::python::Runtime>>,
    },
}

impl Job {
    /// The process the job is for (its tenant's share of the reader).
    fn pid(&self) -> u32 {
        match self {
            Job::Process { pid, .. }
            | Job::Symbols { pid, .. }
            | Job::Maps { pid, .. }
            | Job::Parse { pid, .. }
            | Job::Heap { pid, .. }
            | Job::Python { pid, .. } => *pid,
        }
    }
}

/// Jobs queued by tenant (`crate::tenant`), taken one step per tenant in turn: a tenant
/// with thousands of files to read delays another's next step by one of its own, not by
/// its whole queue.
pub struct Fair<T> {
    queues: HashMap<crate::tenant::Tenant, VecDeque<T>>,
    turns: VecDeque<crate::tenant::Tenant>,
}

impl<T> Default for Fair<T> {
    fn default() -> Self {
        Self {
            queues: HashMap::new(),
            turns: VecDeque::new(),
        }
    }
}

impl<T> Fair<T> {
    pub fn push(&mut self, tenant: crate::tenant::Tenant, item: T) {
        let q = self.queues.entry(tenant.clone()).or_default();
        if q.is_empty() {
            self.turns.push_back(tenant);
        }
        q.push_back(item);
    }

    /// The next tenant's first item.
    pub fn pop(&mut self) -> Option<(crate::tenant::Tenant, T)> {
        let tenant = self.turns.pop_front()?;
        let q = self.queues.get_mut(&tenant)?;
        let item = q.pop_front()?;
        if q.is_empty() {
            self.queues.remove(&tenant);
        } else {
            self.turns.push_back(tenant.clone());
        }
        Some((tenant, item))
    }

    pub fn len(&self) -> usize {
        self.queues.values().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }
}

/// The one thread that talks to the reader, and what it keeps of the answers.
pub struct Loader {
    queue: Mutex<Fair<Job>>,
    wake: Condvar,
    tables: Mutex<Cache<Tables>>,
    symbols: Mutex<Cache<Symbols>>,
    refused: Mutex<HashMap<FileId, Instant>>,
}

static LOADER: LazyLock<Arc<Loader>> = LazyLock::new(|| {
    let l = Arc::new(Loader {
        queue: Mutex::new(Fair::default()),
        wake: Condvar::new(),
        tables: Mutex::new(Cache::new(crate::stacks::unwind::MAX_TABLE_BYTES)),
        symbols: Mutex::new(Cache::new(MAX_SYMBOL_BYTES)),
        refused: Mutex::new(HashMap::new()),
    });
    let run = l.clone();
    if let Err(e) = std::thread::Builder::new()
        .name("rw-loader".into())
        .spawn(move || run.run())
    {
        tracing::warn!("cannot start the loader thread: {e}");
    }
    l
});

/// The answer on `rx` by `deadline`, else `Busy` (counted).
pub fn wait_for<T>(
    rx: &mpsc::Receiver<Result<T, Refusal>>,
    deadline: Instant,
) -> Result<T, Refusal> {
    rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .unwrap_or_else(|_| {
            STATS.refused(Refusal::Busy);
            Err(Refusal::Busy)
        })
}

/// The agent's loader (started at first use).
pub fn loader() -> &'static Loader {
    &LOADER
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Loader {
    fn push(&self, job: Job) {
        let tenant = crate::tenant::of_pid(job.pid());
        lock(&self.queue).push(tenant, job);
        self.wake.notify_one();
    }

    /// Asks for `pid`'s mappings and the unwind tables of its files; the answer comes on
    /// `answer` (never waits).
    pub fn load_process(&self, pid: u32, answer: mpsc::Sender<crate::stacks::unwind::Loaded>) {
        self.push(Job::Process {
            pid,
            answer,
            maps: None,
            next: 0,
            modules: Vec::new(),
        });
    }

    /// The symbols of file `path` of `pid`, waiting up to `within` (for the naming
    /// thread and a profile's end, never the engine).
    pub fn symbols(&self, pid: u32, path: &str, within: Duration) -> Result<Arc<Symbols>, Refusal> {
        wait_for(&self.symbols_async(pid, path), Instant::now() + within)
    }

    /// The symbols of file `path` of `pid`, answered on the receiver (never waits): a
    /// stack's files are asked together and waited for by one deadline
    /// ([`wait_for`]); an answer no one waited for is still kept in the cache.
    pub fn symbols_async(
        &self,
        pid: u32,
        path: &str,
    ) -> mpsc::Receiver<Result<Arc<Symbols>, Refusal>> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.push(Job::Symbols {
            pid,
            path: path.into(),
            answer: tx,
        });
        rx
    }

    /// `pid`'s executable file mappings, waiting up to `within` (as `symbols`).
    pub fn maps(&self, pid: u32, within: Duration) -> Option<Arc<[FileMapping]>> {
        self.maps_async(pid).recv_timeout(within).ok().flatten()
    }

    /// `pid`'s executable file mappings, answered on the receiver (never waits).
    pub fn maps_async(&self, pid: u32) -> mpsc::Receiver<Option<Arc<[FileMapping]>>> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.push(Job::Maps { pid, answer: tx });
        rx
    }

    /// A JVM's heap counters: its hsperfdata file (found in its /tmp when `path` is
    /// None, the loader thread listing the directory) parsed by the reader; answered on
    /// the receiver with the file's path (never waits).
    pub fn jvm_heap_async(
        &self,
        pid: u32,
        path: Option<String>,
    ) -> mpsc::Receiver<(Option<String>, Option<crate::leak::jvm::Heap>)> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.push(Job::Heap {
            pid,
            path,
            answer: tx,
        });
        rx
    }

    /// The answer for `file` (opened by the caller inside a workload's root) parsed as
    /// `kind`, waiting up to `within` (never the engine), with the file's cool-down.
    pub fn parse(
        &self,
        pid: u32,
        kind: Kind,
        file: File,
        within: Duration,
    ) -> Result<Vec<u8>, Refusal> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.push(Job::Parse {
            pid,
            kind,
            file,
            answer: tx,
        });
        rx.recv_timeout(within).unwrap_or_else(|_| {
            STATS.refused(Refusal::Busy);
            Err(Refusal::Busy)
        })
    }

    /// Whether `pid` runs CPython, answered on the receiver (never waits).
    pub fn python_async(&self, pid: u32) -> mpsc::Receiver<Option<crate::stacks::python::Runtime>> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.push(Job::Python { pid, answer: tx });
        rx
    }

    /// Whether `pid` runs CPython, waiting up to `within` (as `symbols`).
    pub fn python(&self, pid: u32, within: Duration) -> Option<crate::stacks::python::Runtime> {
        self.python_async(pid).recv_timeout(within).ok().flatten()
    }

    /// Bytes of unwind tables held.
    pub fn table_bytes(&self) -> usize {
        lock(&self.tables).bytes
    }

    fn run(&self) {
        let mut reader = Reader::default();
        loop {
            let (tenant, job) = {
                let mut q = lock(&self.queue);
                loop {
                    if let Some(j) = q.pop() {
                        break j;
                    }
                    let (guard, waited) = self
                        .wake
                        .wait_timeout(q, REST_AFTER)
                        .unwrap_or_else(|e| e.into_inner());
                    q = guard;
                    if waited.timed_out() && q.is_empty() {
                        // Idle: what the reader holds after its last answer (up to
                        // RESTART_ABOVE_RSS) goes; a new one starts in about 2 ms.
                        reader.rest();
                    }
                }
            };
            if let Some(job) = self.step(&mut reader, job) {
                // Its next step after its tenant's other jobs, and every other tenant's
                // next step.
                lock(&self.queue).push(tenant, job);
            }
        }
    }

    /// Whether `id` is refused (cooling down).
    fn cooling(&self, id: &FileId) -> bool {
        let mut r = lock(&self.refused);
        match r.get(id) {
            Some(at) if at.elapsed() < COOL_DOWN => true,
            Some(_) => {
                r.remove(id);
                false
            }
            None => false,
        }
    }

    /// Asks the reader about `file`, honouring and recording cool-downs.
    fn ask(
        &self,
        reader: &mut Reader,
        kind: Kind,
        file: &File,
        id: FileId,
    ) -> Result<Vec<u8>, Refusal> {
        if self.cooling(&id) {
            STATS.refused(Refusal::Cooling);
            return Err(Refusal::Cooling);
        }
        let out = reader.call(kind, std::os::fd::AsFd::as_fd(file));
        if let Err(r) = out
            && r.cools_down()
        {
            tracing::info!(
                reason = r.reason(),
                dev = id.dev,
                inode = id.ino,
                "the reader failed on a workload's file: refused for {} s",
                COOL_DOWN.as_secs()
            );
            let mut refused = lock(&self.refused);
            if refused.len() >= 65536 {
                refused.clear();
            }
            refused.insert(id, Instant::now());
        }
        out
    }

    fn read_maps(&self, reader: &mut Reader, pid: u32) -> Option<Vec<FileMapping>> {
        let file = File::open(format!("/proc/{pid}/maps")).ok()?;
        // A maps file has no identity of its own worth cooling down (its inode is the
        // process's): a failure refuses nothing, the process's stacks stay unnamed.
        let body = reader
            .call(Kind::Maps, std::os::fd::AsFd::as_fd(&file))
            .ok()?;
        FileMapping::decode_all(&mut wire::Dec(&body)).ok()
    }

    /// One step of `job`: the job again if it has more to do.
    fn step(&self, reader: &mut Reader, job: Job) -> Option<Job> {
        match job {
            Job::Maps { pid, answer } => {
                let _ = answer.send(self.read_maps(reader, pid).map(Into::into));
                None
            }
            Job::Symbols { pid, path, answer } => {
                let _ = answer.send(self.symbols_of(reader, pid, &path));
                None
            }
            Job::Parse {
                kind, file, answer, ..
            } => {
                let out = match FileId::of(&file) {
                    Some(id) => self.ask(reader, kind, &file, id),
                    None => Err(Refusal::Unusable),
                };
                let _ = answer.send(out);
                None
            }
            Job::Heap { pid, path, answer } => {
                let path = path.or_else(|| crate::leak::jvm::find(pid));
                let heap = path.as_deref().and_then(|p| {
                    let file = crate::procfs::open_regular_in_root(pid, p)?;
                    let id = FileId::of(&file)?;
                    let body = self.ask(reader, Kind::Hsperf, &file, id).ok()?;
                    let mut d = wire::Dec(&body);
                    Some(crate::leak::jvm::Heap {
                        retained_bytes: d.u64().ok()?,
                        young_collections: d.u64().ok()?,
                    })
                });
                let _ = answer.send((path, heap));
                None
            }
            Job::Python { pid, answer } => {
                let found = self.read_maps(reader, pid).and_then(|maps| {
                    crate::stacks::python::python_files(&maps).iter().find_map(
                        |(path, mappings)| {
                            let file = crate::procfs::open_regular_in_root(pid, path)?;
                            let id = FileId::of(&file)?;
                            let body = self.ask(reader, Kind::Python, &file, id).ok()?;
                            crate::stacks::python::PythonSymbols::decode(&mut wire::Dec(&body))
                                .ok()?
                                .runtime_in(pid, mappings)
                        },
                    )
                });
                let _ = answer.send(found);
                None
            }
            Job::Process {
                pid,
                answer,
                maps: None,
                ..
            } => {
                let Some(maps) = self.read_maps(reader, pid) else {
                    let _ = answer.send(crate::stacks::unwind::Loaded {
                        pid,
                        modules: Vec::new(),
                    });
                    return None;
                };
                Some(Job::Process {
                    pid,
                    answer,
                    maps: Some(maps),
                    next: 0,
                    modules: Vec::new(),
                })
            }
            Job::Process {
                pid,
                answer,
                maps: Some(maps),
                mut next,
                mut modules,
            } => {
                // Files already read (this job's, or the cache's) cost no turn; the first
                // that needs the reader ends the step.
                let limit = maps.len().min(MAX_FILES_PER_PROCESS);
                let mut asked = false;
                while next < limit && !asked {
                    let m = &maps[next];
                    next += 1;
                    let known = modules
                        .iter()
                        .zip(maps.iter())
                        .find(|(_, earlier)| earlier.path == m.path)
                        .map(|((_, _, t), _)| t.clone());
                    let tables = match known {
                        Some(t) => t,
                        None => {
                            let (t, used_reader) = self.tables_of(reader, pid, &m.path);
                            asked = used_reader;
                            t
                        }
                    };
                    modules.push((m.range.clone(), m.offset, tables));
                }
                if next < limit {
                    return Some(Job::Process {
                        pid,
                        answer,
                        maps: Some(maps),
                        next,
                        modules,
                    });
                }
                let _ = answer.send(crate::stacks::unwind::Loaded { pid, modules });
                None
            }
        }
    }

    /// The tables of `path` in `pid`'s root, and whether the reader was asked.
    fn tables_of(&self, reader: &mut Reader, pid: u32, path: &str) -> (Option<Arc<Tables>>, bool) {
        let Some(file) = crate::procfs::open_regular_in_root(pid, path) else {
            return (None, false);
        };
        let Some(id) = FileId::of(&file) else {
            return (None, false);
        };
        if let Some(t) = lock(&self.tables).get(&id) {
            return (t, false);
        }
        let t = self
            .ask(reader, Kind::Tables, &file, id)
            .ok()
            .and_then(|body| Tables::decode(&mut wire::Dec(&body)).ok())
            .map(Arc::new);
        let bytes = t.as_ref().map_or(0, |t| t.bytes());
        lock(&self.tables).put(id, t.clone(), bytes);
        (t, true)
    }

    fn symbols_of(
        &self,
        reader: &mut Reader,
        pid: u32,
        path: &str,
    ) -> Result<Arc<Symbols>, Refusal> {
        let file = crate::procfs::open_regular_in_root(pid, path).ok_or(Refusal::Unusable)?;
        let id = FileId::of(&file).ok_or(Refusal::Unusable)?;
        if let Some(s) = lock(&self.symbols).get(&id) {
            return s.ok_or(Refusal::Unusable);
        }
        let s = self
            .ask(reader, Kind::Symbols, &file, id)
            .and_then(|body| Symbols::decode(&mut wire::Dec(&body)).map_err(|_| Refusal::Malformed))
            .map(Arc::new);
        match &s {
            Ok(s) => lock(&self.symbols).put(id, Some(s.clone()), s.bytes()),
            // Refused for what it did: the cool-down answers until it ends, not the cache.
            Err(r) if r.unreadable() => {}
            Err(_) => lock(&self.symbols).put(id, None, 0),
        }
        s
    }
}

/// Parses what `kind` asks of the open file `file` (in the reader): the answer's bytes, or
/// None when nothing usable was found.
pub fn parse(kind: Kind, file: File) -> Option<Vec<u8>> {
    let mut e = wire::Enc::default();
    match kind {
        Kind::Maps => {
            let text = crate::stacks::maps::read_file(file, crate::stacks::maps::MAX_MAPS_BYTES)?;
            FileMapping::encode_all(&crate::stacks::maps::executable_owned(&text), &mut e);
        }
        // The file's buffers go before the answer is written: the two at once were the
        // peak of a large binary's parse.
        Kind::Tables => {
            let f = crate::stacks::elf::ElfFile::new(file, crate::stacks::elf::FILE_BUDGET)?;
            let t = Tables::from_file(&f)?;
            drop(f);
            t.encode(&mut e);
        }
        Kind::Symbols => {
            let f = crate::stacks::elf::ElfFile::new(file, crate::stacks::elf::FILE_BUDGET)?;
            let s = Symbols::read(&f)?;
            drop(f);
            s.encode(&mut e);
        }
        Kind::PerfMap => {
            crate::stacks::perfmap::parse_file(file)?.encode(&mut e);
        }
        Kind::AttachReply => {
            use std::io::Read;
            let mut bytes = Vec::new();
            file.take(crate::stacks::jvm::MAX_ANSWER as u64)
                .read_to_end(&mut bytes)
                .ok()?;
            match crate::stacks::jvm::reply(&String::from_utf8_lossy(&bytes)) {
                Ok(()) => e.u8(0),
                Err(crate::stacks::jvm::AttachError::Refused(words)) => {
                    e.u8(1).bytes(words.as_bytes())
                }
                Err(other) => e.u8(1).bytes(other.to_string().as_bytes()),
            };
        }
        Kind::Hsperf => {
            let heap = crate::leak::jvm::read_file(file)?;
            e.u64(heap.retained_bytes).u64(heap.young_collections);
        }
        Kind::Python => {
            let f = crate::stacks::elf::ElfFile::new(file, crate::stacks::elf::FILE_BUDGET)?;
            crate::stacks::python::PythonSymbols::read(&f)?.encode(&mut e);
        }
    }
    Some(e.0)
}

#[doc(hidden)]
pub fn kind_of(v: u8) -> Option<Kind> {
    Kind::from_u8(v)
}

/// Test-only requests, served by the unit-test binary's reader: they do what a hostile
/// file could make a parser do.
#[cfg(test)]
const TEST_SOCKET: u8 = 200;
#[cfg(test)]
const TEST_OPEN: u8 = 203;
#[cfg(test)]
const TEST_ALLOCATE: u8 = 201;
#[cfg(test)]
const TEST_HANG: u8 = 202;

/// Does what a test request asks (in the reader).
#[cfg(test)]
pub(crate) fn test_request(kind: u8) {
    match kind {
        TEST_OPEN => {
            // Refused (EACCES): the reader answers with what it could open, nothing.
            assert!(File::open("/proc/self/status").is_err());
        }
        TEST_SOCKET => {
            // SAFETY: a plain socket(2) call, which the filter kills the reader for.
            unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
        }
        TEST_ALLOCATE => {
            let mut v: Vec<Vec<u8>> = Vec::new();
            loop {
                v.push(vec![1u8; 1 << 20]);
            }
        }
        TEST_HANG => loop {
            std::hint::spin_loop();
        },
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, bytes: &[u8]) -> (PathBuf, File) {
        let p = std::env::temp_dir().join(format!("rw-reader-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        File::create(&p)
            .and_then(|mut f| f.write_all(bytes))
            .expect("write");
        let f = File::open(&p).expect("open");
        (p, f)
    }

    /// The reader really is confined and crash-only: a request that opens a file is
    /// killed by its filter, one that allocates past its budget ends it, one that never
    /// answers is killed at the deadline; each time the next request starts a new reader
    /// that answers.
    #[test]
    fn the_reader_cannot_open_files_outgrow_its_budget_or_hang() {
        let mut r = Reader::default();
        let maps = File::open("/proc/self/maps").expect("maps");
        let ok = |r: &mut Reader| {
            let maps = File::open("/proc/self/maps").expect("maps");
            let body = r
                .call(Kind::Maps, std::os::fd::AsFd::as_fd(&maps))
                .expect("maps");
            let m = FileMapping::decode_all(&mut wire::Dec(&body)).expect("decoded");
            assert!(!m.is_empty());
        };
        ok(&mut r);
        let restarts = STATS.restarts.load(Ordering::Relaxed);
        for (kind, why) in [
            (TEST_SOCKET, Refusal::Forbidden),
            (TEST_ALLOCATE, Refusal::OverBudget),
            (TEST_HANG, Refusal::Deadline),
        ] {
            let child = r.spawn().expect("spawned");
            send_with_fd(&child.sock, kind, std::os::fd::AsFd::as_fd(&maps)).expect("sent");
            let mut head = [0u8; 5];
            let got = match read_by(&child.sock, &mut head, Instant::now() + DEADLINE) {
                Ok(()) => panic!("the reader answered test request {kind}"),
                Err(ReadErr::Late) => r.end(Some(Refusal::Deadline)),
                Err(ReadErr::Closed) => r.end(None),
            };
            assert_eq!(got, why, "test request {kind}");
            ok(&mut r);
        }
        assert!(STATS.restarts.load(Ordering::Relaxed) >= restarts + 3);
        // Opening a file is refused, not fatal: the reader answers (nothing usable).
        let child = r.spawn().expect("spawned");
        send_with_fd(&child.sock, TEST_OPEN, std::os::fd::AsFd::as_fd(&maps)).expect("sent");
        let mut head = [0u8; 5];
        assert!(read_by(&child.sock, &mut head, Instant::now() + DEADLINE).is_ok());
        assert_eq!(head[4], 1, "refused: nothing was parsed");
    }

    /// A reader at rest is ended (and reaped), and the next request starts another.
    #[test]
    fn a_reader_at_rest_is_ended_and_started_again_on_demand() {
        let mut r = Reader::default();
        let maps = File::open("/proc/self/maps").expect("maps");
        assert!(r.call(Kind::Maps, std::os::fd::AsFd::as_fd(&maps)).is_ok());
        let first = r.pid().expect("a reader runs");
        r.rest();
        assert_eq!(r.pid(), None);
        assert!(
            !std::path::Path::new(&format!("/proc/{first}")).exists(),
            "the reader at rest was reaped"
        );
        assert!(r.call(Kind::Maps, std::os::fd::AsFd::as_fd(&maps)).is_ok());
        assert!(r.pid().is_some_and(|p| p != first));
    }

    /// One tenant's thousand queued jobs delay another tenant's job by one step, and a
    /// job's next step goes after every other tenant's.
    #[test]
    fn the_readers_time_is_shared_by_tenant() {
        let mut q = Fair::default();
        for i in 0..1000 {
            q.push("ns:attacker".to_owned(), i);
        }
        q.push("ns:bystander".to_owned(), -1);
        q.push("ns:other".to_owned(), -2);
        let order: Vec<i32> = (0..4).filter_map(|_| q.pop()).map(|(_, j)| j).collect();
        assert_eq!(order, [0, -1, -2, 1]);
        // A job put back (its next step) waits for the other tenants' turns.
        q.push("ns:bystander".to_owned(), -3);
        q.push("ns:attacker".to_owned(), 1000);
        let (t, j) = q.pop().expect("a job");
        assert_eq!((t.as_str(), j), ("ns:attacker", 2));
        assert_eq!(q.pop().map(|(_, j)| j), Some(-3));
        assert_eq!(q.len(), 998);
        while q.pop().is_some() {}
        assert!(q.is_empty());
    }

    /// A file the reader fails on is refused for the cool-down, by the identity of what
    /// was opened: the same bytes at another path are refused too, other files are not.
    #[test]
    fn a_file_that_fails_the_reader_is_refused_by_identity() {
        let loader = Loader {
            queue: Mutex::new(Fair::default()),
            wake: Condvar::new(),
            tables: Mutex::new(Cache::new(1 << 20)),
            symbols: Mutex::new(Cache::new(1 << 20)),
            refused: Mutex::new(HashMap::new()),
        };
        let (p, f) = temp("refused", b"\x7fELF not really");
        let id = FileId::of(&f).expect("id");
        lock(&loader.refused).insert(id, Instant::now());
        let mut r = Reader::default();
        let before = STATS.refusals(Refusal::Cooling);
        assert_eq!(
            loader.ask(&mut r, Kind::Symbols, &f, id),
            Err(Refusal::Cooling)
        );
        assert_eq!(STATS.refusals(Refusal::Cooling), before + 1);
        let other = File::open("/proc/self/maps").expect("maps");
        let other_id = FileId::of(&other).expect("id");
        assert_ne!(other_id, id);
        assert!(loader.ask(&mut r, Kind::Maps, &other, other_id).is_ok());
        let _ = std::fs::remove_file(p);
    }

    /// Hostile ELF files cost the agent nothing: parsed by the reader, each gives no
    /// tables or no names, the agent's own peak memory does not move, and an ordinary
    /// file is read after them.
    #[test]
    fn hostile_files_cost_the_agent_nothing() {
        use crate::stacks::elf::{compressed, compressed_zstd, crafted};
        // 64 MiB of zeros, deflated (~64 KiB), declared as 64 MiB: over MAX_SECTION.
        let zlib = {
            let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
            z.write_all(&vec![0u8; 64 << 20]).expect("deflate");
            z.finish().expect("deflate")
        };
        let zstd = crate::stacks::elf::zstd_rle_bomb(1 << 30);
        let cases: Vec<(&str, Vec<u8>)> = vec![
            (
                "zstd-bomb",
                crafted(&[(
                    ".debug_frame",
                    1,
                    0x800,
                    &compressed_zstd(4096, &zstd),
                    zstd.len() as u64 + 24,
                )]),
            ),
            (
                "zlib-bomb",
                crafted(&[(
                    ".debug_frame",
                    1,
                    0x800,
                    &compressed(4096, &zlib),
                    zlib.len() as u64 + 24,
                )]),
            ),
            (
                "symbol-name-bomb",
                crate::stacks::elf::symbol_name_bomb(200_000, 4000),
            ),
        ];
        let before = crate::procfs::peak_rss_bytes(std::process::id()).expect("VmHWM");
        let mut r = Reader::default();
        for (name, bytes) in &cases {
            let (p, mut f) = temp(name, bytes);
            if *name == "huge-section" {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&p)
                    .and_then(|w| w.set_len((1 << 30) + 4096))
                    .expect("sparse");
                f = File::open(&p).expect("open");
            }
            for kind in [Kind::Tables, Kind::Symbols] {
                let out = r.call(kind, std::os::fd::AsFd::as_fd(&f));
                match (kind, out) {
                    (Kind::Tables, Ok(body)) => {
                        let t = Tables::decode(&mut wire::Dec(&body)).expect("decoded");
                        assert_eq!(t.bytes(), Tables::default().bytes(), "{name}: no rules");
                    }
                    (_, Ok(body)) => {
                        let s = Symbols::decode(&mut wire::Dec(&body)).expect("decoded");
                        assert!(s.bytes() < 8 << 20, "{name}: {} bytes", s.bytes());
                    }
                    (_, Err(e)) => assert!(
                        matches!(e, Refusal::Unusable | Refusal::OverBudget),
                        "{name}: {e:?}"
                    ),
                }
            }
            let _ = std::fs::remove_file(p);
        }
        let exe = File::open(std::env::current_exe().expect("exe")).expect("open");
        let body = r
            .call(Kind::Symbols, std::os::fd::AsFd::as_fd(&exe))
            .expect("this binary's symbols");
        assert!(
            Symbols::decode(&mut wire::Dec(&body))
                .expect("decoded")
                .bytes()
                > 0
        );
        let grown = crate::procfs::peak_rss_bytes(std::process::id())
            .expect("VmHWM")
            .saturating_sub(before);
        assert!(grown < 48 << 20, "the agent's peak grew by {grown} bytes");
    }
}
