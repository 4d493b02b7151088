//! CPython functions in stacks, from the interpreter's own frames.
//!
//! CPython 3.11 and later run a Python function called from Python inside the same C call
//! of `_PyEval_EvalFrameDefault` as its caller, so a native stack shows the evaluation
//! loop and never the Python functions. The kernel reads them at each sample instead
//! (`ebpf/src/python.bpf.h`): the sampled thread's frame chain, as code-object addresses.
//! This module finds the processes that are CPython of a known layout and lists them for
//! the kernel ([`Registry`]), puts each run of Python frames where its C call of the loop
//! is in the native stack ([`merge`]), and names code objects by reading their
//! `co_qualname` and `co_filename` from the process ([`Names`]).
//!
//! Which processes: a file mapped by the process whose name contains `python`
//! (`python3.11`, `libpython3.12.so.1.0`) and that defines `_PyRuntime` and `Py_Version`;
//! the version read from the process's own `Py_Version` picks the layout. Layouts are
//! written here per minor version (3.11, 3.12, 3.13; the offsets are not in any file a
//! release build ships before 3.13's `_Py_DebugOffsets`), and a test checks each against
//! that version's headers. Other versions, and an interpreter embedded under another
//! file name, keep their native stacks only (3.12+ can still be named by their
//! `-X perf` trampolines, see `perfmap`).
//!
//! Why not py-spy: it samples from outside by stopping or reading the process on a
//! timer, and its frames are not the kernel's sample of that moment; the walk has to
//! happen in the kernel, at the sample, for the Python frames to match the native stack
//! they are merged into. Names are read later, from code objects that live as long as
//! their function: a code object freed and its address reused between the sample and the
//! naming (at most one profile or one 5 s naming round) would be named after the new one.

use std::{
    collections::HashMap,
    ops::Range,
    path::{Path, PathBuf},
    sync::Arc,
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use object::{Object, ObjectSegment, ObjectSymbol};
use resourcewatch_ebpf::shared::{self, RwPyProc};

/// Set on a native-stack entry that is a Python frame (the rest is its code object's
/// address): user addresses end below 2^47, so no real frame has it.
pub const TAG: u64 = 1 << 62;
/// Processes [`Registry`] and [`Names`] remember (cleared whole when passed).
const MAX_PROCESSES: usize = 1024;
/// Code-object names [`Names`] keeps (cleared whole when passed): with names of at most
/// 2 x `MAX_NAME_CHARS` characters, a few MiB at most.
const MAX_NAMES: usize = 16_384;
/// Characters read of a function or file name.
const MAX_NAME_CHARS: u64 = 256;

/// Where a CPython minor version keeps what the frame walk and the naming read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub version: (u8, u8),
    /// `_PyRuntimeState.interpreters.main`: the main interpreter (`.head` is the newest).
    pub interp_main: u32,
    pub threads_head: u32,
    pub tstate_next: u32,
    pub tstate_thread_id: u32,
    /// `PyThreadState.cframe` (3.11, 3.12) or `.current_frame` (3.13).
    pub tstate_frame: u32,
    /// `_PyCFrame.current_frame`; `None` when the thread state points at the frame.
    pub cframe_frame: Option<u32>,
    pub frame_code: u32,
    pub frame_previous: u32,
    /// `is_entry` (3.11) or `owner` (3.12+).
    pub frame_entry: u32,
    pub entry_kind: u32,
    pub code_filename: u32,
    pub code_qualname: u32,
    /// sizeof(PyASCIIObject), sizeof(PyCompactUnicodeObject): where a compact string's
    /// characters start.
    pub ascii_size: u64,
    pub compact_size: u64,
}

