// SPDX-License-Identifier: GPL-2.0-only
/*
 * The memory pipeline: RSS per process from rss_stat, samples streamed to user space.
 * Part of resourcewatch.bpf.c, the one object the agent loads (its programs share these
 * maps); included once, in order, from there.
 */
#ifndef RW_MEM_BPF_H
#define RW_MEM_BPF_H

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
	s->oom_cgroup_id = 0;
	s->oom_total_pages = 0;
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

	if (ctl->site_pids && site_listed(ctl, tgid))
		record_growth_site(ctx, mm, member, tgid, total);
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

	/* Only while targets are set (set_targets with none forgets every tracked process):
	 * every process on the node exits through here. */
	struct rw_control *ctl = control();
	if (ctl && ctl->targets) {
		struct rw_target_proc *tp = target_lookup(tgid);
		if (tp)
			tp->exited = 1;
	}

	if (bpf_map_delete_elem(&rw_proc_mem, &tgid) == 0) {
		struct rss r = {};
		emit_sample(task, tgid, RW_SAMPLE_EXIT, &r, bpf_ktime_get_ns());
	}
	bpf_map_delete_elem(&rw_alloc_stats, &tgid);
	return 0;
}

/* read_rss and task_cgroup_id for a kprobe, whose pointers the verifier does not know
 * the types of: every load is a probe read. */
static __always_inline void probe_rss(struct mm_struct *mm, struct rss *r)
{
	if (bpf_core_type_exists(struct mm_rss_stat)) {
		struct mm_struct___pre62 *old = (void *)mm;
		r->file = BPF_CORE_READ(old, rss_stat.count[MM_FILEPAGES].counter);
		r->anon = BPF_CORE_READ(old, rss_stat.count[MM_ANONPAGES].counter);
		r->swap = BPF_CORE_READ(old, rss_stat.count[MM_SWAPENTS].counter);
		r->shmem = BPF_CORE_READ(old, rss_stat.count[MM_SHMEMPAGES].counter);
	} else {
		r->file = BPF_CORE_READ(mm, rss_stat[MM_FILEPAGES].count);
		r->anon = BPF_CORE_READ(mm, rss_stat[MM_ANONPAGES].count);
		r->swap = BPF_CORE_READ(mm, rss_stat[MM_SWAPENTS].count);
		r->shmem = BPF_CORE_READ(mm, rss_stat[MM_SHMEMPAGES].count);
	}
	if ((__s64)r->file < 0) r->file = 0;
	if ((__s64)r->anon < 0) r->anon = 0;
	if ((__s64)r->swap < 0) r->swap = 0;
	if ((__s64)r->shmem < 0) r->shmem = 0;
}

/* A task's memory cgroup (its css in the memory controller, v1 or v2): the limit. */
static __always_inline struct cgroup_subsys_state *probe_memory_css(struct task_struct *task)
{
	struct css_set *cset = BPF_CORE_READ(task, cgroups);
	if (!cset)
		return 0;
	struct cgroup_subsys_state *css = 0;
	__u32 off = bpf_core_field_offset(struct css_set, subsys) +
		    bpf_core_enum_value(enum cgroup_subsys_id, memory_cgrp_id) * sizeof(void *);
	if (bpf_probe_read_kernel(&css, sizeof(css), (void *)cset + off))
		return 0;
	return css;
}

static __always_inline __u64 probe_task_cgroup_id(struct task_struct *task)
{
	if (!rw_config.cgroup_v1_memory)
		return BPF_CORE_READ(task, cgroups, dfl_cgrp, kn, id);
	struct cgroup_subsys_state *css = probe_memory_css(task);
	return css ? BPF_CORE_READ(css, cgroup, kn, id) : 0;
}

/* Streams one OOM kill: the victim's size and cgroup, read before it exits, and the
 * cgroup whose limit was reached (0: the node's memory) with that limit in pages. */
