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

use std::{collections::HashMap, ops::Range, path::Path, sync::Arc};

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

/// Finds whether process `pid` runs a CPython interpreter of a known layout: its maps
/// and the interpreter's symbols are parsed by the reader process (`crate::reader`);
/// waits up to `within` (never on the engine: see [`Registry::runtime`]).
pub fn detect(pid: u32, within: std::time::Duration) -> Option<Runtime> {
    crate::reader::loader().python(pid, within)
}

/// A file's path and its mappings' (start, file offset).
pub type MappedFile = (Arc<str>, Vec<(u64, u64)>);

/// The mapped files of a process that may hold its interpreter: (path, its mappings'
/// (start, file offset)), at most 4 files, named `python*` or `libpython*` (not the
/// extension modules, `_struct.cpython-311-x86_64-linux-gnu.so`, mapped before
/// libpython by some builds).
pub fn python_files(maps: &[super::maps::FileMapping]) -> Vec<MappedFile> {
    let mut files: Vec<MappedFile> = Vec::new();
    for m in maps {
        if !Path::new(&*m.path).file_name().is_some_and(|n| {
            let n = n.to_string_lossy();
            (n.starts_with("python") || n.starts_with("libpython")) && is_python_file(&n)
        }) {
            continue;
        }
        if let Some((_, v)) = files.iter_mut().find(|(p, _)| *p == m.path) {
            v.push((m.range.start, m.offset));
        } else if files.len() < 4 {
            files.push((m.path.clone(), vec![(m.range.start, m.offset)]));
        }
    }
    files
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

/// What detection needs of an interpreter's file, as the reader read it: where its
/// loadable segments are, and the addresses (as the file states them) of `_PyRuntime`,
/// `Py_Version` and the evaluation loop's code.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PythonSymbols {
    /// (file offset, virtual address) of each PT_LOAD segment.
    segments: Vec<(u64, u64)>,
    runtime: Option<u64>,
    version: Option<u64>,
    eval: Vec<Range<u64>>,
}

/// The most evaluation-loop ranges kept (CPython has one, a build with clones a few).
const MAX_EVAL: usize = 16;

impl PythonSymbols {
    /// Read in the reader from an open ELF file.
    pub fn read(file: &super::elf::ElfFile) -> Option<Self> {
        let elf = object::File::parse(file).ok()?;
        let mut out = Self {
            segments: elf
                .segments()
                .take(64)
                .map(|s| (s.file_range().0, s.address()))
                .collect(),
            ..Self::default()
        };
        for sym in elf.dynamic_symbols().chain(elf.symbols()) {
            match sym.name() {
                Ok("_PyRuntime") => out.runtime = Some(sym.address()),
                Ok("Py_Version") => out.version = Some(sym.address()),
                Ok(n)
                    if n == "_PyEval_EvalFrameDefault"
                        || n.starts_with("_PyEval_EvalFrameDefault.") =>
                {
                    let r = sym.address()..sym.address().saturating_add(sym.size());
                    if !r.is_empty() && !out.eval.contains(&r) && out.eval.len() < MAX_EVAL {
                        out.eval.push(r);
                    }
                }
                _ => {}
            }
        }
        Some(out)
    }

    pub fn encode(&self, e: &mut crate::reader::wire::Enc) {
        e.u32(self.segments.len() as u32);
        for &(o, v) in &self.segments {
            e.u64(o).u64(v);
        }
        for a in [self.runtime, self.version] {
            e.u8(u8::from(a.is_some())).u64(a.unwrap_or(0));
        }
        e.u32(self.eval.len() as u32);
        for r in &self.eval {
            e.u64(r.start).u64(r.end);
        }
    }

