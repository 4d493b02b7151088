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
//! runs. Here a map is looked at most every [`RECHECK`] per process, re-read when its
//! length or mtime changed, replacing the old one; only its last [`MAX_BYTES`] (the
//! newest code) and [`MAX_ENTRIES`] objects are kept, names in one buffer, and all maps
//! cached at once stay under [`CACHE_BUDGET`] bytes: a container that writes a huge or
//! hostile map cannot make the agent run out of memory (its frames stay `[unknown]`).
//!
//! The file is opened inside the process's own root (`openat2` with `RESOLVE_IN_ROOT`),
//! so a symlink planted in a container's /tmp cannot point the agent at a host file, and
//! `<pid>` is the process's PID in its own namespace (the last `NSpid` of its status),
//! which is what the runtime inside a container names the file after.

use std::{
    collections::{BTreeMap, HashMap},
    fs::File,
    io::{Read, Seek, SeekFrom},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

/// Only the last 8 MiB of a map are read: about 100,000 Node.js code objects, the newest.
pub const MAX_BYTES: u64 = 8 << 20;

/// Code objects kept per map.
pub const MAX_ENTRIES: usize = 200_000;

/// What all the maps cached at once may hold; beyond it the cache starts again.
pub const CACHE_BUDGET: usize = 32 << 20;

/// How often a process's map is looked at again (a runtime appends as it compiles).
pub const RECHECK: Duration = Duration::from_secs(2);

/// One process's JIT code: non-overlapping `[start, end)` ranges, by start; names are
/// `names[offset..offset + len]`.
#[derive(Debug, Default, PartialEq)]
pub struct PerfMap {
    ranges: Vec<(u64, u64, u32, u32)>,
    names: String,
}

impl PerfMap {
    /// Parses a perf map; lines that do not parse are skipped, bytes that are not UTF-8
    /// replaced. Where code objects overlap (a runtime reused the memory of freed code),
    /// the later line wins: it describes what is there now.
    pub fn parse(data: &[u8]) -> Self {
        // Values: (end, line's name as a range of `data`).
        let mut by_start: BTreeMap<u64, (u64, usize, usize)> = BTreeMap::new();
        let mut at = 0usize;
        for line in data.split(|&b| b == b'\n') {
            let line_at = at;
            at += line.len() + 1;
            let Some((start, size, name)) = fields(line) else {
                continue;
            };
            let name_at = line_at + (name.as_ptr() as usize - line.as_ptr() as usize);
            let end = start.saturating_add(size);
            // What the new object covers goes, one running into it is cut back, and what
            // of either reaches past it stays (still that object's code).
            let covered: Vec<u64> = by_start.range(start..end).map(|(&s, _)| s).collect();
            for s in covered {
                if let Some((old_end, n_at, n_len)) = by_start.remove(&s)
                    && old_end > end
                {
                    // Its tail past the new object is still that object's code.
                    by_start.insert(end, (old_end, n_at, n_len));
                }
            }
            if let Some((_, (prev_end, n_at, n_len))) = by_start.range_mut(..start).next_back()
                && *prev_end > start
            {
                let tail = (*prev_end > end).then_some((*prev_end, *n_at, *n_len));
                *prev_end = start;
                if let Some(tail) = tail {
                    by_start.insert(end, tail);
                }
            }
            by_start.insert(start, (end, name_at, name.len()));
            if by_start.len() > MAX_ENTRIES {
                // The oldest addresses first: bounded whatever the file holds.
                by_start.pop_first();
            }
        }
        let mut map = PerfMap::default();
        map.ranges.reserve(by_start.len());
        for (start, (end, n_at, n_len)) in by_start {
            let name = String::from_utf8_lossy(&data[n_at..n_at + n_len]);
            let offset = map.names.len() as u32;
            map.names.push_str(&name);
            map.ranges
                .push((start, end, offset, (map.names.len() as u32) - offset));
        }
        map.names.shrink_to_fit();
        map
    }

    /// The map of `newer` (a perf map's text) laid over this one: where their code objects
    /// overlap `newer` wins, and what it does not cover keeps this map's names. A JVM
    /// writes its whole code cache again at each request, without the code freed since
    /// (a method recompiled, its old code flushed), which stacks sampled before still hold.
    pub fn overlaid(&self, newer: &[u8]) -> PerfMap {
        let mut data = self.text();
        data.extend_from_slice(newer);
        PerfMap::parse(&data)
    }

    /// The name of the code object holding `addr`.
    pub fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self.ranges.partition_point(|&(s, ..)| s <= addr);
        let &(_, end, offset, len) = self.ranges.get(i.checked_sub(1)?)?;
        (addr < end).then(|| &self.names[offset as usize..(offset + len) as usize])
    }

    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// This map as perf map text (to lay another over it).
    fn text(&self) -> Vec<u8> {
        use std::fmt::Write as _;
        let mut text = String::with_capacity(self.names.len() + self.ranges.len() * 40);
        for &(start, end, offset, len) in &self.ranges {
            let name = &self.names[offset as usize..(offset + len) as usize];
            let _ = writeln!(text, "{start:x} {:x} {name}", end - start);
        }
        text.into_bytes()
    }

    /// `newer` laid over this map (as [`Self::overlaid`]), both already parsed: the
    /// parse here is of text made from checked maps, not a workload's.
    pub fn overlaid_map(&self, newer: &PerfMap) -> PerfMap {
        self.overlaid(&newer.text())
    }

    pub fn encode(&self, e: &mut crate::reader::wire::Enc) {
        e.u32(self.ranges.len() as u32);
        for &(start, end, offset, len) in &self.ranges {
            e.u64(start).u64(end).u32(offset).u32(len);
        }
        e.bytes(self.names.as_bytes());
    }

    /// Decoded and checked: at most `MAX_ENTRIES` sorted, non-overlapping ranges whose
    /// names lie in the names at char boundaries.
    pub fn decode(
        d: &mut crate::reader::wire::Dec<'_>,
    ) -> Result<Self, crate::reader::wire::Malformed> {
        use crate::reader::wire::Malformed;
        let n = d.count(24)?;
        if n > MAX_ENTRIES {
            return Err(Malformed);
        }
        let mut ranges = Vec::with_capacity(n);
        let mut prev_end = 0;
        for _ in 0..n {
            let r = (d.u64()?, d.u64()?, d.u32()?, d.u32()?);
            if r.0 >= r.1 || r.0 < prev_end {
                return Err(Malformed);
            }
            prev_end = r.1;
            ranges.push(r);
        }
        let names = d.bytes()?;
        if names.len() as u64 > MAX_BYTES * 2 {
            return Err(Malformed);
        }
        let names = std::str::from_utf8(names)
            .map_err(|_| Malformed)?
            .to_owned();
        if ranges
            .iter()
            .any(|&(_, _, o, l)| names.get(o as usize..o as usize + l as usize).is_none())
        {
            return Err(Malformed);
        }
        Ok(Self { ranges, names })
    }

    /// Heap bytes held.
    pub fn bytes(&self) -> usize {
        self.ranges.capacity() * std::mem::size_of::<(u64, u64, u32, u32)>() + self.names.capacity()
    }
}

