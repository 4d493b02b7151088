//! Addresses to function names.
//!
//! User addresses are placed from `/proc/PID/maps` (which file of the process, at which
//! offset: PIE and ASLR undone), then looked up in the function symbols (`.symtab`,
//! `.dynsym`) of that file, opened inside the process's root so a container's binaries
//! are found in its own mount namespace and a symlink cannot lead out of it. The maps and
//! the files are workload-chosen input, so they are parsed by the reader process
//! (`crate::reader`), with bounds, never mapped, and cached by the identity of the file
//! opened, not by what the maps say; blazesym, which mmaps files, names kernel addresses
//! only (`/proc/kallsyms`, the kernel's own). An address outside any file is JIT-compiled code
//! when the process's runtime writes a perf map (see `perfmap`), named from it. What
//! cannot be resolved is said, never guessed: `[unknown]` outside any file and any perf
//! map (JIT code of a runtime writing none, a garbage frame of a binary without frame
//! pointers), `[libfoo.so]` in a file without a symbol for the address (or one that
//! breaks a bound).

use std::{collections::HashMap, sync::Arc};

use blazesym::{
    MaybeDefault,
    symbolize::{
        Input, Symbolized, Symbolizer as Blaze,
        source::{Kernel, Source},
    },
};

use super::{elf::Symbols, maps::FileMapping};

/// How long the naming waits for the reader's answer about one file or maps (the
/// loader's queue, then the reader's deadline): past it, that file's frames are named
/// by the file alone.
const READER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a process's maps read are used for.
const MAPS_FOR: std::time::Duration = std::time::Duration::from_secs(1);
/// Processes whose maps are kept (cleared whole when passed).
const MAX_MAPS_KEPT: usize = 16;

/// Name shown for an address outside any file of the process.
pub const UNKNOWN: &str = "[unknown]";
/// Name shown for kernel frames when the kernel's symbols cannot be read (no CAP_SYSLOG:
/// /proc/kallsyms shows zero addresses).
pub const KERNEL: &str = "[kernel]";

/// The name of a frame in a file whose content the reader refused: `[libfoo.so:
/// unreadable (over_budget)]`, from the file's own `[libfoo.so]`.
fn unreadable(module: &str, why: crate::reader::Refusal) -> String {
    format!(
        "{}: unreadable ({})]",
        module.trim_end_matches(']'),
        why.reason()
    )
}

/// The file a frame was found in: what pprof calls its mapping.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Module {
    /// The file's path in the process's mount namespace, or `[kernel.kallsyms]` (as
    /// perf names the kernel).
    pub path: Arc<str>,
    /// Its GNU build ID in hex, when the file has one.
    pub build_id: Option<Arc<str>>,
}

/// The kernel as a frame's module.
pub fn kernel_module() -> Arc<Module> {
    static KERNEL_MODULE: std::sync::LazyLock<Arc<Module>> = std::sync::LazyLock::new(|| {
        Arc::new(Module {
            path: "[kernel.kallsyms]".into(),
            build_id: None,
        })
    });
    KERNEL_MODULE.clone()
}

/// A frame's name and the file it was found in (None for interpreted and JIT-compiled
/// code, and for an address outside every file).
pub type Named = (String, Option<Arc<Module>>);

/// A symboliser kept across calls: it caches each file's symbols, and `perf_maps` each
/// process's JIT code names.
pub struct Symbolizer {
    blaze: Blaze,
    /// The symbols the reader answered, by process and the file its maps name: never
    /// shared between processes on what their maps say (a chrooted process's path can
    /// show another file); the reader's own cache is keyed by the file opened.
    symbols: std::sync::Mutex<HashMap<(u32, u64, u64), NamedFile>>,
    /// Maps read lately, by PID.
    maps: std::sync::Mutex<HashMap<u32, ReadMaps>>,
    perf_maps: std::sync::Mutex<super::perfmap::PerfMaps>,
    /// Perf maps given (a profile's JVMs, as they answered during it), used instead of
    /// the file as it is now.
    given_perf_maps: HashMap<u32, Arc<super::perfmap::PerfMap>>,
    /// The names given from a perf map so far: which frames are JIT-compiled code.
    jit_names: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Names of the CPython code objects of Python frames (`python::merge`).
    python: std::sync::Mutex<super::python::Names>,
}

