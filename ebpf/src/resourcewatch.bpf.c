// SPDX-License-Identifier: GPL-2.0-only
/*
 * resourcewatch kernel pipelines:
 *   - CPU: on-CPU time per process from sched_switch into an epoch-double-buffered HashPipe;
 *   - memory: exact per-process RSS from rss_stat into a HashPipe of current RSS, plus a
 *     ring-buffer stream of samples when a process's RSS moved;
 *   - exact tracking of targeted PIDs / cgroups beside the sketches;
 *   - allocation mode: libc uprobes, a pointer -> size map, outstanding bytes per process.
 *
 * All programs are tp_btf (BTF-typed raw tracepoints): arguments are read with plain loads
 * instead of bpf_probe_read calls, and no perf record is built for the event. That is what
 * keeps the per-event cost low (see node-agent/BENCHMARKS.md).
 */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "kernel.h"
#include "resourcewatch.h"

char LICENSE[] SEC("license") = "GPL";

/* Set by the loader before the verifier runs (EbpfLoader::set_global); read-only after. */
const volatile struct rw_config rw_config = {
	.cpu_depth = 4,
	.cpu_width_shift = 10,
	.mem_depth = 4,
	.mem_width_shift = 10,
	.cgroup_v1_memory = 0,
	.page_shift = 12,
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct rw_control);
} rw_control SEC(".maps");

/* Two halves (epochs) of cpu_depth x 2^cpu_width_shift words; resized by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * 4 * 1024);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
} rw_cpu_sketch SEC(".maps");

/* mem_depth x 2^mem_width_shift words of (tgid, resident pages); resized by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4 * 1024);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
} rw_mem_sketch SEC(".maps");

/* Indexed by CPU id; resized by the loader to the number of possible CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct rw_oncpu);
} rw_oncpu SEC(".maps");

/*
 * Preallocated maps are charged in full whatever they hold, so their sizes are what a node
 * needs: a few hundred targeted containers, a few thousand of their processes.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u8);
} rw_target_pids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 512);
	__type(key, __u64);
	__type(value, __u8);
} rw_target_cgroups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2048);
	__type(key, __u32);
	__type(value, struct rw_target_proc);
} rw_target_procs SEC(".maps");

/*
 * The sample filter's state is a cache: LRU, so a node with more memory-active processes
 * than entries evicts the idlest, whose next event simply starts a fresh state (and emits
 * a sample) instead of being refused.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct rw_proc_mem);
} rw_proc_mem SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} rw_samples SEC(".maps");

/* One zeroed rw_proc_mem per CPU, to build a new entry off the stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rw_proc_mem);
} rw_scratch SEC(".maps");

/* Counters for the agent's health report; indexes are RW_STAT_*. */
enum {
	RW_STAT_SAMPLES = 0,
	RW_STAT_SAMPLES_LOST = 1,   /* ring buffer full */
	RW_STAT_PROC_MEM_FULL = 2,  /* rw_proc_mem insert failed: no sample for that event */
	RW_STAT_TARGETS_FULL = 3,   /* rw_target_procs full: a target is not tracked */
	RW_STAT_ALLOC_PTRS_FULL = 4,
	RW_STAT_SWITCH_IN_UNSEEN = 5, /* a task found on a CPU whose switch-in never fired */
	RW_STAT_MAX = 8,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RW_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} rw_stats SEC(".maps");

/* Allocation mode maps; the loader shrinks them to one entry when the mode is off. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct rw_alloc_pending);
} rw_alloc_pending SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct rw_alloc_key);
	__type(value, __u64);
} rw_alloc_ptrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct rw_alloc_stats);
} rw_alloc_stats SEC(".maps");

static __always_inline void stat_inc(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&rw_stats, &idx);
	if (v)
		*v += 1;
}

/* ---- HashPipe ------------------------------------------------------------------------ */

#define KEY_OF(w) ((__u32)((w) >> RW_VALUE_BITS))
#define VAL_OF(w) ((w) & RW_VALUE_MASK)
#define PACK(k, v) (((__u64)(k) << RW_VALUE_BITS) | ((v) & RW_VALUE_MASK))

