//! The CPU pipeline's user side. Kernel side: `ebpf/src/cpu.bpf.h` (sched_switch charges
//! each task's on-CPU time to the HashPipe sketch `rw_cpu_sketch` and, per CPU, to
//! `rw_oncpu`; `rw_cpu_sync` closes a running task's slice when an epoch closes).

use std::{collections::HashMap, os::fd::AsFd, sync::atomic::Ordering, time::Duration};

use aya::{
    Ebpf,
    programs::{ProgramFd, RawTracePoint},
};
use resourcewatch_ebpf::{programs as progs, shared};

use super::Pipelines;
use crate::{
    bpf::{PipelineError, run_on_cpu},
    hashpipe, procfs,
};

/// On-CPU time of every process seen in one closed epoch.
#[derive(Debug, Default)]
pub struct CpuEpoch {
    pub start_ns: u64,
    pub end_ns: u64,
    pub per_tgid: HashMap<u32, u64>,
}

impl Pipelines {
    /// Closes the current CPU epoch and returns what it measured. The new epoch starts
    /// now; the closed half is consumed (swapped to zero slot by slot) so it is empty when
    /// it becomes current again, and tasks still on a CPU are credited up to now.
    pub fn close_cpu_epoch(&self) -> CpuEpoch {
        let now = procfs::monotonic_ns();
        let epoch = self.control_word(shared::control::EPOCH);
        let old = epoch.load(Ordering::SeqCst);
        let (old_half, old_start) = ((old & 1) as usize, old & !1);
        epoch.store((now & !1) | (old_half as u64 ^ 1), Ordering::SeqCst);
        // Each CPU credits its running task's part of the closed epoch to the closed half,
        // on that CPU (see rw_cpu_sync); only then is the half complete.
        // A failure is counted in kernel_stats(); that CPU's running part is late, not lost.
        let _ = self.sync_cpus(true);

        let n = self.opts.cpu.slots();
        let half = &self.cpu_sketch.atomics()[old_half * n..(old_half + 1) * n];
        let per_tgid = hashpipe::collect(half, true);
        CpuEpoch {
            start_ns: old_start,
            end_ns: now,
            per_tgid,
        }
    }

    /// Runs rw_cpu_sync on every CPU (closing the epoch there when `close`). A CPU that
    /// is offline has nothing running to credit; any other failure is counted, the other
    /// CPUs are still done, and the first failure is returned.
    pub(super) fn sync_cpus(&self, close: bool) -> Result<(), PipelineError> {
        let mut first = Ok(());
        for cpu in 0..self.ncpus {
            match run_on_cpu(self.cpu_sync.as_fd(), cpu, close as u64) {
                Err(e) if e.raw_os_error() != Some(libc::ENXIO) => {
                    self.sync_failures.fetch_add(1, Ordering::Relaxed);
                    if first.is_ok() {
                        first = Err(PipelineError::CpuSync { cpu, source: e });
                    }
                }
                _ => {}
            }
        }
        first
    }
}

/// The program run on each CPU to learn what it is running (loaded, never attached).
pub(super) fn load_cpu_sync(bpf: &mut Ebpf) -> Result<ProgramFd, PipelineError> {
    let program = progs::CPU_SYNC;
    let err = |source| PipelineError::Program {
        program,
        tracepoint: "none (run on each CPU)",
        source: Box::new(source),
    };
    let prog: &mut RawTracePoint = bpf
        .program_mut(program)
        .ok_or(PipelineError::MissingProgram(program))?
        .try_into()
        .map_err(err)?;
    prog.load().map_err(err)?;
    prog.fd()
        .map_err(err)?
        .try_clone()
        .map_err(|e| err(aya::programs::ProgramError::IOError(e)))
}

/// Forces one context switch on every CPU. A task already running when the programs
/// attach has no switch-in recorded, so its time would be invisible until its CPU next
/// switches, which for a CPU hog on an otherwise idle core can take seconds. A short-lived
/// thread pinned to each CPU makes the scheduler switch away from it and back.
pub(super) fn prime_cpus(ncpus: u32) {
    let threads: Vec<_> = (0..ncpus)
        .map(|cpu| {
            std::thread::spawn(move || {
                // SAFETY: a zeroed cpu_set_t with one CPU set, applied to this thread only.
                unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu as usize, &mut set);
                    if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
                        return; // offline CPU: nothing runs there
                    }
                }
                for _ in 0..2 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}
