//! `/proc/PID/maps` of a workload, read with a bound.
//!
//! A process chooses its own maps: up to `vm.max_map_count` (65,530 by default) mappings,
//! each named by a path of up to 4 KiB, so its maps file can pass 250 MiB. Read whole, as
//! `read_to_string` does, one such process would cost the agent more than its memory
//! limit. Here at most `MAX_MAPS_BYTES` are read; a process whose maps are longer is
//! treated as if it could not be read (its stacks keep their addresses unnamed).

use std::{io::Read, ops::Range};

/// The most bytes of one process's maps read (a JVM with a large heap: ~200 KiB; a
/// Chromium renderer: ~1 MiB).
pub const MAX_MAPS_BYTES: u64 = 8 << 20;

/// The maps of process `pid`, or None when they cannot be read or are over the bound.
pub fn read(pid: u32) -> Option<String> {
    read_path(&format!("/proc/{pid}/maps"), MAX_MAPS_BYTES)
}

fn read_path(path: &str, max: u64) -> Option<String> {
    read_file(std::fs::File::open(path).ok()?, max)
}

/// An open maps file read whole, or None when it is over `max` bytes.
pub fn read_file(file: std::fs::File, max: u64) -> Option<String> {
    let mut out = Vec::new();
    // One byte more than the bound tells a file at the bound from one past it.
    file.take(max + 1).read_to_end(&mut out).ok()?;
    if out.len() as u64 > max {
        return None;
    }
    // Paths are bytes: a name that is not UTF-8 is read lossily (it is only ever used to
    // open the file inside the process's root, where such a path then fails to open).
    Some(
        String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
    )
}

/// One executable file mapping of /proc/PID/maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping<'a> {
    pub range: Range<u64>,
    pub offset: u64,
    pub dev: u64,
    pub inode: u64,
    pub path: &'a str,
}

impl<'a> Mapping<'a> {
    /// An executable mapping of a file that still exists; None for any other line.
    pub fn parse(line: &'a str) -> Option<Self> {
        let mut it = line.splitn(6, ' ');
        let (start, end) = it.next()?.split_once('-')?;
        let perms = it.next()?;
        let offset = u64::from_str_radix(it.next()?, 16).ok()?;
        let (major, minor) = it.next()?.split_once(':')?;
        let inode: u64 = it.next()?.parse().ok()?;
        let path = it.next()?.trim_start();
        if !perms.contains('x') || inode == 0 || !path.starts_with('/') {
            return None;
        }
        // A file replaced on disk since it was mapped: what is at its path now is not
        // what runs.
        if path.ends_with(" (deleted)") {
            return None;
        }
        let dev =
            (u64::from_str_radix(major, 16).ok()? << 32) | u64::from_str_radix(minor, 16).ok()?;
        let range = u64::from_str_radix(start, 16).ok()?..u64::from_str_radix(end, 16).ok()?;
        if range.is_empty() {
            return None;
        }
        Some(Self {
            range,
            offset,
            dev,
            inode,
            path,
        })
    }

    /// The file offset of address `addr` of this mapping.
    pub fn file_offset(&self, addr: u64) -> Option<u64> {
        self.range
            .contains(&addr)
            .then(|| self.offset.checked_add(addr - self.range.start))?
    }
}

/// The most executable file mappings of one process kept (a JVM has about 100; a tenant
/// can make 65,530).
pub const MAX_FILE_MAPPINGS: usize = 8192;
/// The longest path kept (the kernel's PATH_MAX).
const MAX_PATH: usize = 4096;

/// One executable file mapping, owned: what the reader answers of a maps file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileMapping {
    pub range: Range<u64>,
    pub offset: u64,
    pub dev: u64,
    pub inode: u64,
    pub path: std::sync::Arc<str>,
}

impl FileMapping {
    /// The file offset of address `addr` of this mapping.
    pub fn file_offset(&self, addr: u64) -> Option<u64> {
        self.range
            .contains(&addr)
            .then(|| self.offset.checked_add(addr - self.range.start))?
    }

    pub fn encode_all(all: &[Self], e: &mut crate::reader::wire::Enc) {
        e.u32(all.len() as u32);
        for m in all {
            e.u64(m.range.start)
                .u64(m.range.end)
                .u64(m.offset)
                .u64(m.dev)
                .u64(m.inode)
                .bytes(m.path.as_bytes());
        }
    }