/*
 * Stage s hashes with its own odd multiplier (Fibonacci hashing): consecutive PIDs, the
 * common case, spread over the whole stage, and the stages are independent. Multipliers
 * are computed rather than tabled so the program needs no extra read-only section. The
 * user-space model (node-agent/src/hashpipe.rs) uses the same formula; keep them equal.
 */
#define RW_HASH_BASE 0x9E3779B1u
#define RW_HASH_STEP 0x6A09E668u /* even, so every multiplier stays odd */

static __always_inline __u32 hp_index(__u32 stage, __u32 key, __u32 shift)
{
	__u32 h = key * (RW_HASH_BASE + stage * RW_HASH_STEP);
	return h >> (32 - shift);
}

/*
 * Pushes (key, val) through the stages of one sketch copy starting at slot `base`. Stage 0
 * always inserts and kicks its occupant on; later stages keep the larger of occupant and
 * carried entry and pass the smaller on; what falls off the last stage is dropped (it is
 * the smallest seen on that path). With `add_on_match`, a stage already holding the key
 * adds to it (CPU time is a sum); without, the caller has already looked for the key.
 */
static __always_inline void hp_push(void *map, __u32 base, __u32 depth, __u32 shift, __u32 key, __u64 val,
				    bool add_on_match)
{
	const __u32 width = 1u << shift;
	__u32 ckey = key;
	__u64 cval = val;

#pragma clang loop unroll(disable)
	for (__u32 s = 0; s < RW_MAX_DEPTH; s++) {
		if (s >= depth)
			break;
		__u32 idx = base + s * width + hp_index(s, ckey, shift);
		__u64 *slot = bpf_map_lookup_elem(map, &idx);
		if (!slot)
			return;
		__u64 w = *slot;
		if (add_on_match && KEY_OF(w) == ckey) {
			__sync_fetch_and_add(slot, cval);
			return;
		}
		if (s == 0) {
			__u64 old = __sync_lock_test_and_set(slot, PACK(ckey, cval));
			if (old == 0)
				return;
			ckey = KEY_OF(old);
			cval = VAL_OF(old);
			continue;
		}
		if (w == 0) {
			if (__sync_val_compare_and_swap(slot, 0, PACK(ckey, cval)) == 0)
				return;
			continue;
		}
		if (VAL_OF(w) < cval &&
		    __sync_val_compare_and_swap(slot, w, PACK(ckey, cval)) == w) {
			ckey = KEY_OF(w);
			cval = VAL_OF(w);
		}
	}
}

/* Add delta to key in the CPU sketch half `half`; a key may sit in several stages, and
 * readers sum them. */
static __always_inline void cpu_sketch_add(__u32 half, __u32 key, __u64 delta)
{
	const __u32 depth = rw_config.cpu_depth;
	const __u32 shift = rw_config.cpu_width_shift;
	hp_push(&rw_cpu_sketch, (half * depth) << shift, depth, shift, key, delta, 1);
}

/*
 * Set key's current resident pages in the memory sketch; returns the previous value, or
 * -1 if key was not in the sketch. RSS is a level, not a sum, so the key is looked for in
 * every stage first: updating it in place keeps one copy per key, and a copy's value is
 * never stale because every RSS change fires rss_stat. A value of 0 (process exiting)
 * removes the key.
 */
static __always_inline __s64 mem_sketch_set(__u32 key, __u64 pages)
{
	const __u32 depth = rw_config.mem_depth;
	const __u32 shift = rw_config.mem_width_shift;
	const __u32 width = 1u << shift;

#pragma clang loop unroll(disable)
	for (__u32 s = 0; s < RW_MAX_DEPTH; s++) {
		if (s >= depth)
			break;
		__u32 idx = s * width + hp_index(s, key, shift);
		__u64 *slot = bpf_map_lookup_elem(&rw_mem_sketch, &idx);
		if (!slot)
			return -1;
		__u64 w = *slot;
		if (KEY_OF(w) == key) {
			if (pages == 0)
				__sync_val_compare_and_swap(slot, w, 0);
			else
				*slot = PACK(key, pages);
			return VAL_OF(w);
		}
	}
	if (pages != 0)
		hp_push(&rw_mem_sketch, 0, depth, shift, key, pages, 0);
	return -1;
}

