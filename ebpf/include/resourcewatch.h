/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Every type shared between the kernel programs and user space. The Rust mirror lives in
 * ebpf/src/shared.rs and a test there checks that sizes and offsets match this file
 * (through the BTF that clang emits into the object), so change both together.
 */
#ifndef RESOURCEWATCH_H
#define RESOURCEWATCH_H

#include <linux/types.h>

/*
 * HashPipe slots are one 64-bit word: (tgid << RW_VALUE_BITS) | value. One word means a
 * slot is replaced, kicked or incremented with a single atomic instruction, so two CPUs
 * can never leave a slot with one task's key and another's value. PID_MAX_LIMIT is 2^22
 * on 64-bit kernels, which leaves 42 bits for the value: CPU nanoseconds per epoch (73 min
 * of CPU time, far above any interval times core count we accept) or resident pages
 * (16 EiB).
 */
#define RW_KEY_BITS 22
#define RW_VALUE_BITS 42
#define RW_VALUE_MASK ((1ULL << RW_VALUE_BITS) - 1)

/* Compile-time ceilings; the actual depth and width are chosen at load time. */
#define RW_MAX_DEPTH 8
#define RW_MAX_WIDTH_SHIFT 16

/* rw_control.targets bits: which exact-tracking maps hold entries. */
#define RW_TARGET_PIDS 1u
#define RW_TARGET_CGROUPS 2u

/* rw_alloc_pending.kind */
#define RW_ALLOC_HEAP 1u
#define RW_ALLOC_MMAP 2u

/* rw_mem_sample.kind */
#define RW_SAMPLE_RSS 1u
#define RW_SAMPLE_EXIT 2u
#define RW_SAMPLE_OOM_KILL 3u /* the kernel's OOM killer chose this process (mem.bpf.h) */

/* HashPipe stage multipliers: stage s hashes with RW_HASH_BASE + s * RW_HASH_STEP (odd). */
#define RW_HASH_BASE 0x9E3779B1u
#define RW_HASH_STEP 0x6A09E668u /* even, so every multiplier stays odd */

/* Indexes of the rw_stats per-CPU counters (the agent's health report). */
#define RW_STAT_SAMPLES 0
#define RW_STAT_SAMPLES_LOST 1       /* ring buffer full */
#define RW_STAT_PROC_MEM_FULL 2      /* rw_proc_mem insert failed: no sample for that event */
#define RW_STAT_TARGETS_FULL 3       /* rw_target_procs full: a target is not tracked */
#define RW_STAT_ALLOC_PTRS_FULL 4
#define RW_STAT_SWITCH_IN_UNSEEN 5   /* a task found on a CPU whose switch-in never fired */
#define RW_STAT_STACKS_LOST 6        /* a sample kept no stack (no stack copy sent, no stack id), or its counter could not be stored (map full) */
#define RW_STAT_TARGETS_SPILLED 7    /* a target's probe window was full: kept in rw_target_procs */
#define RW_STAT_MAX 8

/* Load-time configuration, a read-only global: the verifier sees its fields as constants. */
struct rw_config {
	__u32 cpu_depth;       /* HashPipe stages of the CPU sketch, 1..RW_MAX_DEPTH */
	__u32 cpu_width_shift; /* log2 of slots per stage, 1..RW_MAX_WIDTH_SHIFT */
	__u32 mem_depth;
	__u32 mem_width_shift;
	__u32 cgroup_v1_memory; /* 1: cgroup ids from the v1 memory controller; 0: from v2 */
	__u32 page_shift;       /* log2 of the page size */
};

/* The one-entry control array, mmapped and written by user space while programs run. */
/* Processes whose growth sites can be captured at once (rw_control.site_pid). */
#define RW_MAX_SITE_CAPTURES 8

struct rw_control {
	/*
	 * Bit 0: the CPU-sketch half being filled. Bits 63..1: when that epoch started
	 * (CLOCK_MONOTONIC ns, bit 0 cleared). One word so a program never pairs one epoch's
	 * half with another's start time.
	 */
	__u64 epoch_word;
	__u32 targets;                /* RW_TARGET_* */
	__u32 _pad0;
	__u64 sample_min_delta_pages; /* emit a memory sample once RSS moved this much */
	__u64 sample_min_interval_ns; /* ... and at most this often per process */
	__u64 ring_coalesce_ns;       /* minimum spacing of kernel ring entries */
	__u64 site_pids;              /* processes whose growth sites are captured (rw_site_pids) */
	/*
	 * Their tgids (0: a free slot). rss_stat compares these before any map lookup: a
	 * lookup in rw_site_pids on every event cost every other process 22 ns while a
	 * capture ran (BENCHMARKS.md); eight compares of one cache line cost next to nothing.
	 */
	__u64 site_pid[RW_MAX_SITE_CAPTURES];
};

