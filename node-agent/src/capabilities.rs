//! What this node's kernel and this process's privileges allow, checked one by one so a
//! missing piece is named in a sentence instead of surfacing as an errno from the loader.

use std::{fs, path::Path};

use serde::Serialize;

use crate::cgroup_resolver::CgroupLayout;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_DAC_OVERRIDE: u32 = 1;
const CAP_KILL: u32 = 5;

/// Which requirement a check is: code asks by id, never by matching a check's name.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CheckId {
    Privileges,
    Btf,
    SchedSwitch,
    RssStat,
    SchedProcessExit,
    RingBuffer,
    Atomics,
    /// rss_stat at every page fault (6.2 on): growth sites charged where pages are taken.
    FaultTimeRss,
    Cgroups,
    Uprobes,
    Ptrace,
    ReadOwnerOnlyFiles,
    AttachJvms,
}

/// One requirement and whether it holds.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Check {
    pub id: CheckId,
    pub name: String,
    pub ok: bool,
    /// Why it fails (or a note when it holds), in words a user can act on.
    pub detail: String,
    /// Without it nothing works; otherwise a feature is lost.
    pub required: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct CapabilityReport {
    pub kernel_release: String,
    pub cgroup_version: Option<String>,
    pub checks: Vec<Check>,
}

impl CapabilityReport {
    /// The first failing required check, as one sentence.
    pub fn fatal(&self) -> Option<String> {
        self.checks
            .iter()
            .find(|c| c.required && !c.ok)
            .map(|c| format!("{}: {}", c.name, c.detail))
    }

    /// Whether a requirement holds; a check that did not run does not hold.
    pub fn holds(&self, id: CheckId) -> bool {
        self.checks.iter().any(|c| c.id == id && c.ok)
    }

    pub fn missing(&self) -> Vec<&Check> {
        self.checks.iter().filter(|c| !c.ok).collect()
    }
}

/// Runs every check; reads files only, loads nothing.
pub fn probe() -> CapabilityReport {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned();
    let caps = effective_caps();
    let has = |bit: u32| caps.is_some_and(|c| c & (1 << bit) != 0);
    let btf = fs::read("/sys/kernel/btf/vmlinux").ok();
    let layout = CgroupLayout::detect();
    let mut checks = vec![
        privileges_check(has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))),
        Check::of(
            CheckId::Btf,
            "BTF",
            true,
            btf.is_some(),
            "kernel BTF at /sys/kernel/btf/vmlinux",
            "no /sys/kernel/btf/vmlinux: the kernel needs CONFIG_DEBUG_INFO_BTF=y for CO-RE programs",
        ),
    ];
    checks.extend(tracepoint_checks(btf.as_deref()));
    checks.extend(kernel_version_checks(&release));
    checks.push(cgroups_check(&layout));
    checks.extend(optional_checks(&has));
    CapabilityReport {
        kernel_release: release,
        cgroup_version: layout.ok().map(|l| l.version_name().to_owned()),
        checks,
    }
}

/// Whether tracing programs load: the capabilities, and bpf() answering (a seccomp
/// filter can refuse it although they are effective).
fn privileges_check(privileged: bool) -> Check {
    // The agent ships with the runtime's default seccomp profile, which containerd >= 1.7
    // opens to bpf with CAP_BPF and perf_event_open with CAP_PERFMON, older runtimes only
    // with CAP_SYS_ADMIN.
    let bpf_call = if privileged {
        crate::bpf::map_create_answers()
    } else {
        Ok(())
    };
    Check {
        id: CheckId::Privileges,
        name: "privileges".into(),
        ok: privileged && bpf_call.is_ok(),
        detail: match (&bpf_call, privileged) {
            (_, false) => "run as root, or grant CAP_BPF and CAP_PERFMON (kernel >= 5.8), to load tracing programs".into(),
            (Ok(()), true) => "CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN) are effective".into(),
            (Err(e), true) if e.raw_os_error() == Some(libc::EPERM) && seccomp_filtered() => {
                "bpf() is refused (EPERM) by a seccomp filter although CAP_BPF is effective: this container runtime's default seccomp profile allows bpf only with CAP_SYS_ADMIN; run the agent with seccompProfile Unconfined (chart: agent.seccompProfile.type=Unconfined)".into()
            }
            (Err(e), true) => format!("bpf() fails although CAP_BPF is effective: {e}"),
        },
        required: true,
    }
}

