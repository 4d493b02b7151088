//! Small readers of /proc and clocks the agent needs beside the kernel maps.
//!
//! Hand-made rather than the `procfs` crate because each is a one-field read on the
//! per-interval path (statm's resident pages, one `kB` line of status, schedstat's first
//! field, stat's `starttime` after the last `)`), for the Top-K processes only: the crate
//! parses every field of a file into a struct to return one; and the CPU clock
//! (`clock_getcpuclockid`) is not /proc at all. The one trap, a `comm` holding spaces and
//! parentheses in `stat`, is handled where `stat` is read: fields start after the last `)`.

use std::{fs, io, path::Path};

/// CLOCK_MONOTONIC in ns: the clock of `bpf_ktime_get_ns`, so user and kernel time compare.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Wall-clock time (Unix epoch) in ns, for timestamps users read.
pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec; these clocks always exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 { v as u64 } else { 4096 }
}

/// Number of possible CPUs (ids 0..n), the size of per-CPU kernel arrays.
pub fn possible_cpus() -> io::Result<u32> {
    let text = fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list_max(text.trim())
        .map(|max| max + 1)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected cpu list {text:?}"),
            )
        })
}

fn parse_cpu_list_max(s: &str) -> Option<u32> {
    s.split(',')
        .filter_map(|r| r.rsplit('-').next()?.parse::<u32>().ok())
        .max()
}

/// The command name of a process (`/proc/PID/comm`), if it still exists.
pub fn comm(pid: u32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_owned())
}

/// Every process id in /proc.
pub fn pids() -> Vec<u32> {
    fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Resident pages of a process as the kernel accounts them (file + anon + shmem), from
/// `/proc/PID/statm`: the same counters the rss_stat tracepoint reports.
pub fn resident_pages(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    s.split_whitespace().nth(1)?.parse().ok()
}

/// Resident memory of a process by kind, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RssBreakdown {
    pub anon: u64,
    pub file: u64,
    pub shmem: u64,
    pub swap: u64,
}

impl RssBreakdown {
    pub fn resident(&self) -> u64 {
        self.anon + self.file + self.shmem
    }
}

/// `RssAnon`, `RssFile`, `RssShmem` and `VmSwap` from `/proc/PID/status`.
pub fn rss_breakdown(pid: u32) -> Option<RssBreakdown> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mut r = RssBreakdown::default();
    let mut seen = false;
    for line in s.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let kb = || {
            rest.split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                * 1024
        };
        match key {
            "RssAnon" => (r.anon, seen) = (kb(), true),
            "RssFile" => r.file = kb(),
            "RssShmem" => r.shmem = kb(),
            "VmSwap" => r.swap = kb(),
            _ => {}
        }
    }
    seen.then_some(r)
}

/// Total on-CPU ns of a process's live threads, from `/proc/PID/task/*/schedstat` (the
/// scheduler's exact `sum_exec_runtime`). Used as ground truth by tests and benchmarks.
pub fn cpu_ns(pid: u32) -> Option<u64> {
    let dir = fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0;
    for t in dir.flatten() {
        let p = t.path().join("schedstat");
        if let Ok(s) = fs::read_to_string(&p) {
            total += s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Some(total)
}

/// A process's total CPU time (all threads, dead ones included) exactly at the moment of
/// the call, from its POSIX CPU clock: unlike schedstat, the running slice is included.
pub fn process_cpu_clock_ns(pid: u32) -> Option<u64> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: clock is a valid out-pointer; ts likewise.
    unsafe {
        if libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) != 0 {
            return None;
        }
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        if libc::clock_gettime(clock, &mut ts) != 0 {
            return None;
        }
        Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
    }
}

