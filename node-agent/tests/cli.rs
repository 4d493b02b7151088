//! The `resourcewatch-agent` command line as scripts see it: exit codes, messages and the
//! `--json` contract.

mod common;

use std::process::Command;

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_resourcewatch-agent"))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn an_interval_below_10ms_is_refused_with_exit_2() {
    let out = agent()
        .args(["top", "--interval", "5ms", "--count", "1"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("below the 10ms minimum"));
}

#[test]
fn a_sketch_width_that_is_not_a_power_of_two_is_refused() {
    let out = agent()
        .args(["top", "--sketch-width", "1000", "--count", "1"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("power of two"));
}

/// Without privileges: one sentence naming what is missing, exit code 2, nothing on stdout.
#[test]
fn without_privileges_top_says_why_and_exits_2() {
    if !is_root() || Command::new("setpriv").arg("--version").output().is_err() {
        common::skip(
            "without_privileges_top_says_why_and_exits_2",
            "needs root and setpriv to drop privileges",
        );
        return;
    }
    // The test binary may live under a directory an unprivileged user cannot enter.
    let copy = std::env::temp_dir().join(format!("rw-agent-cli-{}", std::process::id()));
    std::fs::copy(env!("CARGO_BIN_EXE_resourcewatch-agent"), &copy).expect("copy the binary");
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ])
        .arg(&copy)
        .args(["top", "--count", "1"])
        .output()
        .expect("runs");
    let _ = std::fs::remove_file(&copy);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(out.stdout.is_empty());
    assert_eq!(stderr.trim().lines().count(), 1, "one sentence: {stderr}");
    assert!(
        stderr.contains("CAP_BPF"),
        "names the missing capability: {stderr}"
    );
    each_cause_once(&stderr);
}

/// An error chain as the command line prints it (`a: b: c`) names no cause twice.
fn each_cause_once(line: &str) {
    let parts: Vec<&str> = line.trim().split(": ").collect();
    for (i, p) in parts.iter().enumerate() {
        assert!(
            !parts[i + 1..]
                .iter()
                .any(|q| q.contains(p) || p.contains(q)),
            "{p:?} is printed twice in {line:?}"
        );
    }
}

/// A target that is no cgroup: the command line names the flag and the cause, once each.
#[test]
fn a_target_cgroup_that_does_not_exist_is_named_with_its_cause_once() {
    if let Some(why) = common::kernel_missing() {
        common::skip(
            "a_target_cgroup_that_does_not_exist_is_named_with_its_cause_once",
            &why,
        );
        return;
    }
    let spec = "/sys/fs/cgroup/rw-no-such-cgroup";
    let out = agent()
        .args(["top", "--count", "1", "--target-cgroup", spec])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "stderr: {stderr}");
    assert_eq!(
        stderr.trim(),
        format!("resourcewatch-agent top: --target-cgroup {spec}: cgroup {spec} does not exist")
    );
    each_cause_once(&stderr);
}

#[test]
fn json_prints_one_object_per_interval_with_the_documented_fields() {
    if let Some(why) = common::kernel_missing() {
        common::skip(
            "json_prints_one_object_per_interval_with_the_documented_fields",
            &why,
        );
        return;
    }
    let out = agent()
        .args([
            "top",
            "--json",
            "--count",
            "3",
            "--interval",
            "100ms",
            "-k",
            "5",
        ])
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let frames: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert_eq!(frames.len(), 3, "--count 3 prints three objects");
    // Typed fields, not just present ones: a row of nulls or an empty ranking is a bug.
    // Except for a process that exited before the agent read its /proc entry (a short
    // command of a busy machine, ranked for the CPU it burned): its name and cgroup are
    // unknown, `null` as documented. Rows of processes still running must be named.
    let ident = |r: &serde_json::Value, what: &str| {
        let pid = r["pid"].as_u64().filter(|&p| p > 0);
        let pid = pid.unwrap_or_else(|| panic!("{what} pid: {r}"));
        let gone = !std::path::Path::new(&format!("/proc/{pid}")).exists();
        if gone && r["comm"].is_null() {
            assert!(
                r["cgroup"].is_null(),
                "{what}: named its cgroup, not its comm: {r}"
            );
            return;
        }
        assert!(
            r["comm"].as_str().is_some_and(|c| !c.is_empty()),
            "{what} comm: {r}"
        );
        assert!(r["cgroup"].is_string(), "{what} cgroup: {r}");
        for k in ["container_id", "pod_uid"] {
            assert!(r[k].is_string() || r[k].is_null(), "{what} {k}: {r}");
        }
    };
    for (i, f) in frames.iter().enumerate() {
        assert!(f["ts_ns"].as_u64().expect("ts_ns") > 1_600_000_000_000_000_000);
        let interval = f["interval_ns"].as_u64().expect("interval_ns");
        assert!(
            (80_000_000..200_000_000).contains(&interval),
            "interval_ns {interval}"
        );
        let cpu = f["cpu"].as_array().expect("cpu array");
        let mem = f["memory"].as_array().expect("memory array");
        assert!(cpu.len() <= 5 && !mem.is_empty() && mem.len() <= 5);
        // After the first interval something has run on the machine: this test, the agent.
        assert!(i == 0 || !cpu.is_empty(), "frame {i} ranks no CPU");
        for r in cpu {
            ident(r, "cpu");
            assert!(r["cpu_ns"].as_u64().is_some_and(|n| n > 0), "cpu_ns: {r}");
            assert!(
                r["cpu_percent"].as_f64().is_some_and(|p| p > 0.0),
                "cpu_percent: {r}"
            );
            for k in [
                "pid",
                "comm",
                "cpu_ns",
                "cpu_percent",
                "cgroup",
                "container_id",
                "pod_uid",
            ] {
                assert!(r.get(k).is_some(), "cpu row lacks {k}: {r}");
            }
        }
        for r in mem {
            ident(r, "memory");
            assert!(r["rss_bytes"].as_u64().is_some_and(|b| b > 0), "rss: {r}");
            for k in [
                "pid",
                "comm",
                "rss_bytes",
                "cgroup",
                "container_id",
                "pod_uid",
            ] {
                assert!(r.get(k).is_some(), "memory row lacks {k}: {r}");
            }
        }
        assert!(f["leaks"].is_array());
        // Ranked: largest first.
        let rss: Vec<u64> = mem
            .iter()
            .map(|r| r["rss_bytes"].as_u64().expect("rss"))
            .collect();
        assert!(rss.windows(2).all(|w| w[0] >= w[1]), "{rss:?}");
    }
}

