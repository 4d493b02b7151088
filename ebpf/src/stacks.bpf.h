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
					     __s32 user_stack, __s32 kernel_stack, __u32 seq)
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
	s->seq = seq;
	s->_pad = 0;
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
 * Charges `bytes` to the current user stack: a stack sample to user space (numbered `seq`
 * for a growth site's revocation), or the frame-pointer walk's stack id when the sample
 * cannot be sent.
 */
static __always_inline void charge_stack(void *ctx, __u32 tgid, __u64 bytes, __u32 kind,
					 __u32 seq)
{
	__s32 user_stack = bpf_get_stackid(ctx, &rw_site_stacks, BPF_F_USER_STACK);
	/* A stack id that failed (a hash collision in the stack map, a task with no user
	 * stack) loses nothing while the sample reaches user space with its stack copy: lost
	 * is counted only for a sample that keeps no stack at all. */
	if (send_stack_sample(kind, tgid, bytes, user_stack, -1, seq) == 0)
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
 * Adds `add` bytes to `*pending` and, once RW_SITE_SAMPLE_BYTES have gathered, charges
 * them all to the current user stack: one stack per RW_SITE_SAMPLE_BYTES, since a copy of
 * the stack per allocation would cost more than what it explains.
 */
static __always_inline void charge_site(void *ctx, __u64 *pending, __u32 tgid, __u64 add,
					__u32 kind)
{
	__u64 bytes = __sync_fetch_and_add(pending, add) + add;
	if (bytes < RW_SITE_SAMPLE_BYTES)
		return;
	/* Taken by this event; a racing thread's add lands in the next sample. */
	__sync_fetch_and_sub(pending, bytes);
	charge_stack(ctx, tgid, bytes, kind, 0);
}

/* Whether user space listed `tgid` for a growth-site capture: constant indices, unrolled. */
static __always_inline int site_listed(const struct rw_control *ctl, __u32 tgid)
{
#pragma unroll
	for (int i = 0; i < RW_MAX_SITE_CAPTURES; i++)
		if (ctl->site_pid[i] == tgid)
			return 1;
	return 0;
}

/* CPUs whose per-CPU counter deltas resident_exact() reads at a capture's start; a larger
 * machine's growth sites use the folded counts alone. */
#define RW_MAX_SUMMED_CPUS 512

/* An entry per CPU: its address on each CPU, less the percpu address every CPU's is
 * found from, is that CPU's per-CPU offset (resident_exact). */
struct rw_pcpu_probe {
	__u64 map;  /* this map's own address, stored to be read back as a number */
	__u64 real; /* likewise, one CPU's entry's address */
	__u64 base; /* the entry's percpu address: 0 until read */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rw_pcpu_probe);
} rw_pcpu SEC(".maps");

/*
 * The resident pages of `mm` exactly, where the kernel keeps them as percpu_counters
 * (6.2 on): the folded counts plus every CPU's deltas, or `approx` (what read_rss()
 * summed) when those cannot be read; before 6.2, see below. Why: the folded count moves in steps of 32+ pages, at whichever event crosses
 * a CPU's batch, so the stack seen when it moves is a random one of the events before;
 * a churn that faults more often than a leak takes most of the leak's growth that way.
 *
 * A CPU's delta is at `counters` plus that CPU's per-CPU offset. Kernels built with GCC
 * have no percpu tag in their BTF, so bpf_per_cpu_ptr() refuses the pointer, and
 * __per_cpu_offset is not a BTF variable; the offset is found instead from a per-CPU
 * array of this program's own: bpf_map_lookup_percpu_elem() gives its entry's address on
 * a CPU, and the array (struct bpf_array) holds the entry's percpu address after `aux`.
 * Reading the map's address as a number is allowed to CAP_PERFMON (it stores a pointer
 * into a map value). Every CPU's deltas are read at the capture's first event and kept
 * (rw_site_deltas); after that, an event reads only its own counter's delta on its own
 * CPU, since each change of a delta fires this tracepoint on the CPU that made it: one
 * read per event whatever the number of CPUs (all of them at each event cost the captured
 * process about twice as much already on 2 CPUs). A delta outside what a batch allows means the
 * layout is not the one expected: the folded counts are used then, for the capture.
 *
 * Before 6.2 the counters are atomic, but each thread keeps the page faults of its own mm
 * in its task (task->rss_stat) and adds them only every 64 events, and only that sync
 * fires the tracepoint; pages unmapped are subtracted at once. A level from the counters
 * alone fell by up to 64 pages more than the process gave back at each unmap, and took
 * back charges it had not given back (a leak beside a buffer unmapped each time kept
 * nothing). So the current thread's own pending faults are added, except those of the
 * event's member while it is being synced (events then above 64: the counter has them
 * already, the task not yet cleared). Other threads' pending faults are not seen: each
 * can hide up to 64 pages.
 */
/* Each CPU's unfolded deltas of a captured process's resident counters, as last read
 * (resident_exact). Entries made by user space with the capture. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, struct rw_site_deltas);
} rw_site_deltas SEC(".maps");

/* What resident_exact() hands each CPU's step of its bpf_loop(). */
struct rw_pcpu_sum {
	struct rw_pcpu_probe *pp;
	__u64 base;
	__u64 file, anon, shmem; /* percpu addresses of the three counters' deltas */
	__s64 sum;
	__u32 tgid;
	__u32 failed;
};

/* A delta outside what a batch allows (percpu_counter_batch is max(32, 2 x CPUs)) means
 * the layout is not the one expected. */
static __always_inline int delta_sane(__s32 v)
{
	return v <= 65536 && v >= -65536;
}

static long pcpu_sum_step(__u32 cpu, void *data)
{
	struct rw_pcpu_sum *d = data;
	__u32 zero = 0;
	void *entry = bpf_map_lookup_percpu_elem(&rw_pcpu, &zero, cpu);
	if (!entry)
		return 1; /* past the last CPU */
	struct rw_site_deltas *seen = bpf_map_lookup_percpu_elem(&rw_site_deltas, &d->tgid, cpu);
	if (!seen) {
		d->failed = 1;
		return 1;
	}
	struct rw_pcpu_probe *pp = d->pp;
	pp->real = (__u64)entry;
	__u64 off = *(volatile __u64 *)&pp->real - d->base;
	__s32 f = 0, a = 0, sh = 0;
	if (bpf_probe_read_kernel(&f, sizeof(f), (void *)(d->file + off)) ||
	    bpf_probe_read_kernel(&a, sizeof(a), (void *)(d->anon + off)) ||
	    bpf_probe_read_kernel(&sh, sizeof(sh), (void *)(d->shmem + off)) ||
	    !delta_sane(f) || !delta_sane(a) || !delta_sane(sh)) {
		d->failed = 1;
		return 1;
	}
	seen->d[0] = f;
	seen->d[1] = a;
	seen->d[2] = sh;
	d->sum += f + a + sh;
	return 0;
}

static __always_inline __u64 resident_pre62(struct mm_struct *mm, int member)
{
	struct mm_struct___pre62 *old = (void *)mm;
	__s64 level = (long)BPF_CORE_READ(old, rss_stat.count[MM_FILEPAGES].counter) +
		      (long)BPF_CORE_READ(old, rss_stat.count[MM_ANONPAGES].counter) +
		      (long)BPF_CORE_READ(old, rss_stat.count[MM_SHMEMPAGES].counter);
	struct task_struct___pre62 *t = (void *)bpf_get_current_task_btf();
	if (bpf_core_field_exists(t->rss_stat) && BPF_CORE_READ(t, mm) == (void *)mm) {
		int syncing = BPF_CORE_READ(t, rss_stat.events) > 64;
		int file = BPF_CORE_READ(t, rss_stat.count[MM_FILEPAGES]);
		int anon = BPF_CORE_READ(t, rss_stat.count[MM_ANONPAGES]);
		int shmem = BPF_CORE_READ(t, rss_stat.count[MM_SHMEMPAGES]);
		if (!(syncing && member == MM_FILEPAGES))
			level += file;
		if (!(syncing && member == MM_ANONPAGES))
			level += anon;
		if (!(syncing && member == MM_SHMEMPAGES))
			level += shmem;
	}
	return level > 0 ? (__u64)level : 0;
}

static __always_inline __u64 resident_exact(struct mm_struct *mm, int member, __u64 approx,
					    struct rw_site_state *st, __u32 tgid)
{
	if (bpf_core_type_exists(struct mm_rss_stat))
		return resident_pre62(mm, member);
	__u32 zero = 0;
	struct rw_pcpu_probe *pp = bpf_map_lookup_elem(&rw_pcpu, &zero);
	struct rw_site_deltas *seen = bpf_map_lookup_elem(&rw_site_deltas, &tgid);
	if (!pp || !seen)
		return approx;
	__u64 base = pp->base;
	if (!base) {
		pp->map = (__u64)(void *)&rw_pcpu;
		__u64 map = *(volatile __u64 *)&pp->map;
		__u64 at = map + bpf_core_field_offset(struct bpf_array, aux) + sizeof(void *);
		if (bpf_probe_read_kernel(&base, sizeof(base), (void *)at) || !base)
			return approx;
		pp->base = base;
	}
	__s64 counts = (__s64)mm->rss_stat[MM_FILEPAGES].count + (__s64)mm->rss_stat[MM_ANONPAGES].count +
		       (__s64)mm->rss_stat[MM_SHMEMPAGES].count;
	if (!st->started) {
		/* Every CPU's deltas once, remembered per CPU. */
		struct rw_pcpu_sum d = {
			.pp = pp,
			.base = base,
			.file = (__u64)mm->rss_stat[MM_FILEPAGES].counters,
			.anon = (__u64)mm->rss_stat[MM_ANONPAGES].counters,
			.shmem = (__u64)mm->rss_stat[MM_SHMEMPAGES].counters,
			.tgid = tgid,
		};
		/* bpf_loop: the verifier checks the step once, not once per CPU. */
		bpf_loop(RW_MAX_SUMMED_CPUS, pcpu_sum_step, &d, 0);
		if (d.failed)
			return approx;
		st->unfolded = d.sum;
		st->exact = 1;
	} else {
		/* Then only the event's counter on this CPU: every change of a CPU's delta
		 * fires this tracepoint on that CPU, so the others are as last read. */
		if (!st->exact)
			return approx;
		__u64 ctr;
		int i;
		if (member == MM_FILEPAGES) {
			ctr = (__u64)mm->rss_stat[MM_FILEPAGES].counters;
			i = 0;
		} else if (member == MM_ANONPAGES) {
			ctr = (__u64)mm->rss_stat[MM_ANONPAGES].counters;
			i = 1;
		} else if (member == MM_SHMEMPAGES) {
			ctr = (__u64)mm->rss_stat[MM_SHMEMPAGES].counters;
			i = 2;
		} else {
			goto out; /* swap: not resident */
		}
		/* pp is this CPU's entry: its address less the percpu one is this CPU's offset. */
		pp->real = (__u64)pp;
		__u64 off = *(volatile __u64 *)&pp->real - base;
		__s32 v = 0;
		if (bpf_probe_read_kernel(&v, sizeof(v), (void *)(ctr + off)) || !delta_sane(v)) {
			st->exact = 0;
			return approx;
		}
		__s32 was = seen->d[i & 3];
		seen->d[i & 3] = v;
		__sync_fetch_and_add(&st->unfolded, (__s64)(v - was));
	}
out:;
	__s64 level = counts + st->unfolded;
	return level > 0 ? (__u64)level : 0;
}

/* Tells user space that `bytes` of growth-site sample `seq` were given back. */
static __always_inline void send_revoke(__u32 tgid, __u32 seq, __u64 bytes)
{
	if (!seq)
		return;
	struct rw_site_revoke *r = bpf_ringbuf_reserve(&rw_stack_samples, sizeof(*r), 0);
	if (!r) {
		/* That sample's bytes stay charged: counted as a sample's stack lost. */
		stat_inc(RW_STAT_STACKS_LOST);
		return;
	}
	r->bytes = bytes;
	r->tgid = tgid;
	r->kind = RW_STACK_SAMPLE_REVOKE;
	r->seq = seq;
	r->_pad = 0;
	bpf_ringbuf_submit(r, 0);
}

#define RW_HAVE_BPF_LOOP bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_loop)

/* What record_growth_site() hands each step of its revoking bpf_loop(). */
struct rw_site_revoking {
	struct rw_site_state *st;
	__u64 level;
	__u64 next; /* the `next` the lowest charge taken back reached: `next` again */
	__u32 tgid;
};

/* Takes back the newest charge if the level fell below its top. */
static long site_revoke_step(__u32 i, void *data)
{
	struct rw_site_revoking *r = data;
	struct rw_site_state *st = r->st;
	__u32 depth = st->depth;
	if (!depth || depth > RW_SITE_KEPT)
		return 1;
	struct rw_site_charge *c = &st->kept[(st->bottom + depth - 1) & (RW_SITE_KEPT - 1)];
	if (c->top <= r->level)
		return 1;
	send_revoke(r->tgid, c->seq, (__u64)c->count << rw_config.page_shift);
	r->next = c->next;
	st->depth = depth - 1;
	return 0;
}

/* A gap to the next charge, in pages: uniform in 1 .. 2 x RW_SITE_SAMPLE_BYTES - 1. */
static __always_inline __u64 site_gap(void)
{
	__u64 mean = RW_SITE_SAMPLE_BYTES >> rw_config.page_shift;
	if (!mean)
		mean = 1;
	return 1 + bpf_get_prandom_u32() % (2 * mean - 1);
}

/*
 * Called from rw_rss_stat for a process listed in rw_site_pids (see struct rw_site_state
 * for the levels). The event whose resident level reaches `next` charges the growth since
 * the last charge to the user stack of its task if that task belongs to the process (a
 * fault, a brk or an mmap of its own; reclaim or another process's ptrace write have
 * none, and their pages are kept with no sample). A charge whose top the level falls
 * back below is taken back whole, and the next charge is taken where it was: so each
 * stretch of the level ends up charged to an event that raised the level through it for
 * good, and not to a transient that went through it first.
 *
 * Why, and not only new highs charged: a transient that faults memory in and gives it
 * back (a buffer unmapped after use, an arena freed, a heap top trimmed) sits on top of
 * everything else, so it makes every new high while a leak under it raises the floor;
 * charging new highs charged a leak beside a 512 KiB buffer to the buffer's memset, all
 * of it. Memory a process frees and takes back without giving it to the kernel moves no
 * counter. Why random gaps: a program's growth is often periodic (16
 * pages an iteration, say), and charges at fixed steps of 64 pages then land on the same
 * point of every period: on one allocator write that first touches a page of the next
 * chunk, it took half of a leak's growth in 1 run of 10. Two threads of one process
 * racing here can misattribute a charge; the indexes stay in bounds.
 */
static __noinline void record_growth_site(void *ctx, struct mm_struct *mm, int member,
					  __u32 tgid, __u64 total)
{
	struct rw_site_state *st = bpf_map_lookup_elem(&rw_site_pids, &tgid);
	if (!st)
		return;
	__u64 level = resident_exact(mm, member, total, st, tgid);
	if (!st->started) {
		st->mark = level;
		st->floor = level;
		st->next = level + site_gap();
		st->started = 1;
		return;
	}
	__u64 mark = st->mark;
	if (level >= st->next) {
		__u32 seq = 0;
		if ((bpf_get_current_pid_tgid() >> 32) == tgid) {
			seq = st->seq + 1;
			if (!seq)
				seq = 1;
			st->seq = seq;
		}
		__u32 depth = st->depth;
		if (depth >= RW_SITE_KEPT) {
			/* The oldest charge stays for good: nothing under it is revoked. */
			struct rw_site_charge *old = &st->kept[st->bottom & (RW_SITE_KEPT - 1)];
			st->floor = old->top;
			st->bottom++;
			depth = RW_SITE_KEPT - 1;
		}
		struct rw_site_charge *c = &st->kept[(st->bottom + depth) & (RW_SITE_KEPT - 1)];
		c->seq = seq;
		c->top = level;
		c->count = level - mark;
		c->next = st->next;
		st->depth = depth + 1;
		st->mark = level;
		st->next = level + site_gap();
		if (seq)
			charge_stack(ctx, tgid, (level - mark) << rw_config.page_shift,
				     RW_STACK_SAMPLE_SITE, seq);
		return;
	}
	if (level >= mark)
		return;
	struct rw_site_revoking r = { .st = st, .tgid = tgid, .level = level };
	if (RW_HAVE_BPF_LOOP) {
		bpf_loop(RW_SITE_KEPT, site_revoke_step, &r, 0);
	} else {
		/* bpf_loop is Linux 5.17's (on an older kernel that branch is dead code the
		 * verifier drops): eight at an event here, the rest at the next ones below. */
#pragma unroll
		for (int i = 0; i < 8; i++)
			if (site_revoke_step(i, &r))
				break;
	}
	/* Charged now: up to the top of the newest charge left. The next is taken where the
	 * lowest one taken back was, by whatever raises the level there again: its `next`,
	 * not its top, which can be far above where an older kernel told the level in steps
	 * of 64 faults (the transient would then take every charge again before the growth
	 * under it got there). */
	__u32 depth = st->depth;
	if (depth && depth <= RW_SITE_KEPT)
		st->mark = st->kept[(st->bottom + depth - 1) & (RW_SITE_KEPT - 1)].top;
	else
		st->mark = st->floor;
	if (r.next)
		st->next = r.next;
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
			      key.kernel_stack, 0) == 0)
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