/*
 * What each CPU is running, indexed by CPU id. Written at every switch-in; user space reads
 * it to count the time of tasks still on a CPU when an epoch closes. 64 bytes so that two
 * CPUs never write one cache line.
 */
struct rw_oncpu {
	__u64 start_ns;      /* switch-in time, CLOCK_MONOTONIC */
	__u32 tgid;
	__u32 pid;
	__u32 target;        /* 1 if the task is exactly tracked */
	__u32 _pad0;
	__u64 start_runtime; /* the task's se.sum_exec_runtime at switch-in */
	__s64 clock_offset;  /* CLOCK_MONOTONIC minus the scheduler's task clock, on this CPU */
	__u64 calib_epoch;   /* epoch_word when clock_offset was measured */
	__u64 credited_ns;   /* the running part up to here was credited by rw_cpu_sync */
	__u64 target_from_ns; /* a target's slice counts for it from here (>= start_ns) */
};

/* Exact, never-evicted values of a targeted process (hash map keyed by tgid). */
struct rw_target_proc {
	__u64 cpu_ns;      /* cumulative on-CPU time since tracking began */
	__u64 cgroup_id;
	__u64 file_pages;
	__u64 anon_pages;
	__u64 swap_pages;
	__u64 shmem_pages;
	__u64 updated_ns;
	__u32 exited;
	__u32 _pad0;
};

/*
 * The exactly tracked processes live in an open-addressed table in a BPF_F_MMAPABLE array
 * (rw_target_slots), so user space reads all of them from memory instead of walking a
 * hash map's buckets through syscalls (the batched walk of 16,384 buckets was 17 % of the
 * agent's time at 5,000 tracked processes and 100 ms). A process hashes to
 * (tgid * RW_HASH_BASE) >> (32 - RW_TARGET_SLOTS_SHIFT) and occupies the first free slot of
 * the RW_TARGET_PROBES that follow (wrapping); a process whose window is full spills into
 * the rw_target_procs hash map, so nothing is lost.
 */
#define RW_TARGET_SLOTS_SHIFT 14
#define RW_TARGET_PROBES 8

struct rw_target_slot {
	__u32 tgid;  /* 0: free; claimed by compare-and-swap; ~0u: retired by user space, freed later */
	__u32 _pad0;
	struct rw_target_proc v;
};

/* Samples kept per process in the kernel ring (a power of two). */
#define RW_RING_LEN 16

/*
 * Per-process state of the memory sample stream (LRU hash keyed by tgid): the filter that
 * decides when a sample is streamed, and a ring of the last RW_RING_LEN samples at MiB
 * resolution. Ring entries are at least rw_control.ring_coalesce_ns apart: a sample
 * closer than that to the newest entry replaces its value (keeping its time), so a burst
 * takes one slot and 16 slots span minutes to hours. User space reads the ring on demand
 * (a process that becomes a target has its recent history at once); the long history and
 * the regression live in user space (node-agent/src/leak), where floating point is.
 */
struct rw_proc_mem {
	__u64 last_emit_pages;
	__u64 last_emit_ns;
	__u32 ring_head;  /* next slot to write */
	__u32 ring_count; /* valid entries, up to RW_RING_LEN */
	__u32 ring_mib[RW_RING_LEN];
	__u32 ring_ds[RW_RING_LEN]; /* CLOCK_MONOTONIC in deciseconds */
};

/* One record of the memory sample ring buffer. */
struct rw_mem_sample {
	__u64 ts_ns;
	__u64 cgroup_id;
	__u64 file_pages;
	__u64 anon_pages;
	__u64 swap_pages;
	__u64 shmem_pages;
	__u32 tgid;
	__u32 kind; /* RW_SAMPLE_* */
	char comm[16];
	/* RW_SAMPLE_OOM_KILL only (0 otherwise): the id of the memory cgroup whose limit was
	 * reached, 0 for a system-wide OOM; and what the killer measured against (the
	 * cgroup's limit, or the node's RAM + swap), in pages. */
	__u64 oom_cgroup_id;
	__u64 oom_total_pages;
};

