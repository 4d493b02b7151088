//! `compare`: what the agent costs against what a user would otherwise run for the same
//! figures at the same interval, each alone on one workload:
//!
//! - **/proc poller**: every interval, list /proc and read each process's `stat` and
//!   `statm`, then rank by the CPU time since the last pass and by resident size. This is
//!   what `top`, Inspektor Gadget's `top` gadgets (on kernels without their eBPF
//!   iterators) and per-process exporters do; it is written here rather than run as
//!   `top -b` so that both sides produce the same two Top-K lists and nothing else
//!   (no terminal rendering, no per-user lookups) is counted against the poller.
//! - **competent /proc poller**: the same lists from one file per process (`stat` holds
//!   the resident size too), read into one buffer reused across processes and passes,
//!   its path written into a reused buffer, parsed in place: what a careful poller
//!   (procps' `readproc` with its reused buffers) costs.
//! - **cgroup reader**: every interval, each targeted container's `cpuacct.usage`,
//!   `memory.usage_in_bytes` and `memory.stat` (v1; `cpu.stat`, `memory.current`,
//!   `memory.stat` on v2), what cAdvisor-style per-container readers do. It gives
//!   per-container figures only, no process Top-K.
//! - **agent**: `resourcewatch-agent top --json -k K --interval I`, exact tracking of the
//!   same containers (`--target-cgroup`), its user and system CPU plus the kernel time of
//!   its eBPF programs (`run_time_ns` of each program it holds, `kernel.bpf_stats_enabled`).
//!
//! The pollers' cost is their thread's CPU time (user + system: the /proc and cgroupfs
//! reads are system time). The workload: `procs` long-lived processes, the first 50 busy
//! on a geometric duty cycle, the rest asleep and waking once a second, plus `churn`
//! short-lived processes a second; spread round-robin over `containers` memory cgroups.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    agent::{proc_cpu_ticks, status_kb},
    cost::SysctlGuard,
    fail,
    workload::{Workload, duty_cycle, fork, thread_cpu_ns},
};

/// One tool's cost over a run.
struct Cost {
    /// User + system CPU of the tool's process or thread, seconds.
    cpu_s: f64,
    /// Kernel time of its eBPF programs, seconds (the agent only).
    bpf_s: f64,
    /// eBPF program runs (the agent only).
    bpf_runs: u64,
    wall_s: f64,
    passes: u64,
    /// The agent's resident memory at the end and its peak, KiB.
    rss_kib: Option<(u64, u64)>,
    /// The agent's own account of the work it did (the agent only).
    work: Option<Work>,
}

/// What an agent printed over a run (`top --json`, a frame per line): that it did the
/// work measured, not a part of it.
#[derive(Clone, Debug, Default)]
struct Work {
    frames: u64,
    /// Every process that appeared among the exactly tracked ones.
    tracked: std::collections::HashSet<u64>,
    /// The kernel's counters in the last frame: processes spilled out of the slot table,
    /// and tracked processes dropped (the spill map full).
    spilled: u64,
    dropped: u64,
}

impl Work {
    fn frame(&mut self, line: &str) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            return;
        };
        self.frames += 1;
        for row in v["targets"].as_array().into_iter().flatten() {
            if let Some(pid) = row["pid"].as_u64() {
                self.tracked.insert(pid);
            }
        }
        self.spilled = v["kernel"]["targets_spilled"].as_u64().unwrap_or(0);
        self.dropped = v["kernel"]["targets_full"].as_u64().unwrap_or(0);
    }

    /// Why the run does not count, if it does not: the agent printed fewer than half the
    /// frames its interval gives, tracked fewer than the `expected` processes, or dropped
    /// some.
    fn check(&self, passes: u64, expected: usize) -> Result<(), String> {
        if self.frames < passes / 2 {
            return Err(format!(
                "{} frames printed in {passes} intervals: it did not do the work measured",
                self.frames
            ));
        }
        if self.tracked.len() < expected {
            return Err(format!(
                "tracked {} of the {expected} processes in the containers",
                self.tracked.len()
            ));
        }
        if self.dropped > 0 {
            return Err(format!(
                "dropped {} tracked processes (its maps were full)",
                self.dropped
            ));
        }
        Ok(())
    }
}

