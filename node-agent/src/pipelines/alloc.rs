//! The allocation pipeline (libc uprobes, as in the eHashPipe paper), attached to one
//! process at a time. Kernel side: `ebpf/src/alloc.bpf.h` (`rw_alloc_pending`,
//! `rw_alloc_ptrs`, `rw_alloc_stats`).

use std::{collections::HashSet, num::NonZeroU32};

use aya::{
    maps::HashMap as BpfHashMap,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeScope},
    },
};
use resourcewatch_ebpf::{maps, programs as progs, shared::RwAllocStats};

use super::Pipelines;
use crate::bpf::PipelineError;

/// (program, libc symbol) of allocation mode. Return probes share one program per kind.
const ALLOC_PROGRAMS: [(&str, &str); 10] = [
    (progs::MALLOC_ENTER, "malloc"),
    (progs::ALLOC_RETURN, "malloc"),
    (progs::CALLOC_ENTER, "calloc"),
    (progs::ALLOC_RETURN, "calloc"),
    (progs::REALLOC_ENTER, "realloc"),
    (progs::ALLOC_RETURN, "realloc"),
    (progs::FREE_ENTER, "free"),
    (progs::MMAP_ENTER, "mmap"),
    (progs::MMAP_RETURN, "mmap"),
    (progs::MUNMAP_ENTER, "munmap"),
];

impl Pipelines {
    /// Loads (does not attach) the libc uprobes: they are attached per target PID.
    pub(super) fn load_alloc_programs(&mut self) -> Result<(), PipelineError> {
        let unique: HashSet<&'static str> = ALLOC_PROGRAMS.iter().map(|(p, _)| *p).collect();
        for name in unique {
            let err = |source| PipelineError::Program {
                program: name,
                tracepoint: "uprobe",
                source: Box::new(source),
            };
            let prog: &mut UProbe = self
                .bpf
                .program_mut(name)
                .ok_or(PipelineError::MissingProgram(name))?
                .try_into()
                .map_err(err)?;
            prog.load().map_err(err)?;
        }
        Ok(())
    }

    /// Attaches the allocation uprobes to one process's libc.
    pub fn trace_allocations(&mut self, pid: u32) -> Result<(), PipelineError> {
        if !self.opts.allocation_mode {
            return Err(PipelineError::AllocationModeOff(pid));
        }
        if self.alloc_pids.contains(&pid) {
            return Ok(());
        }
        // Its libc opened inside its root and its symbols read within bounds (aya would
        // read the file by a path resolved outside the root, whole), attached through
        // /proc/self/fd/N of that open file at the offsets found.
        let names: Vec<&str> = ALLOC_PROGRAMS.iter().map(|(_, s)| *s).collect();
        let (libc, offsets) = crate::stacks::elf::mapped_symbol_offsets(
            pid,
            is_libc,
            &names,
            |n, w| n == w,
            crate::reader::DEADLINE,
        )
        .ok_or(PipelineError::NoLibc { pid })?;
        let libc_path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&libc));
        let scope =
            UProbeScope::OneProcess(NonZeroU32::new(pid).ok_or(PipelineError::NoLibc { pid })?);
        for ((program, symbol), off) in ALLOC_PROGRAMS.into_iter().zip(offsets) {
            let err = |source| PipelineError::Uprobe {
                pid,
                symbol,
                source: Box::new(source),
            };
            let prog: &mut UProbe = self
                .bpf
                .program_mut(program)
                .ok_or(PipelineError::MissingProgram(program))?
                .try_into()
                .map_err(err)?;
            prog.attach(UProbeAttachLocation::AbsoluteOffset(off), &libc_path, scope)
                .map_err(err)?;
        }
        self.alloc_pids.insert(pid);
        Ok(())
    }

    /// Outstanding allocated bytes per traced process.
    pub fn allocations(&self) -> Vec<(u32, RwAllocStats)> {
        let Some(map) = self.bpf.map(maps::ALLOC_STATS) else {
            return Vec::new();
        };
        let Ok(stats) = BpfHashMap::<_, u32, RwAllocStats>::try_from(map) else {
            return Vec::new();
        };
        let mut v: Vec<(u32, RwAllocStats)> = stats.iter().filter_map(Result::ok).collect();
        v.sort_by_key(|(pid, _)| *pid);
        v
    }
}

/// Whether a mapped file's name is a libc (`libc.so.6`, or `libc-2.31.so` of older glibc).
fn is_libc(base: &str) -> bool {
    base.starts_with("libc.so") || (base.starts_with("libc-") && base.ends_with(".so"))
}
