// SPDX-License-Identifier: GPL-2.0-only
/*
 * Cgroup ids and the exact tracking of targeted processes and cgroups.
 * Part of resourcewatch.bpf.c, the one object the agent loads (its programs share these
 * maps); included once, in order, from there.
 */
#ifndef RW_TARGETS_BPF_H
#define RW_TARGETS_BPF_H

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

static __always_inline __u32 target_home(__u32 tgid)
{
	return (tgid * RW_HASH_BASE) >> (32 - RW_TARGET_SLOTS_SHIFT);
}

/*
 * The slot holding tgid, or 0. The whole window is searched (a slot before the process's
 * may have been freed since it claimed a later one); *free gets the first free slot seen.
 */
static __always_inline struct rw_target_slot *target_find(__u32 tgid, __u32 *free)
{
	__u32 home = target_home(tgid);
	*free = (__u32)-1;
#pragma unroll
	for (__u32 i = 0; i < RW_TARGET_PROBES; i++) {
		__u32 idx = (home + i) & ((1u << RW_TARGET_SLOTS_SHIFT) - 1);
		struct rw_target_slot *s = bpf_map_lookup_elem(&rw_target_slots, &idx);
		if (!s)
			return 0;
		__u32 key = *(volatile __u32 *)&s->tgid;
		if (key == tgid)
			return s;
		if (!key && *free == (__u32)-1)
			*free = idx;
	}
	return 0;
}

/* Counters of a tracked process wherever they live (a slot, or the spill map), or 0. */
static __always_inline struct rw_target_proc *target_lookup(__u32 tgid)
{
	__u32 free;
	struct rw_target_slot *s = target_find(tgid, &free);
	if (s)
		return &s->v;
	return bpf_map_lookup_elem(&rw_target_procs, &tgid);
}

static __always_inline struct rw_target_proc *target_spill(__u32 tgid, __u64 cgroup_id)
{
	struct rw_target_proc *tp = bpf_map_lookup_elem(&rw_target_procs, &tgid);
	if (tp)
		return tp;
	stat_inc(RW_STAT_TARGETS_SPILLED);
	struct rw_target_proc fresh = { .cgroup_id = cgroup_id };
	/* Fails if another CPU inserted it first (fine) or the map is full (counted below). */
	bpf_map_update_elem(&rw_target_procs, &tgid, &fresh, BPF_NOEXIST);
	tp = bpf_map_lookup_elem(&rw_target_procs, &tgid);
	if (!tp)
		stat_inc(RW_STAT_TARGETS_FULL);
	return tp;
}

/*
 * The counters of a tracked process, created on its first event. A free slot is claimed
 * by compare-and-swap; user space zeroes a slot's counters before it frees it, so a claim
 * starts from zero. A process that spilled once stays in the spill map.
 */
static __always_inline struct rw_target_proc *target_entry(__u32 tgid, __u64 cgroup_id)
{
	__u32 free;
	struct rw_target_slot *s = target_find(tgid, &free);
	if (s)
		return &s->v;
	struct rw_target_proc *tp = bpf_map_lookup_elem(&rw_target_procs, &tgid);
	if (tp)
		return tp;
	if (free != (__u32)-1) {
		s = bpf_map_lookup_elem(&rw_target_slots, &free);
		if (s) {
			__u32 was = __sync_val_compare_and_swap(&s->tgid, 0, tgid);
			/* Lost the race to another CPU handling the same process: same slot. */
			if (!was || was == tgid) {
				if (!was && cgroup_id)
					s->v.cgroup_id = cgroup_id;
				return &s->v;
			}
		}
	}
	return target_spill(tgid, cgroup_id);
}

/* Whether the task is exactly tracked, by its process or its cgroup. */
static __always_inline bool task_is_target(__u32 targets, __u32 tgid, struct task_struct *task)
{
	return targets && tgid &&
	       is_target(targets, tgid, (targets & RW_TARGET_CGROUPS) ? task_cgroup_id(task) : 0);
}

/*
 * Exact targets are cumulative: a slice is added whole. A process's last thread switches
 * out for the last time after the exit tracepoint ran; when that switch creates the entry
 * (a process whose only run was its exit), it is marked exited here, or nothing would
 * ever free it.
 */
static __always_inline void target_add_cpu(struct task_struct *task, __u32 tgid, __u64 ns)
{
	struct rw_target_proc *tp = target_entry(tgid, 0);
	if (!tp)
		return;
	__sync_fetch_and_add(&tp->cpu_ns, ns);
	struct signal_struct *sig = task->signal;
	if (sig && sig->live.counter == 0)
		tp->exited = 1;
}

#endif /* RW_TARGETS_BPF_H */
