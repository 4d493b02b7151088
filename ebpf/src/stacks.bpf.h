// SPDX-License-Identifier: GPL-2.0-only
/*
 * Stacks: CPU profiles of chosen processes (a perf-event program, attached only while a
 * profile runs) and the growth sites of leaking processes (from rss_stat, only for the
 * processes user space listed in rw_site_pids, for a bounded time).
 * Part of resourcewatch.bpf.c, the one object the agent loads (its programs share these
 * maps); included once, in order, from there, after mem.bpf.h's helpers are declared.
 *
 * Each sample takes two user stacks:
 *   - the frame-pointer walk of bpf_get_stackid, deduplicated in a stack-trace map (the
 *     seeds' profilers, Pixie and Pyroscope): complete for code that keeps frame pointers
 *     (Go, JIT code with them on), garbage after the leaf for code that does not;
 *   - the registers and the top RW_STACK_COPY bytes of the user stack, sent through a ring
 *     buffer and unwound in user space with the binaries' .eh_frame tables
 *     (node-agent/src/stacks/unwind.rs), which is how perf's `--call-graph dwarf` and
 *     samply reach main in code built without frame pointers (most C, C++ and Rust).
 * Unwinding in user space rather than in the kernel (Parca's way) keeps the kernel side
 * to one copy per sample and no per-binary tables in BPF maps; its cost is the copy
 * (~16 KiB per sample) and the user-space walk, both measured in node-agent/BENCHMARKS.md.
 * When the ring buffer is full the sample is counted with its frame-pointer walk only, as
 * before the copy existed: nothing is lost, some stacks are shorter.
 */
#ifndef RW_STACKS_BPF_H
#define RW_STACKS_BPF_H

/* ---- maps ------------------------------------------------------------------------------ */

/* The two stack pipelines (CPU profile, growth sites) have the same pair of maps: stack
 * traces, and a figure (samples or bytes) per rw_stack_key. One definition of each shape;
 * the stack-trace maps are sized by the loader (PipelineOptions::stack_entries). */
#define RW_STACK_TRACE_MAP(name)                                          \
	struct {                                                          \
		__uint(type, BPF_MAP_TYPE_STACK_TRACE);                   \
		__uint(max_entries, 1024);                                \
		__uint(key_size, sizeof(__u32));                          \
		__uint(value_size, RW_STACK_DEPTH * sizeof(__u64));       \
	} name SEC(".maps")

#define RW_STACK_FIGURE_MAP(name, entries)                                \
	struct {                                                          \
		__uint(type, BPF_MAP_TYPE_HASH);                          \
		__uint(max_entries, entries);                             \
		__type(key, struct rw_stack_key);                         \
		__type(value, __u64);                                     \
	} name SEC(".maps")

RW_STACK_TRACE_MAP(rw_profile_stacks);
/* CPU samples per rw_stack_key. */
RW_STACK_FIGURE_MAP(rw_profile_counts, 16384);

/* Profiled processes (tgid -> 1) and cgroups (cgroup id -> 1). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} rw_profile_pids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u64);
	__type(value, __u32);
} rw_profile_cgroups SEC(".maps");

RW_STACK_TRACE_MAP(rw_site_stacks);
/* Bytes of resident growth per rw_stack_key. */
RW_STACK_FIGURE_MAP(rw_site_bytes, 4096);

/* Processes whose growth sites are captured: tgid -> their rw_site_state. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, struct rw_site_state);
} rw_site_pids SEC(".maps");

/* Stack samples (struct rw_stack_sample) of profiles and growth sites, for unwinding in
 * user space. Sized by the loader; the default holds 256 samples. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 * 1024 * 1024);
} rw_stack_samples SEC(".maps");

/* ---- helpers --------------------------------------------------------------------------- */

static __always_inline void stack_count_add(void *map, struct rw_stack_key *key, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(map, key);
	if (v) {
		__sync_fetch_and_add(v, n);
		return;
	}
	__u64 init = n;
	if (bpf_map_update_elem(map, key, &init, BPF_NOEXIST) == 0)
		return;
	/* Another CPU inserted it first, or the map is full. */
	v = bpf_map_lookup_elem(map, key);
	if (v)
		__sync_fetch_and_add(v, n);
	else
		stat_inc(RW_STAT_STACKS_LOST);
}

/*
 * The return address on top of the current task's user stack, if the instruction before
 * it is a call; else 0.
 *
 * Why: a frame-pointer walk starts at the instruction pointer and then follows the saved
 * frame pointers, so when the event lands in a leaf that keeps no frame (memset, memcpy,
 * Go's memclrNoHeapPointers: where new memory is first touched), the leaf's caller is
 * missing from the stack: the walk goes from the leaf straight to the caller's caller. At
 * that point the caller's return address is still the word at the stack pointer. In a
 * function that did push a frame the word is something else (a saved register, a local),
 * hence the call-instruction check, and user space keeps it only when it falls in an
 * executable mapping of a file and is not already the walk's next frame. x86-64 only.
 */
