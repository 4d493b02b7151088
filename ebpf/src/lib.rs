//! The kernel programs, embedded, and the Rust mirror of the types they share with user space.

pub mod shared;

/// The compiled object holding every resourcewatch program and map (`src/resourcewatch.bpf.c`).
///
/// Aligned because aya parses it in place as an ELF file.
pub static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/resourcewatch.bpf.o"));

/// Empty programs on the same tracepoints (`src/floor.bpf.c`), used by the benchmarks to
/// measure what `kernel.bpf_stats_enabled` itself costs per event.
pub static FLOOR_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/floor.bpf.o"));

/// Names of the programs in [`OBJECT`], as the loader looks them up.
pub mod programs {
    pub const SCHED_SWITCH: &str = "rw_sched_switch";
    pub const RSS_STAT: &str = "rw_rss_stat";
    pub const PROCESS_EXIT: &str = "rw_process_exit";
    pub const CPU_SYNC: &str = "rw_cpu_sync";
    pub const MALLOC_ENTER: &str = "rw_malloc_enter";
    pub const CALLOC_ENTER: &str = "rw_calloc_enter";
    pub const REALLOC_ENTER: &str = "rw_realloc_enter";
    pub const MMAP_ENTER: &str = "rw_mmap_enter";
    pub const ALLOC_RETURN: &str = "rw_alloc_return";
    pub const MMAP_RETURN: &str = "rw_mmap_return";
    pub const FREE_ENTER: &str = "rw_free_enter";
    pub const MUNMAP_ENTER: &str = "rw_munmap_enter";
    pub const PROFILE: &str = "rw_profile";
    pub const JVM_ALLOC: &str = "rw_jvm_alloc";
    pub const OOM_KILL: &str = "rw_oom_kill";
    pub const MARK_VICTIM: &str = "rw_mark_victim";
}

/// Names of the maps in [`OBJECT`].
pub mod maps {
    pub const CONTROL: &str = "rw_control";
    pub const CPU_SKETCH: &str = "rw_cpu_sketch";
    pub const MEM_SKETCH: &str = "rw_mem_sketch";
    pub const ONCPU: &str = "rw_oncpu";
    pub const TARGET_PIDS: &str = "rw_target_pids";
    pub const TARGET_CGROUPS: &str = "rw_target_cgroups";
    pub const TARGET_PROCS: &str = "rw_target_procs";
    pub const TARGET_SLOTS: &str = "rw_target_slots";
    pub const PROC_MEM: &str = "rw_proc_mem";
    pub const SAMPLES: &str = "rw_samples";
    pub const STATS: &str = "rw_stats";
    pub const ALLOC_PENDING: &str = "rw_alloc_pending";
    pub const ALLOC_PTRS: &str = "rw_alloc_ptrs";
    pub const ALLOC_STATS: &str = "rw_alloc_stats";
    pub const PROFILE_STACKS: &str = "rw_profile_stacks";
    pub const PROFILE_COUNTS: &str = "rw_profile_counts";
    pub const PROFILE_PIDS: &str = "rw_profile_pids";
    pub const PROFILE_CGROUPS: &str = "rw_profile_cgroups";
    pub const SITE_STACKS: &str = "rw_site_stacks";
    pub const SITE_BYTES: &str = "rw_site_bytes";
    pub const SITE_PIDS: &str = "rw_site_pids";
    pub const SITE_DELTAS: &str = "rw_site_deltas";
    pub const STACK_SAMPLES: &str = "rw_stack_samples";
    pub const PY_PROCS: &str = "rw_py_procs";
}

/// Name of the read-only configuration global (`struct rw_config`).
pub const CONFIG_GLOBAL: &str = "rw_config";