    pub fn decode(
        d: &mut crate::reader::wire::Dec<'_>,
    ) -> Result<Self, crate::reader::wire::Malformed> {
        use crate::reader::wire::Malformed;
        let n = d.count(16)?;
        if n > 64 {
            return Err(Malformed);
        }
        let mut segments = Vec::with_capacity(n);
        for _ in 0..n {
            segments.push((d.u64()?, d.u64()?));
        }
        let mut opt = || -> Result<Option<u64>, Malformed> {
            let some = d.u8()? != 0;
            let v = d.u64()?;
            Ok(some.then_some(v))
        };
        let (runtime, version) = (opt()?, opt()?);
        let n = d.count(16)?;
        if n > MAX_EVAL {
            return Err(Malformed);
        }
        let mut eval = Vec::with_capacity(n);
        for _ in 0..n {
            eval.push(d.u64()?..d.u64()?);
        }
        Ok(Self {
            segments,
            runtime,
            version,
            eval,
        })
    }

    /// The runtime of process `pid`, which maps this file at `mappings` (start, file
    /// offset): its load bias, then its version read from its memory (4 bytes).
    pub fn runtime_in(&self, pid: u32, mappings: &[(u64, u64)]) -> Option<Runtime> {
        let page = crate::procfs::page_size();
        // The load bias: a mapping of file offset `off` at `start` holds the segment whose
        // page-rounded file offset is `off`.
        let bias = mappings.iter().find_map(|&(start, off)| {
            self.segments
                .iter()
                .find(|&&(file_off, _)| file_off / page * page == off)
                .map(|&(_, vaddr)| start.wrapping_sub(vaddr / page * page))
        })?;
        let mut v = [0u8; 4];
        if !crate::procfs::read_process_memory(pid, bias.wrapping_add(self.version?), &mut v) {
            return None;
        }
        let v = u32::from_ne_bytes(v);
        let layout = Layout::for_version((v >> 24) as u8, (v >> 16) as u8)?;
        Some(Runtime {
            layout,
            runtime: bias.wrapping_add(self.runtime?),
            eval: self
                .eval
                .iter()
                .map(|r| bias.wrapping_add(r.start)..bias.wrapping_add(r.end))
                .collect(),
        })
    }
}

/// The CPython processes listed for the kernel's frame walk (`rw_py_procs`), found as
/// their samples arrive (or before, for a process about to be captured).
pub struct Registry {
    map: Option<BpfHashMap<MapData, u32, RwPyProc>>,
    known: HashMap<u32, Option<Arc<Runtime>>>,
    /// Processes asked of the reader and not answered yet.
    asked: HashMap<u32, std::sync::mpsc::Receiver<Option<Runtime>>>,
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
            asked: HashMap::new(),
            enabled: true,
        })
    }

    /// Process `pid`'s runtime, if it is CPython; looked for once (by the reader, never
    /// waited for: the process's samples until the answer keep their native frames),
    /// and listed for the kernel when found.
    pub fn runtime(&mut self, pid: u32) -> Option<Arc<Runtime>> {
        self.runtime_within(pid, std::time::Duration::ZERO)
    }

    /// As [`Self::runtime`], waiting up to `within` for the answer (a profile's named
    /// processes, listed before their first sample; never the engine).
    pub fn runtime_within(
        &mut self,
        pid: u32,
        within: std::time::Duration,
    ) -> Option<Arc<Runtime>> {
        use std::sync::mpsc::RecvTimeoutError;
        if !self.enabled {
            return None;
        }
        if let Some(r) = self.known.get(&pid) {
            return r.clone();
        }
        if self.known.len() >= MAX_PROCESSES {
            self.clear();
        }
        if !self.asked.contains_key(&pid) {
            if self.asked.len() >= MAX_PROCESSES {
                return None;
            }
            self.asked
                .insert(pid, crate::reader::loader().python_async(pid));
        }
        let answer = match self.asked.get(&pid).map(|rx| rx.recv_timeout(within)) {
            Some(Ok(found)) => found.map(Arc::new),
            Some(Err(RecvTimeoutError::Timeout)) | None => return None,
            Some(Err(RecvTimeoutError::Disconnected)) => None,
        };
        self.asked.remove(&pid);
        let found = answer;
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
        self.asked.clear();
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

/// How long naming waits for a process's detection.
const DETECT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

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
            .or_insert_with(|| detect(pid, DETECT_WAIT).map(|r| r.layout));
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
        let wait = std::time::Duration::from_secs(20);
        assert!(detect(std::process::id(), wait).is_none());
        assert!(detect(1 << 23, wait).is_none());
    }
}
