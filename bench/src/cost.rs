//! `cost` and `profile`: ns per event of each program (kernel.bpf_stats_enabled), the `perf bench sched pipe` ratio with and without the pipelines, and what a CPU profile costs the profiled process.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use resourcewatch_agent::pipelines::{PipelineOptions, Pipelines};

use crate::{
    Capture, fail,
    workload::{Workload, fork},
};

pub(crate) struct SysctlGuard {
    path: &'static str,
    old: String,
}

impl SysctlGuard {
    pub(crate) fn set(path: &'static str, value: &str) -> SysctlGuard {
        let old = std::fs::read_to_string(path).unwrap_or_else(|e| fail(&format!("{path}: {e}")));
        std::fs::write(path, value).unwrap_or_else(|e| fail(&format!("{path}: {e}")));
        SysctlGuard { path, old }
    }
}

impl Drop for SysctlGuard {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path, self.old.trim());
    }
}

pub(crate) fn perf_pipe(loops: u64, pin: Option<u32>) -> f64 {
    let mut cmd = match pin {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.args(["-c", &cpu.to_string(), "perf"]);
            c
        }
        None => Command::new("perf"),
    };
    let out = cmd
        .args(["bench", "sched", "pipe", "-l", &loops.to_string()])
        .stderr(Stdio::null())
        .output()
        .unwrap_or_else(|e| fail(&format!("perf bench (install linux-perf): {e}")));
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Total time:")
                .and_then(|r| r.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or_else(|| fail(&format!("unexpected perf output: {text}")))
}

/// Page-fault heavy work: map, touch and unmap 64 MiB, `rounds` times.
pub(crate) fn fault_storm(rounds: usize) {
    let pid = fork(move || {
        for _ in 0..rounds {
            drop(resourcewatch_workloads::Chunk::new(64 << 20));
        }
    });
    // SAFETY: waiting for our child.
    unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), 0) };
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[m - 1] + v[m]) / 2.0
    } else {
        v[m]
    }
}

/// The empty programs (ebpf/src/floor.bpf.c) attached to the tracepoints ours use;
/// detached when dropped.
pub(crate) fn attach_floor() -> aya::Ebpf {
    let btf = aya::Btf::from_sys_fs().unwrap_or_else(|e| fail(&e));
    let mut bpf = aya::Ebpf::load(resourcewatch_ebpf::FLOOR_OBJECT).unwrap_or_else(|e| fail(&e));
    for (name, tp) in [
        ("floor_sched_switch", "sched_switch"),
        ("floor_rss_stat", "rss_stat"),
    ] {
        let p: &mut aya::programs::BtfTracePoint = bpf
            .program_mut(name)
            .and_then(|p| p.try_into().ok())
            .unwrap_or_else(|| fail(&name));
        p.load(tp, &btf).unwrap_or_else(|e| fail(&e));
        p.attach().unwrap_or_else(|e| fail(&e));
    }
    bpf
}

/// ns/event of the empty programs: the measurement floor.
pub(crate) fn floor(loops: u64) -> Vec<(String, f64)> {
    use std::os::fd::{AsFd, AsRawFd};
    let bpf = attach_floor();
    perf_pipe(loops, None);
    fault_storm(20);
    let mut out = Vec::new();
    for (name, prog) in bpf.programs() {
        let Ok(fd) = prog.fd() else { continue };
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_fd().as_raw_fd()))
            .unwrap_or_default();
        let f = |k: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        if f("run_cnt:") > 0.0 {
            out.push((name.to_owned(), f("run_time_ns:") / f("run_cnt:")));
        }
    }
    out
}

/// One run of the profiled worker: a forked child pinned to `cpu` runs `work` iterations
/// of a multiply-add loop and reports its wall time through a pipe. With `profiler`, the
/// child is sampled at `frequency` for its whole run.
pub(crate) fn profiled_run(
    cpu: usize,
    work: u64,
    profiler: Option<(&mut resourcewatch_agent::profile::Profiler, u64)>,
) -> (Duration, u64) {
    let mut fds = [0; 2];
    // SAFETY: a pipe into a local array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: the child only computes, writes to the pipe and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: pinning this child; plain arithmetic; writing 8 bytes; _exit.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
            // Wait for the profiler to be attached (or not): 200 ms.
            std::thread::sleep(Duration::from_millis(200));
            let start = Instant::now();
            let mut x = 0u64;
            for i in 0..work {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            let ns = start.elapsed().as_nanos() as u64;
            libc::write(fds[1], (&ns as *const u64).cast(), 8);
            libc::_exit((x & 1) as i32);
        }
    }
    let pid = pid as u32;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let samples = std::thread::scope(|scope| {
        let stop = &stop;
        let sampler = profiler.map(|(p, freq)| {
            scope.spawn(move || {
                p.run(
                    &resourcewatch_agent::profile::ProfileTarget {
                        pids: vec![pid],
                        cgroups: vec![],
                    },
                    freq,
                    Duration::from_secs(600),
                    stop,
                )
                .map(|prof| prof.samples())
                .unwrap_or_else(|e| fail(&format!("profile: {e}")))
            })
        });
        let mut ns = 0u64;
        // SAFETY: reading 8 bytes from our pipe.
        let n = unsafe { libc::read(fds[0], (&mut ns as *mut u64).cast(), 8) };
        assert_eq!(n, 8, "the worker's time");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: reaping our child.
        unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), 0) };
        (
            Duration::from_nanos(ns),
            sampler.map_or(0, |h| h.join().expect("sampler")),
        )
    });
    // SAFETY: closing our pipe.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    samples
}

