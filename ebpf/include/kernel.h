/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * The few kernel types the programs read, declared by hand instead of a 130k-line
 * vmlinux.h. Only the fields we touch are listed; preserve_access_index makes clang emit
 * CO-RE relocations, so the loader fixes every offset against the running kernel's BTF.
 */
#ifndef RESOURCEWATCH_KERNEL_H
#define RESOURCEWATCH_KERNEL_H

#include <linux/types.h>

typedef __s64 s64;
typedef __u64 u64;
typedef _Bool bool;

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

typedef struct {
	int counter;
} atomic_t;

typedef struct {
	long counter;
} atomic_long_t;

struct kernfs_node {
	u64 id;
};

struct cgroup {
	struct kernfs_node *kn;
};

struct cgroup_subsys_state {
	struct cgroup *cgroup;
	struct cgroup_subsys_state *parent;
};

struct css_set {
	struct cgroup_subsys_state *subsys[12];
	struct cgroup *dfl_cgrp;
};

/* Since 6.2 each RSS counter is a percpu_counter; count is what get_mm_counter() reads,
 * `counters` the per-CPU deltas not yet folded into it (a percpu address). */
struct percpu_counter {
	s64 count;
	void *counters;
};

/* kernel/bpf/arraymap.c: a per-CPU array's per-CPU values start right after `aux`, in an
 * 8-aligned union with a percpu address per entry (mem.bpf.h, resident_exact). */
struct bpf_array {
	void *aux;
};

struct mm_struct {
	struct percpu_counter rss_stat[4];
	struct task_struct *owner;
	unsigned long start_stack;
};

/* Before 6.2: struct mm_rss_stat { atomic_long_t count[NR_MM_COUNTERS]; }. */
struct mm_rss_stat {
	atomic_long_t count[4];
};

struct mm_struct___pre62 {
	struct mm_rss_stat rss_stat;
	struct task_struct *owner;
};

/* Before 6.2 (SPLIT_RSS_COUNTING): the page faults a thread has not yet added to its mm's
 * counters, and how many events since it last did (it does at 64). */
struct task_rss_stat {
	int events;
	int count[4];
};

struct task_struct___pre62 {
	struct task_rss_stat rss_stat;
	struct mm_struct *mm;
};

struct signal_struct {
	atomic_t live;
};

struct sched_entity {
	u64 exec_start;
	u64 sum_exec_runtime;
	u64 prev_sum_exec_runtime; /* sum_exec_runtime when the task was last picked */
};

/* x86-64: the user fs base, which glibc and musl point at the thread's own pthread
 * struct (so it is pthread_self()); set by clone(CLONE_SETTLS) or arch_prctl. */
struct thread_struct {
	unsigned long fsbase;
};

struct task_struct {
	struct sched_entity se;
	int pid;
	int tgid;
	char comm[16];
	struct css_set *cgroups;
	struct signal_struct *signal;
	struct mm_struct *mm;
	struct thread_struct thread;
};

/* include/linux/page_counter.h, in pages. */
struct page_counter {
	atomic_long_t usage;
	unsigned long max;
};

/* include/linux/memcontrol.h: the memory cgroup's state begins with its css. */
struct mem_cgroup {
	struct cgroup_subsys_state css;
	struct page_counter memory;
};

/* include/linux/oom.h: what oom_kill_process() is given. memcg is NULL for a system-wide
 * OOM (and for sysrq-f); totalpages is the memcg's limit or the node's RAM + swap. */
struct oom_control {
	struct mem_cgroup *memcg;
	unsigned long totalpages;
	struct task_struct *chosen;
};

#pragma clang attribute pop

/* Its values depend on the kernel's config; read with bpf_core_enum_value(). */
enum cgroup_subsys_id {
	memory_cgrp_id = 4,
};

/* enum mm counter members, as in include/linux/mm_types_task.h */
enum {
	MM_FILEPAGES = 0,
	MM_ANONPAGES = 1,
	MM_SWAPENTS = 2,
	MM_SHMEMPAGES = 3,
};

#endif