/// When a process started, in CLOCK_MONOTONIC ns: `starttime` of `/proc/PID/stat` is in
/// clock ticks since boot (boot time: equal to the monotonic clock on a machine that never
/// suspended, which nodes do not; saturates otherwise).
pub fn start_monotonic_ns(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    // starttime is field 22; `rest` starts (after a space) at field 3.
    let ticks: u64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let boot_ns = ticks.saturating_mul(1_000_000_000 / hz);
    let since_boot = clock_ns(libc::CLOCK_BOOTTIME);
    Some(monotonic_ns().saturating_sub(since_boot.saturating_sub(boot_ns)))
}

/// The highest resident size a process ever had (`VmHWM`), bytes.
pub fn peak_rss_bytes(pid: u32) -> Option<u64> {
    kib_field(
        &fs::read_to_string(format!("/proc/{pid}/status")).ok()?,
        "VmHWM:",
    )
}

/// A `Key:   N kB` line of /proc/PID/status or /proc/meminfo, in bytes.
pub fn kib_field(text: &str, key: &str) -> Option<u64> {
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Text of `/proc/PID/cgroup`, its first 64 KiB: one line per hierarchy, each a path a
/// process's owner may make deep (a cgroup namespace's tenant creates its own), so the
/// read is bounded like any other of another process's files.
pub fn cgroup_text(pid: u32) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    fs::File::open(format!("/proc/{pid}/cgroup"))
        .ok()?
        .take(64 << 10)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// Fills `buf` from process `pid`'s memory at `addr`; false unless all of it was read.
/// process_vm_readv rather than /proc/PID/mem: it needs the ptrace access check only
/// (CAP_SYS_PTRACE for another user's process), where /proc/PID/mem is also a file of
/// mode 0600 owned by that user.
pub fn read_process_memory(pid: u32, addr: u64, buf: &mut [u8]) -> bool {
    if buf.is_empty() {
        return true;
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: one local iovec over `buf`, which outlives the call; the remote one is only
    // read by the kernel, in the other process, with its permission checks.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    n == buf.len() as isize
}

/// Opens `path` (relative to the process's root) of process `pid` with `flags`, resolved
/// inside its root (`openat2` with `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`): absolute
/// symlinks and `..` stay in the container, so a file a container planted cannot point the
/// agent at the node's own files. ENOSYS before Linux 5.6.
pub fn open_in_root(pid: u32, path: &str, flags: i32) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let root = fs::File::open(format!("/proc/{pid}/root"))?;
    let path = std::ffi::CString::new(path.trim_start_matches('/'))
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: open_how is plain data (non_exhaustive, so built from zeroes).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: valid descriptor, NUL-terminated path, and `how` of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us alone.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// A regular file of process `pid`'s root, opened for reading with [`open_in_root`] and
/// without blocking (a FIFO put where a mapped file was would block an open forever).
pub fn open_regular_in_root(pid: u32, path: &str) -> Option<fs::File> {
    let fd = open_in_root(
        pid,
        path,
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW,
    )
    .ok()?;
    let file = fs::File::from(fd);
    file.metadata().ok()?.is_file().then_some(file)
}

/// When process `pid` started (`starttime` of /proc/PID/stat, in clock ticks since boot):
/// with the PID, it names one process (PIDs are reused).
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command in parentheses (which may hold spaces): field 22 is the 20th.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

pub fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_start_is_in_the_past_and_our_peak_covers_our_rss() {
        let me = std::process::id();
        let start = start_monotonic_ns(me).expect("start");
        let now = monotonic_ns();
        assert!(
            start <= now && now - start < 3_600_000_000_000,
            "{start} vs {now}"
        );
        let peak = peak_rss_bytes(me).expect("VmHWM");
        assert!(peak >= resident_pages(me).unwrap_or(0) * page_size() / 2 && peak > 0);
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list_max("0-1"), Some(1));
        assert_eq!(parse_cpu_list_max("0"), Some(0));
        assert_eq!(parse_cpu_list_max("0-3,8-11"), Some(11));
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(resident_pages(me).expect("statm") > 0);
        assert!(cpu_ns(me).expect("schedstat") > 0);
        assert!(comm(me).is_some());
        assert!(monotonic_ns() > 0 && realtime_ns() > 1_600_000_000_000_000_000);
    }
}
