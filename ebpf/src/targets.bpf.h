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

#endif /* RW_TARGETS_BPF_H */
