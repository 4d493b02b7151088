//! Stacks captured in the kernel (`ebpf/src/stacks.bpf.h`): CPU profiles and leak growth
//! sites. Reading them out of the maps, naming their frames, and the formats people
//! already use (folded stacks, pprof, an SVG flame graph).

pub mod elf;
pub mod jvm;
pub mod maps;
pub mod output;
pub mod perfmap;
pub mod python;
pub mod symbolize;
pub mod unwind;

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
};

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData, RingBuf, StackTraceMap},
};
use resourcewatch_ebpf::shared::{self, RwSiteRevoke, RwStackKey, RwStackSample};
use serde::Serialize;

use crate::bpf::PipelineError;
use perfmap::PerfMap;
pub use symbolize::{Module, Symbolizer};

/// One counter of the kernel: a process's user and kernel stacks (innermost first, as
/// the kernel walked them) and its count (samples, or bytes of growth).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawStack {
    pub tgid: u32,
    pub user: Vec<u64>,
    pub kernel: Vec<u64>,
    /// The return address on top of the user stack, if one was found (see stacks.bpf.h).
    pub caller: u64,
    pub value: u64,
}

/// A named stack, root first, and its count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Stack {
    pub tgid: u32,
    /// The process's name when the stack was named (also its first frame then).
    pub comm: Option<String>,
    pub frames: Vec<String>,
    /// The file each frame was found in, beside `frames` (pprof's mappings); empty when
    /// not known, None for a frame in no file (the command, interpreted or JIT code).
    #[serde(skip)]
    pub modules: Vec<Option<Arc<Module>>>,
    /// How many of `frames`, from the end, are kernel frames.
    pub kernel_frames: usize,
    pub value: u64,
}

/// Reads every counter of `counts` with its stacks from `stacks`, then empties both.
pub(crate) fn drain(
    bpf: &mut Ebpf,
    counts: &'static str,
    stacks: &'static str,
) -> Result<Vec<RawStack>, PipelineError> {
    let mut map: BpfHashMap<_, RwStackKey, u64> = BpfHashMap::try_from(
        bpf.map_mut(counts)
            .ok_or(PipelineError::MissingMap(counts))?,
    )
    .map_err(crate::bpf::map_err(counts))?;
    let entries: Vec<(RwStackKey, u64)> = map.iter().filter_map(Result::ok).collect();
    for (k, _) in &entries {
        let _ = map.remove(k);
    }
    let mut traces: StackTraceMap<_> = StackTraceMap::try_from(
        bpf.map_mut(stacks)
            .ok_or(PipelineError::MissingMap(stacks))?,
    )
    .map_err(crate::bpf::map_err(stacks))?;
    let frames = |id: i32| trace(&traces, id);
    let out = entries
        .iter()
        .map(|(k, v)| RawStack {
            tgid: k.tgid,
            user: frames(k.user_stack),
            kernel: frames(k.kernel_stack),
            caller: k.caller,
            value: *v,
        })
        .collect();
    let ids: Vec<u32> = traces.stack_ids().filter_map(Result::ok).collect();
    for id in ids {
        let _ = traces.remove(&id);
    }
    Ok(out)
}

/// The addresses of stack `id` in `traces`, innermost first (none for an id < 0: no stack
/// was taken).
fn trace<T: std::borrow::Borrow<aya::maps::MapData>>(
    traces: &StackTraceMap<T>,
    id: i32,
) -> Vec<u64> {
    if id < 0 {
        return Vec::new();
    }
    traces
        .get(&(id as u32), 0)
        .map(|t| t.frames().iter().map(|f| f.ip).collect())
        .unwrap_or_default()
}

/// What the stack pipelines learn of the processes they sample: CPython processes listed
/// for the kernel's frame walk, JVMs asked for perf maps.
pub struct Runtimes {
    pub python: python::Registry,
    jvm: jvm::PerfMapRequests,
}