impl Cost {
    fn percent(&self) -> f64 {
        100.0 * (self.cpu_s + self.bpf_s) / self.wall_s
    }
}

/// The containers' cgroups, made for the run and removed after it.
struct Containers {
    v1: bool,
    dirs: Vec<PathBuf>,
    cpu_dirs: Vec<PathBuf>,
}

impl Containers {
    fn create(n: usize) -> Containers {
        let v1 = Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists();
        let (mem_root, cpu_root) = if v1 {
            (
                PathBuf::from("/sys/fs/cgroup/memory/rw-compare"),
                Some(PathBuf::from("/sys/fs/cgroup/cpuacct/rw-compare")),
            )
        } else {
            (PathBuf::from("/sys/fs/cgroup/rw-compare"), None)
        };
        let mut dirs = Vec::new();
        let mut cpu_dirs = Vec::new();
        for i in 0..n {
            let d = mem_root.join(format!("c{i}"));
            std::fs::create_dir_all(&d).unwrap_or_else(|e| fail(&format!("{}: {e}", d.display())));
            dirs.push(d);
            if let Some(root) = &cpu_root {
                let c = root.join(format!("c{i}"));
                std::fs::create_dir_all(&c)
                    .unwrap_or_else(|e| fail(&format!("{}: {e}", c.display())));
                cpu_dirs.push(c);
            }
        }
        Containers { v1, dirs, cpu_dirs }
    }

    fn enter(&self, i: usize, pid: u32) {
        let i = i % self.dirs.len();
        for d in std::iter::once(&self.dirs[i]).chain(self.cpu_dirs.get(i)) {
            std::fs::write(d.join("cgroup.procs"), pid.to_string())
                .unwrap_or_else(|e| fail(&format!("{}: {e}", d.display())));
        }
    }

    /// The files a per-container reader reads each interval.
    fn files(&self) -> Vec<PathBuf> {
        let mut f = Vec::new();
        for (i, d) in self.dirs.iter().enumerate() {
            if self.v1 {
                f.push(self.cpu_dirs[i].join("cpuacct.usage"));
                f.push(d.join("memory.usage_in_bytes"));
            } else {
                f.push(d.join("cpu.stat"));
                f.push(d.join("memory.current"));
            }
            f.push(d.join("memory.stat"));
        }
        f
    }
}