/// x86-64 layouts, from each version's `Include/internal` headers (the test
/// `layouts_match_the_installed_headers` compiles `offsetof`s against them).
pub const LAYOUTS: [Layout; 3] = [
    Layout {
        version: (3, 11),
        interp_main: 48,
        threads_head: 16,
        tstate_next: 8,
        tstate_thread_id: 152,
        tstate_frame: 56,
        cframe_frame: Some(8),
        frame_code: 32,
        frame_previous: 48,
        frame_entry: 68,
        entry_kind: shared::PY_ENTRY_FLAG,
        code_filename: 112,
        code_qualname: 128,
        ascii_size: 48,
        compact_size: 72,
    },
    Layout {
        version: (3, 12),
        interp_main: 48,
        threads_head: 72,
        tstate_next: 8,
        tstate_thread_id: 136,
        tstate_frame: 56,
        cframe_frame: Some(0),
        frame_code: 0,
        frame_previous: 8,
        frame_entry: 70,
        entry_kind: shared::PY_ENTRY_SHIM,
        code_filename: 112,
        code_qualname: 128,
        ascii_size: 40,
        compact_size: 56,
    },
    Layout {
        version: (3, 13),
        interp_main: 640,
        threads_head: 7344,
        tstate_next: 8,
        tstate_thread_id: 152,
        tstate_frame: 72,
        cframe_frame: None,
        frame_code: 0,
        frame_previous: 8,
        frame_entry: 70,
        entry_kind: shared::PY_ENTRY_SHIM,
        code_filename: 112,
        code_qualname: 128,
        ascii_size: 40,
        compact_size: 56,
    },
];

impl Layout {
    fn for_version(major: u8, minor: u8) -> Option<&'static Layout> {
        LAYOUTS.iter().find(|l| l.version == (major, minor))
    }
}

/// A CPython process: its layout, where its `_PyRuntime` is, and where the evaluation
/// loop's code is (the native frames a run of Python frames belongs to).
#[derive(Debug)]
pub struct Runtime {
    pub layout: &'static Layout,
    pub runtime: u64,
    pub eval: Vec<Range<u64>>,
}

impl Runtime {
    /// What the kernel's walk needs of this process.
    pub fn kernel_entry(&self) -> RwPyProc {
        let l = self.layout;
        RwPyProc {
            runtime: self.runtime,
            interp_main: l.interp_main,
            threads_head: l.threads_head,
            tstate_next: l.tstate_next,
            tstate_thread_id: l.tstate_thread_id,
            tstate_frame: l.tstate_frame,
            cframe_frame: l.cframe_frame.unwrap_or(shared::PY_NO_CFRAME),
            frame_code: l.frame_code,
            frame_previous: l.frame_previous,
            frame_entry: l.frame_entry,
            entry_kind: l.entry_kind,
        }
    }
}

/// Finds whether process `pid` runs a CPython interpreter of a known layout.
pub fn detect(pid: u32) -> Option<Runtime> {
    let maps = super::maps::read(pid)?;
    let mut files: Vec<(PathBuf, Vec<(u64, u64)>)> = Vec::new();
    for line in maps.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(_perms), Some(offset), Some(_dev), Some(_inode)) =
            (it.next(), it.next(), it.next(), it.next(), it.next())
        else {
            continue;
        };
        let Some(path) = it.next().filter(|p| p.starts_with('/')) else {
            continue;
        };
        if !Path::new(path)
            .file_name()
            .is_some_and(|n| is_python_file(&n.to_string_lossy()))
        {
            continue;
        }
        let (Some(start), Ok(offset)) = (
            range
                .split('-')
                .next()
                .and_then(|s| u64::from_str_radix(s, 16).ok()),
            u64::from_str_radix(offset, 16),
        ) else {
            continue;
        };
        match files.iter_mut().find(|(p, _)| p == Path::new(path)) {
            Some((_, m)) => m.push((start, offset)),
            None => files.push((PathBuf::from(path), vec![(start, offset)])),
        }
    }
    files
        .iter()
        .find_map(|(path, mappings)| runtime_in(pid, path, mappings))
}

/// Whether a mapped file's name is a CPython interpreter or library of the default build
/// (`python3.11`, `libpython3.12.so.1.0`), not a free-threaded one (`python3.13t`,
/// `libpython3.13t.so`: another object and interpreter layout).
fn is_python_file(name: &str) -> bool {
    let Some(at) = name.find("python") else {
        return false;
    };
    let version = &name[at + "python".len()..];
    let digits = version.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
    !digits.starts_with('t')
}

