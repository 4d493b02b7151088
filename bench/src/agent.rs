//! `agent`: CPU and RSS of `resourcewatch-agent top --json` at a given interval.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use resourcewatch_agent::procfs;

use crate::{
    cost::SysctlGuard,
    fail,
    workload::{Shape, Skew, spawn_workload},
};

pub(crate) fn proc_cpu_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = s.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

pub(crate) fn status_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| procfs::kib_field(&s, key))
        .unwrap_or(0)
        / 1024
}

pub(crate) fn agent(interval: Duration, duration: Duration, with_workload: bool) {
    let _w = with_workload.then(|| {
        spawn_workload(
            200,
            20,
            1,
            Shape {
                skew: Skew::default(),
                memory_cycle: None,
            },
        )
    });
    let exe = std::env::current_exe().unwrap_or_else(|e| fail(&e));
    let agent = exe.with_file_name("resourcewatch-agent");
    let ms = format!("{}ms", interval.as_millis());
    let mut child = Command::new(&agent)
        .args(["top", "--json", "-k", "30", "--interval", &ms])
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| fail(&format!("{}: {e}", agent.display())));
    let pid = child.id();
    // The programs' own run time is counted only while this is on; it runs in the context
    // of whatever task hit the tracepoint, so the agent's utime + stime never include it.
    let _stats = SysctlGuard::set("/proc/sys/kernel/bpf_stats_enabled", "1");
    // Skip start-up (loading, verification, seeding) and measure the steady state.
    std::thread::sleep(Duration::from_secs(5));
    let tick = 100.0; // USER_HZ
    let t0 = Instant::now();
    let c0 = proc_cpu_ticks(pid).unwrap_or_else(|| fail(&"the agent exited early"));
    let k0 = bpf_run_time_ns(pid);
    std::thread::sleep(duration);
    let c1 = proc_cpu_ticks(pid).unwrap_or_else(|| fail(&"the agent exited early"));
    let k1 = bpf_run_time_ns(pid);
    let secs = t0.elapsed().as_secs_f64();
    let rss = status_kb(pid, "VmRSS:");
    let hwm = status_kb(pid, "VmHWM:");
    let _ = child.kill();
    let _ = child.wait();
    let user_system = 100.0 * (c1 - c0) as f64 / tick / secs;
    let programs = 100.0 * k1.saturating_sub(k0) as f64 / 1e9 / secs;
    crate::record::figure("agent.percent_of_a_core", user_system + programs, "%");
    crate::record::figure("agent.user_system", user_system, "%");
    crate::record::figure("agent.ebpf_programs", programs, "%");
    crate::record::figure("agent.rss", rss as f64 / 1024.0, "MiB");
    crate::record::figure("agent.peak_rss", hwm as f64 / 1024.0, "MiB");
    println!(
        "agent at --interval {ms}{}: CPU {:.3} % of a core over {secs:.0}s = {user_system:.3} % user + system (/proc/PID/stat) + {programs:.3} % its eBPF programs (run_time_ns of the programs it holds, kernel.bpf_stats_enabled=1); RSS {:.1} MiB (peak {:.1} MiB)",
        if with_workload {
            " with 200 processes + churn"
        } else {
            ""
        },
        user_system + programs,
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
}

/// Total run time of the BPF programs process `pid` holds open (their fdinfo's
/// `run_time_ns`, counted while kernel.bpf_stats_enabled=1).
pub(crate) fn bpf_run_time_ns(pid: u32) -> u64 {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return 0;
    };
    fds.filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter(|info| info.lines().any(|l| l.starts_with("prog_id:")))
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("run_time_ns:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .sum()
}
