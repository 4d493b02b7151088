//! Addresses to function names, with blazesym (the libbpf project's symboliser) rather
//! than an ELF/DWARF reader of our own.
//!
//! User addresses are normalised first (which file of the process, at which offset: PIE
//! and ASLR undone from `/proc/PID/maps`), then looked up in that file read through
//! `/proc/PID/root`, so a container's binaries are found in its own mount namespace. That
//! is also why blazesym's own process mode is not used: it reads files either by the path
//! in the maps (the host's view: wrong in a container) or through `/proc/PID/map_files`
//! (CAP_SYS_ADMIN, which the agent does not have). Symbols come from `.symtab`/`.dynsym`
//! and DWARF when present. An address outside any file is JIT-compiled code when the
//! process's runtime writes a perf map (see `perfmap`), named from it. What cannot be
//! resolved is said, never guessed: `[unknown]` outside any file and any perf map (JIT
//! code of a runtime writing none, a garbage frame of a binary without frame pointers),
//! `[libfoo.so]` in a file without a symbol for the address.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use blazesym::{
    MaybeDefault, Pid,
    normalize::{NormalizeOpts, Normalizer, UserMeta},
    symbolize::{
        Input, Symbolized, Symbolizer as Blaze,
        source::{Elf, Kernel, Source},
    },
};

/// Name shown for an address outside any file of the process.
pub const UNKNOWN: &str = "[unknown]";
/// Name shown for kernel frames when the kernel's symbols cannot be read (no CAP_SYSLOG:
/// /proc/kallsyms shows zero addresses).
pub const KERNEL: &str = "[kernel]";

/// A symboliser kept across calls: blazesym caches each file's parsed symbols, and
/// `perf_maps` each process's JIT code names.
pub struct Symbolizer {
    normalizer: Normalizer,
    blaze: Blaze,
    perf_maps: std::sync::Mutex<super::perfmap::PerfMaps>,
    /// The names given from a perf map so far: which frames are JIT-compiled code.
    jit_names: std::sync::Mutex<std::collections::HashSet<String>>,
    /// PLT ranges per file read (`plt_ranges`).
    plt: std::sync::Mutex<HashMap<PathBuf, Vec<std::ops::Range<u64>>>>,
    /// Names of the CPython code objects of Python frames (`python::merge`).
    python: std::sync::Mutex<super::python::Names>,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    pub fn new() -> Self {
        Self {
            // Build ids are not needed to symbolise on this node, and reading them opens
            // each file by the path in the maps, which a container's files are not at.
            normalizer: Normalizer::builder().enable_build_ids(false).build(),
            blaze: Blaze::builder()
                .enable_code_info(false)
                .enable_inlined_fns(false)
                .build(),
            perf_maps: Default::default(),
            jit_names: Default::default(),
            plt: Default::default(),
            python: Default::default(),
        }
    }