/* ---- cgroups and targets ---------------------------------------------------------------- */

/*
 * The id of the cgroup a task belongs to in the hierarchy user space resolves paths in:
 * the v2 hierarchy on unified hosts, the v1 memory controller's on v1 and hybrid hosts (on
 * those, container runtimes leave the unified hierarchy unused). Equal to the inode number
 * of the cgroup's directory.
 */
static __always_inline __u64 task_cgroup_id(struct task_struct *task)
{
	struct css_set *cset = task->cgroups;
	if (!cset)
		return 0;
	if (!rw_config.cgroup_v1_memory) {
		struct cgroup *cgrp = cset->dfl_cgrp;
		if (!cgrp || !cgrp->kn)
			return 0;
		return cgrp->kn->id;
	}
	/* subsys[memory_cgrp_id]: the index is a load-time constant (CO-RE enum value), but a
	 * CO-RE field access needs a compile-time one, so compute the address and probe-read. */
	struct cgroup_subsys_state *css = 0;
	__u32 off = bpf_core_field_offset(struct css_set, subsys) +
		    bpf_core_enum_value(enum cgroup_subsys_id, memory_cgrp_id) * sizeof(void *);
	if (bpf_probe_read_kernel(&css, sizeof(css), (void *)cset + off) || !css)
		return 0;
	return BPF_CORE_READ(css, cgroup, kn, id);
}

static __always_inline bool is_target(__u32 targets, __u32 tgid, __u64 cgroup_id)
{
	if ((targets & RW_TARGET_PIDS) && bpf_map_lookup_elem(&rw_target_pids, &tgid))
		return 1;
	if ((targets & RW_TARGET_CGROUPS) && cgroup_id && bpf_map_lookup_elem(&rw_target_cgroups, &cgroup_id))
		return 1;
	return 0;
}

static __always_inline struct rw_target_proc *target_entry(__u32 tgid, __u64 cgroup_id)
{
	struct rw_target_proc *tp = bpf_map_lookup_elem(&rw_target_procs, &tgid);
	if (tp)
		return tp;
	struct rw_target_proc fresh = { .cgroup_id = cgroup_id };
	/* Fails if another CPU inserted it first (fine) or the map is full (counted below). */
	bpf_map_update_elem(&rw_target_procs, &tgid, &fresh, BPF_NOEXIST);
	tp = bpf_map_lookup_elem(&rw_target_procs, &tgid);
	if (!tp)
		stat_inc(RW_STAT_TARGETS_FULL);
	return tp;
}

/* Whether the task is exactly tracked, by its process or its cgroup. */
static __always_inline bool task_is_target(__u32 targets, __u32 tgid, struct task_struct *task)
{
	return targets && tgid &&
	       is_target(targets, tgid, (targets & RW_TARGET_CGROUPS) ? task_cgroup_id(task) : 0);
}

/* Exact targets are cumulative: a slice is added whole. */
static __always_inline void target_add_cpu(__u32 tgid, __u64 ns)
{
	struct rw_target_proc *tp = target_entry(tgid, 0);
	if (tp)
		__sync_fetch_and_add(&tp->cpu_ns, ns);
}

/* ---- CPU pipeline ---------------------------------------------------------------------- */

static __always_inline struct rw_control *control(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&rw_control, &zero);
}

