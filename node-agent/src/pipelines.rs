//! Loads and attaches the kernel pipelines, and reads them: sketches through mmap (one
//! memory read per slot, no syscall), exact targets through batched lookups and
//! allocation totals through map iteration, memory samples from the ring buffer.

use std::{
    collections::{HashMap, HashSet},
    fs,
    num::NonZeroU32,
    os::fd::{AsFd, AsRawFd, BorrowedFd},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, Map, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, ProgramFd, RawTracePoint, UProbe, uprobe::UProbeScope},
};
use resourcewatch_ebpf::{
    CONFIG_GLOBAL, OBJECT, maps, programs as progs,
    shared::{self, RwAllocStats, RwConfig, RwMemSample, RwOncpu, RwProcMem, RwTargetProc},
};

use crate::{
    cgroup_resolver::CgroupLayout,
    hashpipe::{self, Geometry},
    procfs,
};

/// What the loader is asked to build.
#[derive(Clone, Debug)]
pub struct PipelineOptions {
    pub cpu: Geometry,
    pub mem: Geometry,
    /// A memory sample is streamed once a process's RSS moved this much...
    pub sample_min_delta_bytes: u64,
    /// ...and at most this often per process (bursts are coalesced into the newest value).
    pub sample_min_interval: Duration,
    /// Entries of each process's kernel ring are at least this far apart; closer samples
    /// fold into the newest entry.
    pub ring_coalesce: Duration,
    /// Load the libc uprobes (allocation mode); they attach per PID with [`Pipelines::trace_allocations`].
    pub allocation_mode: bool,
    /// Entries of each stack map (CPU profiles, leak growth sites): each holds one stack
    /// of up to 64 frames (512 bytes), preallocated. Distinct stacks beyond this, and
    /// stacks whose hash collides with a stored one, are counted as lost.
    pub stack_entries: u32,
    /// Bytes of the ring buffer that carries stack samples (copies of user stacks, 16 KiB
    /// each) to be unwound in user space; a power of two, at least a page. Samples that do
    /// not fit are counted with their frame-pointer walk instead.
    pub stack_sample_bytes: u32,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        Self {
            cpu: Geometry {
                depth: 4,
                width_shift: 10,
            },
            mem: Geometry {
                depth: 4,
                width_shift: 10,
            },
            sample_min_delta_bytes: 1 << 20,
            sample_min_interval: Duration::from_secs(1),
            ring_coalesce: Duration::from_secs(5),
            allocation_mode: false,
            stack_entries: 1024,
            // 127 growth-site samples (31 MiB of growth) between two reads of the agent
            // (one per report interval in a cluster, 2-5 s).
            stack_sample_bytes: 2 << 20,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(
        "the kernel has no BTF at /sys/kernel/btf/vmlinux (needs CONFIG_DEBUG_INFO_BTF=y): {0}"
    )]
    NoBtf(#[source] aya::BtfError),
    #[error("cannot read the CPU list: {0}")]
    Cpus(#[source] std::io::Error),
    #[error("cgroups: {0}")]
    Cgroup(#[from] crate::cgroup_resolver::CgroupError),
    #[error(
        "loading the BPF object failed (are you root, or do you have CAP_BPF and CAP_PERFMON?): {0}"
    )]
    Load(#[source] Box<aya::EbpfError>),
    #[error("program {program}: the kernel refused it for tracepoint {tracepoint}: {source}")]
    Program {
        program: &'static str,
        tracepoint: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    #[error("map {0} is missing from the BPF object")]
    MissingMap(&'static str),
    #[error("program {0} is missing from the BPF object")]
    MissingProgram(&'static str),
    #[error("map {name} in the BPF object is not of the {want} type this agent reads")]
    MapType {
        name: &'static str,
        want: &'static str,
    },
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    #[error("mmap of map {name} failed: {source}")]
    Mmap {
        name: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "running rw_cpu_sync on CPU {cpu} failed (BPF_PROG_TEST_RUN on a CPU needs kernel >= 5.10): {source}"
    )]
    CpuSync {
        cpu: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("allocation mode is off: start with allocation mode to trace PID {0}")]
    AllocationModeOff(u32),
    #[error("PID {0}: no such process")]
    NoProcess(u32),
    #[error("growth sites are already being captured for {max} processes")]
    SiteCapturesFull { max: usize },
    #[error("PID {pid}: no libc found in /proc/{pid}/maps (statically linked, or exited)")]
    NoLibc { pid: u32 },
    #[error("PID {pid}: attaching the {symbol} uprobe failed: {source}")]
    Uprobe {
        pid: u32,
        symbol: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
}

pub(crate) fn map_err(name: &'static str) -> impl FnOnce(aya::maps::MapError) -> PipelineError {
    move |source| PipelineError::Map {
        name,
        source: Box::new(source),
    }
}

/// `union bpf_attr` as BPF_PROG_TEST_RUN reads it (linux/bpf.h, 5.10+).
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_F_TEST_RUN_ON_CPU: u32 = 1;

/// Runs a raw tracepoint program once on `cpu` with `arg` as its only argument. aya has no
/// wrapper for BPF_PROG_TEST_RUN, hence the raw syscall.
fn run_on_cpu(prog: BorrowedFd<'_>, cpu: u32, arg: u64) -> std::io::Result<()> {
    let ctx = [arg];
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        ctx_size_in: size_of_val(&ctx) as u32,
        ctx_in: ctx.as_ptr() as u64,
        flags: BPF_F_TEST_RUN_ON_CPU,
        cpu,
        ..Default::default()
    };
    // SAFETY: attr is a valid, fully initialised bpf_attr prefix; ctx outlives the call.
    unsafe { bpf_call(BPF_PROG_TEST_RUN, &mut attr) }
}

/// The raw `bpf(2)` syscall with `attr` as its `union bpf_attr` prefix, for the commands
/// aya 0.14 does not wrap (BPF_PROG_TEST_RUN, BPF_MAP_LOOKUP_BATCH).
///
/// # Safety
/// `A` must be a `#[repr(C)]` prefix of `union bpf_attr` for `cmd`, fully initialised,
/// and every pointer in it must stay valid (and, for outputs, writable) for the call.
unsafe fn bpf_call<A>(cmd: libc::c_long, attr: &mut A) -> std::io::Result<()> {
    // SAFETY: the caller's contract above.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut A, size_of::<A>()) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The batch part of `union bpf_attr` (BPF_MAP_*_BATCH).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// Entries asked for per call: a hash map's batch never splits a bucket, and a bucket holds
/// a handful; ENOSPC (a bucket larger than this) doubles it.
const BATCH_CHUNK: usize = 1024;

/// Every entry of a BPF hash map with BPF_MAP_LOOKUP_BATCH (Linux 5.6+): one `bpf()` per
/// thousand entries instead of two per entry (next key, then lookup), which at a 100 ms
/// interval with 5,000 tracked processes was a third of the agent's CPU
/// (node-agent/BENCHMARKS.md, "Against the alternatives"). aya 0.14 has no wrapper, hence
/// the raw syscall. Err when the kernel refuses the command: the caller falls back to
/// iteration.
fn lookup_batch<K: aya::Pod, V: aya::Pod>(fd: BorrowedFd<'_>) -> std::io::Result<Vec<(K, V)>> {
    let mut chunk = BATCH_CHUNK;
    // SAFETY: Pod types are plain data for which all-zero bytes are a valid value.
    let zero_k: K = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let zero_v: V = unsafe { std::mem::zeroed() };
    let (mut keys, mut values) = (vec![zero_k; chunk], vec![zero_v; chunk]);
    let mut out = Vec::new();
    // A hash map's batch token is its next bucket's index.
    let mut token: Option<u32> = None;
    loop {
        let mut next: u32 = 0;
        let mut attr = BatchAttr {
            in_batch: token.as_ref().map_or(0, |t| t as *const u32 as u64),
            out_batch: &mut next as *mut u32 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..Default::default()
        };
        // SAFETY: attr is a valid, fully initialised bpf_attr prefix; the token, `next`
        // and both buffers (of `count` elements of the map's key and value types) outlive
        // the call.
        let err = unsafe { bpf_call(BPF_MAP_LOOKUP_BATCH, &mut attr) }.err();
        if err.as_ref().and_then(|e| e.raw_os_error()) == Some(libc::ENOSPC) {
            chunk *= 2;
            keys.resize(chunk, zero_k);
            values.resize(chunk, zero_v);
            continue;
        }
        let n = (attr.count as usize).min(chunk);
        out.extend(keys[..n].iter().copied().zip(values[..n].iter().copied()));
        match err {
            None => token = Some(next),
            // The end of the map (the last chunk's entries were returned with it).
            Some(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            Some(e) => return Err(e),
        }
    }
}

/// A BPF array map (created with BPF_F_MMAPABLE) mapped into this process.
struct MmapArray<T> {
    ptr: NonNull<T>,
    len: usize,
    bytes: usize,
}

impl<T> MmapArray<T> {
    fn new(bpf: &Ebpf, name: &'static str, len: usize) -> Result<Self, PipelineError> {
        let data = match bpf.map(name) {
            Some(Map::Array(data)) => data,
            Some(_) => {
                return Err(PipelineError::MapType {
                    name,
                    want: "array",
                });
            }
            None => return Err(PipelineError::MissingMap(name)),
        };
        // Array elements are laid out back to back, each rounded up to 8 bytes.
        assert!(
            size_of::<T>().is_multiple_of(8),
            "mmapped array elements must be 8-byte multiples"
        );
        let page = procfs::page_size() as usize;
        let bytes = (len * size_of::<T>()).div_ceil(page) * page;
        // SAFETY: mapping a BPF map fd we own, shared and read-write, at a kernel-chosen
        // address; the kernel keeps the map alive while the mapping exists.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                data.fd().as_fd_raw(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(PipelineError::Mmap {
                name,
                source: std::io::Error::last_os_error(),
            });
        }
        let ptr = NonNull::new(addr.cast::<T>()).ok_or_else(|| PipelineError::Mmap {
            name,
            source: std::io::Error::other("mapped at address 0"),
        })?;
        Ok(Self { ptr, len, bytes })
    }

    /// Overwrites element `i`; only before the programs that write it are attached.
    fn write(&self, i: usize, value: T) {
        assert!(i < self.len);
        // SAFETY: in bounds of a live, writable mapping.
        unsafe { std::ptr::write_volatile(self.ptr.as_ptr().add(i), value) }
    }

    /// A torn-free copy of element `i` (the kernel may be writing it).
    fn read(&self, i: usize) -> T {
        assert!(i < self.len);
        // SAFETY: in bounds of a live mapping; T is plain data so any bytes are valid.
        unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(i)) }
    }
}

impl MmapArray<u64> {
    fn atomics(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is len u64s, 8-byte aligned (page aligned), and lives as long
        // as self; AtomicU64 has the same layout as u64 and the kernel uses atomic
        // instructions on the same words.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast::<AtomicU64>(), self.len) }
    }
}

impl<T> Drop for MmapArray<T> {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what new() mapped.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.bytes) };
    }
}

