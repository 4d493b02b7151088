// SPDX-License-Identifier: GPL-2.0-only
/*
 * HashPipe: the Top-K sketches of CPU time and resident memory.
 * Part of resourcewatch.bpf.c, the one object the agent loads (its programs share these
 * maps); included once, in order, from there.
 */
#ifndef RW_HASHPIPE_BPF_H
#define RW_HASHPIPE_BPF_H

/* ---- HashPipe ------------------------------------------------------------------------ */

#define KEY_OF(w) ((__u32)((w) >> RW_VALUE_BITS))
#define VAL_OF(w) ((w) & RW_VALUE_MASK)
#define PACK(k, v) (((__u64)(k) << RW_VALUE_BITS) | ((v) & RW_VALUE_MASK))

/*
 * Stage s hashes with its own odd multiplier (Fibonacci hashing): consecutive PIDs, the
 * common case, spread over the whole stage, and the stages are independent. Multipliers
 * are computed rather than tabled so the program needs no extra read-only section. The
 * user-space model (node-agent/src/hashpipe.rs) uses the same formula and multipliers
 * (RW_HASH_BASE, RW_HASH_STEP in resourcewatch.h, checked against their Rust mirror).
 */

static __always_inline __u32 hp_index(__u32 stage, __u32 key, __u32 shift)
{
	__u32 h = key * (RW_HASH_BASE + stage * RW_HASH_STEP);
	return h >> (32 - shift);
}

/*
 * Pushes (key, val) through the stages of one sketch copy starting at slot `base`. Stage 0
 * always inserts and kicks its occupant on; later stages keep the larger of occupant and
 * carried entry and pass the smaller on; what falls off the last stage is dropped (it is
 * the smallest seen on that path). With `add_on_match`, a stage already holding the key
 * adds to it (CPU time is a sum); without, the caller has already looked for the key.
 */
static __always_inline void hp_push(void *map, __u32 base, __u32 depth, __u32 shift, __u32 key, __u64 val,
				    bool add_on_match)
{
	const __u32 width = 1u << shift;
	__u32 ckey = key;
	__u64 cval = val;

#pragma clang loop unroll(disable)
	for (__u32 s = 0; s < RW_MAX_DEPTH; s++) {
		if (s >= depth)
			break;
		__u32 idx = base + s * width + hp_index(s, ckey, shift);
		__u64 *slot = bpf_map_lookup_elem(map, &idx);
		if (!slot)
			return;
		__u64 w = *slot;
		if (add_on_match && KEY_OF(w) == ckey) {
			__sync_fetch_and_add(slot, cval);
			return;
		}
		if (s == 0) {
			__u64 old = __sync_lock_test_and_set(slot, PACK(ckey, cval));
			if (old == 0)
				return;
			ckey = KEY_OF(old);
			cval = VAL_OF(old);
			continue;
		}
		if (w == 0) {
			if (__sync_val_compare_and_swap(slot, 0, PACK(ckey, cval)) == 0)
				return;
			continue;
		}
		if (VAL_OF(w) < cval &&
		    __sync_val_compare_and_swap(slot, w, PACK(ckey, cval)) == w) {
			ckey = KEY_OF(w);
			cval = VAL_OF(w);
		}
	}
}

/* Add delta to key in the CPU sketch half `half`; a key may sit in several stages, and
 * readers sum them. */
static __always_inline void cpu_sketch_add(__u32 half, __u32 key, __u64 delta)
{
	const __u32 depth = rw_config.cpu_depth;
	const __u32 shift = rw_config.cpu_width_shift;
	hp_push(&rw_cpu_sketch, (half * depth) << shift, depth, shift, key, delta, 1);
}

/*
 * Set key's current resident pages in the memory sketch; returns the previous value, or
 * -1 if key was not in the sketch. RSS is a level, not a sum, so the key is looked for in
 * every stage first: updating it in place keeps one copy per key, and a copy's value is
 * never stale because every RSS change fires rss_stat. A value of 0 (process exiting)
 * removes the key.
 */
static __always_inline __s64 mem_sketch_set(__u32 key, __u64 pages)
{
	const __u32 depth = rw_config.mem_depth;
	const __u32 shift = rw_config.mem_width_shift;
	const __u32 width = 1u << shift;

#pragma clang loop unroll(disable)
	for (__u32 s = 0; s < RW_MAX_DEPTH; s++) {
		if (s >= depth)
			break;
		__u32 idx = s * width + hp_index(s, key, shift);
		__u64 *slot = bpf_map_lookup_elem(&rw_mem_sketch, &idx);
		if (!slot)
			return -1;
		__u64 w = *slot;
		if (KEY_OF(w) == key) {
			if (pages == 0)
				__sync_val_compare_and_swap(slot, w, 0);
			else
				*slot = PACK(key, pages);
			return VAL_OF(w);
		}
	}
	if (pages != 0)
		hp_push(&rw_mem_sketch, 0, depth, shift, key, pages, 0);
	return -1;
}

#endif /* RW_HASHPIPE_BPF_H */