impl Runtimes {
    /// Holds the `rw_py_procs` map of a loaded object.
    pub fn take(bpf: &mut Ebpf) -> Result<Self, PipelineError> {
        Ok(Self {
            python: python::Registry::take(bpf)?,
            jvm: jvm::PerfMapRequests::default(),
        })
    }

    /// Process `pid` is sampled, or about to be: looked at once (and a JVM asked again
    /// every few seconds); its CPython runtime, if it is one.
    pub fn seen(&mut self, pid: u32) -> Option<std::sync::Arc<python::Runtime>> {
        self.jvm.seen(pid);
        self.python.runtime(pid)
    }

    /// As [`Self::seen`], waiting up to `within` for the CPython detection (a profile's
    /// named processes; never the engine).
    pub fn seen_within(
        &mut self,
        pid: u32,
        within: std::time::Duration,
    ) -> Option<std::sync::Arc<python::Runtime>> {
        self.jvm.seen(pid);
        self.python.runtime_within(pid, within)
    }

    /// Keeps the perf maps JVMs answer, for [`Self::jvm_maps`] (a profile, named after it
    /// ends).
    pub fn keep_jvm_maps(&mut self) {
        self.jvm.keep_answers();
    }

    /// The capture ended: the perf maps of the JVMs it sampled, each asked once more
    /// within `within` and laid over what they answered during the capture.
    pub fn jvm_maps(&mut self, within: std::time::Duration) -> HashMap<u32, Arc<PerfMap>> {
        self.jvm.finish(within)
    }

    /// Forgets every process (a capture ended: PIDs may be reused before the next).
    pub fn clear(&mut self) {
        self.python.clear();
        self.jvm.clear();
    }
}

/// Walked stack samples merged: (process, user frames, kernel frames, caller) -> figure.
pub type Walked = HashMap<WalkedKey, u64>;
/// (process, user frames, kernel frames, caller).
pub type WalkedKey = (u32, Vec<u64>, Vec<u64>, u64);

/// Growth-site samples the kernel can still revoke (stacks.bpf.h, `record_growth_site`:
/// growth given back to the kernel is taken off the sample that was charged with it),
/// per process, oldest first: each one's number, the stack its bytes went to and how many
/// are left. As many per process as the kernel keeps revocable.
#[derive(Default)]
pub struct Revocable {
    recent: HashMap<u32, VecDeque<(u32, WalkedKey, u64)>>,
    /// Bytes revoked from stacks already handed out by a drain: the next drain's user
    /// takes them off what it added up.
    revoked: Walked,
}

impl Revocable {
    fn charged(&mut self, tgid: u32, seq: u32, key: WalkedKey, bytes: u64) {
        let recent = self.recent.entry(tgid).or_default();
        if recent.len() >= shared::SITE_KEPT {
            recent.pop_front();
        }
        recent.push_back((seq, key, bytes));
    }

    /// Takes `bytes` of sample `seq` of `tgid` off its stack in `into`, or off what was
    /// handed out already. A sample never seen (lost to a full ring, or from before the
    /// capture) has nothing to take back.
    fn revoke(&mut self, tgid: u32, seq: u32, bytes: u64, into: &mut Walked) {
        let Some(recent) = self.recent.get_mut(&tgid) else {
            return;
        };
        let Some(at) = recent.iter().rposition(|(s, _, _)| *s == seq) else {
            return;
        };
        let (_, key, left) = &mut recent[at];
        let take = bytes.min(*left);
        *left -= take;
        let key = key.clone();
        if *left == 0 {
            recent.remove(at);
        }
        let mut rest = take;
        if let Some(v) = into.get_mut(&key) {
            let here = rest.min(*v);
            *v -= here;
            rest -= here;
            if *v == 0 {
                into.remove(&key);
            }
        }
        if rest > 0 {
            *self.revoked.entry(key).or_default() += rest;
        }
    }

    /// Bytes revoked from stacks a drain already handed out, as raw stacks to subtract.
    pub fn take_revoked(&mut self) -> Vec<RawStack> {
        sampled(std::mem::take(&mut self.revoked))
    }

