//! `#[repr(C)]` mirrors of `include/resourcewatch.h`; the test below checks every size and
//! offset against what the C compiler produced for the same header.

/// Bits of a HashPipe word that hold the process id (PID_MAX_LIMIT is 2^22).
pub const KEY_BITS: u32 = 22;
/// Bits of a HashPipe word that hold the value (ns of CPU, or resident pages).
pub const VALUE_BITS: u32 = 42;
pub const VALUE_MASK: u64 = (1 << VALUE_BITS) - 1;
pub const MAX_DEPTH: u32 = 8;
pub const MAX_WIDTH_SHIFT: u32 = 16;
pub const TARGET_PIDS: u32 = 1;
pub const TARGET_CGROUPS: u32 = 2;
pub const ALLOC_HEAP: u32 = 1;
pub const ALLOC_MMAP: u32 = 2;
/// Samples in each process's kernel ring.
pub const RING_LEN: usize = 16;
pub const SAMPLE_RSS: u32 = 1;
pub const SAMPLE_EXIT: u32 = 2;
/// The kernel's OOM killer chose the process (`rw_oom_kill`).
pub const SAMPLE_OOM_KILL: u32 = 3;
/// Multiplier of stage 0's hash, and the step added per stage (see `hp_index` in C).
pub const HASH_BASE: u32 = 0x9E37_79B1;
pub const HASH_STEP: u32 = 0x6A09_E668;
/// Frames kept per captured stack (the stack maps' values are this many addresses).
pub const STACK_DEPTH: usize = 64;
/// Bytes of user stack copied per stack sample (`RW_STACK_COPY`).
pub const STACK_COPY: usize = 16384;
/// CPython frames kept per stack sample (`RW_PY_DEPTH`): code-object addresses, innermost
/// first, with [`PY_ENTRY`] on the outermost frame of each C call of the evaluation loop.
pub const PY_DEPTH: usize = 64;
pub const PY_ENTRY: u64 = 1;
/// Threads of a Python process the kernel looks at for the sampled one.
pub const PY_THREADS: u32 = 128;
/// [`RwPyProc::entry_kind`]: 3.11's `is_entry` flag, or 3.12+'s C-stack shim frames.
pub const PY_ENTRY_FLAG: u32 = 1;
pub const PY_ENTRY_SHIM: u32 = 2;
pub const PY_OWNED_BY_CSTACK: u32 = 3;
/// [`RwPyProc::cframe_frame`] when the thread state points at the frame itself (3.13+).
pub const PY_NO_CFRAME: u32 = u32::MAX;
/// Kinds of [`RwStackSample`].
pub const STACK_SAMPLE_PROFILE: u32 = 1;
pub const STACK_SAMPLE_SITE: u32 = 2;
pub const STACK_SAMPLE_JVM_ALLOC: u32 = 3;
/// A growth-site revocation ([`RwSiteRevoke`]), not a stack.
pub const STACK_SAMPLE_REVOKE: u32 = 4;
/// Growth-site charges that stay revocable (`RW_SITE_KEPT`).
pub const SITE_KEPT: usize = 128;
/// Bytes of growth per growth-site stack sample (`RW_SITE_SAMPLE_BYTES`).
pub const SITE_SAMPLE_BYTES: u64 = 256 * 1024;
/// Processes whose growth sites can be captured at once (`rw_control.site_pid`).
pub const MAX_SITE_CAPTURES: usize = 8;

/// Indexes of the `rw_stats` per-CPU counters.
pub mod stat {
    pub const SAMPLES: u32 = 0;
    pub const SAMPLES_LOST: u32 = 1;
    pub const PROC_MEM_FULL: u32 = 2;
    pub const TARGETS_FULL: u32 = 3;
    pub const ALLOC_PTRS_FULL: u32 = 4;
    /// A task found on a CPU (switched out, or running at a close) whose switch-in the
    /// sched_switch program never saw.
    pub const SWITCH_IN_UNSEEN: u32 = 5;
    /// A sample kept no stack: neither a stack copy sent to user space (the ring buffer
    /// full) nor a stack id (the stack map full, or a hash collision in it); or its counter
    /// could not be stored (the counter map full).
    pub const STACKS_LOST: u32 = 6;
    /// A tracked process's probe window in `rw_target_slots` was full: it lives in the
    /// `rw_target_procs` spill map.
    pub const TARGETS_SPILLED: u32 = 7;
    pub const COUNT: u32 = 8;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RwConfig {
    pub cpu_depth: u32,
    pub cpu_width_shift: u32,
    pub mem_depth: u32,
    pub mem_width_shift: u32,
    pub cgroup_v1_memory: u32,
    pub page_shift: u32,
}

/// 64-bit word indexes of `rw_control`, as user space reads and writes it through its
/// mmap: derived from the struct (checked against the C header), so named once.
pub mod control {
    use std::mem::offset_of;

