//! Names of JIT-compiled code from the runtime's perf map: `/tmp/perf-<pid>.map`, one
//! `START SIZE name` line per code object, written by Node.js (`--perf-basic-prof`), the
//! JVM (`jcmd PID Compiler.perfmap`), CPython 3.12+ (`-X perf`) and others, the format
//! Linux perf reads (tools/perf/Documentation/jit-interface.txt).
//!
//! Hand-made rather than blazesym's perf-map source, for two measured reasons: blazesym
//! 0.2.7 parses `START` and `SIZE` as bare hex and rejects the whole file at the first
//! `0x` prefix, which is what OpenJDK 17 writes (`0x00007f3f18ec7600 0x238 int
//! Burn.burnInJava(int)`), where perf accepts both; and its cache keeps every reloaded
//! version of a file until evicted, while a Node.js map grows for as long as the process
//! runs. Here a map is re-read when its length or mtime changes, replaces the old one,
//! and is refused above [`MAX_BYTES`].
//!
//! The file is opened inside the process's own root (`openat2` with `RESOLVE_IN_ROOT`),
//! so a symlink planted in a container's /tmp cannot point the agent at a host file, and
//! `<pid>` is the process's PID in its own namespace (the last `NSpid` of its status),
//! which is what the runtime inside a container names the file after.

use std::{
    collections::{BTreeMap, HashMap},
    ffi::CString,
    fs::File,
    io::Read,
    os::fd::{FromRawFd, OwnedFd},
    sync::Arc,
    time::SystemTime,
};

/// A perf map larger than this is not read (its frames stay `[unknown]`): 64 MiB is
/// about 600,000 Node.js code objects, far more than a service keeps.
pub const MAX_BYTES: u64 = 64 << 20;

/// Processes whose map is kept at once; beyond it the cache starts again.
const MAX_CACHED: usize = 64;

/// One process's JIT code: non-overlapping `[start, end)` ranges, by start.
#[derive(Debug, Default, PartialEq)]
pub struct PerfMap {
    ranges: Vec<(u64, u64, String)>,
}

impl PerfMap {
    /// Parses a perf map; lines that do not parse are skipped. Where code objects overlap
    /// (a runtime reused the memory of freed code), the later line wins: it describes what
    /// is there now.
    pub fn parse(text: &str) -> Self {
        let mut by_start: BTreeMap<u64, (u64, &str)> = BTreeMap::new();
        for line in text.lines() {
            let mut parts = line.trim_start().splitn(3, char::is_whitespace);
            let (Some(start), Some(size), Some(name)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let (Some(start), Some(size)) = (hex(start), hex(size)) else {
                continue;
            };
            let name = name.trim();
            if size == 0 || name.is_empty() {
                continue;
            }
            let end = start.saturating_add(size);
            // Drop what the new object covers, and cut back one that runs into it.
            let covered: Vec<u64> = by_start.range(start..end).map(|(&s, _)| s).collect();
            for s in covered {
                by_start.remove(&s);
            }
            if let Some((_, (prev_end, _))) = by_start.range_mut(..start).next_back()
                && *prev_end > start
            {
                *prev_end = start;
            }
            by_start.insert(start, (end, name));
        }
        Self {
            ranges: by_start
                .into_iter()
                .map(|(s, (e, n))| (s, e, n.to_owned()))
                .collect(),
        }
    }

    /// The name of the code object holding `addr`.
    pub fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self.ranges.partition_point(|&(s, _, _)| s <= addr);
        let (_, end, name) = self.ranges.get(i.checked_sub(1)?)?;
        (addr < *end).then_some(name.as_str())
    }

    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

/// Hex with or without `0x` (perf's strtoull accepts both).
fn hex(s: &str) -> Option<u64> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    u64::from_str_radix(digits, 16).ok()
}

/// The processes' perf maps as last read, each with the length and mtime it was read at.
#[derive(Default)]
pub struct PerfMaps {
    cache: HashMap<u32, ((u64, SystemTime), Arc<PerfMap>)>,
}

