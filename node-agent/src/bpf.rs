//! The kernel objects as the agent handles them: loading the BPF object, map errors,
//! arrays mapped into memory (`BPF_F_MMAPABLE`: one memory read per slot, no syscall),
//! batched hash lookups and test runs of a program on one CPU (commands aya 0.14 does not
//! wrap). Shared by the pipelines, the stack readers and the profiler.

use std::{
    os::fd::{AsFd, AsRawFd, BorrowedFd},
    ptr::NonNull,
    sync::atomic::AtomicU64,
};

use aya::{Ebpf, maps::Map};

use crate::procfs;

/// Errors of loading, attaching and reading the kernel pipelines.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// Between unloading the pipelines and loading them again (a new sketch geometry).
    #[error("the pipelines were unloaded to be loaded again")]
    Unloaded,
    #[error("the kernel has no BTF at /sys/kernel/btf/vmlinux (needs CONFIG_DEBUG_INFO_BTF=y)")]
    NoBtf(#[source] aya::BtfError),
    #[error("cannot read the CPU list")]
    Cpus(#[source] std::io::Error),
    #[error("cgroups")]
    Cgroup(#[from] crate::cgroup_resolver::CgroupError),
    #[error(
        "loading the BPF object failed (are you root, or do you have CAP_BPF and CAP_PERFMON?)"
    )]
    Load(#[source] Box<aya::EbpfError>),
    #[error("program {program}: the kernel refused it for tracepoint {tracepoint}")]
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
    #[error("map {name}")]
    Map {
        name: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    #[error("mmap of map {name} failed")]
    Mmap {
        name: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "running rw_cpu_sync on CPU {cpu} failed (BPF_PROG_TEST_RUN on a CPU needs kernel >= 5.10)"
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
    #[error("PID {pid}: attaching the {symbol} uprobe failed")]
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
pub(crate) fn run_on_cpu(prog: BorrowedFd<'_>, cpu: u32, arg: u64) -> std::io::Result<()> {
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
pub(crate) fn lookup_batch<K: aya::Pod, V: aya::Pod>(
    fd: BorrowedFd<'_>,
) -> std::io::Result<Vec<(K, V)>> {
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
pub(crate) struct MmapArray<T> {
    ptr: NonNull<T>,
    len: usize,
    bytes: usize,
}

impl<T> MmapArray<T> {
    pub(crate) fn new(bpf: &Ebpf, name: &'static str, len: usize) -> Result<Self, PipelineError> {
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
    pub(crate) fn write(&self, i: usize, value: T) {
        assert!(i < self.len);
        // SAFETY: in bounds of a live, writable mapping.
        unsafe { std::ptr::write_volatile(self.ptr.as_ptr().add(i), value) }
    }

    /// Element `i` in the mapping, for field-wise atomic or volatile access.
    pub(crate) fn ptr(&self, i: usize) -> *mut T {
        assert!(i < self.len);
        // SAFETY: in bounds of the mapping (checked above).
        unsafe { self.ptr.as_ptr().add(i) }
    }

    /// A torn-free copy of element `i` (the kernel may be writing it).
    pub(crate) fn read(&self, i: usize) -> T {
        assert!(i < self.len);
        // SAFETY: in bounds of a live mapping; T is plain data so any bytes are valid.
        unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(i)) }
    }
}

impl MmapArray<u64> {
    pub(crate) fn atomics(&self) -> &[AtomicU64] {
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

pub(crate) trait AsFdRaw {
    fn as_fd_raw(&self) -> i32;
}

impl AsFdRaw for aya::maps::MapFd {
    fn as_fd_raw(&self) -> i32 {
        self.as_fd().as_raw_fd()
    }
}

/// One of the kernel's per-CPU self-counters (`RW_STAT_*`), summed over CPUs; 0 if unreadable.
pub(crate) fn read_stat(bpf: &Ebpf, index: u32) -> u64 {
    bpf.map(resourcewatch_ebpf::maps::STATS)
        .and_then(|m| aya::maps::PerCpuArray::<_, u64>::try_from(m).ok())
        .and_then(|arr| arr.get(&index, 0).ok())
        .map_or(0, |v| v.iter().sum())
}

/// The raw `bpf(2)` syscall with `attr` as its `union bpf_attr` prefix, for the commands
/// aya 0.14 does not wrap (BPF_PROG_TEST_RUN, BPF_MAP_LOOKUP_BATCH).
///
/// # Safety
/// `A` must be a `#[repr(C)]` prefix of `union bpf_attr` for `cmd`, fully initialised,
/// and every pointer in it must stay valid (and, for outputs, writable) for the call.
unsafe fn bpf_call<A>(cmd: libc::c_long, attr: &mut A) -> std::io::Result<()> {
    // SAFETY: the caller's contract above.
    unsafe { bpf_call_ret(cmd, attr) }.map(|_| ())
}

/// As [`bpf_call`], returning what the call returned (a descriptor, for the commands that
/// make one).
///
/// # Safety
/// As [`bpf_call`].
unsafe fn bpf_call_ret<A>(cmd: libc::c_long, attr: &mut A) -> std::io::Result<libc::c_long> {
    // SAFETY: the caller's contract above.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut A, size_of::<A>()) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Whether bpf() itself answers: creates (and closes) a one-slot array map. Capabilities
/// can be effective while a seccomp filter refuses the call (capabilities::probe).
pub(crate) fn map_create_answers() -> std::io::Result<()> {
    /// The BPF_MAP_CREATE prefix of `union bpf_attr`.
    #[repr(C)]
    struct MapCreate {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
    }
    const BPF_MAP_CREATE: libc::c_long = 0;
    const BPF_MAP_TYPE_ARRAY: u32 = 2;
    let mut attr = MapCreate {
        map_type: BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: 4,
        max_entries: 1,
        map_flags: 0,
    };
    // SAFETY: attr is a valid, fully initialised bpf_attr prefix with no pointers.
    let fd = unsafe { bpf_call_ret(BPF_MAP_CREATE, &mut attr) }?;
    // SAFETY: the call made this descriptor and nothing else holds it.
    drop(unsafe {
        <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as libc::c_int)
    });
    Ok(())
}