    use super::RwControl;

    pub const EPOCH: usize = offset_of!(RwControl, epoch_word) / 8;
    pub const TARGETS: usize = offset_of!(RwControl, targets) / 8;
    pub const MIN_DELTA: usize = offset_of!(RwControl, sample_min_delta_pages) / 8;
    pub const MIN_INTERVAL: usize = offset_of!(RwControl, sample_min_interval_ns) / 8;
    pub const RING_COALESCE: usize = offset_of!(RwControl, ring_coalesce_ns) / 8;
    pub const SITE_PIDS: usize = offset_of!(RwControl, site_pids) / 8;
    /// The first of the `MAX_SITE_CAPTURES` tgid slots.
    pub const SITE_PID: usize = offset_of!(RwControl, site_pid) / 8;
    /// Words in the struct.
    pub const WORDS: usize = size_of::<RwControl>() / 8;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RwControl {
    pub epoch_word: u64,
    pub targets: u32,
    pub _pad0: u32,
    pub sample_min_delta_pages: u64,
    pub sample_min_interval_ns: u64,
    pub ring_coalesce_ns: u64,
    pub site_pids: u64,
    pub site_pid: [u64; MAX_SITE_CAPTURES],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RwOncpu {
    pub start_ns: u64,
    pub tgid: u32,
    pub pid: u32,
    pub target: u32,
    pub _pad0: u32,
    pub start_runtime: u64,
    pub clock_offset: i64,
    pub calib_epoch: u64,
    pub credited_ns: u64,
    /// A target's slice counts for it from here (a task on a CPU when it became a target).
    pub target_from_ns: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RwTargetProc {
    pub cpu_ns: u64,
    pub cgroup_id: u64,
    pub file_pages: u64,
    pub anon_pages: u64,
    pub swap_pages: u64,
    pub shmem_pages: u64,
    pub updated_ns: u64,
    pub exited: u32,
    pub _pad0: u32,
}

/// log2 of the slots of `rw_target_slots`, and how many a process may probe.
pub const TARGET_SLOTS_SHIFT: u32 = 14;
pub const TARGET_SLOTS: usize = 1 << TARGET_SLOTS_SHIFT;
pub const TARGET_PROBES: usize = 8;

/// The first slot a process may occupy in `rw_target_slots` (`target_home` in C).
pub fn target_home(tgid: u32) -> usize {
    (tgid.wrapping_mul(HASH_BASE) >> (32 - TARGET_SLOTS_SHIFT)) as usize
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RwTargetSlot {
    /// 0: free.
    pub tgid: u32,
    pub _pad0: u32,
    pub v: RwTargetProc,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RwProcMem {
    pub last_emit_pages: u64,
    pub last_emit_ns: u64,
    pub ring_head: u32,
    pub ring_count: u32,
    pub ring_mib: [u32; RING_LEN],
    pub ring_ds: [u32; RING_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RwMemSample {
    pub ts_ns: u64,
    pub cgroup_id: u64,
    pub file_pages: u64,
    pub anon_pages: u64,
    pub swap_pages: u64,
    pub shmem_pages: u64,
    pub tgid: u32,
    pub kind: u32,
    pub comm: [u8; 16],
    /// [`SAMPLE_OOM_KILL`] only: the memory cgroup whose limit was reached (0: the node's
    /// memory), and what the killer measured against, in pages.
    pub oom_cgroup_id: u64,
    pub oom_total_pages: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RwAllocKey {
    pub tgid: u32,
    pub _pad0: u32,
    pub ptr: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RwAllocPending {
    pub size: u64,
    pub old_ptr: u64,
    pub kind: u32,
    pub _pad0: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RwAllocStats {
    pub outstanding_bytes: i64,
    pub allocs: u64,
    pub frees: u64,
    pub unknown_frees: u64,
}

/// Key of a stack counter: a process, its user and kernel stack ids (< 0: none), and the
/// return address found on top of its user stack (0: none; see stacks.bpf.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RwStackKey {
    pub caller: u64,
    pub tgid: u32,
    pub user_stack: i32,
    pub kernel_stack: i32,
    pub _pad0: u32,
}

/// A stack sample for unwinding in user space (`struct rw_stack_sample`): read from the
/// ring buffer in place, so `stack` is the `STACK_COPY` bytes that follow the header.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RwStackSample {
    pub value: u64,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub caller: u64,
    pub tgid: u32,
    pub kind: u32,
    pub user_stack: i32,
    pub kernel_stack: i32,
    pub stack_len: u32,
    pub py_len: u32,
    /// A growth-site sample's number, for its revocation (0: none).
    pub seq: u32,
    pub _pad: u32,
    pub py_frames: [u64; PY_DEPTH],
    pub stack: [u8; STACK_COPY],
}

impl Default for RwStackSample {
    fn default() -> Self {
        Self {
            value: 0,
            ip: 0,
            sp: 0,
            bp: 0,
            caller: 0,
            tgid: 0,
            kind: 0,
            user_stack: -1,
            kernel_stack: -1,
            stack_len: 0,
            py_len: 0,
            seq: 0,
            _pad: 0,
            py_frames: [0; PY_DEPTH],
            stack: [0; STACK_COPY],
        }
    }
}

/// A CPython process whose frames the kernel walks per stack sample (`struct rw_py_proc`):
/// the address of its `_PyRuntime` and the offsets of what the walk reads.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RwPyProc {
    pub runtime: u64,
    pub interp_main: u32,
    pub threads_head: u32,
    pub tstate_next: u32,
    pub tstate_thread_id: u32,
    pub tstate_frame: u32,
    pub cframe_frame: u32,
    pub frame_code: u32,
    pub frame_previous: u32,
    pub frame_entry: u32,
    pub entry_kind: u32,
}

/// One charge of a growth-site capture (`struct rw_site_charge`): resident pages
/// `(top - count, top]` charged to sample `seq` when the level reached `next`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RwSiteCharge {
    pub seq: u32,
    pub top: u32,
    pub count: u32,
    pub next: u32,
}

/// A growth-site capture's state (`struct rw_site_state`, whose comment says how growth
/// is charged and revoked). All zero starts a capture: the kernel sets the levels from
/// the process's first event.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RwSiteState {
    pub mark: u64,
    pub next: u64,
    pub floor: u64,
    pub alloc_pending: u64,
    pub seq: u32,
    pub bottom: u32,
    pub depth: u32,
    pub started: u32,
    pub exact: u32,
    pub _pad: u32,
    pub unfolded: i64,
    pub kept: [RwSiteCharge; SITE_KEPT],
}

/// One CPU's unfolded counter deltas of a captured process (`struct rw_site_deltas`, in
/// `rw_site_deltas`, a per-CPU hash the agent fills with zeros at a capture's start).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RwSiteDeltas {
    pub d: [i32; 4],
}

impl Default for RwSiteState {
    fn default() -> Self {
        Self {
            mark: 0,
            next: 0,
            floor: 0,
            alloc_pending: 0,
            seq: 0,
            bottom: 0,
            depth: 0,
            started: 0,
            exact: 0,
            _pad: 0,
            unfolded: 0,
            kept: [RwSiteCharge::default(); SITE_KEPT],
        }
    }
}

/// A growth-site revocation (`struct rw_site_revoke`, kind [`STACK_SAMPLE_REVOKE`] in the
/// stack-sample ring): `bytes` of sample `seq` of `tgid` were given back.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RwSiteRevoke {
    pub bytes: u64,
    pub tgid: u32,
    pub kind: u32,
    pub seq: u32,
    pub _pad: u32,
}

// SAFETY: all of these are repr(C) plain-old-data with explicit padding fields, so every
// bit pattern is valid and no byte is uninitialised.
unsafe impl aya::Pod for RwConfig {}
unsafe impl aya::Pod for RwControl {}
unsafe impl aya::Pod for RwOncpu {}
unsafe impl aya::Pod for RwTargetProc {}
unsafe impl aya::Pod for RwTargetSlot {}
unsafe impl aya::Pod for RwProcMem {}
unsafe impl aya::Pod for RwMemSample {}
unsafe impl aya::Pod for RwAllocKey {}
unsafe impl aya::Pod for RwAllocPending {}
unsafe impl aya::Pod for RwAllocStats {}
unsafe impl aya::Pod for RwStackKey {}
unsafe impl aya::Pod for RwSiteState {}
unsafe impl aya::Pod for RwSiteCharge {}
unsafe impl aya::Pod for RwSiteRevoke {}
unsafe impl aya::Pod for RwSiteDeltas {}
unsafe impl aya::Pod for RwPyProc {}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, mem::offset_of};

    use super::*;

    /// (name, size, offset) for every struct and field, as Rust lays them out.
    macro_rules! layout {
        ($($cname:literal => $ty:ty { $($field:ident),* $(,)? }),* $(,)?) => {{
            let mut m = BTreeMap::new();
            $(
                m.insert($cname.to_owned(), (size_of::<$ty>(), 0usize));
                $(
                    let probe = <$ty>::default();
                    m.insert(
                        format!("{}.{}", $cname, stringify!($field)),
                        (size_of_val(&probe.$field), offset_of!($ty, $field)),
                    );
                )*
            )*
            m
        }};
    }

    #[test]
    fn rust_mirror_matches_the_c_header() {
        let rust = layout! {
            "rw_config" => RwConfig { cpu_depth, cpu_width_shift, mem_depth, mem_width_shift, cgroup_v1_memory, page_shift },
            "rw_control" => RwControl { epoch_word, targets, _pad0, sample_min_delta_pages, sample_min_interval_ns, ring_coalesce_ns, site_pids, site_pid },
            "rw_oncpu" => RwOncpu { start_ns, tgid, pid, target, _pad0, start_runtime, clock_offset, calib_epoch, credited_ns, target_from_ns },
            "rw_target_proc" => RwTargetProc { cpu_ns, cgroup_id, file_pages, anon_pages, swap_pages, shmem_pages, updated_ns, exited, _pad0 },
            "rw_target_slot" => RwTargetSlot { tgid, _pad0, v },
            "rw_proc_mem" => RwProcMem { last_emit_pages, last_emit_ns, ring_head, ring_count, ring_mib, ring_ds },
            "rw_mem_sample" => RwMemSample { ts_ns, cgroup_id, file_pages, anon_pages, swap_pages, shmem_pages, tgid, kind, comm, oom_cgroup_id, oom_total_pages },
            "rw_alloc_key" => RwAllocKey { tgid, _pad0, ptr },
            "rw_alloc_pending" => RwAllocPending { size, old_ptr, kind, _pad0 },
            "rw_alloc_stats" => RwAllocStats { outstanding_bytes, allocs, frees, unknown_frees },
            "rw_stack_key" => RwStackKey { caller, tgid, user_stack, kernel_stack, _pad0 },
            "rw_stack_sample" => RwStackSample {
                value, ip, sp, bp, caller, tgid, kind, user_stack, kernel_stack, stack_len, py_len,
                seq, _pad, py_frames, stack,
            },
            "rw_site_charge" => RwSiteCharge { seq, top, count, next },
            "rw_site_state" => RwSiteState { mark, next, floor, alloc_pending, seq, bottom, depth, started, exact, _pad, unfolded, kept },
            "rw_site_revoke" => RwSiteRevoke { bytes, tgid, kind, seq, _pad },
            "rw_site_deltas" => RwSiteDeltas { d },
            "rw_py_proc" => RwPyProc {
                runtime, interp_main, threads_head, tstate_next, tstate_thread_id, tstate_frame,
                cframe_frame, frame_code, frame_previous, frame_entry, entry_kind,
            },
        };
        let c: BTreeMap<String, (usize, usize)> = probe()
            .lines()
            .filter(|l| !l.starts_with("const "))
            .map(|l| {
                let mut it = l.split_whitespace();
                let name = it.next().expect("name").to_owned();
                let size = it.next().and_then(|s| s.parse().ok()).expect("size");
                let off = it.next().and_then(|s| s.parse().ok()).expect("offset");
                (name, (size, off))
            })
            .collect();
        assert!(c.len() > 40, "layout probe saw too few fields: {c:?}");
        assert_eq!(
            rust, c,
            "ebpf/src/shared.rs and include/resourcewatch.h disagree"
        );
    }

    fn probe() -> &'static str {
        include_str!(concat!(env!("OUT_DIR"), "/layout.txt"))
    }

