//! `unwind`: what copying and walking user stacks with unwind tables costs per CPU-profile sample, against the frame-pointer walk alone.

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use crate::{cost::SysctlGuard, fail};

/// One profile of `pid` for `seconds`: (samples, walked, kernel ns per sample, user-space
/// us per walked sample, mean user frames per sample, table MiB).
pub(crate) fn unwind_run(
    profiler: &mut resourcewatch_agent::profile::Profiler,
    pid: u32,
    seconds: u64,
    frequency: u64,
) -> (u64, u64, f64, f64, f64, f64) {
    let (cnt0, ns0) = profiler.program_stats();
    let prof = profiler
        .run(
            &resourcewatch_agent::profile::ProfileTarget {
                pids: vec![pid],
                cgroups: vec![],
            },
            frequency,
            Duration::from_secs(seconds),
            &std::sync::atomic::AtomicBool::new(false),
        )
        .unwrap_or_else(|e| fail(&format!("profile: {e}")));
    let (cnt1, ns1) = profiler.program_stats();
    let samples = prof.samples();
    // Every CPU's invocations are in the run time; the target's samples are what it buys.
    let _invocations = cnt1 - cnt0;
    let frames: u64 = prof
        .stacks
        .iter()
        .map(|s| s.user.len() as u64 * s.value)
        .sum();
    (
        samples,
        prof.walked,
        (ns1 - ns0) as f64 / samples.max(1) as f64,
        prof.walk_time.as_secs_f64() * 1e6 / prof.walked.max(1) as f64,
        frames as f64 / samples.max(1) as f64,
        prof.table_bytes as f64 / f64::from(1 << 20),
    )
}

pub(crate) fn unwind_cost(cmds: &[String], seconds: u64, frequency: u64, rounds: usize) {
    let _stats = SysctlGuard::set("/proc/sys/kernel/bpf_stats_enabled", "1");
    let mut tables = resourcewatch_agent::profile::Profiler::load(16384)
        .unwrap_or_else(|e| fail(&format!("loading the profiler: {e}")));
    let mut fp = resourcewatch_agent::profile::Profiler::load_frame_pointers_only(16384)
        .unwrap_or_else(|e| fail(&format!("loading the profiler: {e}")));
    // The same as `tables` but for CPython's frames, which it leaves unwalked: what the
    // kernel's walk of them (ebpf/src/python.bpf.h) adds is the difference.
    let mut no_py = resourcewatch_agent::profile::Profiler::load(16384)
        .unwrap_or_else(|e| fail(&format!("loading the profiler: {e}")));
    no_py.without_python_frames();
    println!(
        "{seconds} s profiles at {frequency} Hz, {rounds} rounds per mode, alternating; kernel ns per sample = the profiling program's run_time_ns over the target's samples (its early returns on other CPUs included, the same in both modes)"
    );
    println!(
        "| program | mode | samples | walked | kernel ns/sample | user-space us/walked sample | user frames/sample | tables MiB |\n|---|---|---|---|---|---|---|---|"
    );
    for (n, cmd) in cmds.iter().enumerate() {
        let mut child = Command::new("sh")
            .args(["-c", &format!("exec {cmd}")])
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| fail(&format!("{cmd}: {e}")));
        // Past start-up (a runtime's JIT and perf map).
        std::thread::sleep(Duration::from_secs(2));
        let pid = child.id();
        for round in 0..rounds {
            let order = if round % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
            for m in order {
                let (profiler, mode, key) = match m {
                    0 => (&mut tables, "copy + tables (+ Python frames)", "tables"),
                    1 => (
                        &mut no_py,
                        "copy + tables, Python frames off",
                        "tables_no_python",
                    ),
                    _ => (&mut fp, "frame pointers only", "frame_pointers"),
                };
                let (samples, walked, kns, uus, frames, mib) =
                    unwind_run(profiler, pid, seconds, frequency);
                // Each round a figure of its own: the summary's median is over every
                // round of every run. Commands are numbered in the order given.
                let fig = |what: &str, v: f64, unit: &str| {
                    crate::record::figure(&format!("cmd{}.{key}.{what}", n + 1), v, unit);
                };
                fig("kernel_ns_per_sample", kns, "ns");
                fig("user_frames_per_sample", frames, "frames");
                if walked > 0 {
                    fig("user_space_us_per_walked_sample", uus, "us");
                }
                let uus = if walked > 0 {
                    format!("{uus:.1}")
                } else {
                    "-".to_owned()
                };
                println!(
                    "| `{cmd}` | {mode} | {samples} | {walked} | {kns:.0} | {uus} | {frames:.1} | {mib:.2} |"
                );
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