trait AsFdRaw {
    fn as_fd_raw(&self) -> i32;
}

impl AsFdRaw for aya::maps::MapFd {
    fn as_fd_raw(&self) -> i32 {
        self.as_fd().as_raw_fd()
    }
}

/// On-CPU time of every process seen in one closed epoch.
#[derive(Debug, Default)]
pub struct CpuEpoch {
    pub start_ns: u64,
    pub end_ns: u64,
    pub per_tgid: HashMap<u32, u64>,
}

/// One exactly tracked process.
#[derive(Clone, Copy, Debug)]
pub struct TargetProcess {
    pub tgid: u32,
    /// Cumulative on-CPU ns since tracking began, including the running slice.
    pub cpu_ns: u64,
    pub rss_bytes: u64,
    pub anon_bytes: u64,
    pub file_bytes: u64,
    pub shmem_bytes: u64,
    pub swap_bytes: u64,
    pub exited: bool,
}

/// The kernel's accounting of one program.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProgramStats {
    pub name: String,
    pub run_cnt: u64,
    pub run_time_ns: u64,
}

/// Counters the kernel programs keep about themselves.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct KernelStats {
    pub samples: u64,
    pub samples_lost: u64,
    pub proc_mem_full: u64,
    pub targets_full: u64,
    pub alloc_ptrs_full: u64,
    /// Tasks switched out whose switch-in was never reported (running at attach, or a
    /// tracepoint the kernel skipped); their slice is credited from the scheduler's own
    /// bookkeeping instead.
    pub switch_ins_unseen: u64,
    /// rw_cpu_sync runs that failed (the running part of an epoch went uncredited).
    pub cpu_sync_failures: u64,
    /// Stacks (profiles, growth sites) or their counters that did not fit their maps.
    pub stacks_lost: u64,
}