    /// Forgets `tgid`'s samples (its capture ended).
    pub fn forget(&mut self, tgid: u32) {
        self.recent.remove(&tgid);
    }
}

/// One item of the stack-sample ring, held in order per process until its tables are
/// ready (`unwind::Held`): a sample with the kernel's walks of it (read at once, before
/// [`drain`] empties the stack-trace map), or a revocation.
pub(crate) enum RingItem {
    Sample {
        s: Box<RwStackSample>,
        fp: Vec<u64>,
        kernel: Vec<u64>,
    },
    Revoke {
        seq: u32,
        bytes: u64,
    },
}

/// Reads every stack sample waiting in `ring` (stacks.bpf.h's copies of user stacks) and
/// walks those whose process's tables are ready with `unwinder` (the others are held, in
/// order, until theirs are, or for at most `unwind::HOLD_FOR`), adding each to `into`
/// (merged with equal stacks). Each walk is stitched to the sample's frame-pointer walk,
/// read with its kernel stack from the stack-trace map `stacks`: call this before
/// [`drain`] empties that map. The CPython frames the kernel read go in where their
/// evaluation loop is (`runtimes`). Never waits for the reader.
pub(crate) fn read_samples(
    ring: &mut RingBuf<MapData>,
    bpf: &Ebpf,
    stacks: &'static str,
    unwinder: &mut unwind::Unwinder,
    runtimes: &mut Runtimes,
    into: &mut Walked,
    revocable: Option<&mut Revocable>,
) -> Result<(), PipelineError> {
    let traces: StackTraceMap<_> =
        StackTraceMap::try_from(bpf.map(stacks).ok_or(PipelineError::MissingMap(stacks))?)
            .map_err(crate::bpf::map_err(stacks))?;
    let frames = |id: i32| trace(&traces, id);
    while let Some(item) = ring.next() {
        if item.len() == std::mem::size_of::<RwSiteRevoke>() {
            // SAFETY: as below, a whole plain-old-data rw_site_revoke.
            let r: RwSiteRevoke = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            drop(item);
            if r.kind == shared::STACK_SAMPLE_REVOKE {
                unwinder.held.push(
                    r.tgid,
                    RingItem::Revoke {
                        seq: r.seq,
                        bytes: r.bytes,
                    },
                );
            }
            continue;
        }
        if item.len() < std::mem::size_of::<RwStackSample>() {
            continue;
        }
        // SAFETY: the item holds a whole rw_stack_sample (checked above), a plain-old-data
        // struct that any bytes are valid for; read unaligned as the ring gives 8-byte
        // alignment only.
        let s: Box<RwStackSample> =
            Box::new(unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) });
        drop(item);
        // Asked for when new (or its mappings changed); never waited for.
        unwinder.refresh(s.tgid, s.ip);
        let (fp, kernel) = (frames(s.user_stack), frames(s.kernel_stack));
        unwinder
            .held
            .push(s.tgid, RingItem::Sample { s, fp, kernel });
    }
    settle(unwinder, runtimes, into, revocable, false);
    Ok(())
}

/// Walks the held items of processes whose tables are ready (every one when `all`), in
/// order, into `into`.
pub(crate) fn settle(
    unwinder: &mut unwind::Unwinder,
    runtimes: &mut Runtimes,
    into: &mut Walked,
    mut revocable: Option<&mut Revocable>,
    all: bool,
) {
    let mut held = std::mem::take(&mut unwinder.held);
    let items = held.release(all, |pid| {
        unwinder.refresh(pid, 0) == unwind::Readiness::Ready
    });
    unwinder.held = held;
    for (tgid, item) in items {
        let (s, fp, kernel) = match item {
            RingItem::Revoke { seq, bytes } => {
                if let Some(rv) = revocable.as_deref_mut() {
                    rv.revoke(tgid, seq, bytes, into);
                }
                continue;
            }
            RingItem::Sample { s, fp, kernel } => (s, fp, kernel),
        };
        let len = (s.stack_len as usize).min(s.stack.len());
        let walk = unwinder.walk(s.tgid, s.ip, s.sp, s.bp, &s.stack[..len]);
        let mut user = unwind::stitch(&walk, &fp);
        // Every sampled process is looked at once: a CPython one is listed for the
        // kernel's frame walk from then on (its first samples have native frames only),
        // a JVM asked for its perf map.
        if let Some(rt) = runtimes.seen(s.tgid)
            && s.py_len > 0
        {
            let n = (s.py_len as usize).min(s.py_frames.len());
            user = python::merge(&user, &s.py_frames[..n], &rt.eval);
        }
        // A walk that reached the root has every caller; the return address found on top
        // of the stack is only for walks that stopped early.
        let caller = if walk.complete { 0 } else { s.caller };
        let key = (s.tgid, user, kernel, caller);
        if s.seq != 0
            && let Some(rv) = revocable.as_deref_mut()
        {
            rv.charged(s.tgid, s.seq, key.clone(), s.value);
        }
        *into.entry(key).or_default() += s.value;
    }
}

