//! A JVM's retained heap, read from its hsperfdata file: the shared-memory performance
//! counters every HotSpot JVM publishes by default (`-XX:+UsePerfData`) in
//! `/tmp/hsperfdata_<user>/<pid>`, which `jstat` and `jps` read.
//!
//! Why: a JVM's resident size says little about a slow leak. G1 commits heap ahead of need
//! and keeps what it committed, so a 100 KB/s leak fills heap already resident and the
//! resident size stays flat for minutes (measured in the corpus: flat for 40 s to 5
//! minutes, the leak found only when the heap expanded). What the collector keeps after
//! each young collection (the old generation and the survivors) is the heap's live set
//! plus what was promoted, and a leak raises it at every collection.
//!
//! Hand-made rather than a crate: no maintained Rust reader of the format exists, and the
//! format is two fixed headers (`PerfDataPrologue`, `PerfDataEntry` in OpenJDK's
//! `perfMemory.hpp`, stable since JDK 6) and named 64-bit counters.
//!
//! Inside a container, the file is in the container's `/tmp` under the PID the JVM sees
//! (`NSpid`): read through `/proc/PID/root`, as `jps` does across namespaces.
//!
//! Every process that moves memory is probed, and its `/tmp` is the workload's: the
//! directory and the file are opened inside the process's root (`openat2`
//! `RESOLVE_IN_ROOT`, so a symlink cannot point at the node's files), without blocking,
//! the file only when regular (checked on the descriptor) and no larger than
//! `MAX_FILE_BYTES`; the listing stops after `MAX_TMP_ENTRIES`. A sparse file declaring
//! gigabytes planted as `hsperfdata_x/<pid>` once cost the agent that much memory per read.

use std::io::Read;
use std::os::fd::AsRawFd;

use crate::procfs;

const MAGIC: u32 = 0xcafe_c0c0;
/// HotSpot sizes the file by `-XX:PerfDataMemorySize`, 64 KiB by default (32 KiB before
/// JDK 9); a file 16 times that is not one a JVM wrote.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// Entries of a workload's `/tmp` looked at for an `hsperfdata_<user>` directory.
pub const MAX_TMP_ENTRIES: usize = 4096;
const PROLOGUE_LEN: usize = 32;
const ENTRY_HEADER_LEN: usize = 20;

/// What is read from one JVM's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heap {
    /// Old generation plus survivors: what the last young collection kept. Eden (new
    /// allocation, mostly garbage) is left out.
    pub retained_bytes: u64,
    /// Young collections so far.
    pub young_collections: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("too short for a perfdata prologue")]
    Short,
    #[error("not a perfdata file (magic {0:#x})")]
    Magic(u32),
    #[error("the JVM has not made its counters accessible yet")]
    NotAccessible,
    #[error("an entry runs past the end of the file")]
    Truncated,
    #[error("no old-generation counters (a collector this reader does not know)")]
    NoGenerations,
}

fn bytes<const N: usize>(d: &[u8], at: usize) -> Result<[u8; N], ParseError> {
    d.get(at..at + N)
        .and_then(|s| s.try_into().ok())
        .ok_or(ParseError::Truncated)
}

fn read_u32(d: &[u8], at: usize, little: bool) -> Result<u32, ParseError> {
    let b = bytes(d, at)?;
    Ok(if little {
        u32::from_le_bytes(b)
    } else {
        u32::from_be_bytes(b)
    })
}

fn read_i64(d: &[u8], at: usize, little: bool) -> Result<i64, ParseError> {
    let b = bytes(d, at)?;
    Ok(if little {
        i64::from_le_bytes(b)
    } else {
        i64::from_be_bytes(b)
    })
}

/// Parses a perfdata file's bytes.
pub fn parse(d: &[u8]) -> Result<Heap, ParseError> {
    if d.len() < PROLOGUE_LEN {
        return Err(ParseError::Short);
    }
    // The magic is written big-endian whatever the byte order of the rest.
    let magic = read_u32(d, 0, false)?;
    if magic != MAGIC {
        return Err(ParseError::Magic(magic));
    }
    let little = d[4] == 1;
    if d[7] == 0 {
        return Err(ParseError::NotAccessible);
    }
    let entry_offset = read_u32(d, 24, little)? as usize;
    let entries = read_u32(d, 28, little)? as usize;
    let (mut retained, mut young, mut old_seen) = (0u64, 0u64, false);
    let mut off = entry_offset;
    for _ in 0..entries {
        let len = read_u32(d, off, little)? as usize;
        let name_at = off + read_u32(d, off + 4, little)? as usize;
        let vector_len = read_u32(d, off + 8, little)?;
        let data_type = *d.get(off + 12).ok_or(ParseError::Truncated)?;
        let data_at = off + read_u32(d, off + 16, little)? as usize;
        if len < ENTRY_HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        if vector_len == 0 && data_type == b'J' {
            let name_end = d[name_at.min(d.len())..]
                .iter()
                .position(|&b| b == 0)
                .ok_or(ParseError::Truncated)?;
            let name = &d[name_at..name_at + name_end];
            let value = || read_i64(d, data_at, little).map(|v| v.max(0) as u64);
            match counter(name) {
                Counter::Retained { old } => {
                    retained += value()?;
                    old_seen |= old;
                }
                Counter::YoungCollections => young = value()?,
                Counter::Other => {}
            }
        }
        off += len;
    }
    if !old_seen {
        return Err(ParseError::NoGenerations);
    }
    Ok(Heap {
        retained_bytes: retained,
        young_collections: young,
    })
}