/// The runtime defined by file `path` (in `pid`'s root), mapped by `pid` at `mappings`
/// (start, file offset).
fn runtime_in(pid: u32, path: &Path, mappings: &[(u64, u64)]) -> Option<Runtime> {
    let file = super::elf::ElfFile::open(pid, &path.to_string_lossy())?;
    let elf = object::File::parse(&file).ok()?;
    let page = crate::procfs::page_size();
    // The load bias: a mapping of file offset `off` at `start` holds the segment whose
    // page-rounded file offset is `off`.
    let bias = mappings.iter().find_map(|&(start, off)| {
        elf.segments()
            .find(|s| s.file_range().0 / page * page == off)
            .map(|s| start.wrapping_sub(s.address() / page * page))
    })?;
    let mut runtime = None;
    let mut version = None;
    let mut eval = Vec::new();
    for sym in elf.dynamic_symbols().chain(elf.symbols()) {
        match sym.name() {
            Ok("_PyRuntime") => runtime = Some(sym.address()),
            Ok("Py_Version") => version = Some(sym.address()),
            Ok(n)
                if n == "_PyEval_EvalFrameDefault"
                    || n.starts_with("_PyEval_EvalFrameDefault.") =>
            {
                let r =
                    bias.wrapping_add(sym.address())..bias.wrapping_add(sym.address() + sym.size());
                if !r.is_empty() && !eval.contains(&r) {
                    eval.push(r);
                }
            }
            _ => {}
        }
    }
    let mut v = [0u8; 4];
    if !crate::procfs::read_process_memory(pid, bias.wrapping_add(version?), &mut v) {
        return None;
    }
    let v = u32::from_ne_bytes(v);
    let layout = Layout::for_version((v >> 24) as u8, (v >> 16) as u8)?;
    Some(Runtime {
        layout,
        runtime: bias.wrapping_add(runtime?),
        eval,
    })
}

/// The CPython processes listed for the kernel's frame walk (`rw_py_procs`), found as
/// their samples arrive (or before, for a process about to be captured).
pub struct Registry {
    map: Option<BpfHashMap<MapData, u32, RwPyProc>>,
    known: HashMap<u32, Option<Arc<Runtime>>>,
    /// Whether processes are listed at all (off only to measure what the walk costs).
    pub enabled: bool,
}

impl Registry {
    /// The registry of a loaded object, holding its `rw_py_procs` map.
    pub fn take(bpf: &mut aya::Ebpf) -> Result<Self, crate::bpf::PipelineError> {
        let name = resourcewatch_ebpf::maps::PY_PROCS;
        let map = bpf
            .take_map(name)
            .ok_or(crate::bpf::PipelineError::MissingMap(name))?;
        Ok(Self {
            map: Some(BpfHashMap::try_from(map).map_err(crate::bpf::map_err(name))?),
            known: HashMap::new(),
            enabled: true,
        })
    }

    /// Process `pid`'s runtime, if it is CPython; looked for once, and listed for the
    /// kernel when found.
    pub fn runtime(&mut self, pid: u32) -> Option<Arc<Runtime>> {
        if !self.enabled {
            return None;
        }
        if let Some(r) = self.known.get(&pid) {
            return r.clone();
        }
        if self.known.len() >= MAX_PROCESSES {
            self.clear();
        }
        let found = detect(pid).map(Arc::new);
        if let (Some(rt), Some(map)) = (&found, &mut self.map)
            && let Err(e) = map.insert(pid, rt.kernel_entry(), 0)
        {
            // Full (more CPython processes captured at once than the map holds): this
            // one's stacks keep their native frames.
            tracing::info!("CPython process {pid} not listed for frame walks: {e}");
        }
        self.known.insert(pid, found.clone());
        found
    }

    /// Forgets every process (a capture ended: PIDs may be reused before the next).
    pub fn clear(&mut self) {
        if let Some(map) = &mut self.map {
            for (pid, rt) in &self.known {
                if rt.is_some() {
                    let _ = map.remove(pid);
                }
            }
        }
        self.known.clear();
    }
}