/*
 * On each switch the outgoing task's slice is credited to its process. Two choices keep
 * this cheap (see node-agent/BENCHMARKS.md for the measurements behind them):
 *
 * - The slice length is the scheduler's own accounting, se.sum_exec_runtime, which
 *   update_curr() brought up to date just before this tracepoint: exact (it is what
 *   /proc/PID/schedstat reports) and free to read. bpf_ktime_get_ns() costs more here than
 *   the whole rest of the program.
 * - The switch-in time, which user space needs to credit tasks still running when it
 *   closes an epoch, is the scheduler's clock at this switch (se.exec_start, set by
 *   update_curr / set_next_entity) shifted to CLOCK_MONOTONIC by a per-CPU offset that
 *   is measured with one bpf_ktime_get_ns() per CPU per epoch. Between calibrations the
 *   two clocks drift by at most the IRQ time the task clock excludes.
 *
 * The switch-in state lives in a per-CPU array slot, not a hash keyed by thread id: an
 * array slot is a few instructions, a hash lookup tens of nanoseconds. The running part
 * of the slice up to the slot's credited_ns was already credited by rw_cpu_sync when an
 * epoch closed on this CPU, so that part is subtracted here.
 */
/*
 * How long `task` has been on the CPU since it was last picked, at most `max`: the
 * scheduler's own bookkeeping (prev_sum_exec_runtime, kept by the fair class; `max` bounds
 * it for classes that do not keep it). For a task whose switch-in this program never saw.
 */
static __always_inline __u64 ran_since_pick(struct task_struct *task, __u64 max)
{
	__u64 ran = max;
	if (bpf_core_field_exists(task->se.prev_sum_exec_runtime)) {
		__u64 runtime = BPF_CORE_READ(task, se.sum_exec_runtime);
		__u64 picked = BPF_CORE_READ(task, se.prev_sum_exec_runtime);
		ran = runtime > picked ? runtime - picked : 0;
	}
	return ran < max ? ran : max;
}

/*
 * `prev` is switched out but this CPU's slot never saw it switched in: it was already
 * running when the programs attached, or the tracepoint did not fire for its switch-in.
 * The second happens: on the Firecracker guest kernel CI runs on, ftrace's own
 * sched_switch event shows no switch away from some tasks (the idle task of one CPU, the
 * init process's threads), so whoever those switched to runs unannounced. Without this,
 * that task's whole slice was lost (up to a third of an epoch, measured with
 * node-agent/tests/kernel.rs running_time_is_split_across_short_epochs under load).
 *
 * The slice is the scheduler's own (ran_since_pick); it cannot have begun before this
 * slot's last recorded switch. rw_cpu_sync credited the slot's task, not `prev`, for any running part, so nothing is
 * subtracted; a slice that straddles an epoch close lands whole in the current epoch.
 */
static __attribute__((noinline)) void credit_unseen_slice(struct rw_control *ctl, struct rw_oncpu *oc,
							  struct task_struct *prev, __u64 epoch, __u64 now)
{
	__u64 slice = ran_since_pick(prev, now > oc->start_ns ? now - oc->start_ns : 0);
	__u32 tgid = prev->tgid;
	stat_inc(RW_STAT_SWITCH_IN_UNSEEN);
	if (!slice)
		return;
	cpu_sketch_add(epoch & 1, tgid, slice);
	if (task_is_target(ctl->targets, tgid, prev))
		target_add_cpu(tgid, slice);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(rw_sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct rw_oncpu *oc = bpf_map_lookup_elem(&rw_oncpu, &cpu);
	struct rw_control *ctl = control();
	if (!oc || !ctl)
		return 0;

	__u64 epoch = ctl->epoch_word;
	__u64 sched_now = prev->se.exec_start;
	if (next->se.exec_start > sched_now)
		sched_now = next->se.exec_start;
	if (oc->calib_epoch != epoch) {
		oc->clock_offset = (__s64)(bpf_ktime_get_ns() - sched_now);
		oc->calib_epoch = epoch;
	}
	__u64 now = sched_now + oc->clock_offset;

	__u32 tgid = oc->tgid;
	if (tgid && oc->pid == (__u32)prev->pid) {
		__u64 runtime = prev->se.sum_exec_runtime;
		__u64 slice = runtime > oc->start_runtime ? runtime - oc->start_runtime : 0;
		__u64 credited = oc->credited_ns > oc->start_ns ? oc->credited_ns - oc->start_ns : 0;
		if (slice > credited)
			cpu_sketch_add(epoch & 1, tgid, slice - credited);
		/* User space adds the running part of a target's slice when it reads, without
		 * storing it. */
		if (oc->target && slice)
			target_add_cpu(tgid, slice);
	} else if (prev->tgid) {
		credit_unseen_slice(ctl, oc, prev, epoch, now);
	}

	__u32 next_tgid = next->tgid;
	oc->start_ns = now;
	oc->credited_ns = 0;
	oc->start_runtime = next->se.sum_exec_runtime;
	oc->tgid = next_tgid;
	oc->pid = next->pid;
	oc->target = task_is_target(ctl->targets, next_tgid, next);
	return 0;
}

/*
 * Run by user space on one CPU at a time (BPF_PROG_TEST_RUN with BPF_F_TEST_RUN_ON_CPU: an
 * IPI with interrupts off, so no sched_switch runs on that CPU meanwhile), after it moved
 * the epoch word on. ctx[0] = 1 closes the epoch on this CPU, 0 only resynchronises.
 *
 * Crediting tasks still running at a close here, rather than in user space from a copy of
 * the slot, removes two errors: a switch between user space moving the epoch on and
 * reading the slot lost the old epoch's part of that slice, and a slot left stale by a
 * switch the tracepoint never reported (see credit_unseen_slice) credited the wrong task
 * while the one really running got nothing. Here the running task is known for certain.
 */
SEC("raw_tp")
int rw_cpu_sync(__u64 *ctx)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct rw_oncpu *oc = bpf_map_lookup_elem(&rw_oncpu, &cpu);
	struct rw_control *ctl = control();
	if (!oc || !ctl)
		return 0;
	__u64 close = ctx[0];
	__u64 now = bpf_ktime_get_ns();
	struct task_struct *cur = bpf_get_current_task_btf();
	__u32 pid = BPF_CORE_READ(cur, pid);