fn cgroups_check(layout: &Result<CgroupLayout, crate::cgroup_resolver::CgroupError>) -> Check {
    Check {
        id: CheckId::Cgroups,
        name: "cgroups".into(),
        ok: layout.is_ok(),
        detail: match layout {
            Ok(l) => format!(
                "{} layout, container ids from {}",
                l.version_name(),
                l.root().display()
            ),
            Err(e) => format!(
                "{}: processes cannot be attributed to containers",
                resourcewatch_runtime::error_chain(e)
            ),
        },
        required: false,
    }
}

/// What the agent does without, in part: uprobes, and reading other users' processes.
fn optional_checks(has: &dyn Fn(u32) -> bool) -> Vec<Check> {
    vec![
        Check::of(
            CheckId::Uprobes,
            "uprobes",
            false,
            Path::new("/sys/bus/event_source/devices/uprobe").exists(),
            "available for allocation mode",
            "no uprobe event source (CONFIG_UPROBE_EVENTS): allocation mode is unavailable",
        ),
        Check::of(
            CheckId::Ptrace,
            "CAP_SYS_PTRACE",
            false,
            has(CAP_SYS_PTRACE) || has(CAP_SYS_ADMIN),
            "can read other processes' memory maps and stacks (allocation mode, naming frames)",
            "without it /proc/PID/maps of other users' processes is unreadable: allocation mode is limited to own processes, and their growth sites and profiles are [unknown]",
        ),
        Check::of(
            CheckId::ReadOwnerOnlyFiles,
            "CAP_DAC_READ_SEARCH",
            false,
            has(CAP_DAC_READ_SEARCH),
            "can read files only their owner may read (CPython's perf map, mode 0600)",
            "without it another user's files of mode 0600 are unreadable: CPython's Python functions in that user's stacks are [unknown]",
        ),
        Check::of(
            CheckId::AttachJvms,
            "CAP_KILL and CAP_DAC_OVERRIDE",
            false,
            has(CAP_KILL) && has(CAP_DAC_OVERRIDE),
            "can ask another user's JVM for its perf map (SIGQUIT, its 0600 attach socket)",
            "without them another user's JVM is not asked for its perf map: its compiled Java methods are [unknown] unless something runs `jcmd PID Compiler.perfmap`",
        ),
    ]
}

/// A seccomp filter applies to this process (`Seccomp: 2` in /proc/self/status).
fn seccomp_filtered() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Seccomp:").map(|v| v.trim() == "2"))
        })
        .unwrap_or(false)
}

impl Check {
    /// A check whose detail is one of two sentences, by outcome.
    fn of(
        id: CheckId,
        name: &str,
        required: bool,
        ok: bool,
        if_ok: impl Into<String>,
        if_not: impl Into<String>,
    ) -> Check {
        Check {
            id,
            name: name.into(),
            ok,
            detail: if ok { if_ok.into() } else { if_not.into() },
            required,
        }
    }
}