static __always_inline __u64 top_return_address(void)
{
#if defined(__TARGET_ARCH_x86)
	struct task_struct *task = bpf_get_current_task_btf();
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	__u64 sp = 0, ret = 0;
	__u8 code[7];
	if (!regs || bpf_probe_read_kernel(&sp, sizeof(sp), &PT_REGS_SP(regs)))
		return 0;
	if (bpf_probe_read_user(&ret, sizeof(ret), (void *)sp) || ret < sizeof(code))
		return 0;
	if (bpf_probe_read_user(code, sizeof(code), (void *)(ret - sizeof(code))))
		return 0;
	if (code[2] == 0xe8)                                 /* call rel32 */
		return ret;
	if (code[1] == 0xff && code[2] == 0x15)              /* call *disp32(%rip) */
		return ret;
	if (code[5] == 0xff && (code[6] & 0xf8) == 0xd0)     /* call *%reg */
		return ret;
	if (code[4] == 0xff && (code[5] & 0xf8) == 0x50)     /* call *disp8(%reg) */
		return ret;
	if (code[1] == 0xff && (code[2] & 0xf8) == 0x90)     /* call *disp32(%reg) */
		return ret;
	return 0;
#else
	return 0;
#endif
}

/*
 * Sends a stack sample of the current task: its user registers and the top of its user
 * stack. 0 when sent; < 0 when the ring buffer is full or the task has no user stack
 * (a kernel thread), and the caller counts the sample by its frame-pointer walk instead.
 */
static __always_inline int send_stack_sample(__u32 kind, __u32 tgid, __u64 value,
					     __s32 user_stack, __s32 kernel_stack)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	if (!regs)
		return -1;
	struct rw_stack_sample *s = bpf_ringbuf_reserve(&rw_stack_samples, sizeof(*s), 0);
	if (!s)
		return -1;
	s->value = value;
	s->tgid = tgid;
	s->kind = kind;
	s->user_stack = user_stack;
	s->kernel_stack = kernel_stack;
	s->py_len = 0;
	s->ip = 0;
	s->sp = 0;
	s->bp = 0;
	s->caller = top_return_address();
	bpf_probe_read_kernel(&s->ip, sizeof(s->ip), &PT_REGS_IP(regs));
	bpf_probe_read_kernel(&s->sp, sizeof(s->sp), &PT_REGS_SP(regs));
	bpf_probe_read_kernel(&s->bp, sizeof(s->bp), &PT_REGS_FP(regs));
	void *sp = (void *)s->sp;
	__u32 len = 0;
	/* A main thread's stack ends just above where the process started (argc, then argv,
	 * envp, auxv and their strings): no frame lies above that, so the copy stops there,
	 * in one read. */
	__u64 top = 0;
	if (task->pid == task->tgid && task->mm)
		top = BPF_CORE_READ(task, mm, start_stack);
	if (top > s->sp && top - s->sp < RW_STACK_COPY - 64) {
		__u32 want = (__u32)(top - s->sp) + 64;
		if (want > RW_STACK_COPY)
			want = RW_STACK_COPY;
		if (!bpf_probe_read_user(s->stack, want, sp))
			len = want;
	}
	/* Elsewhere the stack's end is not known here: the largest of these sizes that reads
	 * whole is copied (a read that crosses the end of the mapping fails as a whole). */
	if (len)
		;
	else if (!bpf_probe_read_user(s->stack, RW_STACK_COPY, sp))
		len = RW_STACK_COPY;
	else if (!bpf_probe_read_user(s->stack, 12288, sp))
		len = 12288;
	else if (!bpf_probe_read_user(s->stack, 8192, sp))
		len = 8192;
	else if (!bpf_probe_read_user(s->stack, 6144, sp))
		len = 6144;
	else if (!bpf_probe_read_user(s->stack, 4096, sp))
		len = 4096;
	else if (!bpf_probe_read_user(s->stack, 3072, sp))
		len = 3072;
	else if (!bpf_probe_read_user(s->stack, 2048, sp))
		len = 2048;
	else if (!bpf_probe_read_user(s->stack, 1024, sp))
		len = 1024;
	else if (!bpf_probe_read_user(s->stack, 512, sp))
		len = 512;
	else if (!bpf_probe_read_user(s->stack, 128, sp))
		len = 128;
	if (!len || !s->ip) {
		bpf_ringbuf_discard(s, 0);
		return -1;
	}
	s->stack_len = len;
	s->py_len = python_frames(task, tgid, s->py_frames);
	bpf_ringbuf_submit(s, 0);
	return 0;
}

/*
 * Adds `add` bytes to `*pending` and, once RW_SITE_SAMPLE_BYTES have gathered, charges
 * them all to the current user stack: one stack per RW_SITE_SAMPLE_BYTES, since a copy of
 * the stack per fault (or per allocation) would cost more than what it explains.
 */