/* Allocation mode: key of the pointer -> size map. */
struct rw_alloc_key {
	__u32 tgid;
	__u32 _pad0;
	__u64 ptr;
};

/* Allocation mode: what an entry probe leaves for its return probe (keyed by pid_tgid). */
struct rw_alloc_pending {
	__u64 size;
	__u64 old_ptr; /* realloc: the pointer being resized */
	__u32 kind;    /* RW_ALLOC_* */
	__u32 _pad0;
};

/* Allocation mode: per-process totals (hash map keyed by tgid). */
struct rw_alloc_stats {
	__s64 outstanding_bytes;
	__u64 allocs;
	__u64 frees;
	__u64 unknown_frees; /* frees of pointers allocated before tracking began */
};

/* Frames kept per captured stack: the stack maps' values are this many addresses. */
#define RW_STACK_DEPTH 64

/*
 * Key of a stack counter (CPU samples of a profile, or bytes of resident growth): one
 * process, one user and one kernel stack (ids in the stack map; < 0 when none was taken).
 * `caller` is the return address on top of the user stack, when it follows a call
 * instruction: the caller of a leaf function that keeps no frame pointer, which the
 * kernel's frame-pointer walk skips (stacks.bpf.h); 0 otherwise.
 */
struct rw_stack_key {
	__u64 caller;
	__u32 tgid;
	__s32 user_stack;
	__s32 kernel_stack;
	__u32 _pad0;
};

/*
 * Bytes of user stack copied per stack sample, for unwinding in user space with the
 * binaries' .eh_frame (stacks.bpf.h): perf's `--call-graph dwarf` copies 8 KiB by
 * default; 16 KiB reaches main in the native part of deeper stacks, and what lies past
 * the window is taken from the frame-pointer walk taken beside it.
 */
#define RW_STACK_COPY 16384

/*
 * CPython frames kept per stack sample (python.bpf.h walks the interpreter's own frame
 * list, as py-spy and Pyroscope's pyperf do): each is the address of the frame's code
 * object, with RW_PY_ENTRY set on the outermost frame that one C call of the evaluation
 * loop (_PyEval_EvalFrameDefault) runs, so user space can put each run of Python frames
 * where its C frame is in the native stack.
 */
#define RW_PY_DEPTH 64
#define RW_PY_ENTRY 1
/* Threads of a Python process looked at for the sampled one. */
#define RW_PY_THREADS 128
/* How a version marks where one C call of the evaluation loop starts: a bool in the
 * frame (3.11's is_entry), or a shim frame the C stack owns (3.12+: owner == 3). */
#define RW_PY_ENTRY_FLAG 1
#define RW_PY_ENTRY_SHIM 2
#define RW_PY_OWNED_BY_CSTACK 3
/* rw_py_proc.cframe_frame when the thread state points at the frame itself (3.13+). */
#define RW_PY_NO_CFRAME 0xffffffff

/*
 * A CPython process whose frames are walked per stack sample (rw_py_procs, by tgid):
 * where its _PyRuntime is, and the offsets of the fields the walk reads, one set per
 * minor version (node-agent/src/stacks/python.rs, checked against CPython's headers).
 */
struct rw_py_proc {
	__u64 runtime;
	__u32 interp_main;      /* _PyRuntimeState.interpreters.main */
	__u32 threads_head;     /* PyInterpreterState.threads.head */
	__u32 tstate_next;      /* PyThreadState.next */
	__u32 tstate_thread_id; /* PyThreadState.thread_id: pthread_self(), the fs base */
	__u32 tstate_frame;     /* PyThreadState.cframe (3.11, 3.12) or .current_frame */
	__u32 cframe_frame;     /* _PyCFrame.current_frame, or RW_PY_NO_CFRAME */
	__u32 frame_code;       /* _PyInterpreterFrame.f_code (.f_executable in 3.13) */
	__u32 frame_previous;   /* _PyInterpreterFrame.previous */
	__u32 frame_entry;      /* .is_entry (3.11) or .owner (3.12+) */
	__u32 entry_kind;       /* RW_PY_ENTRY_FLAG or RW_PY_ENTRY_SHIM */
};

