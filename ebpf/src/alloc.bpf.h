// SPDX-License-Identifier: GPL-2.0-only
/*
 * Allocation mode: libc uprobes, a pointer -> size map, outstanding bytes per process.
 * Part of resourcewatch.bpf.c, the one object the agent loads (its programs share these
 * maps); included once, in order, from there.
 */
#ifndef RW_ALLOC_BPF_H
#define RW_ALLOC_BPF_H

/* ---- allocation mode (uprobes on libc, attached per target PID) ------------------------- */

/*
 * glibc's malloc calls mmap itself for large blocks, and both sit at probed addresses. A
 * call that starts while another is pending on the same thread is the allocator's own
 * work: it is skipped (BPF_NOEXIST), and each return probe only completes its own kind,
 * so a block is counted once, as the size the application asked for.
 */
static __always_inline void alloc_enter(__u64 size, __u64 old_ptr, __u32 kind)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct rw_alloc_pending p = { .size = size, .old_ptr = old_ptr, .kind = kind };
	bpf_map_update_elem(&rw_alloc_pending, &id, &p, BPF_NOEXIST);
}

static __always_inline struct rw_alloc_stats *alloc_stats(__u32 tgid)
{
	struct rw_alloc_stats *st = bpf_map_lookup_elem(&rw_alloc_stats, &tgid);
	if (st)
		return st;
	struct rw_alloc_stats fresh = {};
	bpf_map_update_elem(&rw_alloc_stats, &tgid, &fresh, BPF_NOEXIST);
	return bpf_map_lookup_elem(&rw_alloc_stats, &tgid);
}

static __always_inline void forget_ptr(__u32 tgid, __u64 ptr, struct rw_alloc_stats *st)
{
	struct rw_alloc_key k = { .tgid = tgid, .ptr = ptr };
	__u64 *size = bpf_map_lookup_elem(&rw_alloc_ptrs, &k);
	if (!size) {
		__sync_fetch_and_add(&st->unknown_frees, 1);
		return;
	}
	__sync_fetch_and_sub(&st->outstanding_bytes, *size);
	__sync_fetch_and_add(&st->frees, 1);
	bpf_map_delete_elem(&rw_alloc_ptrs, &k);
}

static __always_inline void alloc_exit(__u64 ptr, __u32 kind)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	struct rw_alloc_pending *p = bpf_map_lookup_elem(&rw_alloc_pending, &id);
	if (!p || p->kind != kind)
		return;
	bool is_mmap = kind == RW_ALLOC_MMAP;
	__u64 size = p->size, old_ptr = p->old_ptr;
	bpf_map_delete_elem(&rw_alloc_pending, &id);

	bool failed = is_mmap ? (ptr == (__u64)-1) : (ptr == 0);
	struct rw_alloc_stats *st = alloc_stats(tgid);
	if (!st)
		return;
	/* realloc: the old block is released only if the call succeeded (or size was 0). */
	if (old_ptr && (!failed || size == 0))
		forget_ptr(tgid, old_ptr, st);
	if (failed || size == 0)
		return;
	struct rw_alloc_key k = { .tgid = tgid, .ptr = ptr };
	if (bpf_map_update_elem(&rw_alloc_ptrs, &k, &size, BPF_ANY)) {
		stat_inc(RW_STAT_ALLOC_PTRS_FULL);
		return;
	}
	__sync_fetch_and_add(&st->outstanding_bytes, size);
	__sync_fetch_and_add(&st->allocs, 1);
}

SEC("uprobe")
int BPF_KPROBE(rw_malloc_enter, __u64 size) { alloc_enter(size, 0, RW_ALLOC_HEAP); return 0; }

SEC("uprobe")
int BPF_KPROBE(rw_calloc_enter, __u64 n, __u64 size) { alloc_enter(n * size, 0, RW_ALLOC_HEAP); return 0; }

SEC("uprobe")
int BPF_KPROBE(rw_realloc_enter, __u64 ptr, __u64 size) { alloc_enter(size, ptr, RW_ALLOC_HEAP); return 0; }

SEC("uprobe")
int BPF_KPROBE(rw_mmap_enter, __u64 addr, __u64 len) { alloc_enter(len, 0, RW_ALLOC_MMAP); return 0; }

SEC("uretprobe")
int BPF_KRETPROBE(rw_alloc_return, __u64 ptr) { alloc_exit(ptr, RW_ALLOC_HEAP); return 0; }

SEC("uretprobe")
int BPF_KRETPROBE(rw_mmap_return, __u64 ptr) { alloc_exit(ptr, RW_ALLOC_MMAP); return 0; }

SEC("uprobe")
int BPF_KPROBE(rw_free_enter, __u64 ptr)
{
	if (!ptr)
		return 0;
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct rw_alloc_stats *st = alloc_stats(tgid);
	if (st)
		forget_ptr(tgid, ptr, st);
	return 0;
}

/* munmap may release part of a mapping; we account the whole mapping at its start
 * address, the common case for allocators that unmap what they mapped. */
SEC("uprobe")
int BPF_KPROBE(rw_munmap_enter, __u64 addr, __u64 len)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct rw_alloc_key k = { .tgid = tgid, .ptr = addr };
	if (!bpf_map_lookup_elem(&rw_alloc_ptrs, &k))
		return 0;
	struct rw_alloc_stats *st = alloc_stats(tgid);
	if (st)
		forget_ptr(tgid, addr, st);
	return 0;
}

#endif /* RW_ALLOC_BPF_H */