impl Drop for Containers {
    fn drop(&mut self) {
        // The workload is killed first (its Drop runs before this one's: declared later).
        for d in self.dirs.iter().chain(&self.cpu_dirs) {
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        for d in self.dirs.iter().chain(&self.cpu_dirs).take(1) {
            if let Some(root) = d.parent() {
                let _ = std::fs::remove_dir(root);
            }
        }
        if let Some(root) = self.cpu_dirs.first().and_then(|d| d.parent()) {
            let _ = std::fs::remove_dir(root);
        }
    }
}

/// The workload described in the module's comment, its processes in `containers`.
/// The workload of one comparison.
#[derive(Clone, Copy, Debug)]
pub struct Mix {
    pub procs: usize,
    pub busy: usize,
    pub containers: usize,
    pub churn: u32,
}

fn spawn(mix: Mix, containers: &Containers) -> Workload {
    let Mix {
        procs, busy, churn, ..
    } = mix;
    let mut pids = Vec::with_capacity(procs + 1);
    for i in 0..procs {
        let pid = if i < busy.min(50) {
            let duty = 0.05 * 0.93f64.powi(i as i32);
            fork(move || duty_cycle(duty, Duration::from_millis(20)))
        } else if i < busy {
            // 6 us every 20 ms: a process that wakes often and does little (a poller, a
            // request loop), 50 context switches a second each.
            fork(|| duty_cycle(0.0003, Duration::from_millis(20)))
        } else {
            fork(|| {
                crate::workload::touch_anon(256 << 10);
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            })
        };
        containers.enter(i, pid);
        pids.push(pid);
    }
    if churn > 0 {
        let gap = Duration::from_secs(1) / churn;
        let spawner = fork(move || {
            loop {
                fork(|| {
                    crate::workload::touch_anon(1 << 20);
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_millis(2) {
                        std::hint::spin_loop();
                    }
                });
                // SAFETY: non-blocking reaping of our own children.
                while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
                std::thread::sleep(gap);
            }
        });
        containers.enter(0, spawner);
        pids.push(spawner);
    }
    Workload { pids }
}

/// Runs `pass` every `interval` on a thread of its own for `duration`; its CPU time.
fn poll(interval: Duration, duration: Duration, mut pass: impl FnMut() + Send) -> Cost {
    std::thread::scope(|s| {
        s.spawn(|| {
            let c0 = thread_cpu_ns();
            let t0 = Instant::now();
            let mut next = t0;
            let mut passes = 0;
            while t0.elapsed() < duration {
                pass();
                passes += 1;
                next += interval;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            Cost {
                cpu_s: (thread_cpu_ns() - c0) as f64 / 1e9,
                bpf_s: 0.0,
                bpf_runs: 0,
                wall_s: t0.elapsed().as_secs_f64(),
                passes,
                rss_kib: None,
                work: None,
            }
        })
        .join()
        .unwrap_or_else(|_| fail(&"a poller panicked"))
    })
}

/// One /proc pass: every process's CPU time and resident size, ranked.
fn proc_pass(k: usize, prev: &mut HashMap<u32, u64>, page: u64) -> usize {
    let mut cpu: Vec<(u64, u32)> = Vec::new();
    let mut mem: Vec<(u64, u32)> = Vec::new();
    let mut seen = HashMap::with_capacity(prev.len());
    let Ok(dir) = std::fs::read_dir("/proc") else {
        fail(&"cannot list /proc")
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        // A process that exits between the listing and the read is skipped, as top does.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Ok(statm) = std::fs::read_to_string(format!("/proc/{pid}/statm")) else {
            continue;
        };
        let Some(rest) = stat.rsplit_once(')').map(|r| r.1) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let rss = statm
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * page;
        let delta = ticks.saturating_sub(prev.get(&pid).copied().unwrap_or(ticks));
        seen.insert(pid, ticks);
        cpu.push((delta, pid));
        mem.push((rss, pid));
    }
    *prev = seen;
    let n = cpu.len();
    for list in [&mut cpu, &mut mem] {
        if list.len() > k {
            list.select_nth_unstable_by(k, |a, b| b.cmp(a));
            list.truncate(k);
        }
        list.sort_unstable_by(|a, b| b.cmp(a));
    }
    std::hint::black_box((&cpu, &mem));
    n
}

/// What the competent poller keeps across passes: path and file buffers, the two lists.
type LeanBuffers = (String, Vec<u8>, Vec<(u64, u32)>, Vec<(u64, u32)>);

/// The competent pass: the same two lists from `/proc/PID/stat` alone (`utime`, `stime`
/// and `rss` are its fields 14, 15 and 24), with the path and the contents in buffers
/// reused across processes and passes, parsed without allocating.
fn proc_pass_lean(
    k: usize,
    prev: &mut HashMap<u32, u64>,
    seen: &mut HashMap<u32, u64>,
    bufs: &mut LeanBuffers,
    page: u64,
) -> usize {
    use std::{fmt::Write as _, io::Read as _};
    let (path, content, cpu, mem) = bufs;
    cpu.clear();
    mem.clear();
    seen.clear();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        fail(&"cannot list /proc")
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        path.clear();
        let _ = write!(path, "/proc/{pid}/stat");
        content.clear();
        let Ok(mut f) = std::fs::File::open(&*path) else {
            continue;
        };
        if f.read_to_end(content).is_err() {
            continue;
        }
        // After the command's closing parenthesis: field 3 (state) onwards.
        let Some(close) = content.iter().rposition(|&b| b == b')') else {
            continue;
        };
        let num = |field: usize| -> u64 {
            content[close + 1..]
                .split(|&b| b == b' ')
                .filter(|s| !s.is_empty())
                .nth(field - 3)
                .map_or(0, |s| {
                    s.iter()
                        .take_while(|b| b.is_ascii_digit())
                        .fold(0, |n, &b| n * 10 + u64::from(b - b'0'))
                })
        };
        let ticks = num(14) + num(15);
        let rss = num(24) * page;
        let delta = ticks.saturating_sub(prev.get(&pid).copied().unwrap_or(ticks));
        seen.insert(pid, ticks);
        cpu.push((delta, pid));
        mem.push((rss, pid));
    }
    std::mem::swap(prev, seen);
    let n = cpu.len();
    for list in [&mut *cpu, &mut *mem] {
        if list.len() > k {
            list.select_nth_unstable_by(k, |a, b| b.cmp(a));
            list.truncate(k);
        }
        list.sort_unstable_by(|a, b| b.cmp(a));
    }
    std::hint::black_box((&cpu, &mem));
    n
}