pub(crate) fn profile_cost(pairs: usize, frequency: u64, work: u64) {
    let mut profiler = resourcewatch_agent::profile::Profiler::load(16384)
        .unwrap_or_else(|e| fail(&format!("loading the profiler: {e}")));
    let cpu = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
    println!(
        "profiled worker: {work} iterations pinned to CPU {cpu}, sampled at {frequency} Hz; {pairs} pairs, the order alternating"
    );
    println!("| pair | without | with | samples | ratio |\n|---|---|---|---|---|");
    let mut ratios = Vec::new();
    for i in 0..pairs {
        let mut without = Duration::ZERO;
        let mut with = (Duration::ZERO, 0);
        for first in [i % 2 == 0, i % 2 != 0] {
            if first {
                without = profiled_run(cpu, work, None).0;
            } else {
                with = profiled_run(cpu, work, Some((&mut profiler, frequency)));
            }
        }
        let ratio = with.0.as_secs_f64() / without.as_secs_f64();
        ratios.push(ratio);
        println!(
            "| {} | {:.3} s | {:.3} s | {} | x{ratio:.4} |",
            i + 1,
            without.as_secs_f64(),
            with.0.as_secs_f64(),
            with.1
        );
    }
    ratios.sort_by(f64::total_cmp);
    crate::record::figure("profiled.median_ratio", ratios[ratios.len() / 2], "x");
    println!(
        "median ratio x{:.4} (min x{:.4}, max x{:.4})",
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1]
    );
}

/// A process for a growth-site capture to list: idle, or the fault storm itself (it
/// sleeps 300 ms so the capture is in place before its first fault).
pub(crate) fn capture_target(pipes: &mut Pipelines, capture: Capture) -> Workload {
    let pid = match capture {
        Capture::Other => fork(|| std::thread::sleep(Duration::from_secs(3600))),
        Capture::Own => fork(|| {
            std::thread::sleep(Duration::from_millis(300));
            // One growing round: every event is a page of growth.
            drop(resourcewatch_workloads::Chunk::new(256 << 20));
        }),
    };
    std::thread::sleep(Duration::from_millis(50));
    pipes.capture_growth_sites(pid).unwrap_or_else(|e| fail(&e));
    Workload { pids: vec![pid] }
}

/// ns per event of each program against an empty program on the same tracepoint.
fn per_event_cost(loops: u64, capture: Option<Capture>) {
    let _stats = SysctlGuard::set("/proc/sys/kernel/bpf_stats_enabled", "1");
    // One method for every figure: the kernel's run_time_ns / run_cnt of our program,
    // and of an empty program on the same tracepoint under the same load, measured in
    // the same invocation; the difference is our programs' own work (the empty one is
    // what the accounting itself reports, two clock reads around each run).
    let floors = floor(loops);
    let mut pipes = Pipelines::load(PipelineOptions::default()).unwrap_or_else(|e| fail(&e));
    let mut target = capture.map(|c| capture_target(&mut pipes, c));
    perf_pipe(loops, None);
    match (capture, &mut target) {
        (Some(Capture::Own), Some(t)) => {
            // SAFETY: waiting for our own child (its storm ends it); reaped, it is no
            // longer the Workload's to kill.
            unsafe { libc::waitpid(t.pids[0] as i32, std::ptr::null_mut(), 0) };
            t.pids.clear();
        }
        _ => fault_storm(20),
    }
    std::thread::sleep(Duration::from_millis(200));
    if let Some(c) = capture {
        println!(
            "with a growth-site capture running on {c:?} (RW_STAT stacks lost: {})",
            pipes.kernel_stats().stacks_lost
        );
    }
    println!("| program | events | ns/event | empty program, same tracepoint | over it |");
    println!("|---|---|---|---|---|");
    for s in pipes.program_stats().iter().filter(|s| s.run_cnt > 0) {
        let ns = s.run_time_ns as f64 / s.run_cnt as f64;
        let empty = s
            .name
            .strip_prefix("rw_")
            .and_then(|t| {
                floors
                    .iter()
                    .find(|(f, _)| f.strip_prefix("floor_") == Some(t))
            })
            .map(|(_, f)| *f);
        crate::record::figure(&format!("{}.ns_per_event", s.name), ns, "ns");
        if let Some(f) = empty {
            crate::record::figure(&format!("{}.empty_program_ns", s.name), f, "ns");
            crate::record::figure(&format!("{}.over_empty_ns", s.name), ns - f, "ns");
        }
        match empty {
            Some(f) => println!(
                "| {} | {} | {ns:.1} | {f:.1} | {:.1} |",
                s.name,
                s.run_cnt,
                ns - f
            ),
            None => println!("| {} | {} | {ns:.1} | | |", s.name, s.run_cnt),
        }
    }
}