/* Kinds of rw_stack_sample. */
#define RW_STACK_SAMPLE_PROFILE 1
#define RW_STACK_SAMPLE_SITE 2
#define RW_STACK_SAMPLE_JVM_ALLOC 3
#define RW_STACK_SAMPLE_REVOKE 4

/*
 * One stack sample of a captured process, for unwinding in user space: the registers a
 * CFI walk starts from, the frame-pointer walk's stack ids (as in rw_stack_key), the
 * figure (1 CPU sample, or bytes of growth), `caller` as in rw_stack_key (for binaries
 * with neither tables nor frame pointers in their leaves), the `py_len` CPython frames of
 * the sampled thread (0 for other processes) and `stack_len` bytes copied from `sp` up.
 */
struct rw_stack_sample {
	__u64 value;
	__u64 ip;
	__u64 sp;
	__u64 bp;
	__u64 caller;
	__u32 tgid;
	__u32 kind;
	__s32 user_stack;
	__s32 kernel_stack;
	__u32 stack_len;
	__u32 py_len;
	__u32 seq; /* a growth-site sample's number, for its revocation (0: none) */
	__u32 _pad;
	__u64 py_frames[RW_PY_DEPTH];
	__u8 stack[RW_STACK_COPY];
};

/* How many charges of a growth-site capture stay revocable (see rw_site_state). */
#define RW_SITE_KEPT 128

/* One charge of resident growth: the pages (top - count, top] of the resident level,
 * charged to sample `seq` (0: to no stack, the growth came from outside the process) when
 * the level reached `next` (at or below `top`: the kernel may tell the level in steps). */
struct rw_site_charge {
	__u32 seq;
	__u32 top;
	__u32 count;
	__u32 next;
};

/*
 * A growth-site capture's state per process (rw_site_pids), in pages of the process's
 * resident level. `mark` is where the last charge ends and `next` the level at which the
 * next is taken, a random gap above it (1 to 2 x RW_SITE_SAMPLE_BYTES, a sample per
 * RW_SITE_SAMPLE_BYTES on average). The event whose level reaches `next` charges the
 * pages (mark, level] to its stack; they stay charged while the level stays at or above
 * that top. A charge whose top the level falls below is revoked whole (a record of kind
 * RW_STACK_SAMPLE_REVOKE to user space), and the `next` it reached is `next` again:
 * memory given back soon after it was taken was a transient's. The
 * charges still revocable are a stack (kept[], a ring of RW_SITE_KEPT from `bottom`,
 * covering (floor, mark] in order); one pushed out at the bottom stays for good and
 * raises `floor`, below which nothing is charged again. `started` is 0 until the
 * process's first event, which sets the levels and reads every CPU's counter deltas. `alloc_pending` is a JVM's heap
 * allocation not yet charged (its allocation probes, stacks.bpf.h).
 */
struct rw_site_state {
	__u64 mark;
	__u64 next;
	__u64 floor;
	__u64 alloc_pending;
	__u32 seq;
	__u32 bottom;
	__u32 depth;
	__u32 started;
	__u32 exact;     /* 1 while `unfolded` is kept (stacks.bpf.h, resident_exact) */
	__u32 _pad;
	__s64 unfolded;  /* every CPU's deltas not yet in the counters, summed */
	struct rw_site_charge kept[RW_SITE_KEPT];
};

/* One CPU's unfolded deltas of a captured process's resident counters (file, anon,
 * shmem; the fourth unused) as last read: the per-CPU hash rw_site_deltas. */
struct rw_site_deltas {
	__s32 d[4];
};

/* What a revoke record says: `bytes` of sample `seq` of process `tgid` were given back
 * (same first fields as rw_stack_sample, told apart by kind). */
struct rw_site_revoke {
	__u64 bytes;
	__u32 tgid;
	__u32 kind;
	__u32 seq;
	__u32 _pad;
};

/* Bytes of growth per stack sample of a growth-site capture (a sample is charged with
 * what accumulated since the previous one: sampling weighted by bytes, as heap profilers
 * sample allocations). */
#define RW_SITE_SAMPLE_BYTES (256 * 1024)

#endif