impl PerfMaps {
    /// The perf map of `pid` (host PID), read again if it changed; None when the process
    /// writes none, it is over [`MAX_BYTES`], or it cannot be read.
    pub fn get(&mut self, pid: u32) -> Option<Arc<PerfMap>> {
        let Some(mut file) = open(pid) else {
            self.cache.remove(&pid);
            return None;
        };
        let meta = file.metadata().ok()?;
        if !meta.is_file() || meta.len() > MAX_BYTES {
            tracing::debug!(pid, bytes = meta.len(), "perf map not read");
            return None;
        }
        let stamp = (meta.len(), meta.modified().ok()?);
        if let Some((at, map)) = self.cache.get(&pid)
            && *at == stamp
        {
            return Some(map.clone());
        }
        let mut text = String::new();
        (&mut file).take(MAX_BYTES).read_to_string(&mut text).ok()?;
        let map = Arc::new(PerfMap::parse(&text));
        if self.cache.len() >= MAX_CACHED {
            self.cache.clear();
        }
        self.cache.insert(pid, (stamp, map.clone()));
        Some(map)
    }
}

/// `pid`'s PID in its own PID namespace: the last field of `NSpid:` in its status.
fn namespace_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// Opens `/tmp/perf-<nspid>.map` resolved inside `pid`'s root: absolute symlinks and `..`
/// stay in the container, the last component may not be a symlink at all.
fn open(pid: u32) -> Option<File> {
    let ns_pid = namespace_pid(pid)?;
    let root = File::open(format!("/proc/{pid}/root")).ok()?;
    let path = CString::new(format!("tmp/perf-{ns_pid}.map")).ok()?;
    // SAFETY: open_how is plain data (non_exhaustive, so built from zeroes).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    use std::os::fd::AsRawFd;
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
        return None;
    }
    // SAFETY: the kernel just returned this descriptor to us alone.
    Some(File::from(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_and_openjdk_lines_parse_and_later_code_replaces_earlier() {
        let map = PerfMap::parse(
            "32f2fdfcabfe 26 JS:~burnInJavaScript /tmp/burn.js:1:26\n\
             0x00007f3f18ec7600 0x0000000000000238 int Burn.burnInJava(int)\n\
             not a line\n\
             1000 0 Empty\n\
             2000 100 old code\n\
             2080 100 new code\n\
             2000 10 newest at the start\n",
        );
        assert_eq!(
            map.lookup(0x32f2fdfcabfe + 0x10),
            Some("JS:~burnInJavaScript /tmp/burn.js:1:26")
        );
        assert_eq!(map.lookup(0x32f2fdfcabfe + 0x26), None);
        assert_eq!(
            map.lookup(0x7f3f18ec7600 + 0x237),
            Some("int Burn.burnInJava(int)")
        );
        assert_eq!(map.lookup(0x1000), None, "a zero-size object");
        assert_eq!(map.lookup(0x2005), Some("newest at the start"));
        assert_eq!(map.lookup(0x2050), None, "cut back by the newer objects");
        assert_eq!(map.lookup(0x2090), Some("new code"));
        assert_eq!(map.len(), 4);
    }

    #[test]
    fn a_process_without_a_map_has_none() {
        let mut maps = PerfMaps::default();
        assert!(maps.get(std::process::id()).is_none());
        assert!(maps.get(1 << 23).is_none());
    }

    /// Written in our own /tmp under our own namespace PID, it is found, and read again
    /// when it grows; a symlink in its place is not followed.
    #[test]
    fn the_map_is_found_by_namespace_pid_reread_when_it_grows_and_no_symlink_is_followed() {
        let pid = std::process::id();
        let ns = namespace_pid(pid).expect("NSpid");
        let path = std::path::PathBuf::from(format!("/tmp/perf-{ns}.map"));
        std::fs::write(&path, "1000 10 first\n").expect("write the map");
        let mut maps = PerfMaps::default();
        let one = maps.get(pid).expect("found");
        assert_eq!(one.lookup(0x1001), Some("first"));
        std::fs::write(&path, "1000 10 first\n2000 10 second\n").expect("append");
        let two = maps.get(pid).expect("found");
        assert_eq!(two.lookup(0x2001), Some("second"));
        std::fs::remove_file(&path).expect("remove");
        let target = path.with_extension("target");
        std::fs::write(&target, "1000 10 via a symlink\n").expect("target");
        std::os::unix::fs::symlink(&target, &path).expect("symlink");
        let via_link = maps.get(pid);
        std::fs::remove_file(&path).ok();
        std::fs::remove_file(&target).ok();
        assert!(via_link.is_none(), "followed a symlink: {via_link:?}");
    }
}