/// Stacks read by [`read_samples`], as raw stacks.
pub(crate) fn sampled(into: Walked) -> Vec<RawStack> {
    into.into_iter()
        .map(|((tgid, user, kernel, caller), value)| RawStack {
            tgid,
            user,
            kernel,
            caller,
            value,
        })
        .collect()
}

/// Names every frame, and merges stacks that name the same frames. Sorted by value, then
/// by frames. The root frame is the process's command when `comm` gives one.
pub fn name(
    raw: &[RawStack],
    sym: &Symbolizer,
    comm: impl Fn(u32) -> Option<String>,
) -> Vec<Stack> {
    // Stacks naming the same frames merge; the files of the first one are kept.
    type Key = (u32, Vec<String>, usize);
    type Files = Vec<Option<Arc<Module>>>;
    let mut merged: HashMap<Key, (u64, Files)> = HashMap::new();
    let mut comms: HashMap<u32, Option<String>> = HashMap::new();
    for r in raw {
        let mut frames: Vec<String> = Vec::new();
        let mut modules: Files = Vec::new();
        if let Some(c) = comms.entry(r.tgid).or_insert_with(|| comm(r.tgid)) {
            frames.push(c.clone());
            modules.push(None);
        }
        // The demanglers and parsers read names a workload chose: a panic in one costs
        // that stack its user frames, not the agent.
        let user = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| user_frames(r, sym)))
            .unwrap_or_else(|_| vec![(symbolize::UNKNOWN.to_owned(), None); r.user.len()]);
        for (name, module) in user.into_iter().rev() {
            frames.push(name);
            modules.push(module);
        }
        let kernel = if r.kernel.is_empty() {
            Vec::new()
        } else {
            sym.kernel(&r.kernel)
        };
        let kernel_frames = kernel.len();
        frames.extend(kernel.into_iter().rev());
        modules.extend(std::iter::repeat_n(
            Some(symbolize::kernel_module()),
            kernel_frames,
        ));
        merged
            .entry((r.tgid, frames, kernel_frames))
            .or_insert_with(|| (0, modules))
            .0 += r.value;
    }
    let mut out: Vec<Stack> = merged
        .into_iter()
        .map(|((tgid, frames, kernel_frames), (value, modules))| Stack {
            tgid,
            comm: comms.get(&tgid).cloned().flatten(),
            frames,
            modules,
            kernel_frames,
            value,
        })
        .collect();
    out.sort_by(|a, b| b.value.cmp(&a.value).then_with(|| a.frames.cmp(&b.frames)));
    out
}