/// The loaded, attached pipelines.
pub struct Pipelines {
    // Field order matters for Drop: mappings go before the object that owns the maps.
    cpu_sketch: MmapArray<u64>,
    mem_sketch: MmapArray<u64>,
    oncpu: MmapArray<RwOncpu>,
    control: MmapArray<u64>,
    samples: RingBuf<MapData>,
    /// Growth-site stack samples, walked by `unwinder` into `site_walked` as they come.
    stack_samples: RingBuf<MapData>,
    unwinder: crate::stacks::unwind::Unwinder,
    site_walked: crate::stacks::Walked,
    opts: PipelineOptions,
    layout: CgroupLayout,
    ncpus: u32,
    page: u64,
    alloc_pids: HashSet<u32>,
    /// rw_cpu_sync, run on each CPU in turn (never attached).
    cpu_sync: ProgramFd,
    sync_failures: AtomicU64,
    bpf: Ebpf,
}

impl Pipelines {
    /// Loads the object sized by `opts`, attaches the tracepoints and seeds the memory
    /// sketch with the processes that already exist.
    pub fn load(opts: PipelineOptions) -> Result<Self, PipelineError> {
        let btf = Btf::from_sys_fs().map_err(PipelineError::NoBtf)?;
        let ncpus = procfs::possible_cpus().map_err(PipelineError::Cpus)?;
        let layout = CgroupLayout::detect()?;
        let mut bpf = load_object(&opts, &btf, ncpus, &layout)?;
        let cpu_sync = load_cpu_sync(&mut bpf)?;
        let control = MmapArray::<u64>::new(&bpf, maps::CONTROL, shared::control::WORDS)?;
        let cpu_sketch = MmapArray::<u64>::new(&bpf, maps::CPU_SKETCH, 2 * opts.cpu.slots())?;
        let mem_sketch = MmapArray::<u64>::new(&bpf, maps::MEM_SKETCH, opts.mem.slots())?;
        let oncpu = MmapArray::<RwOncpu>::new(&bpf, maps::ONCPU, ncpus as usize)?;
        let samples = RingBuf::try_from(
            bpf.take_map(maps::SAMPLES)
                .ok_or(PipelineError::MissingMap(maps::SAMPLES))?,
        )
        .map_err(map_err(maps::SAMPLES))?;
        let stack_samples = RingBuf::try_from(
            bpf.take_map(maps::STACK_SAMPLES)
                .ok_or(PipelineError::MissingMap(maps::STACK_SAMPLES))?,
        )
        .map_err(map_err(maps::STACK_SAMPLES))?;

        let mut this = Self {
            cpu_sketch,
            mem_sketch,
            oncpu,
            control,
            samples,
            stack_samples,
            unwinder: crate::stacks::unwind::Unwinder::new(),
            site_walked: HashMap::new(),
            opts,
            layout,
            ncpus,
            page: procfs::page_size(),
            alloc_pids: HashSet::new(),
            cpu_sync,
            sync_failures: AtomicU64::new(0),
            bpf,
        };
        this.start_first_epoch();
        this.attach_tracepoints(&btf)?;
        // Learn what each CPU is running now rather than at its first switch, and find out
        // here, loudly, if this kernel cannot run the program on a given CPU.
        this.sync_cpus(false)?;
        if this.opts.allocation_mode {
            this.load_alloc_programs()?;
        }
        this.seed_memory();
        prime_cpus(this.ncpus);
        Ok(this)
    }