static __always_inline void charge_site(void *ctx, __u64 *pending, __u32 tgid, __u64 add,
					__u32 kind)
{
	__u64 bytes = __sync_fetch_and_add(pending, add) + add;
	if (bytes < RW_SITE_SAMPLE_BYTES)
		return;
	/* Taken by this event; a racing thread's add lands in the next sample. */
	__sync_fetch_and_sub(pending, bytes);
	__s32 user_stack = bpf_get_stackid(ctx, &rw_site_stacks, BPF_F_USER_STACK);
	/* A stack id that failed (a hash collision in the stack map, a task with no user
	 * stack) loses nothing while the sample reaches user space with its stack copy: lost
	 * is counted only for a sample that keeps no stack at all. */
	if (send_stack_sample(kind, tgid, bytes, user_stack, -1) == 0)
		return;
	if (user_stack < 0)
		stat_inc(RW_STAT_STACKS_LOST);
	struct rw_stack_key key = {
		.tgid = tgid,
		.user_stack = user_stack,
		.kernel_stack = -1,
	};
	key.caller = top_return_address();
	stack_count_add(&rw_site_bytes, &key, bytes);
}

/*
 * Called from rw_rss_stat for a process listed in rw_site_pids: when its resident total
 * goes above the highest seen so far, the growth is charged to the user stack of the task
 * that caused it, if that task belongs to the process (a fault, a brk or an mmap of its
 * own; reclaim or another process's ptrace write have no stack of the process).
 *
 * Only new highs count: memory a process frees and takes back (allocator churn, a GC
 * sawtooth) is resident already and adds nothing, so over a capture window what stays is
 * where the process's footprint really grew, which for a leak is the leak. Two threads of
 * one process racing on the high-water mark can misattribute a few pages.
 */
/* Whether user space listed `tgid` for a growth-site capture: constant indices, unrolled. */
static __always_inline int site_listed(const struct rw_control *ctl, __u32 tgid)
{
#pragma unroll
	for (int i = 0; i < RW_MAX_SITE_CAPTURES; i++)
		if (ctl->site_pid[i] == tgid)
			return 1;
	return 0;
}

static __always_inline void record_growth_site(void *ctx, __u32 tgid, __u64 total)
{
	struct rw_site_state *st = bpf_map_lookup_elem(&rw_site_pids, &tgid);
	if (!st)
		return;
	__u64 prev = st->high;
	if (total <= prev)
		return;
	st->high = total;
	if ((bpf_get_current_pid_tgid() >> 32) != tgid)
		return;
	charge_site(ctx, &st->pending, tgid, (total - prev) << rw_config.page_shift,
		    RW_STACK_SAMPLE_SITE);
}

/*
 * A JVM's heap allocations, while its growth sites are captured: attached by user space to
 * HotSpot's AllocTracer::send_allocation_in_new_tlab (a thread took a new TLAB of this
 * many bytes) and ::send_allocation_outside_tlab (one object too large for a TLAB), which
 * HotSpot calls whether JFR is on or not; async-profiler's allocation mode hooks the same
 * two. Both take the bytes as their third argument. Sampled by bytes like resident growth,
 * with a counter of its own: a garbage-collected heap grows where the collector copies
 * live objects, which says nothing of where they were made; its allocations do.
 */
SEC("uprobe")
int BPF_KPROBE(rw_jvm_alloc, void *klass, void *obj, __u64 bytes)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct rw_site_state *st = bpf_map_lookup_elem(&rw_site_pids, &tgid);
	if (!st || !bytes)
		return 0;
	charge_site(ctx, &st->alloc_pending, tgid, bytes, RW_STACK_SAMPLE_JVM_ALLOC);
	return 0;
}

/* ---- CPU profile ----------------------------------------------------------------------- */

/*
 * A software cpu-clock event at the profile's frequency on every CPU (this VM has no PMU);
 * only the profiled processes and cgroups are sampled. Idle (tgid 0) never is.
 */
SEC("perf_event")
int rw_profile(struct bpf_perf_event_data *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!tgid)
		return 0;
	if (!bpf_map_lookup_elem(&rw_profile_pids, &tgid)) {
		__u64 cgid = task_cgroup_id(bpf_get_current_task_btf());
		if (!cgid || !bpf_map_lookup_elem(&rw_profile_cgroups, &cgid))
			return 0;
	}
	struct rw_stack_key key = { .tgid = tgid };
	key.user_stack = bpf_get_stackid(ctx, &rw_profile_stacks, BPF_F_USER_STACK);
	key.kernel_stack = bpf_get_stackid(ctx, &rw_profile_stacks, 0);
	/* As for growth sites: lost only when the sample keeps no stack at all. */
	if (send_stack_sample(RW_STACK_SAMPLE_PROFILE, tgid, 1, key.user_stack,
			      key.kernel_stack) == 0)
		return 0;
	if (key.user_stack < 0 && key.kernel_stack < 0)
		stat_inc(RW_STAT_STACKS_LOST);
	/* Samples land in frameless leaves too (Go's small functions, memcpy): their callers
	 * are put back the same way as for growth sites. */
	key.caller = top_return_address();
	stack_count_add(&rw_profile_counts, &key, 1);
	return 0;
}

#endif /* RW_STACKS_BPF_H */