/// The BTF-typed tracepoints the pipelines attach to, looked up in the kernel's BTF.
fn tracepoint_checks(btf: Option<&[u8]>) -> Vec<Check> {
    [
        (CheckId::SchedSwitch, "sched_switch", "the CPU pipeline"),
        (
            CheckId::RssStat,
            "rss_stat",
            "the memory pipeline (kernel >= 5.5)",
        ),
        (
            CheckId::SchedProcessExit,
            "sched_process_exit",
            "cleaning up exited processes",
        ),
    ]
    .into_iter()
    .map(|(id, tp, what)| {
        let present = btf.is_some_and(|b| contains(b, format!("btf_trace_{tp}\0").as_bytes()));
        Check::of(
            id,
            &format!("tracepoint {tp}"),
            true,
            present,
            format!("BTF-typed tracepoint available for {what}"),
            if btf.is_none() {
                "cannot check without kernel BTF".into()
            } else {
                format!("the kernel's BTF has no btf_trace_{tp}: {what} cannot attach")
            },
        )
    })
    .collect()
}

/// What the kernel's version alone decides: the ring buffer, BPF atomics, and whether
/// rss_stat fires at every page fault.
fn kernel_version_checks(release: &str) -> [Check; 3] {
    let version = parse_release(release);
    [
        Check::of(
            CheckId::RingBuffer,
            "BPF ring buffer",
            true,
            version >= (5, 8),
            "kernel >= 5.8",
            format!("kernel {release} < 5.8 has no BPF ring buffer"),
        ),
        Check::of(
            CheckId::Atomics,
            "BPF atomics",
            true,
            version >= (5, 12),
            "kernel >= 5.12 (compare-and-exchange for the sketches)",
            format!(
                "kernel {release} < 5.12 lacks BPF compare-and-exchange, which the sketches use"
            ),
        ),
        // ebpf/src/stacks.bpf.h, resident_exact(): before 6.2 a thread adds its page
        // faults to its mm's counters (and the tracepoint fires) only every 64 events.
        Check::of(
            CheckId::FaultTimeRss,
            "rss_stat at every page fault",
            false,
            version >= (6, 2),
            "kernel >= 6.2: a leak's growth sites are charged at the faults that take its pages",
            format!(
                "kernel {release} < 6.2 reports a thread's page faults to rss_stat every 64 events: growth sites are charged at those, and a leak whose faults never include the 64th (one beside a buffer unmapped each time, which makes the kernel count afresh) is not charged at all"
            ),
        ),
    ]
}

/// Whether the running kernel (`/proc/sys/kernel/osrelease`) is at least `major.minor`.
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    parse_release(release.trim()) >= (major, minor)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Whether this process may create uprobes: CAP_SYS_ADMIN, since Linux took uprobe perf
/// events back from CAP_PERFMON (a uprobe writes into another process's code).
pub fn can_create_uprobes() -> bool {
    effective_caps().is_some_and(|c| c & (1 << CAP_SYS_ADMIN) != 0)
}

fn effective_caps() -> Option<u64> {
    let s = fs::read_to_string("/proc/self/status").ok()?;
    let hex = s.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

fn parse_release(r: &str) -> (u32, u32) {
    let mut it = r
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases() {
        assert_eq!(parse_release("6.18.44-fc-v769"), (6, 18));
        assert_eq!(parse_release("5.4.0-150-generic"), (5, 4));
        assert!(parse_release("5.15.0") >= (5, 12));
    }

    #[test]
    fn fatal_names_the_first_required_failure() {
        let r = CapabilityReport {
            kernel_release: "x".into(),
            cgroup_version: None,
            checks: vec![
                Check {
                    id: CheckId::Uprobes,
                    name: "uprobes".into(),
                    ok: false,
                    detail: "d0".into(),
                    required: false,
                },
                Check {
                    id: CheckId::Btf,
                    name: "BTF".into(),
                    ok: false,
                    detail: "no vmlinux".into(),
                    required: true,
                },
            ],
        };
        assert_eq!(r.fatal().as_deref(), Some("BTF: no vmlinux"));
        assert_eq!(r.missing().len(), 2);
        assert!(!r.holds(CheckId::Btf));
        assert!(
            !r.holds(CheckId::RingBuffer),
            "a check that did not run does not hold"
        );
    }
}