/// A file's symbols as the reader answered, or why there are none.
type NamedFile = Result<Arc<Symbols>, crate::reader::Refusal>;
/// A process's executable file mappings, and when they were read.
type ReadMaps = (std::time::Instant, Arc<[FileMapping]>);

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    pub fn new() -> Self {
        Self {
            blaze: Blaze::builder()
                .enable_code_info(false)
                .enable_inlined_fns(false)
                .build(),
            perf_maps: Default::default(),
            given_perf_maps: HashMap::new(),
            jit_names: Default::default(),
            symbols: Default::default(),
            maps: Default::default(),
            python: Default::default(),
        }
    }

    /// A symboliser naming the JIT code of the processes in `maps` from them rather than
    /// from their perf map files (`Profile::jvm_maps`).
    pub fn with_perf_maps(mut self, maps: HashMap<u32, Arc<super::perfmap::PerfMap>>) -> Self {
        self.given_perf_maps = maps;
        self
    }

    /// Names of `addrs` in process `pid`, in order; one per address.
    ///
    /// `return_addrs` says the addresses are return addresses (every frame of a stack walk
    /// but the first): they are looked up one byte back, inside the call instruction, so
    /// that a call at the very end of a function is not named after the next one.
    pub fn user(&self, pid: u32, addrs: &[u64], return_addrs: bool) -> Vec<String> {
        self.user_in_files(pid, addrs, return_addrs)
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }

    /// As [`Self::user`], each name with the file it was found in.
    pub fn user_in_files(&self, pid: u32, addrs: &[u64], return_addrs: bool) -> Vec<Named> {
        let mut names = vec![UNKNOWN.to_owned(); addrs.len()];
        let mut modules: Vec<Option<Arc<Module>>> = vec![None; addrs.len()];
        if addrs.is_empty() || pid == 0 {
            return names.into_iter().zip(modules).collect();
        }
        let lookup: Vec<u64> = addrs
            .iter()
            .map(|&a| if return_addrs { a.saturating_sub(1) } else { a })
            .collect();
        self.name_python(pid, addrs, &mut names);
        let Some(maps) = self.maps(pid) else {
            // The process is gone, or its maps are not readable (or over their bound).
            return names.into_iter().zip(modules).collect();
        };
        let mappings = &*maps;
        // File offsets grouped by file, so each file is looked up once.
        let mut by_file: HashMap<usize, Vec<(usize, u64)>> = HashMap::new();
        let mut outside_files = Vec::new();
        for (i, &addr) in lookup.iter().enumerate() {
            if super::python::is_python(addrs[i]) {
                continue;
            }
            match mappings.iter().position(|m| m.range.contains(&addr)) {
                Some(at) => match mappings[at].file_offset(addr) {
                    Some(offset) => by_file.entry(at).or_default().push((i, offset)),
                    None => continue,
                },
                None => outside_files.push(i),
            }
        }
        self.name_jit(pid, &lookup, &outside_files, &mut names);
        // Every file's symbols asked at once and waited for by one deadline: a stack
        // through many files (a tenant's to choose) costs one wait, not one per file.
        let deadline = std::time::Instant::now() + READER_WAIT;
        // Per file: what this symboliser holds already, or the reader's coming answer.
        let mut pending: HashMap<usize, Result<NamedFile, _>> = by_file
            .keys()
            .map(|&at| {
                let m = &mappings[at];
                let held = self
                    .known_symbols(pid, m)
                    .ok_or_else(|| crate::reader::loader().symbols_async(pid, &m.path));
                (at, held)
            })
            .collect();
        for (at, items) in by_file {
            let m = &mappings[at];
            let module = format!(
                "[{}]",
                m.path
                    .rsplit('/')
                    .next()
                    .filter(|n| !n.is_empty())
                    .unwrap_or(&m.path)
            );
            let symbols = match pending.remove(&at) {
                Some(Ok(held)) => held,
                Some(Err(rx)) => self.keep_symbols(pid, m, crate::reader::wait_for(&rx, deadline)),
                None => Err(crate::reader::Refusal::Busy),
            };
            // A file whose content made the reader fail is said to be unreadable, and why.
            let module = match &symbols {
                Err(r) if r.unreadable() => unreadable(&module, *r),
                _ => module,
            };
            let file = Arc::new(Module {
                path: m.path.clone(),
                build_id: symbols
                    .as_ref()
                    .ok()
                    .and_then(|s| s.build_id.as_deref())
                    .map(Into::into),
            });
            for &(i, offset) in &items {
                names[i] = symbols
                    .as_ref()
                    .ok()
                    .and_then(|s| s.name_at(offset))
                    .unwrap_or_else(|| module.clone());
                modules[i] = Some(file.clone());
            }
        }
        names.into_iter().zip(modules).collect()
    }

    /// The Python frames among `addrs` (the kernel's walk of the interpreter's frames),
    /// named from the code objects.
    fn name_python(&self, pid: u32, addrs: &[u64], names: &mut [String]) {
        if !addrs.iter().any(|&a| super::python::is_python(a)) {
            return;
        }
        let mut python = self.python.lock().unwrap_or_else(|e| e.into_inner());
        let mut jit = self.jit_names.lock().unwrap_or_else(|e| e.into_inner());
        for (i, &a) in addrs.iter().enumerate() {
            if super::python::is_python(a) {
                names[i] = python.name(pid, a);
                // Counted with the JIT frames: a growth site keeps the code that asked.
                jit.insert(names[i].clone());
            }
        }
    }

    /// The frames of `lookup` at `outside_files` (in no file of the process) named from
    /// the process's perf map, when its runtime writes one.
    fn name_jit(&self, pid: u32, lookup: &[u64], outside_files: &[usize], names: &mut [String]) {
        if outside_files.is_empty() {
            return;
        }
        let map = self.given_perf_maps.get(&pid).cloned().or_else(|| {
            self.perf_maps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(pid)
        });
        if let Some(map) = map {
            let mut jit = self.jit_names.lock().unwrap_or_else(|e| e.into_inner());
            for &i in outside_files {
                if let Some(name) = map.lookup(lookup[i]) {
                    names[i] = name.to_owned();
                    jit.insert(names[i].clone());
                }
            }
        }
    }

    /// The executable file mappings of `pid` (parsed by the reader), asked again only
    /// after `MAPS_FOR` (one stack asks several times).
    fn maps(&self, pid: u32) -> Option<Arc<[FileMapping]>> {
        {
            let cache = self.maps.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((at, maps)) = cache.get(&pid)
                && at.elapsed() < MAPS_FOR
            {
                return Some(maps.clone());
            }
        }
        let maps = crate::reader::loader().maps(pid, READER_WAIT)?;
        let mut cache = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= MAX_MAPS_KEPT {
            cache.clear();
        }
        cache.insert(pid, (std::time::Instant::now(), maps.clone()));
        Some(maps)
    }

    /// What this symboliser already holds of the file of mapping `m` of `pid`.
    fn known_symbols(&self, pid: u32, m: &FileMapping) -> Option<NamedFile> {
        self.symbols
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(pid, m.dev, m.inode))
            .cloned()
    }

    /// Keeps the reader's answer for the file of mapping `m` of `pid`, and returns it.
    fn keep_symbols(&self, pid: u32, m: &FileMapping, symbols: NamedFile) -> NamedFile {
        if symbols.as_ref().err() == Some(&crate::reader::Refusal::Busy) {
            // Not waited for this time: asked again at the next naming.
            return symbols;
        }
        let mut cache = self.symbols.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= 4096 {
            cache.clear();
        }
        cache.insert((pid, m.dev, m.inode), symbols.clone());
        symbols
    }

    /// Whether `name` was given to a frame from a runtime's perf map (JIT-compiled code).
    pub fn is_jit(&self, name: &str) -> bool {
        self.jit_names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
    }

    /// Whether `pid` maps, for execution, a file of exactly this name (anything can be
    /// named so: what is done with it is bounded).
    pub fn maps_file_named(&self, pid: u32, name: &str) -> bool {
        self.maps(pid)
            .is_some_and(|maps| maps.iter().any(|m| m.path.rsplit('/').next() == Some(name)))
    }

    /// Whether return address `addr` is in an executable file mapping of `pid` (a
    /// plausible code address).
    pub fn in_file(&self, pid: u32, addr: u64) -> bool {
        let addr = addr.saturating_sub(1);
        self.maps(pid)
            .is_some_and(|maps| maps.iter().any(|m| m.range.contains(&addr)))
    }

    /// Names of kernel addresses (the first is the sampled instruction, the others return
    /// addresses), or [`KERNEL`] for each when the kernel's symbols are unreadable.
    pub fn kernel(&self, addrs: &[u64]) -> Vec<String> {
        let lookup: Vec<u64> = addrs
            .iter()
            .enumerate()
            .map(|(i, &a)| if i == 0 { a } else { a.saturating_sub(1) })
            .collect();
        let src = Source::Kernel(Kernel {
            // /proc/kallsyms only: searching the disk for a vmlinux with DWARF is slow and
            // a node rarely has one.
            vmlinux: MaybeDefault::None,
            ..Default::default()
        });
        match self.blaze.symbolize(&src, Input::AbsAddr(&lookup)) {
            Ok(syms) if syms.len() == addrs.len() => syms
                .iter()
                .map(|s| match s {
                    Symbolized::Sym(sym) => sym.name.to_string(),
                    Symbolized::Unknown(_) => KERNEL.to_owned(),
                })
                .collect(),
            _ => vec![KERNEL.to_owned(); addrs.len()],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn a_function_with_a_name() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn own_functions_are_named_and_garbage_is_unknown() {
        let s = Symbolizer::new();
        let me = std::process::id();
        let f = a_function_with_a_name as *const () as u64;
        let names = s.user(me, &[f + 1, 0x10], false);
        assert!(names[0].contains("a_function_with_a_name"), "{names:?}");
        assert_eq!(names[1], UNKNOWN);
        assert!(s.in_file(me, f + 1));
        assert!(!s.in_file(me, 0x10));
    }

    #[test]
    fn a_frame_in_a_refused_file_says_why() {
        use crate::reader::Refusal;
        assert_eq!(
            unreadable("[libfoo.so]", Refusal::OverBudget),
            "[libfoo.so: unreadable (over_budget)]"
        );
        for r in Refusal::ALL {
            let expected = matches!(
                r,
                Refusal::Deadline
                    | Refusal::OverBudget
                    | Refusal::Crashed
                    | Refusal::Forbidden
                    | Refusal::Malformed
                    | Refusal::Cooling
            );
            assert_eq!(r.unreadable(), expected, "{r:?}");
        }
    }

    #[test]
    fn a_gone_process_gives_unknown_frames() {
        let s = Symbolizer::new();
        // PID_MAX_LIMIT is 2^22: this PID cannot exist.
        assert_eq!(s.user(1 << 23, &[0x401000], false), vec![UNKNOWN]);
    }
}
