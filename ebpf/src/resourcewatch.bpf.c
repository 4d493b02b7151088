// SPDX-License-Identifier: GPL-2.0-only
/*
 * resourcewatch kernel pipelines:
 *   - CPU: on-CPU time per process from sched_switch into an epoch-double-buffered HashPipe;
 *   - memory: exact per-process RSS from rss_stat into a HashPipe of current RSS, plus a
 *     ring-buffer stream of samples when a process's RSS moved;
 *   - exact tracking of targeted PIDs / cgroups beside the sketches;
 *   - allocation mode: libc uprobes, a pointer -> size map, outstanding bytes per process;
 *   - stacks: CPU profiles of chosen processes (perf events) and the growth sites of
 *     leaking ones (rss_stat).
 *
 * The tracepoint programs are tp_btf (BTF-typed raw tracepoints): arguments are read with
 * plain loads instead of bpf_probe_read calls, and no perf record is built for the event.
 * That is what keeps the per-event cost low (see node-agent/BENCHMARKS.md).
 */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "kernel.h"
#include "resourcewatch.h"

char LICENSE[] SEC("license") = "GPL";

/*
 * One compilation unit, split by pipeline as Tetragon splits its programs by hook: the
 * programs share maps, and aya loads them from one object.
 */
#include "maps.bpf.h"
#include "hashpipe.bpf.h"
#include "targets.bpf.h"
#include "python.bpf.h"
#include "stacks.bpf.h"
#include "cpu.bpf.h"
#include "mem.bpf.h"
#include "alloc.bpf.h"