/// The kernel time and runs of every eBPF program `pid` holds open.
fn bpf_of(pid: u32) -> (u64, u64) {
    let (mut ns, mut runs) = (0, 0);
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return (0, 0);
    };
    for fd in fds.flatten() {
        let Ok(info) = std::fs::read_to_string(fd.path()) else {
            continue;
        };
        if !info.contains("prog_type:") {
            continue;
        }
        let field = |key: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        ns += field("run_time_ns:");
        runs += field("run_cnt:");
    }
    (ns, runs)
}

/// The agent's cost over `duration`, and its account of the work, checked: at least
/// `expected` processes tracked (those in `targets`).
fn agent(
    k: usize,
    interval: Duration,
    duration: Duration,
    (targets, expected): (&[PathBuf], usize),
    changed_rows: bool,
) -> Cost {
    let exe = std::env::current_exe().unwrap_or_else(|e| fail(&e));
    let bin = exe.with_file_name("resourcewatch-agent");
    let ms = format!("{}ms", interval.as_millis());
    let mut cmd = Command::new(&bin);
    cmd.args(["top", "--json", "-k", &k.to_string(), "--interval", &ms]);
    for d in targets {
        cmd.arg("--target-cgroup").arg(d);
    }
    if changed_rows {
        cmd.arg("--changed-rows");
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| fail(&format!("{}: {e}", bin.display())));
    let pid = child.id();
    let work = std::sync::Arc::new(std::sync::Mutex::new(Work::default()));
    let reader = child.stdout.take().map(|out| {
        let work = work.clone();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                work.lock().unwrap_or_else(|e| e.into_inner()).frame(&line);
            }
        })
    });
    // Loading, verification and the first seeding are start-up, not steady state.
    std::thread::sleep(Duration::from_secs(5));
    let gone = || fail(&"the agent exited early (run it alone to see why)");
    let (c0, (b0, r0), t0) = (
        proc_cpu_ticks(pid).unwrap_or_else(gone),
        bpf_of(pid),
        Instant::now(),
    );
    std::thread::sleep(duration);
    let (c1, (b1, r1)) = (proc_cpu_ticks(pid).unwrap_or_else(gone), bpf_of(pid));
    let wall_s = t0.elapsed().as_secs_f64();
    let rss_kib = Some((status_kb(pid, "VmRSS:"), status_kb(pid, "VmHWM:")));
    let _ = child.kill();
    let _ = child.wait();
    if let Some(r) = reader {
        let _ = r.join();
    }
    let work = work.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let passes = (wall_s / interval.as_secs_f64()) as u64;
    let what = if changed_rows {
        "the agent (--changed-rows)"
    } else {
        "the agent"
    };
    if let Err(why) = work.check(passes, expected) {
        fail(&format!("{what}: {why}"));
    }
    Cost {
        cpu_s: (c1 - c0) as f64 / 100.0,
        bpf_s: (b1 - b0) as f64 / 1e9,
        bpf_runs: r1 - r0,
        wall_s,
        passes,
        rss_kib,
        work: Some(work),
    }
}

