// SPDX-License-Identifier: GPL-2.0-only
/*
 * Empty programs on the same tracepoints, for benchmarks only: what kernel.bpf_stats
 * reports for them is the measurement's own cost on this machine (two clock reads and the
 * dispatch), the floor under every per-event figure in node-agent/BENCHMARKS.md.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

SEC("tp_btf/sched_switch")
int BPF_PROG(floor_sched_switch) { return 0; }

SEC("tp_btf/rss_stat")
int BPF_PROG(floor_rss_stat) { return 0; }