	if (pid != oc->pid) {
		/* The slot is stale: `cur` was switched in unannounced, after the slot's last
		 * switch. Its slice so far is the scheduler's (up to a tick behind). */
		__u32 tgid = pid ? BPF_CORE_READ(cur, tgid) : 0;
		__u64 ran = ran_since_pick(cur, now > oc->start_ns ? now - oc->start_ns : 0);
		oc->start_ns = now - ran;
		oc->credited_ns = 0;
		__u64 runtime = BPF_CORE_READ(cur, se.sum_exec_runtime);
		oc->start_runtime = runtime > ran ? runtime - ran : 0;
		oc->tgid = tgid;
		oc->pid = pid;
		oc->target = task_is_target(ctl->targets, tgid, cur);
		if (tgid)
			stat_inc(RW_STAT_SWITCH_IN_UNSEEN);
	}
	if (!close)
		return 0;

	__u64 epoch = ctl->epoch_word;
	__u64 cutoff = epoch & ~1ULL; /* the new epoch's start is the closed one's end */
	if (oc->tgid) {
		__u64 from = oc->start_ns > oc->credited_ns ? oc->start_ns : oc->credited_ns;
		if (cutoff > from)
			cpu_sketch_add((epoch & 1) ^ 1, oc->tgid, cutoff - from);
	}
	if (cutoff > oc->credited_ns)
		oc->credited_ns = cutoff;
	return 0;
}

/* ---- memory pipeline ------------------------------------------------------------------- */

struct rss {
	__u64 file, anon, swap, shmem;
};

static __always_inline void read_rss(struct mm_struct *mm, struct rss *r)
{
	if (bpf_core_type_exists(struct mm_rss_stat)) {
		struct mm_struct___pre62 *old = (void *)mm;
		r->file = BPF_CORE_READ(old, rss_stat.count[MM_FILEPAGES].counter);
		r->anon = BPF_CORE_READ(old, rss_stat.count[MM_ANONPAGES].counter);
		r->swap = BPF_CORE_READ(old, rss_stat.count[MM_SWAPENTS].counter);
		r->shmem = BPF_CORE_READ(old, rss_stat.count[MM_SHMEMPAGES].counter);
	} else {
		r->file = mm->rss_stat[MM_FILEPAGES].count;
		r->anon = mm->rss_stat[MM_ANONPAGES].count;
		r->swap = mm->rss_stat[MM_SWAPENTS].count;
		r->shmem = mm->rss_stat[MM_SHMEMPAGES].count;
	}
	/* Counters are batched per CPU and may read slightly negative; clamp like the kernel's
	 * get_mm_counter() does for /proc. */
	if ((__s64)r->file < 0) r->file = 0;
	if ((__s64)r->anon < 0) r->anon = 0;
	if ((__s64)r->swap < 0) r->swap = 0;
	if ((__s64)r->shmem < 0) r->shmem = 0;
}