    /// Names of `addrs` in process `pid`, in order; one per address.
    ///
    /// `return_addrs` says the addresses are return addresses (every frame of a stack walk
    /// but the first): they are looked up one byte back, inside the call instruction, so
    /// that a call at the very end of a function is not named after the next one.
    pub fn user(&self, pid: u32, addrs: &[u64], return_addrs: bool) -> Vec<String> {
        let mut names = vec![UNKNOWN.to_owned(); addrs.len()];
        if addrs.is_empty() || pid == 0 {
            return names;
        }
        let lookup: Vec<u64> = addrs
            .iter()
            .map(|&a| if return_addrs { a.saturating_sub(1) } else { a })
            .collect();
        if addrs.iter().any(|&a| super::python::is_python(a)) {
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
        let opts = NormalizeOpts {
            map_files: false,
            ..Default::default()
        };
        let Ok(out) = self
            .normalizer
            .normalize_user_addrs_opts(Pid::from(pid), &lookup, &opts)
        else {
            // The process is gone, or its maps are not readable.
            return names;
        };
        // File offsets grouped by file, so each file is looked up once.
        let mut by_file: HashMap<usize, Vec<(usize, u64)>> = HashMap::new();
        let mut outside_files = Vec::new();
        for (i, &(offset, meta)) in out.outputs.iter().enumerate() {
            if super::python::is_python(addrs[i]) {
                continue;
            }
            match out.meta.get(meta) {
                Some(UserMeta::Elf(_)) => by_file.entry(meta).or_default().push((i, offset)),
                Some(UserMeta::Unknown(_)) => outside_files.push(i),
                _ => {}
            }
        }
        if !outside_files.is_empty() {
            let map = self
                .perf_maps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(pid);
            if let Some(map) = map {
                let mut jit = self.jit_names.lock().unwrap_or_else(|e| e.into_inner());
                for i in outside_files {
                    if let Some(name) = map.lookup(lookup[i]) {
                        names[i] = name.to_owned();
                        jit.insert(names[i].clone());
                    }
                }
            }
        }
        for (meta, items) in by_file {
            let Some(UserMeta::Elf(elf)) = out.meta.get(meta) else {
                continue;
            };
            let file = in_mount_namespace(pid, &elf.path);
            let module = format!(
                "[{}]",
                elf.path.file_name().map_or_else(
                    || elf.path.display().to_string(),
                    |n| n.to_string_lossy().into_owned()
                )
            );
            // blazesym opens the file by path, blocking: never a FIFO put where a mapped file
            // was (it would hold the agent's loop forever).
            if !std::fs::metadata(&file).is_ok_and(|m| m.is_file()) {
                for &(i, _) in &items {
                    names[i] = module.clone();
                }
                continue;
            }
            let offsets: Vec<u64> = items.iter().map(|&(_, o)| o).collect();
            let plt = self
                .plt
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(file.clone())
                .or_insert_with(|| plt_ranges(&file))
                .clone();
            let src = Source::Elf(Elf::new(file));
            let resolved = self
                .blaze
                .symbolize(&src, Input::FileOffset(&offsets))
                .unwrap_or_default();
            for (k, &(i, offset)) in items.iter().enumerate() {
                names[i] = match resolved.get(k) {
                    Some(Symbolized::Sym(sym)) if !plt.iter().any(|r| r.contains(&offset)) => {
                        sym.name.to_string()
                    }
                    _ => module.clone(),
                };
            }
        }
        names
    }

    /// Whether `name` was given to a frame from a runtime's perf map (JIT-compiled code).
    pub fn is_jit(&self, name: &str) -> bool {
        self.jit_names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
    }

    /// Whether `addr` is in a file-backed mapping of `pid` (a plausible code address).
    pub fn in_file(&self, pid: u32, addr: u64) -> bool {
        let opts = NormalizeOpts {
            map_files: false,
            ..Default::default()
        };
        self.normalizer
            .normalize_user_addrs_opts(Pid::from(pid), &[addr.saturating_sub(1)], &opts)
            .ok()
            .and_then(|out| {
                let (_, meta) = *out.outputs.first()?;
                Some(matches!(out.meta.get(meta), Some(UserMeta::Elf(_))))
            })
            .unwrap_or(false)
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

/// A path of `pid`'s mount namespace as this process can open it.
/// File-offset ranges of an ELF file's PLT sections (`.plt`, `.plt.sec`, `.plt.got`):
/// stubs with no symbol of their own, which blazesym would name after the nearest sizeless
/// symbol below them (`_init`: 9 % of a CPython profile's leaves read so). Empty when the
/// file cannot be read.
fn plt_ranges(path: &Path) -> Vec<std::ops::Range<u64>> {
    use object::{Object, ObjectSection};
    let Ok(file) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let cache = object::ReadCache::new(file);
    let Ok(elf) = object::File::parse(&cache) else {
        return Vec::new();
    };
    elf.sections()
        .filter(|s| matches!(s.name(), Ok(".plt" | ".plt.sec" | ".plt.got")))
        .filter_map(|s| s.file_range())
        .map(|(off, size)| off..off + size)
        .collect()
}

pub(crate) fn in_mount_namespace(pid: u32, path: &Path) -> PathBuf {
    let mut p = PathBuf::from(format!("/proc/{pid}/root"));
    p.push(path.strip_prefix("/").unwrap_or(path));
    p
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
    fn plt_stubs_are_found_in_this_test_binary() {
        let exe = std::env::current_exe().expect("current exe");
        let plt = plt_ranges(&exe);
        assert!(
            !plt.is_empty() && plt.iter().all(|r| r.start < r.end),
            "{plt:?}"
        );
        assert!(plt_ranges(Path::new("/nonexistent")).is_empty());
    }

    #[test]
    fn a_gone_process_gives_unknown_frames() {
        let s = Symbolizer::new();
        // PID_MAX_LIMIT is 2^22: this PID cannot exist.
        assert_eq!(s.user(1 << 23, &[0x401000], false), vec![UNKNOWN]);
    }

    #[test]
    fn paths_are_read_through_the_process_root() {
        assert_eq!(
            in_mount_namespace(7, Path::new("/usr/lib/libc.so.6")),
            PathBuf::from("/proc/7/root/usr/lib/libc.so.6")
        );
    }
}
