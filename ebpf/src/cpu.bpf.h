// SPDX-License-Identifier: GPL-2.0-only
/*
 * The CPU pipeline: on-CPU time per process from sched_switch.
 * Part of resourcewatch.bpf.c, the one object the agent loads (its programs share these
 * maps); included once, in order, from there.
 */
#ifndef RW_CPU_BPF_H
#define RW_CPU_BPF_H

/* ---- CPU pipeline ---------------------------------------------------------------------- */


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
		target_add_cpu(prev, tgid, slice);
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
		 * storing it. A task that became a target while on this CPU counts from then
		 * (rw_cpu_sync set target_from_ns): its slice before was not the target's. */
		__u64 before = oc->target_from_ns > oc->start_ns ? oc->target_from_ns - oc->start_ns : 0;
		if (oc->target && slice > before)
			target_add_cpu(prev, tgid, slice - before);
	} else if (prev->tgid) {
		credit_unseen_slice(ctl, oc, prev, epoch, now);
	}

	__u32 next_tgid = next->tgid;
	oc->start_ns = now;
	oc->target_from_ns = now;
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
		oc->target_from_ns = oc->start_ns;
		oc->credited_ns = 0;
		__u64 runtime = BPF_CORE_READ(cur, se.sum_exec_runtime);
		oc->start_runtime = runtime > ran ? runtime - ran : 0;
		oc->tgid = tgid;
		oc->pid = pid;
		oc->target = task_is_target(ctl->targets, tgid, cur);
		if (tgid)
			stat_inc(RW_STAT_SWITCH_IN_UNSEEN);
	} else if (oc->tgid) {
		/* Whether the running task is a target is re-read: it may have become one
		 * after it was switched in (targets just programmed, a busy loop that no switch
		 * interrupts). Its slot said "not a target" until its next switch, so user space
		 * counted none of that slice: a CPU-bound process targeted while on-CPU read
		 * 0.5 % busy for a whole interval. It counts from now: the part of its
		 * slice before it became one is not its target's. */
		__u32 target = task_is_target(ctl->targets, oc->tgid, cur);
		if (target && !oc->target)
			oc->target_from_ns = now;
		oc->target = target;
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

#endif /* RW_CPU_BPF_H */