static __always_inline void emit_sample(struct task_struct *owner, __u32 tgid, __u32 kind,
					 const struct rss *r, __u64 now)
{
	struct rw_mem_sample *s = bpf_ringbuf_reserve(&rw_samples, sizeof(*s), 0);
	if (!s) {
		stat_inc(RW_STAT_SAMPLES_LOST);
		return;
	}
	s->ts_ns = now;
	s->cgroup_id = task_cgroup_id(owner);
	s->file_pages = r->file;
	s->anon_pages = r->anon;
	s->swap_pages = r->swap;
	s->shmem_pages = r->shmem;
	s->tgid = tgid;
	s->kind = kind;
	bpf_probe_read_kernel_str(s->comm, sizeof(s->comm), owner->comm);
	bpf_ringbuf_submit(s, 0);
	stat_inc(RW_STAT_SAMPLES);
}

/* Appends a sample to the process's ring, or folds it into the newest entry when that
 * one is younger than `coalesce_ns` (its time is kept, so spacing stays real). */
static __always_inline void ring_record(struct rw_proc_mem *st, __u64 pages, __u64 now, __u64 coalesce_ns)
{
	__u32 mib = (pages << rw_config.page_shift) >> 20;
	__u32 ds = now / 100000000;
	if (st->ring_count) {
		__u32 last = (st->ring_head - 1) & (RW_RING_LEN - 1);
		if ((__u64)(ds - st->ring_ds[last]) * 100000000 < coalesce_ns) {
			st->ring_mib[last] = mib;
			return;
		}
	}
	__u32 slot = st->ring_head & (RW_RING_LEN - 1);
	st->ring_mib[slot] = mib;
	st->ring_ds[slot] = ds;
	st->ring_head = (st->ring_head + 1) & (RW_RING_LEN - 1);
	if (st->ring_count < RW_RING_LEN)
		st->ring_count++;
}

/*
 * The tracepoint fires whenever one of an mm's RSS counters changes, often from another
 * task than the owner (reclaim, a ptrace or process_vm write, exit teardown, khugepaged:
 * the "curr == 0" events). Reading all four counters from the mm itself, and the process
 * from mm->owner, makes every event exact whoever caused it; it also gives the true total
 * (file + anon + shmem) rather than the one member the event names.
 */