/// A native stack (innermost first; the first the sampled address, the others return
/// addresses) with the Python frames of the same sample put in: each run of Python frames
/// up to an entry frame goes right after (as callers of) the next native frame in the
/// evaluation loop, innermost first, tagged with [`TAG`]. Python frames left over (the
/// native walk stopped before reaching their loop) follow the last loop frame found, or
/// end the stack when none was.
pub fn merge(native: &[u64], py: &[u64], eval: &[Range<u64>]) -> Vec<u64> {
    if py.is_empty() {
        return native.to_vec();
    }
    let mut out = Vec::with_capacity(native.len() + py.len());
    let mut rest = py.iter().copied().peekable();
    let mut after_last_loop = None;
    for (i, &addr) in native.iter().enumerate() {
        out.push(addr);
        let at = if i == 0 { addr } else { addr.wrapping_sub(1) };
        if rest.peek().is_none() || !eval.iter().any(|r| r.contains(&at)) {
            continue;
        }
        for f in rest.by_ref() {
            out.push(TAG | (f & !shared::PY_ENTRY));
            if f & shared::PY_ENTRY != 0 {
                break;
            }
        }
        after_last_loop = Some(out.len());
    }
    let left: Vec<u64> = rest.map(|f| TAG | (f & !shared::PY_ENTRY)).collect();
    let at = after_last_loop.unwrap_or(out.len());
    out.splice(at..at, left);
    out
}

/// Whether a stack entry is a Python frame put in by [`merge`].
pub fn is_python(addr: u64) -> bool {
    addr & TAG != 0 && addr >> 63 == 0
}

/// Names of code objects per process (`py::qualname:filename`, as CPython's own perf
/// maps name them), read from the process when first asked.
#[derive(Default)]
pub struct Names {
    runtimes: HashMap<u32, Option<&'static Layout>>,
    names: HashMap<(u32, u64), String>,
}

impl Names {
    /// The name of the Python frame `addr` (tagged) of `pid`; `py::[unknown]` when the
    /// process or its code object can no longer be read.
    pub fn name(&mut self, pid: u32, addr: u64) -> String {
        let code = addr & !TAG;
        if let Some(n) = self.names.get(&(pid, code)) {
            return n.clone();
        }
        if self.runtimes.len() >= MAX_PROCESSES {
            self.runtimes.clear();
        }
        let layout = *self
            .runtimes
            .entry(pid)
            .or_insert_with(|| detect(pid).map(|r| r.layout));
        let Some(name) = layout.and_then(|l| code_name(pid, l, code)) else {
            return "py::[unknown]".to_owned();
        };
        if self.names.len() >= MAX_NAMES {
            self.names.clear();
        }
        self.names.insert((pid, code), name.clone());
        name
    }
}

fn code_name(pid: u32, l: &Layout, code: u64) -> Option<String> {
    code_name_in(
        &|addr, buf| crate::procfs::read_process_memory(pid, addr, buf),
        l,
        code,
    )
}

/// A process's memory, as `read_process_memory` reads it: false when not readable.
type Memory<'a> = &'a dyn Fn(u64, &mut [u8]) -> bool;

/// The name of code object `code`, read from `mem` (a workload's memory: every pointer
/// and length in it is the workload's to choose).
fn code_name_in(mem: Memory<'_>, l: &Layout, code: u64) -> Option<String> {
    let ptr = |off: u32| {
        let mut b = [0u8; 8];
        mem(code.checked_add(u64::from(off))?, &mut b).then(|| u64::from_ne_bytes(b))
    };
    let qualname = read_str(mem, l, ptr(l.code_qualname)?)?;
    let filename = read_str(mem, l, ptr(l.code_filename)?).unwrap_or_default();
    Some(format!("py::{qualname}:{filename}"))
}