enum Counter {
    Retained { old: bool },
    YoungCollections,
    Other,
}

/// `sun.gc.generation.G.space.S.used`: generation 1 is the old one (Serial, Parallel,
/// G1); spaces 1 and 2 of generation 0 are the survivors, space 0 is eden.
fn counter(name: &[u8]) -> Counter {
    if name == b"sun.gc.collector.0.invocations" {
        return Counter::YoungCollections;
    }
    let Some(rest) = name
        .strip_prefix(b"sun.gc.generation.")
        .and_then(|r| r.strip_suffix(b".used"))
    else {
        return Counter::Other;
    };
    match rest {
        [b'1', b'.', b's', b'p', b'a', b'c', b'e', b'.', ..] => Counter::Retained { old: true },
        b"0.space.1" | b"0.space.2" => Counter::Retained { old: false },
        _ => Counter::Other,
    }
}

/// Where process `pid`'s counters are, if it is a JVM publishing them: a path inside its
/// root, `tmp/hsperfdata_<user>/<the PID it sees itself as>`.
pub fn find(pid: u32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let ns_pid = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last())
        .unwrap_or("");
    let ns_pid = if ns_pid.is_empty() {
        pid.to_string()
    } else {
        ns_pid.to_string()
    };
    let tmp = procfs::open_in_root(
        pid,
        "tmp",
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK,
    )
    .ok()?;
    // The directory just opened, not a path resolved again.
    std::fs::read_dir(format!("/proc/self/fd/{}", tmp.as_raw_fd()))
        .ok()?
        .take(MAX_TMP_ENTRIES)
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let name = name.to_str()?;
            name.starts_with("hsperfdata_")
                .then(|| format!("tmp/{name}/{ns_pid}"))
        })
        .find(|p| procfs::open_regular_in_root(pid, p).is_some())
}

/// Reads and parses one file of process `pid`'s root (`find`'s path). The JVM rewrites
/// counters in place while we read: a torn 64-bit value is at worst one collection stale,
/// which the detectors' series absorb.
pub fn read(pid: u32, path: &str) -> Option<Heap> {
    read_file(procfs::open_regular_in_root(pid, path)?)
}