    #[test]
    fn rust_constants_match_the_c_header() {
        let rust: BTreeMap<&str, u64> = [
            ("RW_KEY_BITS", u64::from(KEY_BITS)),
            ("RW_VALUE_BITS", u64::from(VALUE_BITS)),
            ("RW_VALUE_MASK", VALUE_MASK),
            ("RW_MAX_DEPTH", u64::from(MAX_DEPTH)),
            ("RW_MAX_WIDTH_SHIFT", u64::from(MAX_WIDTH_SHIFT)),
            ("RW_TARGET_PIDS", u64::from(TARGET_PIDS)),
            ("RW_TARGET_CGROUPS", u64::from(TARGET_CGROUPS)),
            ("RW_ALLOC_HEAP", u64::from(ALLOC_HEAP)),
            ("RW_ALLOC_MMAP", u64::from(ALLOC_MMAP)),
            ("RW_SAMPLE_RSS", u64::from(SAMPLE_RSS)),
            ("RW_SAMPLE_EXIT", u64::from(SAMPLE_EXIT)),
            ("RW_SAMPLE_OOM_KILL", u64::from(SAMPLE_OOM_KILL)),
            ("RW_RING_LEN", RING_LEN as u64),
            ("RW_HASH_BASE", u64::from(HASH_BASE)),
            ("RW_HASH_STEP", u64::from(HASH_STEP)),
            ("RW_STAT_SAMPLES", u64::from(stat::SAMPLES)),
            ("RW_STAT_SAMPLES_LOST", u64::from(stat::SAMPLES_LOST)),
            ("RW_STAT_PROC_MEM_FULL", u64::from(stat::PROC_MEM_FULL)),
            ("RW_STAT_TARGETS_FULL", u64::from(stat::TARGETS_FULL)),
            ("RW_STAT_TARGETS_SPILLED", u64::from(stat::TARGETS_SPILLED)),
            ("RW_TARGET_SLOTS_SHIFT", u64::from(TARGET_SLOTS_SHIFT)),
            ("RW_TARGET_PROBES", TARGET_PROBES as u64),
            ("RW_STAT_ALLOC_PTRS_FULL", u64::from(stat::ALLOC_PTRS_FULL)),
            (
                "RW_STAT_SWITCH_IN_UNSEEN",
                u64::from(stat::SWITCH_IN_UNSEEN),
            ),
            ("RW_STAT_STACKS_LOST", u64::from(stat::STACKS_LOST)),
            ("RW_STAT_MAX", u64::from(stat::COUNT)),
            ("RW_STACK_DEPTH", STACK_DEPTH as u64),
            ("RW_MAX_SITE_CAPTURES", MAX_SITE_CAPTURES as u64),
            ("RW_STACK_COPY", STACK_COPY as u64),
            ("RW_STACK_SAMPLE_PROFILE", u64::from(STACK_SAMPLE_PROFILE)),
            ("RW_STACK_SAMPLE_SITE", u64::from(STACK_SAMPLE_SITE)),
            (
                "RW_STACK_SAMPLE_JVM_ALLOC",
                u64::from(STACK_SAMPLE_JVM_ALLOC),
            ),
            ("RW_SITE_SAMPLE_BYTES", SITE_SAMPLE_BYTES),
            ("RW_STACK_SAMPLE_REVOKE", u64::from(STACK_SAMPLE_REVOKE)),
            ("RW_SITE_KEPT", SITE_KEPT as u64),
            ("RW_PY_DEPTH", PY_DEPTH as u64),
            ("RW_PY_ENTRY", PY_ENTRY),
            ("RW_PY_THREADS", u64::from(PY_THREADS)),
            ("RW_PY_ENTRY_FLAG", u64::from(PY_ENTRY_FLAG)),
            ("RW_PY_ENTRY_SHIM", u64::from(PY_ENTRY_SHIM)),
            ("RW_PY_OWNED_BY_CSTACK", u64::from(PY_OWNED_BY_CSTACK)),
            ("RW_PY_NO_CFRAME", u64::from(PY_NO_CFRAME)),
        ]
        .into_iter()
        .collect();
        let c: BTreeMap<&str, u64> = probe()
            .lines()
            .filter_map(|l| l.strip_prefix("const "))
            .filter_map(|l| {
                let (name, value) = l.split_once(' ')?;
                Some((name, value.trim().parse().ok()?))
            })
            .collect();
        assert!(c.len() >= 21, "the probe saw too few constants: {c:?}");
        assert_eq!(
            rust, c,
            "ebpf/src/shared.rs and include/resourcewatch.h disagree on a constant"
        );
    }

    #[test]
    fn control_words_are_the_struct_fields() {
        assert_eq!(
            [
                control::EPOCH,
                control::TARGETS,
                control::MIN_DELTA,
                control::MIN_INTERVAL,
                control::RING_COALESCE,
                control::SITE_PIDS,
                control::SITE_PID,
                control::WORDS
            ],
            [0, 1, 2, 3, 4, 5, 6, 14]
        );
    }

    #[test]
    fn oncpu_fills_a_cache_line() {
        assert_eq!(size_of::<RwOncpu>(), 64);
    }

    #[test]
    fn object_is_embedded() {
        assert_eq!(&crate::OBJECT[..4], b"\x7fELF");
    }
}