/// A `str` object's text: compact strings only (every identifier and file name CPython
/// makes for code objects is one), at most `MAX_NAME_CHARS` characters.
fn read_str(mem: Memory<'_>, l: &Layout, obj: u64) -> Option<String> {
    // ob_refcnt, ob_type, length, hash, then the state bit field at 32 in 3.11-3.13.
    let mut head = [0u8; 40];
    if obj == 0 || !mem(obj, &mut head) {
        return None;
    }
    let length = u64::from_ne_bytes(head[16..24].try_into().ok()?).min(MAX_NAME_CHARS);
    let state = u32::from_ne_bytes(head[32..36].try_into().ok()?);
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
    if compact == 0 || !(1..=4).contains(&kind) || kind == 3 {
        return None;
    }
    let start = obj.checked_add(if ascii == 1 {
        l.ascii_size
    } else {
        l.compact_size
    })?;
    let mut data = vec![0u8; (length * u64::from(kind)) as usize];
    if !mem(start, &mut data) {
        return None;
    }
    Some(match kind {
        1 => data.iter().map(|&b| char::from(b)).collect(),
        2 => String::from_utf16_lossy(
            &data
                .chunks_exact(2)
                .map(|c| u16::from_ne_bytes([c[0], c[1]]))
                .collect::<Vec<_>>(),
        ),
        _ => data
            .chunks_exact(4)
            .map(|c| char::from_u32(u32::from_ne_bytes([c[0], c[1], c[2], c[3]])).unwrap_or('?'))
            .collect(),
    })
}

/// Names a code object at the start of `memory` (mapped at `base`) with each known
/// layout (for the fuzz targets).
#[doc(hidden)]
pub fn code_names_in(memory: &[u8], base: u64) -> Vec<Option<String>> {
    let mem = |addr: u64, buf: &mut [u8]| {
        let Some(off) = addr.checked_sub(base).and_then(|o| usize::try_from(o).ok()) else {
            return false;
        };
        match off
            .checked_add(buf.len())
            .and_then(|end| memory.get(off..end))
        {
            Some(src) => {
                buf.copy_from_slice(src);
                true
            }
            None => false,
        }
    };
    [(3, 11), (3, 12), (3, 13)]
        .iter()
        .filter_map(|&(a, b)| Layout::for_version(a, b))
        .map(|l| code_name_in(&mem, l, base))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const E: u64 = shared::PY_ENTRY;

    #[test]
    fn each_run_of_python_frames_follows_its_evaluation_loop_frame() {
        let eval = [0x5000..0x6000, 0x9000..0x9100]; // the loop and its .cold part
        // leaf in C, then the loop (return address inside it), a C call, the loop again,
        // then main. Python: f, g (entry of the inner loop), h (entry of the outer one).
        let native = [0x100, 0x5010, 0x200, 0x5020, 0x300];
        let py = [0xa0, 0xb0 | E, 0xc0 | E];
        assert_eq!(
            merge(&native, &py, &eval),
            [
                0x100,
                0x5010,
                TAG | 0xa0,
                TAG | 0xb0,
                0x200,
                0x5020,
                TAG | 0xc0,
                0x300
            ]
        );
    }

    #[test]
    fn python_frames_the_native_walk_did_not_reach_follow_the_last_loop() {
        let eval = [0x5000..0x6000, 0x9000..0x9100]; // the loop and its .cold part
        let py = [0xa0 | E, 0xb0, 0xc0 | E];
        // The walk ended after one loop frame and some garbage.
        assert_eq!(
            merge(&[0x100, 0x5010, 0x999], &py, &eval),
            [0x100, 0x5010, TAG | 0xa0, TAG | 0xb0, TAG | 0xc0, 0x999]
        );
        // No loop frame at all: the Python frames end the stack.
        assert_eq!(
            merge(&[0x100, 0x200], &py, &eval),
            [0x100, 0x200, TAG | 0xa0, TAG | 0xb0, TAG | 0xc0]
        );
        assert_eq!(merge(&[0x100], &[], &eval), [0x100]);
        // The leaf is the loop itself (the sampled address, not a return address).
        assert_eq!(
            merge(&[0x5000, 0x300], &[0xa0 | E], &eval),
            [0x5000, TAG | 0xa0, 0x300]
        );
        assert!(is_python(TAG | 0xa0) && !is_python(0x7fff_0000_0000));
    }

    #[test]
    fn free_threaded_builds_are_not_taken_for_the_default_one() {
        for name in ["python3.11", "python3", "libpython3.12.so.1.0", "python"] {
            assert!(is_python_file(name), "{name}");
        }
        for name in ["python3.13t", "libpython3.13t.so.1.0", "libc.so.6", "node"] {
            assert!(!is_python_file(name), "{name}");
        }
    }

    #[test]
    fn a_process_that_is_not_python_is_not_detected() {
        assert!(detect(std::process::id()).is_none());
        assert!(detect(1 << 23).is_none());
    }
}