pub fn compare(
    mix: Mix,
    k: usize,
    interval: Duration,
    duration: Duration,
    untargeted: bool,
    changed_rows: bool,
) {
    let Mix {
        procs,
        busy,
        containers,
        churn,
    } = mix;
    let _stats = SysctlGuard::set("/proc/sys/kernel/bpf_stats_enabled", "1");
    let cg = Containers::create(containers.max(1));
    let _workload = spawn(mix, &cg);
    // Let every process start and settle.
    std::thread::sleep(Duration::from_secs(5));
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;

    let mut prev = HashMap::new();
    let mut seen = 0;
    proc_pass(k, &mut prev, page);
    let poller = poll(interval, duration, || seen = proc_pass(k, &mut prev, page));
    let (mut prev, mut scratch, mut bufs) = (HashMap::new(), HashMap::new(), Default::default());
    proc_pass_lean(k, &mut prev, &mut scratch, &mut bufs, page);
    let lean = poll(interval, duration, || {
        proc_pass_lean(k, &mut prev, &mut scratch, &mut bufs, page);
    });

    let files = cg.files();
    let reader = cgroup_reader(&files, interval, duration);

    let agent_run = agent(k, interval, duration, (&cg.dirs, procs), false);
    // The same agent printing only the tracked processes' rows that changed.
    let changed = changed_rows.then(|| agent(k, interval, duration, (&cg.dirs, procs), true));
    // The same agent with no exact tracking: the sketches alone.
    let sketch_only = untargeted.then(|| agent(k, interval, duration, (&[], 0), false));
    let agent = agent_run;

    println!(
        "{procs} long-lived processes ({busy} waking every 20 ms, the rest once a second) + \
         {churn}/s short-lived ({seen} in /proc at the last pass), {containers} containers, \
         K = {k}, every {} ms, {} s each, one after the other:\n",
        interval.as_millis(),
        duration.as_secs()
    );
    let agents = [
        ("resourcewatch-agent top", Some(&agent)),
        ("resourcewatch-agent top --changed-rows", changed.as_ref()),
        (
            "resourcewatch-agent top, no exact targets",
            sketch_only.as_ref(),
        ),
    ];
    let reader_name = format!(
        "cgroup reader ({} files per pass, per-container only)",
        files.len()
    );
    let rows: Vec<(String, &Cost, String)> = agents
        .into_iter()
        .filter_map(|(name, c)| c.map(|c| (name.to_owned(), c, bpf_time(c))))
        .chain([
            (
                "/proc poller (stat + statm of every process)".into(),
                &poller,
                "-".into(),
            ),
            (
                "competent /proc poller (stat only, buffers reused)".into(),
                &lean,
                "-".into(),
            ),
            (reader_name, &reader, "-".into()),
        ])
        .collect();
    print_costs(&rows, agent.percent());
    let keys = [
        ("agent", Some(&agent)),
        ("agent_changed_rows", changed.as_ref()),
        ("agent_topk_only", sketch_only.as_ref()),
        ("proc_poller", Some(&poller)),
        ("competent_poller", Some(&lean)),
        ("cgroup_reader", Some(&reader)),
    ];
    for (key, c) in keys {
        if let Some(c) = c {
            record_cost(key, c, agent.percent());
        }
    }
}