SEC("tp_btf/rss_stat")
int BPF_PROG(rw_rss_stat, struct mm_struct *mm, int member)
{
	struct task_struct *owner = mm->owner;
	if (!owner)
		return 0;
	__u32 tgid = owner->tgid;
	if (!tgid)
		return 0;

	struct rss r;
	read_rss(mm, &r);
	__u64 total = r.file + r.anon + r.shmem;
	__s64 before = mem_sketch_set(tgid, total);

	struct rw_control *ctl = control();
	if (!ctl)
		return 0;

	__u32 targets = ctl->targets;
	if (targets) {
		__u64 cgid = (targets & RW_TARGET_CGROUPS) ? task_cgroup_id(owner) : 0;
		if (is_target(targets, tgid, cgid)) {
			struct rw_target_proc *tp = target_entry(tgid, cgid);
			if (tp) {
				tp->file_pages = r.file;
				tp->anon_pages = r.anon;
				tp->swap_pages = r.swap;
				tp->shmem_pages = r.shmem;
				tp->updated_ns = bpf_ktime_get_ns();
			}
		}
	}

	/*
	 * Fast path: most events move RSS by a few pages. Only when the total crossed into
	 * another sample_min_delta_pages bucket (or the process is new to the sketch) is the
	 * per-process filter state consulted, so the hash lookup is off the common path.
	 */
	__u64 step = ctl->sample_min_delta_pages;
	if (!step)
		return 0;
	if (before >= 0 && ((__u64)before / step) == (total / step))
		return 0;

	__u64 now = bpf_ktime_get_ns();
	struct rw_proc_mem *st = bpf_map_lookup_elem(&rw_proc_mem, &tgid);
	if (!st) {
		/* Zero-initialised from a per-CPU scratch slot: the struct is too big for the
		 * 512-byte BPF stack together with the rest of this program. */
		__u32 zero = 0;
		struct rw_proc_mem *fresh = bpf_map_lookup_elem(&rw_scratch, &zero);
		if (!fresh)
			return 0;
		__builtin_memset(fresh, 0, sizeof(*fresh));
		fresh->last_emit_pages = total;
		fresh->last_emit_ns = now;
		if (bpf_map_update_elem(&rw_proc_mem, &tgid, fresh, BPF_NOEXIST) != 0) {
			stat_inc(RW_STAT_PROC_MEM_FULL);
			return 0;
		}
		st = bpf_map_lookup_elem(&rw_proc_mem, &tgid);
		if (!st)
			return 0;
		ring_record(st, total, now, ctl->ring_coalesce_ns);
		emit_sample(owner, tgid, RW_SAMPLE_RSS, &r, now);
		return 0;
	}
	__u64 last = st->last_emit_pages;
	__u64 moved = total > last ? total - last : last - total;
	if (moved < step)
		return 0;
	/* Coalesce bursts: within the minimum interval the sample is skipped, and the next
	 * event after it carries the newest value. */
	if (now - st->last_emit_ns < ctl->sample_min_interval_ns)
		return 0;
	st->last_emit_pages = total;
	st->last_emit_ns = now;
	ring_record(st, total, now, ctl->ring_coalesce_ns);
	emit_sample(owner, tgid, RW_SAMPLE_RSS, &r, now);
	return 0;
}

/*
 * Process exit: forget it everywhere so dead PIDs never occupy the memory sketch or the
 * filter state, and tell user space (an EXIT record) so it drops the process's series.
 * signal->live reaches 0 when the last thread of the group exits (that is how the kernel
 * computes group_dead), which works on kernels whose tracepoint lacks that argument.
 */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(rw_process_exit, struct task_struct *task)
{
	struct signal_struct *sig = task->signal;
	if (!sig || sig->live.counter != 0)
		return 0;
	__u32 tgid = task->tgid;
	mem_sketch_set(tgid, 0); /* 0 removes the key wherever it is */

	struct rw_target_proc *tp = bpf_map_lookup_elem(&rw_target_procs, &tgid);
	if (tp)
		tp->exited = 1;

	if (bpf_map_delete_elem(&rw_proc_mem, &tgid) == 0) {
		struct rss r = {};
		emit_sample(task, tgid, RW_SAMPLE_EXIT, &r, bpf_ktime_get_ns());
	}
	bpf_map_delete_elem(&rw_alloc_stats, &tgid);
	return 0;
}

/* ---- allocation mode (uprobes on libc, attached per target PID) ------------------------- */

/*
 * glibc's malloc calls mmap itself for large blocks, and both sit at probed addresses. A
 * call that starts while another is pending on the same thread is the allocator's own
 * work: it is skipped (BPF_NOEXIST), and each return probe only completes its own kind,
 * so a block is counted once, as the size the application asked for.
 */
static __always_inline void alloc_enter(__u64 size, __u64 old_ptr, __u32 kind)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct rw_alloc_pending p = { .size = size, .old_ptr = old_ptr, .kind = kind };
	bpf_map_update_elem(&rw_alloc_pending, &id, &p, BPF_NOEXIST);
}

static __always_inline struct rw_alloc_stats *alloc_stats(__u32 tgid)
{
	struct rw_alloc_stats *st = bpf_map_lookup_elem(&rw_alloc_stats, &tgid);
	if (st)
		return st;
	struct rw_alloc_stats fresh = {};
	bpf_map_update_elem(&rw_alloc_stats, &tgid, &fresh, BPF_NOEXIST);
	return bpf_map_lookup_elem(&rw_alloc_stats, &tgid);
}