    /// The first epoch starts now, and the sample filter is configured before any event.
    fn start_first_epoch(&self) {
        let start = procfs::monotonic_ns() & !1;
        self.control_word(shared::control::EPOCH)
            .store(start, Ordering::SeqCst);
        // Each CPU is already running something the program never saw switched in. Its
        // slot says "unknown task since now", so that task's first switch-out is credited
        // from the scheduler's own slice bookkeeping, bounded to the time since attach.
        for cpu in 0..self.ncpus as usize {
            self.oncpu.write(
                cpu,
                RwOncpu {
                    start_ns: start,
                    pid: u32::MAX,
                    ..Default::default()
                },
            );
        }
        let nanos = |d: Duration| d.as_nanos().min(u64::MAX as u128) as u64;
        self.control_word(shared::control::MIN_DELTA).store(
            self.opts.sample_min_delta_bytes.div_ceil(self.page).max(1),
            Ordering::SeqCst,
        );
        self.control_word(shared::control::RING_COALESCE)
            .store(nanos(self.opts.ring_coalesce), Ordering::SeqCst);
        self.control_word(shared::control::MIN_INTERVAL)
            .store(nanos(self.opts.sample_min_interval), Ordering::SeqCst);
    }

    fn attach_tracepoints(&mut self, btf: &Btf) -> Result<(), PipelineError> {
        for (program, tracepoint) in [
            (progs::SCHED_SWITCH, "sched_switch"),
            (progs::RSS_STAT, "rss_stat"),
            (progs::PROCESS_EXIT, "sched_process_exit"),
        ] {
            let err = |source| PipelineError::Program {
                program,
                tracepoint,
                source: Box::new(source),
            };
            let prog: &mut BtfTracePoint = self
                .bpf
                .program_mut(program)
                .ok_or(PipelineError::MissingProgram(program))?
                .try_into()
                .map_err(err)?;
            prog.load(tracepoint, btf).map_err(err)?;
            prog.attach().map_err(err)?;
        }
        Ok(())
    }

    /// Loads (does not attach) the libc uprobes: they are attached per target PID.
    fn load_alloc_programs(&mut self) -> Result<(), PipelineError> {
        let unique: HashSet<&'static str> = ALLOC_PROGRAMS.iter().map(|(p, _)| *p).collect();
        for name in unique {
            let err = |source| PipelineError::Program {
                program: name,
                tracepoint: "uprobe",
                source: Box::new(source),
            };
            let prog: &mut UProbe = self
                .bpf
                .program_mut(name)
                .ok_or(PipelineError::MissingProgram(name))?
                .try_into()
                .map_err(err)?;
            prog.load().map_err(err)?;
        }
        Ok(())
    }

    pub fn options(&self) -> &PipelineOptions {
        &self.opts
    }

    pub fn cgroup_layout(&self) -> &CgroupLayout {
        &self.layout
    }

    fn control_word(&self, i: usize) -> &AtomicU64 {
        &self.control.atomics()[i]
    }

    /// Processes that exist before the programs attach have no rss_stat event until their
    /// RSS changes, so idle ones would never enter the sketch: insert them from /proc with
    /// the same algorithm the kernel runs (concurrent kernel updates are atomic too).
    fn seed_memory(&self) {
        let slots = self.mem_sketch.atomics();
        for pid in procfs::pids() {
            if let Some(pages) = procfs::resident_pages(pid).filter(|&p| p > 0) {
                hashpipe::set(slots, self.opts.mem, pid, pages);
            }
        }
    }

    /// Closes the current CPU epoch and returns what it measured. The new epoch starts
    /// now; the closed half is consumed (swapped to zero slot by slot) so it is empty when
    /// it becomes current again, and tasks still on a CPU are credited up to now.
    pub fn close_cpu_epoch(&self) -> CpuEpoch {
        let now = procfs::monotonic_ns();
        let epoch = self.control_word(shared::control::EPOCH);
        let old = epoch.load(Ordering::SeqCst);
        let (old_half, old_start) = ((old & 1) as usize, old & !1);
        epoch.store((now & !1) | (old_half as u64 ^ 1), Ordering::SeqCst);
        // Each CPU credits its running task's part of the closed epoch to the closed half,
        // on that CPU (see rw_cpu_sync); only then is the half complete.
        // A failure is counted in kernel_stats(); that CPU's running part is late, not lost.
        let _ = self.sync_cpus(true);

        let n = self.opts.cpu.slots();
        let half = &self.cpu_sketch.atomics()[old_half * n..(old_half + 1) * n];
        let per_tgid = hashpipe::collect(half, true);
        CpuEpoch {
            start_ns: old_start,
            end_ns: now,
            per_tgid,
        }
    }

    /// Current resident bytes of every process in the memory sketch.
    pub fn memory(&self) -> HashMap<u32, u64> {
        let mut m = hashpipe::collect(self.mem_sketch.atomics(), false);
        for v in m.values_mut() {
            *v *= self.page;
        }
        m
    }