static __always_inline void oom_emit(struct task_struct *victim, __u64 limit_cgid, __u64 limit_pages)
{
	struct rw_mem_sample *s = bpf_ringbuf_reserve(&rw_samples, sizeof(*s), 0);
	if (!s) {
		stat_inc(RW_STAT_SAMPLES_LOST);
		return;
	}
	struct rss r = {};
	struct mm_struct *mm = BPF_CORE_READ(victim, mm);
	if (mm)
		probe_rss(mm, &r);
	s->ts_ns = bpf_ktime_get_ns();
	s->cgroup_id = probe_task_cgroup_id(victim);
	s->file_pages = r.file;
	s->anon_pages = r.anon;
	s->swap_pages = r.swap;
	s->shmem_pages = r.shmem;
	s->tgid = BPF_CORE_READ(victim, tgid);
	s->kind = RW_SAMPLE_OOM_KILL;
	s->oom_cgroup_id = limit_cgid;
	s->oom_total_pages = limit_pages;
	bpf_probe_read_kernel_str(s->comm, sizeof(s->comm), victim->comm);
	bpf_ringbuf_submit(s, 0);
}

/*
 * An OOM kill, as it is decided: oom_kill_process() is where both the memory cgroup's OOM
 * (a container or pod at its limit) and the system-wide one end, with the victim chosen
 * and the cgroup whose limit was reached (NULL: the node ran out), as libbpf-tools'
 * oomkill reads them. With memory.oom.group (the kubelet sets it on cgroup v2) the rest
 * of the group is killed from inside this call: one record per OOM. Kernels built
 * without kprobes (this project's dev VM) get rw_mark_victim instead.
 */
SEC("kprobe/oom_kill_process")
int BPF_KPROBE(rw_oom_kill, struct oom_control *oc)
{
	struct task_struct *victim = BPF_CORE_READ(oc, chosen);
	if (!victim)
		return 0;
	struct mem_cgroup *memcg = BPF_CORE_READ(oc, memcg);
	oom_emit(victim, memcg ? BPF_CORE_READ(memcg, css.cgroup, kn, id) : 0,
		 BPF_CORE_READ(oc, totalpages));
	return 0;
}

/* A limit of this many pages or more is no limit (PAGE_COUNTER_MAX is 2^51 on 64-bit). */
#define RW_NO_LIMIT_PAGES (1ULL << 50)
/* A charge that fails may be a whole huge page: a cgroup whose usage is this close to its
 * limit when a victim is marked is the one whose limit was reached. */
#define RW_OOM_SLACK_PAGES 512

/*
 * The same from the oom:mark_victim tracepoint, where the kernel passes the victim's
 * task (6.8 on; before, only its pid, and this program does not load). The tracepoint
 * does not say which limit was reached: the victim's memory cgroup and its ancestors are
 * read, and the first one at its limit (within a huge page) is it; none: the node's
 * memory ran out. A container within 2 MiB of its own limit when the node runs out would
 * be taken for a cgroup OOM: the kprobe above has no such blind spot.
 */
SEC("tp_btf/mark_victim")
int BPF_PROG(rw_mark_victim, struct task_struct *victim)
{
	/* Before 6.8 the argument is a pid, never a kernel address: loaded there by mistake,
	 * this program stays silent. */
	if ((__u64)victim < 0xffff000000000000ULL || !BPF_CORE_READ(victim, tgid))
		return 0;
	struct cgroup_subsys_state *css = probe_memory_css(victim);
	for (int i = 0; i < 8 && css; i++) {
		struct mem_cgroup *memcg = (void *)css;
		__u64 usage = BPF_CORE_READ(memcg, memory.usage.counter);
		__u64 max = BPF_CORE_READ(memcg, memory.max);
		if (max < RW_NO_LIMIT_PAGES && usage + RW_OOM_SLACK_PAGES >= max) {
			oom_emit(victim, BPF_CORE_READ(css, cgroup, kn, id), max);
			return 0;
		}
		css = BPF_CORE_READ(css, parent);
	}
	oom_emit(victim, 0, 0);
	return 0;
}

#endif /* RW_MEM_BPF_H */