static __always_inline void forget_ptr(__u32 tgid, __u64 ptr, struct rw_alloc_stats *st)
{
	struct rw_alloc_key k = { .tgid = tgid, .ptr = ptr };
	__u64 *size = bpf_map_lookup_elem(&rw_alloc_ptrs, &k);
	if (!size) {
		__sync_fetch_and_add(&st->unknown_frees, 1);
		return;
	}
	__sync_fetch_and_sub(&st->outstanding_bytes, *size);
	__sync_fetch_and_add(&st->frees, 1);
	bpf_map_delete_elem(&rw_alloc_ptrs, &k);
}

static __always_inline void alloc_exit(__u64 ptr, __u32 kind)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	struct rw_alloc_pending *p = bpf_map_lookup_elem(&rw_alloc_pending, &id);
	if (!p || p->kind != kind)
		return;
	bool is_mmap = kind == RW_ALLOC_MMAP;
	__u64 size = p->size, old_ptr = p->old_ptr;
	bpf_map_delete_elem(&rw_alloc_pending, &id);

	bool failed = is_mmap ? (ptr == (__u64)-1) : (ptr == 0);
	struct rw_alloc_stats *st = alloc_stats(tgid);
	if (!st)
		return;
	/* realloc: the old block is released only if the call succeeded (or size was 0). */
	if (old_ptr && (!failed || size == 0))
		forget_ptr(tgid, old_ptr, st);
	if (failed || size == 0)
		return;
	struct rw_alloc_key k = { .tgid = tgid, .ptr = ptr };
	if (bpf_map_update_elem(&rw_alloc_ptrs, &k, &size, BPF_ANY)) {
		stat_inc(RW_STAT_ALLOC_PTRS_FULL);
		return;
	}
	__sync_fetch_and_add(&st->outstanding_bytes, size);
	__sync_fetch_and_add(&st->allocs, 1);
}

SEC("uprobe")
int BPF_KPROBE(rw_malloc_enter, __u64 size) { alloc_enter(size, 0, RW_ALLOC_HEAP); return 0; }

SEC("uprobe")
int BPF_KPROBE(rw_calloc_enter, __u64 n, __u64 size) { alloc_enter(n * size, 0, RW_ALLOC_HEAP); return 0; }

SEC("uprobe")
int BPF_KPROBE(rw_realloc_enter, __u64 ptr, __u64 size) { alloc_enter(size, ptr, RW_ALLOC_HEAP); return 0; }

SEC("uprobe")
int BPF_KPROBE(rw_mmap_enter, __u64 addr, __u64 len) { alloc_enter(len, 0, RW_ALLOC_MMAP); return 0; }

SEC("uretprobe")
int BPF_KRETPROBE(rw_alloc_return, __u64 ptr) { alloc_exit(ptr, RW_ALLOC_HEAP); return 0; }

SEC("uretprobe")
int BPF_KRETPROBE(rw_mmap_return, __u64 ptr) { alloc_exit(ptr, RW_ALLOC_MMAP); return 0; }

SEC("uprobe")
int BPF_KPROBE(rw_free_enter, __u64 ptr)
{
	if (!ptr)
		return 0;
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct rw_alloc_stats *st = alloc_stats(tgid);
	if (st)
		forget_ptr(tgid, ptr, st);
	return 0;
}

/* munmap may release part of a mapping; we account the whole mapping at its start
 * address, the common case for allocators that unmap what they mapped. */
SEC("uprobe")
int BPF_KPROBE(rw_munmap_enter, __u64 addr, __u64 len)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct rw_alloc_key k = { .tgid = tgid, .ptr = addr };
	if (!bpf_map_lookup_elem(&rw_alloc_ptrs, &k))
		return 0;
	struct rw_alloc_stats *st = alloc_stats(tgid);
	if (st)
		forget_ptr(tgid, addr, st);
	return 0;
}
