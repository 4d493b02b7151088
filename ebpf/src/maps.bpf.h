// SPDX-License-Identifier: GPL-2.0-only
/*
 * The loader's configuration and every map the pipelines share, with the two helpers all of them use.
 * Part of resourcewatch.bpf.c, the one object the agent loads (its programs share these
 * maps); included once, in order, from there.
 */
#ifndef RW_MAPS_BPF_H
#define RW_MAPS_BPF_H

/* Set by the loader before the verifier runs (EbpfLoader::set_global); read-only after. */
const volatile struct rw_config rw_config = {
	.cpu_depth = 4,
	.cpu_width_shift = 10,
	.mem_depth = 4,
	.mem_width_shift = 10,
	.cgroup_v1_memory = 0,
	.page_shift = 12,
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct rw_control);
} rw_control SEC(".maps");

/* Two halves (epochs) of cpu_depth x 2^cpu_width_shift words; resized by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * 4 * 1024);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
} rw_cpu_sketch SEC(".maps");

/* mem_depth x 2^mem_width_shift words of (tgid, resident pages); resized by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4 * 1024);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u64);
} rw_mem_sketch SEC(".maps");

/* Indexed by CPU id; resized by the loader to the number of possible CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct rw_oncpu);
} rw_oncpu SEC(".maps");

/*
 * Preallocated maps are charged in full whatever they hold, so their sizes are what a node
 * needs: a few hundred targeted containers, a few thousand of their processes.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u8);
} rw_target_pids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 512);
	__type(key, __u64);
	__type(value, __u8);
} rw_target_cgroups SEC(".maps");

/* Every process of every targeted container (1.1 MiB); see struct rw_target_slot. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << RW_TARGET_SLOTS_SHIFT);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct rw_target_slot);
} rw_target_slots SEC(".maps");

/*
 * Where a targeted process goes when its probe window in rw_target_slots is full: 16,384
 * entries (about 2 MiB charged), so even a table full of collisions loses nothing. At 2,048, a
 * node with 200 targeted containers and 5,000 processes in them (resourcewatch-bench
 * compare) lost the exact figures of 3,000 of them, and each of their events paid a failed
 * insert into the full map: 700 ns per sched_switch against 150 ns without targets.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct rw_target_proc);
} rw_target_procs SEC(".maps");

/*
 * The sample filter's state is a cache: LRU, so a node with more memory-active processes
 * than entries evicts the idlest, whose next event simply starts a fresh state (and emits
 * a sample) instead of being refused.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct rw_proc_mem);
} rw_proc_mem SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} rw_samples SEC(".maps");

/* One zeroed rw_proc_mem per CPU, to build a new entry off the stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rw_proc_mem);
} rw_scratch SEC(".maps");

/* Counters for the agent's health report; indexes are RW_STAT_* (resourcewatch.h). */

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RW_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} rw_stats SEC(".maps");

/* Allocation mode maps; the loader shrinks them to one entry when the mode is off. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct rw_alloc_pending);
} rw_alloc_pending SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct rw_alloc_key);
	__type(value, __u64);
} rw_alloc_ptrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct rw_alloc_stats);
} rw_alloc_stats SEC(".maps");

static __always_inline void stat_inc(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&rw_stats, &idx);
	if (v)
		*v += 1;
}

static __always_inline struct rw_control *control(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&rw_control, &zero);
}

#endif /* RW_MAPS_BPF_H */
