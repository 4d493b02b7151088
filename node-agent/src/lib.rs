//! The resourcewatch node agent: loads the kernel pipelines, reads them, and predicts leaks.

pub mod bpf;
pub mod capabilities;
pub mod cgroup_resolver;
pub mod daemon;
pub mod hashpipe;
pub mod leak;
pub mod pipelines;
pub mod procfs;
pub mod profile;
pub mod reader;
pub mod snapshot;
pub mod stacks;
pub mod tenant;
pub mod top;

/// Unit tests count each thread's allocations (`reader::adversarial`).
#[cfg(test)]
#[global_allocator]
static COUNTING: reader::adversarial::Counting = reader::adversarial::Counting;

/// Entry points for the fuzz targets (`node-agent/fuzz/`): everything the agent reads
/// from a workload, from bytes. Not an API.
#[doc(hidden)]
pub mod fuzzing {
    use std::{io::Write, os::fd::FromRawFd};

    use crate::stacks::{elf, maps, perfmap, python, unwind};

    /// `data` as an anonymous file, as an ELF file named in a workload's maps would be.
    fn memfd(data: &[u8]) -> Option<std::fs::File> {
        // SAFETY: a NUL-terminated name and no flags but close-on-exec.
        let fd = unsafe { libc::memfd_create(c"fuzz".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: the kernel just returned this descriptor to us alone.
        let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
        f.write_all(data).ok()?;
        Some(f)
    }

    /// An ELF file as the unwinder and the symboliser read it.
    pub fn elf_file(data: &[u8]) {
        let Some(f) = memfd(data) else { return };
        let Some(file) = f
            .try_clone()
            .ok()
            .and_then(|f| elf::ElfFile::new(f, elf::FILE_BUDGET))
        else {
            return;
        };
        let _ = unwind::Tables::from_file(&file);
        let Some(file) = elf::ElfFile::new(f, elf::FILE_BUDGET) else {
            return;
        };
        if let Some(syms) = elf::Symbols::read(&file) {
            for off in [0u64, 0x40, 0x1000, 0x1234, u64::MAX] {
                let _ = syms.name_at(off);
            }
        }
    }

    /// A `/proc/PID/maps` text.
    pub fn maps(data: &[u8]) {
        let text = String::from_utf8_lossy(data);
        for m in maps::executable(&text) {
            let _ = m.file_offset(m.range.start.wrapping_add(0x10));
        }
    }

    /// A perf map (`/tmp/perf-PID.map`).
    pub fn perf_map(data: &[u8]) {
        let map = perfmap::PerfMap::parse(data);
        for a in [0u64, 0x1000, 0x7f00_0000_0000, u64::MAX] {
            let _ = map.lookup(a);
        }
    }

    /// CPython objects in a workload's memory.
    pub fn python_memory(data: &[u8]) {
        let _ = python::code_names_in(data, 0x1000);
    }

    /// A JVM attach answer.
    pub fn jvm_reply(data: &[u8]) {
        let _ = crate::stacks::jvm::reply(&String::from_utf8_lossy(data));
    }

    /// A name from a symbol table.
    pub fn demangle(data: &[u8]) {
        let _ = elf::demangle(&String::from_utf8_lossy(data));
    }
}