/// The DaemonSet grants the agent CAP_BPF and CAP_PERFMON and nothing else (root uid, but
/// no CAP_DAC_OVERRIDE, CAP_SYS_PTRACE or CAP_SYS_ADMIN). This runs `top` the same way and
/// checks that what the DaemonSet mode needs still works on another user's process: exact
/// tracking of a targeted PID and its attribution (comm, cgroup) from /proc.
#[test]
fn with_only_cap_bpf_and_cap_perfmon_other_users_processes_are_tracked_and_attributed() {
    const TEST: &str =
        "with_only_cap_bpf_and_cap_perfmon_other_users_processes_are_tracked_and_attributed";
    if let Some(why) = common::kernel_missing() {
        common::skip(TEST, &why);
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        common::skip(TEST, "needs setpriv to drop capabilities");
        return;
    }
    // A busy process of another user (nobody), alive for the whole run.
    let mut other = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["sh", "-c", "while :; do :; done"])
        .spawn()
        .expect("spawn a busy loop as nobody");
    let pid = other.id();
    // setpriv execs the shell: wait for it, so the process's name is "sh" from frame one.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::fs::read_to_string(format!("/proc/{pid}/comm")).map_or(true, |c| c.trim() != "sh") {
        assert!(
            std::time::Instant::now() < deadline,
            "setpriv did not exec sh within 5 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let out = Command::new("setpriv")
        .args([
            "--inh-caps=-all",
            "--ambient-caps=-all",
            "--bounding-set=-all,+bpf,+perfmon",
            "--",
        ])
        .arg(env!("CARGO_BIN_EXE_resourcewatch-agent"))
        .args([
            "top",
            "--json",
            "--count",
            "2",
            "--interval",
            "500ms",
            "-k",
            "20",
        ])
        .args(["--target-pid", &pid.to_string()])
        .output()
        .expect("runs");
    let _ = other.kill();
    let _ = other.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    let frames: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(frames.len(), 2, "{frames:?}");
    // Both frames: the first one too, which once showed a newly targeted process idle.
    for f in &frames {
        let t = f["targets"]
            .as_array()
            .expect("targets")
            .iter()
            .find(|t| t["pid"].as_u64() == Some(u64::from(pid)))
            .unwrap_or_else(|| panic!("the targeted PID {pid} is tracked: {f}"));
        assert_eq!(t["comm"], "sh", "{t}");
        assert!(t["rss_bytes"].as_u64().unwrap_or(0) > 0, "{t}");
        assert!(t["cgroup"].is_string(), "attributed to a cgroup: {t}");
        assert!(t["cpu_percent"].as_f64().unwrap_or(0.0) > 20.0, "busy: {t}");
    }
    let last = frames.last().expect("a frame");
    // Every memory row of a process still alive is attributed.
    for r in last["memory"].as_array().expect("memory") {
        let p = r["pid"].as_u64().expect("pid");
        if std::path::Path::new(&format!("/proc/{p}")).exists() {
            assert!(r["comm"].is_string() && r["cgroup"].is_string(), "{r}");
        }
    }
}

/// `--log-format json`: one JSON object per line on stderr, the event's fields at the top
/// level and the node among the enclosing `spans` (what a log pipeline joins on). The run mode's first
/// failure to reach an operator is such a line.
#[test]
fn json_logs_carry_the_node_and_the_events_fields() {
    use std::io::{BufRead, BufReader};
    let dir = std::env::temp_dir().join(format!("rw-json-logs-{}", std::process::id()));
    let mut child = agent()
        .args(["--log-format", "json", "run", "--node-name", "node-7"])
        .args(["--operator", "https://127.0.0.1:1", "--metrics-addr", "off"])
        .arg("--tls-dir")
        .arg(&dir)
        .env("RESOURCEWATCH_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runs");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut seen = Vec::new();
    let failed = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            break None;
        };
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        seen.push(line);
        if v["message"] == "stream to the operator failed" {
            break Some(v);
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let v = failed.unwrap_or_else(|| panic!("no failed-stream line within 30 s: {seen:#?}"));
    assert_eq!(v["level"], "WARN", "{v}");
    assert!(
        v["spans"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["node"] == "node-7")),
        "the node among the enclosing spans: {v}"
    );
    assert!(
        v["error"].as_str().is_some_and(|e| !e.is_empty()),
        "the error as a field: {v}"
    );
}

#[test]
fn a_log_filter_that_does_not_parse_is_refused() {
    let out = agent()
        .args(["probe"])
        .env("RESOURCEWATCH_LOG", "info,=[")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("RESOURCEWATCH_LOG"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