pub(crate) fn cost(runs: usize, loops: u64, pin: Option<u32>, capture: Option<Capture>) {
    per_event_cost(loops, capture);
    if runs == 0 {
        return;
    }
    // Stats accounting itself costs time per event, so it is off for the ratio runs.
    // Each round runs the benchmark three times: alone, with the agent's pipelines, and
    // with only the empty programs on the same tracepoints (the floor: what any eBPF
    // program there costs). The order rotates from round to round, so a drift of the
    // machine during a round favours none of the three.
    #[derive(Clone, Copy, PartialEq)]
    enum Arm {
        Without,
        Agent,
        Floor,
    }
    let arms = [Arm::Without, Arm::Agent, Arm::Floor];
    let (mut with, mut without, mut floored) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ratios, mut floor_ratios) = (Vec::new(), Vec::new());
    perf_pipe(loops, pin); // warm-up
    for round in 0..runs {
        let mut t = [0.0; 3];
        for i in 0..3 {
            let arm = arms[(round + i) % 3];
            t[arm as usize] = match arm {
                Arm::Without => perf_pipe(loops, pin),
                Arm::Agent => {
                    let mut pipes =
                        Pipelines::load(PipelineOptions::default()).unwrap_or_else(|e| fail(&e));
                    let target = capture.map(|_| capture_target(&mut pipes, Capture::Other));
                    let t = perf_pipe(loops, pin);
                    drop(target);
                    drop(pipes);
                    t
                }
                Arm::Floor => {
                    let empty = attach_floor();
                    let t = perf_pipe(loops, pin);
                    drop(empty);
                    t
                }
            };
        }
        let [base, agent, empty] = t;
        ratios.push(agent / base);
        floor_ratios.push(empty / base);
        with.push(agent);
        without.push(base);
        floored.push(empty);
    }
    print_ratios(
        loops,
        pin,
        runs,
        (without, with, floored),
        (ratios, floor_ratios),
    );
}

/// The times of each arm and the ratios to the run without, their medians first.
fn print_ratios(
    loops: u64,
    pin: Option<u32>,
    runs: usize,
    (without, with, floored): (Vec<f64>, Vec<f64>, Vec<f64>),
    (ratios, floor_ratios): (Vec<f64>, Vec<f64>),
) {
    crate::record::figure("perf_pipe.agent_median_ratio", median(ratios.clone()), "x");
    crate::record::figure(
        "perf_pipe.empty_programs_median_ratio",
        median(floor_ratios.clone()),
        "x",
    );
    crate::record::figure(
        "perf_pipe.agent_over_empty",
        median(ratios.clone()) / median(floor_ratios.clone()),
        "x",
    );
    let rounded = |v: &[f64]| {
        v.iter()
            .map(|r| (r * 1000.0).round() / 1000.0)
            .collect::<Vec<_>>()
    };
    println!(
        "\nperf bench sched pipe -l {loops}{}, {runs} rounds (without, agent, empty programs; order rotating): \
         medians without {:.3}s, agent {:.3}s, empty programs {:.3}s\n\
         agent: median ratio x{:.3}; ratios {:?}\n\
         empty programs (the floor): median ratio x{:.3}; ratios {:?}",
        pin.map(|c| format!(" pinned to CPU {c}"))
            .unwrap_or_default(),
        median(without),
        median(with),
        median(floored),
        median(ratios.clone()),
        rounded(&ratios),
        median(floor_ratios.clone()),
        rounded(&floor_ratios),
    );
}