    /// Decoded and checked as `Mapping::parse` checks a line: non-empty ranges, absolute
    /// paths of at most PATH_MAX bytes, at most `MAX_FILE_MAPPINGS`.
    pub fn decode_all(
        d: &mut crate::reader::wire::Dec<'_>,
    ) -> Result<Vec<Self>, crate::reader::wire::Malformed> {
        use crate::reader::wire::Malformed;
        let n = d.count(44)?;
        if n > MAX_FILE_MAPPINGS {
            return Err(Malformed);
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let range = d.u64()?..d.u64()?;
            let (offset, dev, inode) = (d.u64()?, d.u64()?, d.u64()?);
            let path = std::str::from_utf8(d.bytes()?).map_err(|_| Malformed)?;
            if range.is_empty() || !path.starts_with('/') || path.len() > MAX_PATH {
                return Err(Malformed);
            }
            out.push(Self {
                range,
                offset,
                dev,
                inode,
                path: path.into(),
            });
        }
        Ok(out)
    }
}

/// Every executable file mapping of a maps text, owned, at most `MAX_FILE_MAPPINGS`.
pub fn executable_owned(maps: &str) -> Vec<FileMapping> {
    maps.lines()
        .filter_map(Mapping::parse)
        .filter(|m| m.path.len() <= MAX_PATH)
        .take(MAX_FILE_MAPPINGS)
        .map(|m| FileMapping {
            range: m.range,
            offset: m.offset,
            dev: m.dev,
            inode: m.inode,
            path: m.path.into(),
        })
        .collect()
}

/// Every executable file mapping of a maps text.
pub fn executable(maps: &str) -> Vec<Mapping<'_>> {
    maps.lines().filter_map(Mapping::parse).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_give_executable_file_mappings_only() {
        let m = Mapping::parse(
            "7f1c2a400000-7f1c2a595000 r-xp 00028000 fe:01 1837      /usr/lib/x86_64-linux-gnu/libc.so.6",
        )
        .expect("an executable file mapping");
        assert_eq!(m.range, 0x7f1c2a400000..0x7f1c2a595000);
        assert_eq!(m.offset, 0x28000);
        assert_eq!(m.dev, (0xfe << 32) | 1);
        assert_eq!(m.inode, 1837);
        assert_eq!(m.path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert_eq!(m.file_offset(0x7f1c2a400010), Some(0x28010));
        assert_eq!(m.file_offset(0x7f1c2a595000), None);
        for other in [
            "7f1c2a3d8000-7f1c2a400000 r--p 00000000 fe:01 1837      /usr/lib/libc.so.6",
            "7ffd5a1f0000-7ffd5a211000 rw-p 00000000 00:00 0          [stack]",
            "7ffd5a3e6000-7ffd5a3e8000 r-xp 00000000 00:00 0          [vdso]",
            "7f00000000-7f00001000 r-xp 00000000 00:05 77 /memfd:jit (deleted)",
            "7f00001000-7f00000000 r-xp 00000000 00:05 77 /backwards",
            "zz-7f00001000 r-xp 00000000 00:05 77 /bad",
            "",
            "7f00000000-7f00001000",
            "7f00000000-7f00001000 r-xp ffffffffffffffffff 00:05 77 /huge-offset",
        ] {
            assert!(Mapping::parse(other).is_none(), "{other}");
        }
        // An offset near the top: no overflow.
        let top = Mapping::parse("1000-3000 r-xp fffffffffffffff0 00:05 9 /x").expect("parsed");
        assert_eq!(top.file_offset(0x2fff), None);
    }

    #[test]
    fn maps_longer_than_the_bound_are_not_read() {
        let path = std::env::temp_dir().join(format!("rw-maps-{}", std::process::id()));
        std::fs::write(&path, "a".repeat(1000)).expect("write");
        let p = path.to_string_lossy();
        assert_eq!(read_path(&p, 1000).map(|s| s.len()), Some(1000));
        assert_eq!(read_path(&p, 999), None);
        std::fs::write(&path, b"\xff/x\n").expect("write");
        assert_eq!(read_path(&p, 1000).as_deref(), Some("\u{fffd}/x\n"));
        let _ = std::fs::remove_file(path);
        assert!(read(std::process::id()).is_some_and(|m| !executable(&m).is_empty()));
    }
}