/// A tool's figures for a kept run (`--keep`): its share of a core and what it is made of.
fn record_cost(key: &str, c: &Cost, agent_percent: f64) {
    use crate::record::figure;
    figure(&format!("{key}.percent_of_a_core"), c.percent(), "%");
    figure(
        &format!("{key}.x_agent"),
        c.percent() / agent_percent.max(1e-9),
        "x",
    );
    figure(&format!("{key}.user_system_cpu"), c.cpu_s, "s");
    if c.bpf_runs > 0 {
        figure(&format!("{key}.ebpf_time"), c.bpf_s, "s");
        figure(
            &format!("{key}.ebpf_ns_per_run"),
            c.bpf_s * 1e9 / c.bpf_runs as f64,
            "ns",
        );
    }
    if let Some((now, peak)) = c.rss_kib {
        figure(&format!("{key}.rss"), now as f64 / 1024.0, "MiB");
        figure(&format!("{key}.peak_rss"), peak as f64 / 1024.0, "MiB");
    }
    if let Some(w) = &c.work {
        figure(
            &format!("{key}.processes_tracked"),
            w.tracked.len() as f64,
            "processes",
        );
        figure(&format!("{key}.spilled"), w.spilled as f64, "processes");
        figure(&format!("{key}.dropped"), w.dropped as f64, "processes");
    }
}

/// A reader of the containers' cgroup files (`files`), every `interval`.
fn cgroup_reader(files: &[std::path::PathBuf], interval: Duration, duration: Duration) -> Cost {
    let mut buf = String::new();
    poll(interval, duration, || {
        for f in files {
            buf.clear();
            if let Ok(s) = std::fs::read_to_string(f) {
                buf.push_str(&s);
            }
            std::hint::black_box(&buf);
        }
    })
}

/// The kernel time of a run's eBPF programs, with their runs.
fn bpf_time(c: &Cost) -> String {
    format!(
        "{:.3} s ({} runs, {:.0} ns each)",
        c.bpf_s,
        c.bpf_runs,
        c.bpf_s * 1e9 / c.bpf_runs.max(1) as f64
    )
}

/// Each tool's cost as a row, against the agent's `agent_percent` of a core.
fn print_costs(rows: &[(String, &Cost, String)], agent_percent: f64) {
    println!(
        "| tool | passes | user + system CPU | eBPF kernel time | total, % of a core | x agent | RSS (peak) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, c, bpf) in rows {
        println!(
            "| {name} | {} | {:.3} s | {bpf} | **{:.3} %** | {:.1} | {} |",
            c.passes,
            c.cpu_s,
            c.percent(),
            c.percent() / agent_percent.max(1e-9),
            c.rss_kib
                .map(|(now, peak)| format!(
                    "{:.1} MiB ({:.1} MiB)",
                    now as f64 / 1024.0,
                    peak as f64 / 1024.0
                ))
                .unwrap_or_else(|| "-".into())
        );
    }
    println!("\nwhat each agent run printed (its own account, checked):");
    for (name, c, _) in rows {
        if let Some(w) = &c.work {
            println!(
                "- {name}: {} frames, {} processes tracked, {} spilled to the map, {} dropped",
                w.frames,
                w.tracked.len(),
                w.spilled,
                w.dropped
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames as `top --json` prints them, read into the run's account, and the account
    /// held to the work: enough frames, every process tracked, none dropped.
    #[test]
    fn a_run_counts_only_when_the_agent_did_the_work() {
        let frame = |pids: &[u64], dropped: u64| {
            let targets: Vec<_> = pids.iter().map(|p| serde_json::json!({"pid": p})).collect();
            serde_json::json!({"targets": targets, "kernel": {"targets_spilled": 3, "targets_full": dropped}})
                .to_string()
        };
        let mut w = Work::default();
        w.frame(&frame(&[1, 2], 0));
        w.frame("not JSON: ignored");
        w.frame(&frame(&[2, 3], 0));
        assert_eq!((w.frames, w.tracked.len(), w.spilled), (2, 3, 3));
        assert_eq!(w.check(4, 3), Ok(()));
        assert!(
            w.check(6, 3)
                .is_err_and(|e| e.contains("2 frames printed in 6"))
        );
        assert!(
            w.check(4, 4)
                .is_err_and(|e| e.contains("tracked 3 of the 4"))
        );
        w.frame(&frame(&[4], 7));
        assert!(w.check(4, 4).is_err_and(|e| e.contains("dropped 7")));
    }
}