    /// Replaces the exactly tracked PIDs and cgroup ids.
    pub fn set_targets(&mut self, pids: &[u32], cgroups: &[u64]) -> Result<(), PipelineError> {
        replace_set(&mut self.bpf, maps::TARGET_PIDS, pids)?;
        replace_set(&mut self.bpf, maps::TARGET_CGROUPS, cgroups)?;
        let bits = if pids.is_empty() {
            0
        } else {
            shared::TARGET_PIDS
        } | if cgroups.is_empty() {
            0
        } else {
            shared::TARGET_CGROUPS
        };
        // `targets` is the low half of word 1 (little-endian), `_pad0` the high half.
        self.control_word(shared::control::TARGETS)
            .store(bits as u64, Ordering::SeqCst);
        // Processes already running in a target get their RSS now, not at their next change.
        let wanted_cgroups: HashSet<u64> = cgroups.iter().copied().collect();
        let mut procs: BpfHashMap<_, u32, RwTargetProc> = BpfHashMap::try_from(
            self.bpf
                .map_mut(maps::TARGET_PROCS)
                .ok_or(PipelineError::MissingMap(maps::TARGET_PROCS))?,
        )
        .map_err(map_err(maps::TARGET_PROCS))?;
        let mut in_target: HashSet<u32> = HashSet::new();
        for pid in procfs::pids() {
            let cgroup_id = procfs::cgroup_text(pid)
                .and_then(|t| self.layout.path_in_proc_cgroup(&t).map(str::to_owned))
                .and_then(|p| self.layout.cgroup_id(&p).ok());
            if !(pids.contains(&pid) || cgroup_id.is_some_and(|c| wanted_cgroups.contains(&c))) {
                continue;
            }
            in_target.insert(pid);
            let Some(rss) = procfs::rss_breakdown(pid) else {
                continue;
            };
            let seeded = |mut e: RwTargetProc| {
                e.cgroup_id = cgroup_id.unwrap_or(e.cgroup_id);
                e.file_pages = rss.file / self.page;
                e.anon_pages = rss.anon / self.page;
                e.shmem_pages = rss.shmem / self.page;
                e.swap_pages = rss.swap / self.page;
                e.updated_ns = procfs::monotonic_ns();
                e
            };
            match procs.get(&pid, 0) {
                // An rss_stat event already wrote fresher values.
                Ok(e) if e.updated_ns != 0 => {}
                // Created by a context switch (CPU only, no RSS yet): add the RSS, keep
                // the CPU. A slice credited between this read and the write is lost
                // (microseconds, once); without this an idle process read 0 bytes until
                // its RSS changed, and a CPU burner almost always did.
                Ok(e) => {
                    let _ = procs.insert(pid, seeded(e), 2 /* BPF_EXIST */);
                }
                Err(_) => {
                    let _ = procs.insert(
                        pid,
                        seeded(RwTargetProc::default()),
                        1, /* BPF_NOEXIST */
                    );
                }
            }
        }
        // Only processes that left every target are forgotten: the others keep their
        // counters across a reconfiguration (wiping them read as 0 % CPU for one interval).
        let stale: Vec<u32> = procs
            .keys()
            .filter_map(Result::ok)
            .filter(|t| !in_target.contains(t))
            .collect();
        for tgid in stale {
            let _ = procs.remove(&tgid);
        }
        Ok(())
    }

    /// Runs rw_cpu_sync on every CPU (closing the epoch there when `close`). A CPU that
    /// is offline has nothing running to credit; any other failure is counted, the other
    /// CPUs are still done, and the first failure is returned.
    fn sync_cpus(&self, close: bool) -> Result<(), PipelineError> {
        let mut first = Ok(());
        for cpu in 0..self.ncpus {
            match run_on_cpu(self.cpu_sync.as_fd(), cpu, close as u64) {
                Err(e) if e.raw_os_error() != Some(libc::ENXIO) => {
                    self.sync_failures.fetch_add(1, Ordering::Relaxed);
                    if first.is_ok() {
                        first = Err(PipelineError::CpuSync { cpu, source: e });
                    }
                }
                _ => {}
            }
        }
        first
    }

    /// Exact values of every tracked process; exited ones are returned once, then removed.
    pub fn targets(&mut self) -> Result<Vec<TargetProcess>, PipelineError> {
        // Resynchronise every CPU's slot first, so the running part below is the running
        // task's, even after a switch the tracepoint did not report.
        // A failure is counted in kernel_stats(); the slots are then as the switches left them.
        let _ = self.sync_cpus(false);
        let now = procfs::monotonic_ns();
        let mut running: HashMap<u32, u64> = HashMap::new();
        for cpu in 0..self.ncpus as usize {
            let oc = self.oncpu.read(cpu);
            if oc.target != 0 && oc.tgid != 0 && now > oc.start_ns {
                *running.entry(oc.tgid).or_default() += now - oc.start_ns;
            }
        }
        let page = self.page;
        let batch = match self.bpf.map(maps::TARGET_PROCS) {
            Some(Map::HashMap(d)) => lookup_batch::<u32, RwTargetProc>(d.fd().as_fd()).ok(),
            _ => None,
        };
        let mut procs: BpfHashMap<_, u32, RwTargetProc> = BpfHashMap::try_from(
            self.bpf
                .map_mut(maps::TARGET_PROCS)
                .ok_or(PipelineError::MissingMap(maps::TARGET_PROCS))?,
        )
        .map_err(map_err(maps::TARGET_PROCS))?;
        // A kernel without batch lookups (before 5.6): entry by entry.
        let entries = batch.unwrap_or_else(|| procs.iter().filter_map(Result::ok).collect());
        let mut out = Vec::with_capacity(entries.len());
        for (tgid, v) in entries {
            out.push(TargetProcess {
                tgid,
                cpu_ns: v.cpu_ns + running.get(&tgid).copied().unwrap_or(0),
                rss_bytes: (v.file_pages + v.anon_pages + v.shmem_pages) * page,
                anon_bytes: v.anon_pages * page,
                file_bytes: v.file_pages * page,
                shmem_bytes: v.shmem_pages * page,
                swap_bytes: v.swap_pages * page,
                exited: v.exited != 0,
            });
        }
        for t in out.iter().filter(|t| t.exited) {
            let _ = procs.remove(&t.tgid);
        }
        out.sort_by_key(|t| t.tgid);
        Ok(out)
    }

