//! The kernel pipelines: one loader for the BPF object they share (its maps sized by
//! [`PipelineOptions`], tracepoints attached, the memory sketch seeded), and one module per
//! pipeline pairing its kernel side (`ebpf/src/*.bpf.h`) with its user side: [`cpu`],
//! [`memory`], [`targets`], [`alloc`], [`sites`]. Sketches are read through mmap (one
//! memory read per slot, no syscall), exact targets through batched lookups, allocation
//! totals through map iteration, memory samples from the ring buffer.

mod alloc;
mod cpu;
mod memory;
mod sites;
mod targets;

pub use crate::bpf::PipelineError;
pub use cpu::CpuEpoch;
pub use targets::TargetProcess;

use std::{
    collections::{HashMap, HashSet},
    fs,
    os::fd::{AsFd, AsRawFd},
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Map, MapData, RingBuf},
    programs::{BtfTracePoint, ProgramFd},
};
use cpu::{load_cpu_sync, prime_cpus};
use resourcewatch_ebpf::{
    CONFIG_GLOBAL, OBJECT, maps, programs as progs,
    shared::{self, RwConfig, RwOncpu},
};

use crate::{
    bpf::{MmapArray, map_err, read_stat},
    cgroup_resolver::CgroupLayout,
    hashpipe::Geometry,
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
    /// Tracked processes whose probe window in the slot table was full (kept, in the
    /// spill map; a steady rise means the table is too small for the node).
    pub targets_spilled: u64,
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
    target_slots: MmapArray<shared::RwTargetSlot>,
    /// Slots of exited processes, reported once and retired at the next read (see targets).
    exited_slots: Vec<(usize, u32)>,
    /// Retired slots and when, zeroed and freed once their grace has passed (see targets).
    retired_slots: Vec<(usize, std::time::Instant)>,
    /// Processes already running when they became targets, and when counting began
    /// (monotonic ns): handed out once with their first row (see `TargetProcess`).
    counted_from: std::collections::HashMap<u32, u64>,
    samples: RingBuf<MapData>,
    /// Growth-site stack samples, walked by `unwinder` into `site_walked` as they come.
    stack_samples: RingBuf<MapData>,
    unwinder: crate::stacks::unwind::Unwinder,
    /// CPython processes listed for the kernel's frame walk, JVMs asked for perf maps.
    runtimes: crate::stacks::Runtimes,
    site_walked: crate::stacks::Walked,
    /// The growth-site samples the kernel can still revoke.
    site_revocable: crate::stacks::Revocable,
    opts: PipelineOptions,
    layout: CgroupLayout,
    ncpus: u32,
    page: u64,
    alloc_pids: HashSet<u32>,
    /// The JVM allocation probes attached per captured JVM (see sites).
    jvm_alloc_links: HashMap<u32, Vec<aya::programs::uprobe::UProbeLinkId>>,
    /// Why OOM kills are not seen (the kprobe on oom_kill_process did not attach), or None.
    oom_kills_unseen: Option<String>,
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
        let target_slots = MmapArray::new(&bpf, maps::TARGET_SLOTS, shared::TARGET_SLOTS)?;
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
        let runtimes = crate::stacks::Runtimes::take(&mut bpf)?;

        let mut this = Self {
            cpu_sketch,
            mem_sketch,
            oncpu,
            control,
            target_slots,
            exited_slots: Vec::new(),
            retired_slots: Vec::new(),
            counted_from: std::collections::HashMap::new(),
            samples,
            stack_samples,
            unwinder: crate::stacks::unwind::Unwinder::new(),
            runtimes,
            site_walked: HashMap::new(),
            site_revocable: crate::stacks::Revocable::default(),
            opts,
            layout,
            ncpus,
            page: procfs::page_size(),
            alloc_pids: HashSet::new(),
            jvm_alloc_links: HashMap::new(),
            oom_kills_unseen: None,
            cpu_sync,
            sync_failures: AtomicU64::new(0),
            bpf,
        };
        this.start_first_epoch();
        this.attach_tracepoints(&btf)?;
        // OOM kills are a feature, not a requirement: a kernel without kprobes (or with
        // oom_kill_process inlined) still gets every other pipeline, and says so.
        match this.attach_oom_probe(&btf) {
            Ok(how) => tracing::debug!(through = how, "OOM kills observed"),
            Err(why) => {
                tracing::warn!(reason = %why, "OOM kills will not be observed");
                this.oom_kills_unseen = Some(why);
            }
        }
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

    /// OOM kills from the kprobe on oom_kill_process (which says exactly which limit was
    /// reached), else from the oom:mark_victim tracepoint where it passes the victim's task
    /// (6.8 on; kernels without kprobes). Err says why neither attached.
    fn attach_oom_probe(&mut self, btf: &Btf) -> Result<&'static str, String> {
        const FUNCTION: &str = "oom_kill_process";
        let kprobe = (|| -> Result<(), String> {
            let prog: &mut aya::programs::KProbe = self
                .bpf
                .program_mut(progs::OOM_KILL)
                .ok_or("not in the object")?
                .try_into()
                .map_err(|e| format!("{e}"))?;
            prog.load().map_err(|e| format!("{e}"))?;
            prog.attach(FUNCTION, 0).map_err(|e| format!("{e}"))?;
            Ok(())
        })();
        let Err(kprobe) = kprobe else {
            return Ok("kprobe oom_kill_process");
        };
        let older = crate::capabilities::kernel_at_least(6, 8)
            .then_some(())
            .ok_or("the tracepoint passes the victim's task from Linux 6.8 on".to_owned());
        let tracepoint = older.and_then(|()| {
            let prog: &mut BtfTracePoint = self
                .bpf
                .program_mut(progs::MARK_VICTIM)
                .ok_or("not in the object")?
                .try_into()
                .map_err(|e| format!("{e}"))?;
            prog.load("mark_victim", btf).map_err(|e| format!("{e}"))?;
            prog.attach().map_err(|e| format!("{e}"))?;
            Ok(())
        });
        match tracepoint {
            Ok(()) => Ok("tracepoint oom:mark_victim"),
            Err(tp) => Err(format!(
                "OOM kills are not observed: the kprobe on {FUNCTION}: {kprobe}; the oom:mark_victim tracepoint: {tp}"
            )),
        }
    }

    /// Why OOM kills are not observed on this node, or None when they are.
    pub fn oom_kills_unseen(&self) -> Option<&str> {
        self.oom_kills_unseen.as_deref()
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
            targets_spilled: get(shared::stat::TARGETS_SPILLED),
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
}

/// The object with the loader's configuration set and its maps sized for this machine.
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