/// An open hsperfdata file read (in the reader process: `crate::reader`).
pub fn read_file(file: std::fs::File) -> Option<Heap> {
    if file.metadata().ok()?.len() > MAX_FILE_BYTES {
        return None;
    }
    // The size checked on the descriptor can change under us: the read is bounded too.
    let mut d = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut d).ok()?;
    if d.len() as u64 > MAX_FILE_BYTES {
        return None;
    }
    parse(&d).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A perfdata image with the given `J` counters, in the JVM's layout.
    fn image(little: bool, counters: &[(&str, i64)]) -> Vec<u8> {
        let u32b = |v: u32| {
            if little {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            }
        };
        let mut d = Vec::new();
        d.extend_from_slice(&MAGIC.to_be_bytes());
        d.extend_from_slice(&[u8::from(little), 2, 0, 1]);
        d.extend_from_slice(&u32b(0)); // used
        d.extend_from_slice(&u32b(0)); // overflow
        d.extend_from_slice(&[0; 8]); // mod time stamp
        d.extend_from_slice(&u32b(PROLOGUE_LEN as u32));
        d.extend_from_slice(&u32b(counters.len() as u32 + 1));
        // A string entry first, as the JVM's are interleaved.
        let mut entries: Vec<(String, Vec<u8>, u8, u32)> = vec![(
            "java.property.java.version".into(),
            b"17\0".to_vec(),
            b'B',
            3,
        )];
        for (name, v) in counters {
            let b = if little {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            };
            entries.push(((*name).into(), b.to_vec(), b'J', 0));
        }
        for (name, data, ty, vlen) in entries {
            let name_off = ENTRY_HEADER_LEN;
            let data_off = (name_off + name.len() + 1).next_multiple_of(8);
            let len = data_off + data.len();
            d.extend_from_slice(&u32b(len as u32));
            d.extend_from_slice(&u32b(name_off as u32));
            d.extend_from_slice(&u32b(vlen));
            d.extend_from_slice(&[ty, 0, 1, 3]);
            d.extend_from_slice(&u32b(data_off as u32));
            d.extend_from_slice(name.as_bytes());
            d.resize(d.len() + data_off - name_off - name.len(), 0);
            d.extend_from_slice(&data);
        }
        d
    }

    const G1: &[(&str, i64)] = &[
        ("sun.gc.collector.0.invocations", 7),
        ("sun.gc.generation.1.space.0.capacity", 369_098_760),
        ("sun.gc.generation.1.space.0.used", 4_116_480),
        ("sun.gc.generation.0.space.0.used", 16_777_216),
        ("sun.gc.generation.0.space.1.used", 0),
        ("sun.gc.generation.0.space.2.used", 491_952),
    ];

    #[test]
    fn retained_heap_is_old_generation_plus_survivors_in_either_byte_order() {
        for little in [true, false] {
            assert_eq!(
                parse(&image(little, G1)),
                Ok(Heap {
                    retained_bytes: 4_116_480 + 491_952,
                    young_collections: 7,
                }),
                "little endian: {little}"
            );
        }
    }

    #[test]
    fn bad_files_are_errors_not_numbers() {
        assert_eq!(parse(&[0; 10]), Err(ParseError::Short));
        let mut d = image(true, G1);
        d[0] = 0;
        assert!(matches!(parse(&d), Err(ParseError::Magic(_))));
        let mut d = image(true, G1);
        d[7] = 0;
        assert_eq!(parse(&d), Err(ParseError::NotAccessible));
        let d = image(true, G1);
        assert_eq!(parse(&d[..d.len() - 4]), Err(ParseError::Truncated));
        // A collector without an old generation (eden only) gives no figure.
        let eden = image(true, &[("sun.gc.generation.0.space.0.used", 5)]);
        assert_eq!(parse(&eden), Err(ParseError::NoGenerations));
    }

    /// Our own process stands for a JVM: its counters under `/tmp/hsperfdata_<x>/<pid>`,
    /// found and read inside its root; what a workload can put there instead is refused
    /// without reading it.
    #[test]
    fn counters_are_found_in_the_process_root_and_hostile_files_are_refused() {
        use std::os::unix::fs::symlink;
        let me = std::process::id();
        let dir = format!("/tmp/hsperfdata_rwtest{me}");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let file = format!("{dir}/{me}");
        std::fs::write(&file, image(true, G1)).expect("perfdata");
        let found = find(me).expect("found");
        assert_eq!(found, format!("tmp/hsperfdata_rwtest{me}/{me}"));
        assert_eq!(read(me, &found).map(|h| h.young_collections), Some(7));
        // The same found by the loader thread and parsed by the reader process, as the
        // engine asks for it.
        let (path, heap) = crate::reader::loader()
            .jvm_heap_async(me, None)
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("answered");
        assert_eq!(path.as_deref(), Some(found.as_str()));
        assert_eq!(heap, read(me, &found));

        // A sparse file declaring 4 GiB: refused by its size, nothing allocated for it.
        std::fs::remove_file(&file).expect("rm");
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(4 << 30))
            .expect("sparse");
        let before = crate::procfs::peak_rss_bytes(me).unwrap_or(0);
        assert_eq!(read(me, &found), None);
        let after = crate::procfs::peak_rss_bytes(me).unwrap_or(0);
        assert!(
            after < before + (64 << 20),
            "peak RSS grew from {before} to {after}"
        );

        // A FIFO: neither opened for a read that would block nor read.
        std::fs::remove_file(&file).expect("rm");
        let c = std::ffi::CString::new(file.clone()).expect("path");
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        let t = std::time::Instant::now();
        assert_eq!(read(me, &found), None);
        assert_eq!(find(me), None, "a FIFO is not a JVM's counters");
        assert!(t.elapsed() < std::time::Duration::from_secs(2));

        // A symlink (to a regular file of the right shape): not followed.
        std::fs::remove_file(&file).expect("rm");
        let target = format!("{dir}/real");
        std::fs::write(&target, image(true, G1)).expect("perfdata");
        symlink(&target, &file).expect("symlink");
        assert_eq!(read(me, &found), None);
        let _ = std::fs::remove_dir_all(&dir);

        // Not a JVM: no hsperfdata directory holds our PID.
        assert_eq!(find(me), None);
    }
}