/// `START SIZE name` of one line (hex with or without `0x`, as perf's strtoull reads it).
fn fields(line: &[u8]) -> Option<(u64, u64, &[u8])> {
    let line = line.trim_ascii();
    let mut parts = line.splitn(3, |b| b.is_ascii_whitespace());
    let (start, size) = (hex(parts.next()?)?, hex(parts.next()?)?);
    let name = parts.next()?.trim_ascii();
    (size > 0 && !name.is_empty()).then_some((start, size, name))
}

fn hex(s: &[u8]) -> Option<u64> {
    let digits = s
        .strip_prefix(b"0x")
        .or_else(|| s.strip_prefix(b"0X"))
        .unwrap_or(s);
    u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

struct Cached {
    checked: Instant,
    /// Length and mtime the map was read at; None: no map.
    stamp: Option<(u64, SystemTime)>,
    map: Option<Arc<PerfMap>>,
}

/// The processes' perf maps as last read.
#[derive(Default)]
pub struct PerfMaps {
    cache: HashMap<u32, Cached>,
}

impl PerfMaps {
    /// The perf map of `pid` (host PID); None when the process writes none or it cannot
    /// be read. Looked at again only after [`RECHECK`].
    pub fn get(&mut self, pid: u32) -> Option<Arc<PerfMap>> {
        let now = Instant::now();
        if let Some(c) = self.cache.get(&pid)
            && now.duration_since(c.checked) < RECHECK
        {
            return c.map.clone();
        }
        let Some((file, stamp)) = open_file(pid) else {
            self.cache.insert(
                pid,
                Cached {
                    checked: now,
                    stamp: None,
                    map: None,
                },
            );
            return None;
        };
        if let Some(c) = self.cache.get_mut(&pid)
            && c.stamp == Some(stamp)
        {
            c.checked = now;
            return c.map.clone();
        }
        let map = parsed(pid, file).map(Arc::new);
        self.cache.remove(&pid);
        let held: usize = self
            .cache
            .values()
            .filter_map(|c| c.map.as_ref())
            .map(|m| m.bytes())
            .sum();
        if held + map.as_ref().map_or(0, |m| m.bytes()) > CACHE_BUDGET {
            self.cache.clear();
        }
        self.cache.insert(
            pid,
            Cached {
                checked: now,
                stamp: Some(stamp),
                map: map.clone(),
            },
        );
        map
    }
}

/// `pid`'s perf map as it is now (its last [`MAX_BYTES`]); None when it writes none or it
/// cannot be read.
pub fn read_map(pid: u32) -> Option<PerfMap> {
    parsed(pid, open_file(pid)?.0)
}

/// How long a thread waits for the reader's parse of a perf map (never the engine: the
/// naming thread, a JVM request's, a profile's end).
const PARSE_WAIT: Duration = Duration::from_secs(10);

/// `pid`'s open perf map parsed by the reader process (`crate::reader`).
fn parsed(pid: u32, file: File) -> Option<PerfMap> {
    let body = crate::reader::loader()
        .parse(pid, crate::reader::Kind::PerfMap, file, PARSE_WAIT)
        .ok()?;
    PerfMap::decode(&mut crate::reader::wire::Dec(&body)).ok()
}

/// The last [`MAX_BYTES`] of an open perf map, parsed (in the reader).
pub fn parse_file(file: File) -> Option<PerfMap> {
    let len = file.metadata().ok()?.len();
    Some(PerfMap::parse(&read(file, len)?))
}

/// `pid`'s perf map opened, if it is a regular file, with its length and mtime.
fn open_file(pid: u32) -> Option<(File, (u64, SystemTime))> {
    let f = open(pid)?;
    let meta = f.metadata().ok()?;
    meta.is_file().then(|| {
        (
            f,
            (
                meta.len(),
                meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            ),
        )
    })
}

/// The last [`MAX_BYTES`] of the file, from the first whole line.
fn read(mut file: File, len: u64) -> Option<Vec<u8>> {
    let skip = len.saturating_sub(MAX_BYTES);
    file.seek(SeekFrom::Start(skip)).ok()?;
    let mut data = Vec::with_capacity(len.min(MAX_BYTES) as usize);
    file.take(MAX_BYTES).read_to_end(&mut data).ok()?;
    if skip > 0 {
        let first = data
            .iter()
            .position(|&b| b == b'\n')
            .map_or(data.len(), |i| i + 1);
        data.drain(..first);
    }
    Some(data)
}

/// `pid`'s PID in its own PID namespace: the last field of `NSpid:` in its status.
pub(crate) fn namespace_pid(pid: u32) -> Option<u32> {
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
    let path = format!("tmp/perf-{ns_pid}.map");
    match crate::procfs::open_in_root(
        pid,
        &path,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
    ) {
        Ok(fd) => Some(File::from(fd)),
        Err(e) => {
            if e.raw_os_error() != Some(libc::ENOENT) {
                // ENOSYS before Linux 5.6, ELOOP for a symlink, EACCES without CAP_SYS_PTRACE.
                tracing::debug!(pid, error = %e, "perf map not opened");
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A JVM's second map lists a method recompiled elsewhere and no longer its old code:
    /// laid over the first, the old code keeps its name, and where new code took the
    /// memory of the old, the new name wins.
    #[test]
    fn a_newer_map_laid_over_an_older_keeps_freed_code_and_replaces_reused_memory() {
        let first = PerfMap::parse(
            b"0x1000 0x100 long Burn.outerJava() [OSR C1]\n\
              0x2000 0x100 int Burn.burnInJava(int)\n\
              0x3000 0x100 void Gone.method()\n",
        );
        let both = first.overlaid(
            b"0x2000 0x100 int Burn.burnInJava(int)\n\
              0x3080 0x100 long Burn.outerJava() [OSR C2]\n",
        );
        assert_eq!(both.lookup(0x1010), Some("long Burn.outerJava() [OSR C1]"));
        assert_eq!(both.lookup(0x2010), Some("int Burn.burnInJava(int)"));
        assert_eq!(both.lookup(0x3010), Some("void Gone.method()"));
        assert_eq!(both.lookup(0x3090), Some("long Burn.outerJava() [OSR C2]"));
        assert_eq!(both.lookup(0x3170), Some("long Burn.outerJava() [OSR C2]"));
        assert_eq!(both.lookup(0x3180), None);
        assert_eq!(both.len(), 4);
        assert_eq!(
            PerfMap::default().overlaid(b"10 10 a\n").lookup(0x15),
            Some("a")
        );
    }

    #[test]
    fn node_and_openjdk_lines_parse_and_later_code_replaces_earlier() {
        let map = PerfMap::parse(
            b"32f2fdfcabfe 26 JS:~burnInJavaScript /tmp/burn.js:1:26\n\
              0x00007f3f18ec7600 0x0000000000000238 int Burn.burnInJava(int)\n\
              not a line\n\
              1000 0 Empty\n\
              2000 100 old code\n\
              2080 100 new code\n\
              2000 10 newest at the start\n\
              3000 100 caf\xc3\n\
              5000 100 outer\n\
              5010 10 inner\n",
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
        assert_eq!(
            map.lookup(0x2050),
            Some("old code"),
            "the old object's tail"
        );
        assert_eq!(map.lookup(0x2090), Some("new code"));
        assert_eq!(
            map.lookup(0x3001),
            Some("caf\u{fffd}"),
            "bad UTF-8 replaced"
        );
        assert_eq!(map.lookup(0x5005), Some("outer"));
        assert_eq!(map.lookup(0x5015), Some("inner"));
        assert_eq!(
            map.lookup(0x5050),
            Some("outer"),
            "outer's code after inner"
        );
    }

    #[test]
    fn a_map_keeps_at_most_max_entries_the_newest_addresses_kept() {
        let mut text = Vec::new();
        for i in 0..(MAX_ENTRIES as u64 + 10) {
            text.extend_from_slice(format!("{:x} 1 f{i}\n", 0x1000 + i).as_bytes());
        }
        let map = PerfMap::parse(&text);
        assert_eq!(map.len(), MAX_ENTRIES);
        assert_eq!(map.lookup(0x1000), None);
        let last = MAX_ENTRIES as u64 + 9;
        assert_eq!(map.lookup(0x1000 + last), Some(format!("f{last}").as_str()));
    }

    /// A process that writes no map (a child `sleep`, not this test process, whose map
    /// another test writes) has none, and so has a PID that cannot exist.
    #[test]
    fn a_process_without_a_map_has_none() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let mut maps = PerfMaps::default();
        let found = maps.get(child.id());
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.is_none());
        assert!(maps.get(1 << 23).is_none());
    }

    /// Files removed even when the test fails.
    struct Remove(Vec<std::path::PathBuf>);
    impl Drop for Remove {
        fn drop(&mut self) {
            for p in &self.0 {
                let _ = std::fs::remove_file(p);
            }
        }
    }

    /// Written in our own /tmp under our own namespace PID, it is found, and read again
    /// when it changed once RECHECK passed; a symlink in its place is not followed; of a
    /// map over MAX_BYTES only the end is read.
    #[test]
    fn the_map_is_found_reread_when_it_changes_cut_to_its_end_and_no_symlink_is_followed() {
        let pid = std::process::id();
        let ns = namespace_pid(pid).expect("NSpid");
        let path = std::path::PathBuf::from(format!("/tmp/perf-{ns}.map"));
        let target = path.with_extension("target");
        let _cleanup = Remove(vec![path.clone(), target.clone()]);
        std::fs::write(&path, "1000 10 first\n").expect("write the map");
        let mut maps = PerfMaps::default();
        assert_eq!(maps.get(pid).expect("found").lookup(0x1001), Some("first"));
        std::fs::write(&path, "1000 10 first\n2000 10 second\n").expect("append");
        assert_eq!(
            maps.get(pid).expect("cached").lookup(0x2001),
            None,
            "before RECHECK"
        );
        std::thread::sleep(RECHECK);
        assert_eq!(maps.get(pid).expect("found").lookup(0x2001), Some("second"));

        let mut big = Vec::new();
        let mut i = 0u64;
        while big.len() as u64 <= MAX_BYTES + 1000 {
            big.extend_from_slice(format!("{:x} 1 code{i}\n", 0x10_0000 + i).as_bytes());
            i += 1;
        }
        std::fs::write(&path, &big).expect("a big map");
        std::thread::sleep(RECHECK);
        let map = maps.get(pid).expect("found");
        assert_eq!(map.lookup(0x10_0000), None, "the start is not read");
        assert_eq!(
            map.lookup(0x10_0000 + i - 1),
            Some(format!("code{}", i - 1).as_str())
        );

        std::fs::remove_file(&path).expect("remove");
        std::fs::write(&target, "1000 10 via a symlink\n").expect("target");
        std::os::unix::fs::symlink(&target, &path).expect("symlink");
        std::thread::sleep(RECHECK);
        let via_link = maps.get(pid);
        assert!(via_link.is_none(), "followed a symlink: {via_link:?}");
    }
}
