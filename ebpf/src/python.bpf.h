// SPDX-License-Identifier: GPL-2.0-only
/*
 * CPython frames of a stack sample: the sampled thread's interpreter frames, read from
 * the process's memory at the moment of the sample (as py-spy does from outside, and
 * Pyroscope's pyperf from BPF). CPython 3.11 and later run Python-to-Python calls inside
 * one C call of _PyEval_EvalFrameDefault, so the native stack shows the evaluation loop
 * but never which Python functions it runs; this list names them.
 *
 * Only for the processes user space found to be CPython of a known layout and listed in
 * rw_py_procs (node-agent/src/stacks/python.rs); part of resourcewatch.bpf.c, included
 * before stacks.bpf.h, which calls python_frames() for each sample it sends.
 *
 * The walk: _PyRuntime -> the main interpreter -> its thread states (newest first, up to
 * RW_PY_THREADS), the one whose
 * thread_id (pthread_self()) is the sampled task's fs base -> its current frame -> the
 * `previous` chain. Every read is a bpf_probe_read_user that fails, and ends the walk, on
 * a page that is not resident or an address that is not mapped: a process that changed
 * under the walk (a thread exiting, a frame being popped) gives a shorter list, never a
 * fault. x86-64 only (the fs base is pthread_self() there).
 */
#ifndef RW_PYTHON_BPF_H
#define RW_PYTHON_BPF_H

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct rw_py_proc);
} rw_py_procs SEC(".maps");

/* One walk's state, per CPU. The walk's two loops are bpf_loop callbacks, which the
 * verifier checks once each: unrolled or bounded loops of this many steps with a
 * data-dependent frame count went past its million-instruction budget. */
struct rw_py_walk {
	struct rw_py_proc py;
	__u64 fsbase;
	__u64 tstate;
	__u64 found;
	__u64 frame;
	__u32 n;
	__u32 _pad0;
	__u64 frames[RW_PY_DEPTH];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rw_py_walk);
} rw_py_scratch SEC(".maps");

static __always_inline __u64 py_read_ptr(__u64 addr)
{
	__u64 v = 0;
	if (bpf_probe_read_user(&v, sizeof(v), (void *)addr))
		return 0;
	return v;
}

static __always_inline struct rw_py_walk *py_walk_state(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&rw_py_scratch, &zero);
}

/* One thread state: stops at the sampled thread's, or at the end of the list. */
static long py_find_thread(__u64 index, void *unused)
{
	struct rw_py_walk *w = py_walk_state();
	if (!w || !w->tstate)
		return 1;
	if (py_read_ptr(w->tstate + w->py.tstate_thread_id) == w->fsbase) {
		w->found = w->tstate;
		return 1;
	}
	w->tstate = py_read_ptr(w->tstate + w->py.tstate_next);
	return 0;
}

/* One frame of the chain, innermost first. */
static long py_step(__u64 index, void *unused)
{
	struct rw_py_walk *w = py_walk_state();
	if (!w || !w->frame)
		return 1;
	__u64 code = py_read_ptr(w->frame + w->py.frame_code);
	__u8 entry = 0;
	bpf_probe_read_user(&entry, sizeof(entry), (void *)(w->frame + w->py.frame_entry));
	if (w->py.entry_kind == RW_PY_ENTRY_SHIM && entry == RW_PY_OWNED_BY_CSTACK) {
		/* The C stack's shim below the frames one call of the loop ran: the frame
		 * before it was that call's outermost. */
		if (w->n)
			w->frames[(w->n - 1) & (RW_PY_DEPTH - 1)] |= RW_PY_ENTRY;
	} else if (code) {
		if (w->n >= RW_PY_DEPTH)
			return 1;
		if (w->py.entry_kind == RW_PY_ENTRY_FLAG && entry)
			code |= RW_PY_ENTRY;
		w->frames[w->n & (RW_PY_DEPTH - 1)] = code;
		w->n++;
	}
	w->frame = py_read_ptr(w->frame + w->py.frame_previous);
	return 0;
}

/*
 * Writes the current thread's Python frames, innermost first, to `out` (RW_PY_DEPTH
 * slots); returns how many. 0 when `tgid` is not a listed CPython process, or the thread
 * runs no Python code.
 */
static __always_inline __u32 python_frames(struct task_struct *task, __u32 tgid, __u64 *out)
{
#if defined(__TARGET_ARCH_x86)
	/* bpf_loop is Linux 5.17's: on an older kernel this is dead code the verifier drops
	 * (the relocation reads 0), and stacks keep their native frames. */
	if (!bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_loop))
		return 0;
	struct rw_py_proc *py = bpf_map_lookup_elem(&rw_py_procs, &tgid);
	struct rw_py_walk *w = py_walk_state();
	if (!py || !w)
		return 0;
	w->py = *py;
	w->fsbase = BPF_CORE_READ(task, thread.fsbase);
	__u64 interp = py_read_ptr(py->runtime + py->interp_main);
	if (!interp || !w->fsbase)
		return 0;
	w->tstate = py_read_ptr(interp + py->threads_head);
	w->found = 0;
	bpf_loop(RW_PY_THREADS, py_find_thread, NULL, 0);
	if (!w->found)
		return 0;
	__u64 frame = py_read_ptr(w->found + py->tstate_frame);
	if (frame && py->cframe_frame != RW_PY_NO_CFRAME)
		frame = py_read_ptr(frame + py->cframe_frame);
	w->frame = frame;
	w->n = 0;
	/* Twice the depth: 3.12+ shim frames take a step but no slot. */
	bpf_loop(2 * RW_PY_DEPTH, py_step, NULL, 0);
	__u32 n = w->n;
	if (!n)
		return 0;
	bpf_probe_read_kernel(out, RW_PY_DEPTH * sizeof(__u64), w->frames);
	return n;
#else
	return 0;
#endif
}

#endif /* RW_PYTHON_BPF_H */