/// The user frames of one stack, innermost first, with the leaf's caller put back when
/// the frame-pointer walk skipped it.
fn user_frames(r: &RawStack, sym: &Symbolizer) -> Vec<symbolize::Named> {
    let Some((&leaf, rest)) = r.user.split_first() else {
        return Vec::new();
    };
    let mut names = sym.user_in_files(r.tgid, &[leaf], false);
    names.extend(sym.user_in_files(r.tgid, rest, true));
    if r.user.iter().any(|&a| python::is_python(a)) {
        // The kernel's walk named the Python functions: the `-X perf` trampolines of the
        // same calls (3.12+) would name each one twice.
        let mut keep = r.user.iter().map(|&a| python::is_python(a));
        names.retain(|(n, _)| keep.next().unwrap_or(true) || !n.starts_with("py::"));
    }
    if r.caller != 0 && sym.in_file(r.tgid, r.caller) {
        let caller = sym.user_in_files(r.tgid, &[r.caller], true).remove(0);
        // The walk found it already (the leaf kept a frame): nothing was skipped.
        let named = |i: usize| names.get(i).map(|(n, _)| n);
        if named(1) != Some(&caller.0) && named(0) != Some(&caller.0) {
            names.insert(1, caller);
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tgid: u32, leaf: u64) -> WalkedKey {
        (tgid, vec![leaf, 0x1000], Vec::new(), 0)
    }

    /// Growth given back is taken off the stack its sample was charged to: before a drain
    /// from the stacks still gathering, after it from what the drain handed out (to be
    /// subtracted by its user); a sample never seen, or another process's, is untouched.
    #[test]
    fn a_revoked_growth_sample_is_taken_off_its_stack_before_or_after_a_drain() {
        let mut rv = Revocable::default();
        let mut into = Walked::new();
        let (leak, buffer) = (key(7, 0xa), key(7, 0xb));
        for (seq, k, bytes) in [(1, &leak, 300), (2, &buffer, 500), (3, &buffer, 200)] {
            rv.charged(7, seq, k.clone(), bytes);
            *into.entry(k.clone()).or_default() += bytes;
        }
        rv.revoke(7, 3, 200, &mut into);
        rv.revoke(7, 2, 100, &mut into);
        assert_eq!(into.get(&buffer), Some(&400));
        rv.revoke(7, 9, 100, &mut into); // never seen
        rv.revoke(8, 1, 100, &mut into); // another process
        assert_eq!(into.get(&leak), Some(&300));
        // Drained: the rest of sample 2 is revoked from what was handed out.
        let drained = sampled(std::mem::take(&mut into));
        assert_eq!(drained.iter().map(|r| r.value).sum::<u64>(), 700);
        rv.revoke(7, 2, 1000, &mut into);
        let back = rv.take_revoked();
        assert_eq!(back.len(), 1);
        assert_eq!(
            (back[0].user.clone(), back[0].value),
            (buffer.1.clone(), 400)
        );
        assert!(rv.take_revoked().is_empty());
        // A sample revoked whole is forgotten: revoking it again takes nothing.
        rv.revoke(7, 2, 10, &mut into);
        assert!(into.is_empty() && rv.take_revoked().is_empty());
        // At most as many samples per process as the kernel keeps revocable.
        for seq in 100..100 + shared::SITE_KEPT as u32 + 5 {
            rv.charged(7, seq, leak.clone(), 1);
        }
        assert_eq!(rv.recent[&7].len(), shared::SITE_KEPT);
        rv.forget(7);
        assert!(!rv.recent.contains_key(&7));
    }

    #[test]
    fn identical_named_stacks_merge_and_sort_by_value() {
        let sym = Symbolizer::new();
        // A PID that cannot exist: every user frame is [unknown], so these name alike.
        let gone = 1 << 23;
        let raw = [
            RawStack {
                tgid: gone,
                user: vec![0x1000, 0x2000],
                value: 3,
                ..Default::default()
            },
            RawStack {
                tgid: gone,
                user: vec![0x3000, 0x4000],
                value: 4,
                ..Default::default()
            },
            RawStack {
                tgid: gone,
                user: vec![0x5000],
                value: 1,
                ..Default::default()
            },
        ];
        let named = name(&raw, &sym, |_| Some("app".to_owned()));
        assert_eq!(named.len(), 2, "{named:?}");
        assert_eq!(named[0].value, 7);
        assert_eq!(named[0].frames, ["app", "[unknown]", "[unknown]"]);
        assert_eq!(named[1].frames, ["app", "[unknown]"]);
    }
}