    /// The kernel's ring of recent samples of a process, oldest first, as
    /// (CLOCK_MONOTONIC ns at 100 ms resolution, resident MiB).
    pub fn process_history(&self, tgid: u32) -> Vec<(u64, u64)> {
        let Some(map) = self.bpf.map(maps::PROC_MEM) else {
            return Vec::new();
        };
        let Ok(states) = BpfHashMap::<_, u32, RwProcMem>::try_from(map) else {
            return Vec::new();
        };
        let Ok(st) = states.get(&tgid, 0) else {
            return Vec::new();
        };
        let n = (st.ring_count as usize).min(shared::RING_LEN);
        let start = (st.ring_head as usize + shared::RING_LEN - n) % shared::RING_LEN;
        (0..n)
            .map(|i| {
                let j = (start + i) % shared::RING_LEN;
                (st.ring_ds[j] as u64 * 100_000_000, st.ring_mib[j] as u64)
            })
            .collect()
    }

    /// Hands every queued memory sample to `f`, without blocking.
    pub fn drain_samples(&mut self, mut f: impl FnMut(&RwMemSample)) {
        while let Some(item) = self.samples.next() {
            if item.len() >= size_of::<RwMemSample>() {
                // SAFETY: the record is an rw_mem_sample written by the kernel program; read
                // unaligned because the ring buffer only guarantees 8-byte alignment.
                let s = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<RwMemSample>()) };
                f(&s);
            }
        }
    }

    /// The ring buffer's fd, to wait on it with epoll/poll.
    pub fn samples_fd(&self) -> i32 {
        self.samples.as_raw_fd()
    }

    pub fn page_size(&self) -> u64 {
        self.page
    }

    /// Sums the kernel's per-CPU self-counters.
    pub fn kernel_stats(&self) -> KernelStats {
        let get = |i: u32| read_stat(&self.bpf, i);
        KernelStats {
            samples: get(shared::stat::SAMPLES),
            samples_lost: get(shared::stat::SAMPLES_LOST),
            proc_mem_full: get(shared::stat::PROC_MEM_FULL),
            targets_full: get(shared::stat::TARGETS_FULL),
            alloc_ptrs_full: get(shared::stat::ALLOC_PTRS_FULL),
            switch_ins_unseen: get(shared::stat::SWITCH_IN_UNSEEN),
            stacks_lost: get(shared::stat::STACKS_LOST),
            cpu_sync_failures: self.sync_failures.load(Ordering::Relaxed),
        }
    }

    /// Run count and total run time of each loaded program, from the kernel's own
    /// accounting (`/proc/self/fdinfo`; counted only while `kernel.bpf_stats_enabled=1`).
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        let mut out = Vec::new();
        for (name, prog) in self.bpf.programs() {
            let Ok(fd) = prog.fd() else { continue };
            let raw = fd.as_fd().as_raw_fd();
            let Ok(info) = fs::read_to_string(format!("/proc/self/fdinfo/{raw}")) else {
                continue;
            };
            let field = |k: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(k))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(0)
            };
            out.push(ProgramStats {
                name: name.to_owned(),
                run_cnt: field("run_cnt:"),
                run_time_ns: field("run_time_ns:"),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Kernel memory charged for every map of the object (`memlock` in fdinfo).
    pub fn map_memory_bytes(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for (name, map) in self.bpf.maps() {
            let fd = match map {
                Map::Array(d)
                | Map::HashMap(d)
                | Map::LruHashMap(d)
                | Map::PerCpuArray(d)
                | Map::RingBuf(d) => d.fd(),
                _ => continue,
            };
            let raw = fd.as_fd().as_raw_fd();
            let Ok(info) = fs::read_to_string(format!("/proc/self/fdinfo/{raw}")) else {
                continue;
            };
            if let Some(v) = info
                .lines()
                .find_map(|l| l.strip_prefix("memlock:"))
                .and_then(|v| v.trim().parse().ok())
            {
                out.push((name.to_owned(), v));
            }
        }
        // The ring buffer was taken out of the object to be read; count it too.
        if let Ok(info) =
            fs::read_to_string(format!("/proc/self/fdinfo/{}", self.samples.as_raw_fd()))
            && let Some(v) = info
                .lines()
                .find_map(|l| l.strip_prefix("memlock:"))
                .and_then(|v| v.trim().parse().ok())
        {
            out.push((maps::SAMPLES.to_owned(), v));
        }
        out.sort();
        out
    }

    /// Attaches the allocation uprobes to one process's libc.
    pub fn trace_allocations(&mut self, pid: u32) -> Result<(), PipelineError> {
        if !self.opts.allocation_mode {
            return Err(PipelineError::AllocationModeOff(pid));
        }
        if self.alloc_pids.contains(&pid) {
            return Ok(());
        }
        let libc = libc_path(pid).ok_or(PipelineError::NoLibc { pid })?;
        let scope =
            UProbeScope::OneProcess(NonZeroU32::new(pid).ok_or(PipelineError::NoLibc { pid })?);
        for (program, symbol) in ALLOC_PROGRAMS {
            let err = |source| PipelineError::Uprobe {
                pid,
                symbol,
                source: Box::new(source),
            };
            let prog: &mut UProbe = self
                .bpf
                .program_mut(program)
                .ok_or(PipelineError::MissingProgram(program))?
                .try_into()
                .map_err(err)?;
            prog.attach(symbol, &libc, scope).map_err(err)?;
        }
        self.alloc_pids.insert(pid);
        Ok(())
    }

    /// Starts charging each new high of `tgid`'s resident memory to the user stack that
    /// caused it (ebpf/src/stacks.bpf.h). The high starts at the process's RSS now, so
    /// only growth from here on counts. Up to `MAX_SITE_CAPTURES` processes at once: the
    /// kernel compares each rss_stat event's process with that many control-word slots
    /// before it looks anything up.
    pub fn capture_growth_sites(&mut self, tgid: u32) -> Result<(), PipelineError> {
        let pages = procfs::resident_pages(tgid).ok_or(PipelineError::NoProcess(tgid))?;
        let slots = (0..shared::MAX_SITE_CAPTURES).map(|i| shared::control::SITE_PID + i);
        let slot_of = |this: &Self, pid: u64| {
            slots
                .clone()
                .find(|&w| this.control_word(w).load(Ordering::SeqCst) == pid)
        };
        if slot_of(self, u64::from(tgid)).is_some() {
            return Ok(());
        }
        let free = slot_of(self, 0).ok_or(PipelineError::SiteCapturesFull {
            max: shared::MAX_SITE_CAPTURES,
        })?;
        let name = maps::SITE_PIDS;
        let mut pids: BpfHashMap<_, u32, shared::RwSiteState> = BpfHashMap::try_from(
            self.bpf
                .map_mut(name)
                .ok_or(PipelineError::MissingMap(name))?,
        )
        .map_err(map_err(name))?;
        // The high-water mark first: the kernel acts on the slot, and looks this up.
        let state = shared::RwSiteState {
            high: pages,
            pending: 0,
        };
        pids.insert(tgid, state, 0).map_err(map_err(name))?;
        self.control_word(free)
            .store(u64::from(tgid), Ordering::SeqCst);
        self.count_site_captures();
        Ok(())
    }

    /// Stops capturing `tgid`'s growth sites (what was captured stays until read).
    pub fn stop_growth_sites(&mut self, tgid: u32) {
        for i in 0..shared::MAX_SITE_CAPTURES {
            let w = self.control_word(shared::control::SITE_PID + i);
            if w.load(Ordering::SeqCst) == u64::from(tgid) {
                w.store(0, Ordering::SeqCst);
            }
        }
        self.count_site_captures();
        let name = maps::SITE_PIDS;
        let Some(map) = self.bpf.map_mut(name) else {
            return;
        };
        let Ok(mut pids) = BpfHashMap::<_, u32, shared::RwSiteState>::try_from(map) else {
            return;
        };
        let _ = pids.remove(&tgid);
        if pids.keys().next().is_none() {
            // No capture left: what the unwinder cached (tables, mappings) goes with it.
            self.unwinder = crate::stacks::unwind::Unwinder::new();
        }
    }

    /// `rw_control.site_pids`: how many slots are taken (0 spares every event the compares).
    fn count_site_captures(&self) {
        let n = (0..shared::MAX_SITE_CAPTURES)
            .filter(|i| {
                self.control_word(shared::control::SITE_PID + i)
                    .load(Ordering::SeqCst)
                    != 0
            })
            .count() as u64;
        self.control_word(shared::control::SITE_PIDS)
            .store(n, Ordering::SeqCst);
    }

    /// The processes whose growth sites are being captured.
    pub fn growth_site_pids(&self) -> Vec<u32> {
        self.bpf
            .map(maps::SITE_PIDS)
            .and_then(|m| BpfHashMap::<_, u32, shared::RwSiteState>::try_from(m).ok())
            .map(|pids| pids.keys().filter_map(Result::ok).collect())
            .unwrap_or_default()
    }

    /// Walks the growth-site stack samples waiting in the ring buffer (cheap when there
    /// are none): call it often while captures run, so the buffer does not fill and the
    /// processes' mappings are still the ones the samples were taken in.
    pub fn read_growth_samples(&mut self) -> Result<(), PipelineError> {
        crate::stacks::read_samples(
            &mut self.stack_samples,
            &self.bpf,
            maps::SITE_STACKS,
            &mut self.unwinder,
            &mut self.site_walked,
        )
    }

    /// Growth captured since the last call, every captured process's (bytes per stack).
    pub fn drain_growth_sites(&mut self) -> Result<Vec<crate::stacks::RawStack>, PipelineError> {
        self.read_growth_samples()?;
        let mut raw = crate::stacks::sampled(std::mem::take(&mut self.site_walked));
        raw.extend(crate::stacks::drain(
            &mut self.bpf,
            maps::SITE_BYTES,
            maps::SITE_STACKS,
        )?);
        Ok(raw)
    }

    /// Outstanding allocated bytes per traced process.
    pub fn allocations(&self) -> Vec<(u32, RwAllocStats)> {
        let Some(map) = self.bpf.map(maps::ALLOC_STATS) else {
            return Vec::new();
        };
        let Ok(stats) = BpfHashMap::<_, u32, RwAllocStats>::try_from(map) else {
            return Vec::new();
        };
        let mut v: Vec<(u32, RwAllocStats)> = stats.iter().filter_map(Result::ok).collect();
        v.sort_by_key(|(pid, _)| *pid);
        v
    }
}

/// The object with the loader's configuration set and its maps sized for this machine.
/// One of the kernel's per-CPU self-counters (`RW_STAT_*`), summed over CPUs; 0 if unreadable.
pub(crate) fn read_stat(bpf: &Ebpf, index: u32) -> u64 {
    bpf.map(maps::STATS)
        .and_then(|m| PerCpuArray::<_, u64>::try_from(m).ok())
        .and_then(|arr| arr.get(&index, 0).ok())
        .map_or(0, |v| v.iter().sum())
}

pub(crate) fn load_object(
    opts: &PipelineOptions,
    btf: &Btf,
    ncpus: u32,
    layout: &CgroupLayout,
) -> Result<Ebpf, PipelineError> {
    let config = RwConfig {
        cpu_depth: opts.cpu.depth,
        cpu_width_shift: opts.cpu.width_shift,
        mem_depth: opts.mem.depth,
        mem_width_shift: opts.mem.width_shift,
        cgroup_v1_memory: matches!(layout, CgroupLayout::V1 { .. }) as u32,
        page_shift: procfs::page_size().trailing_zeros(),
    };
    // Allocation maps cost memory even when unused: shrink them when the mode is off.
    let (pending, ptrs, astats) = if opts.allocation_mode {
        (4096, 262_144, 1024)
    } else {
        (1, 1, 1)
    };
    EbpfLoader::new()
        .btf(Some(btf))
        .override_global(CONFIG_GLOBAL, &config, true)
        .map_max_entries(maps::CPU_SKETCH, 2 * opts.cpu.slots() as u32)
        .map_max_entries(maps::MEM_SKETCH, opts.mem.slots() as u32)
        .map_max_entries(maps::ONCPU, ncpus)
        .map_max_entries(maps::ALLOC_PENDING, pending)
        .map_max_entries(maps::ALLOC_PTRS, ptrs)
        .map_max_entries(maps::ALLOC_STATS, astats)
        .map_max_entries(maps::PROFILE_STACKS, opts.stack_entries.max(1))
        .map_max_entries(maps::SITE_STACKS, opts.stack_entries.max(1))
        .map_max_entries(
            maps::STACK_SAMPLES,
            opts.stack_sample_bytes
                .next_power_of_two()
                .max(procfs::page_size() as u32),
        )
        .load(OBJECT)
        .map_err(|e| PipelineError::Load(Box::new(e)))
}

/// The program run on each CPU to learn what it is running (loaded, never attached).
fn load_cpu_sync(bpf: &mut Ebpf) -> Result<ProgramFd, PipelineError> {
    let program = progs::CPU_SYNC;
    let err = |source| PipelineError::Program {
        program,
        tracepoint: "none (run on each CPU)",
        source: Box::new(source),
    };
    let prog: &mut RawTracePoint = bpf
        .program_mut(program)
        .ok_or(PipelineError::MissingProgram(program))?
        .try_into()
        .map_err(err)?;
    prog.load().map_err(err)?;
    prog.fd()
        .map_err(err)?
        .try_clone()
        .map_err(|e| err(aya::programs::ProgramError::IOError(e)))
}

/// (program, libc symbol) of allocation mode. Return probes share one program per kind.
const ALLOC_PROGRAMS: [(&str, &str); 10] = [
    (progs::MALLOC_ENTER, "malloc"),
    (progs::ALLOC_RETURN, "malloc"),
    (progs::CALLOC_ENTER, "calloc"),
    (progs::ALLOC_RETURN, "calloc"),
    (progs::REALLOC_ENTER, "realloc"),
    (progs::ALLOC_RETURN, "realloc"),
    (progs::FREE_ENTER, "free"),
    (progs::MMAP_ENTER, "mmap"),
    (progs::MMAP_RETURN, "mmap"),
    (progs::MUNMAP_ENTER, "munmap"),
];

/// Forces one context switch on every CPU. A task already running when the programs
/// attach has no switch-in recorded, so its time would be invisible until its CPU next
/// switches, which for a CPU hog on an otherwise idle core can take seconds. A short-lived
/// thread pinned to each CPU makes the scheduler switch away from it and back.
fn prime_cpus(ncpus: u32) {
    let threads: Vec<_> = (0..ncpus)
        .map(|cpu| {
            std::thread::spawn(move || {
                // SAFETY: a zeroed cpu_set_t with one CPU set, applied to this thread only.
                unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu as usize, &mut set);
                    if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
                        return; // offline CPU: nothing runs there
                    }
                }
                for _ in 0..2 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

/// The process's libc, through its own root so a container's libc is found.
fn libc_path(pid: u32) -> Option<String> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let path = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            let base = p.rsplit('/').next().unwrap_or("");
            base.starts_with("libc.so") || (base.starts_with("libc-") && base.ends_with(".so"))
        })?;
    Some(format!("/proc/{pid}/root{path}"))
}

fn replace_set<K: aya::Pod + Eq + std::hash::Hash>(
    bpf: &mut Ebpf,
    name: &'static str,
    keys: &[K],
) -> Result<(), PipelineError> {
    let mut map: BpfHashMap<_, K, u8> =
        BpfHashMap::try_from(bpf.map_mut(name).ok_or(PipelineError::MissingMap(name))?)
            .map_err(map_err(name))?;
    let want: HashSet<&K> = keys.iter().collect();
    let have: Vec<K> = map.keys().filter_map(Result::ok).collect();
    for k in have.iter().filter(|k| !want.contains(k)) {
        map.remove(k).map_err(map_err(name))?;
    }
    for k in keys {
        map.insert(k, 1, 0).map_err(map_err(name))?;
    }
    Ok(())
}
