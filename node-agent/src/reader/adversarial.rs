//! Proof by class, not by case: generated hostile inputs for every parser the reader runs
//! (and the two still run by the agent: perf maps and JVM attach replies), each parsed
//! under a counting allocator, its peak held to the reader's budget.
//!
//! The shapes are the ones that amplified before or could: declared sizes that lie
//! (sections, compressed sections in zlib and zstd, inflating far past what they
//! declare), many sections, symbol tables of huge counts naming one long string, CFI of
//! many tiny entries and of deep programs, maps and perf maps of extreme lines, JVM
//! counters of random shape. A failure prints the seed and the case: rerun one with
//! `RW_ADVERSARIAL_SEED=N`.

use std::{cell::Cell, io::Write as _};

use super::Kind;

/// This crate's unit-test allocator counts each thread's bytes in use and their peak.
pub struct Counting;

thread_local! {
    static IN_USE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn add(n: usize) {
    let _ = IN_USE.try_with(|u| {
        let v = u.get() + n;
        u.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
}

fn sub(n: usize) {
    let _ = IN_USE.try_with(|u| u.set(u.get().saturating_sub(n)));
}

// SAFETY: every call is passed on to the system allocator unchanged; only counted.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        add(l.size());
        // SAFETY: as the caller's contract.
        unsafe { std::alloc::System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        add(l.size());
        // SAFETY: as the caller's contract.
        unsafe { std::alloc::System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        sub(l.size());
        // SAFETY: as the caller's contract.
        unsafe { std::alloc::System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, n: usize) -> *mut u8 {
        add(n);
        sub(l.size());
        // SAFETY: as the caller's contract.
        unsafe { std::alloc::System.realloc(p, l, n) }
    }
}

/// The bytes `f` had in use at its peak on this thread, above what was in use before.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = IN_USE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    (out, PEAK.with(Cell::get).saturating_sub(base))
}

/// splitmix64: enough randomness for shapes, reproducible from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// Mostly small, sometimes huge: 2^(0..bits).
    fn size(&mut self, bits: u32) -> u64 {
        let b = self.below(u64::from(bits) + 1) as u32;
        self.below(1u64 << b) + 1
    }
    fn pick<T: Copy>(&mut self, of: &[T]) -> T {
        of[self.below(of.len() as u64) as usize]
    }
}

fn uleb(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// An `.eh_frame` of `fdes` entries, each a program of `insns` random CFA instructions
/// (advances, offsets, remember/restore state nesting as deep as it goes).
fn eh_frame(r: &mut Rng, fdes: usize, insns: usize) -> Vec<u8> {
    let mut v = Vec::new();
    // CIE: "zR", code 1, data -8, RA 16, pcrel sdata4; CFA = rsp+8, RA at CFA-8.
    let mut cie = vec![0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x1b];
    cie.extend_from_slice(&[0x0c, 7, 8, 0x90, 1]);
    while !(cie.len() + 4).is_multiple_of(8) {
        cie.push(0);
    }
    v.extend_from_slice(&(cie.len() as u32).to_le_bytes());
    v.extend_from_slice(&cie);
    for i in 0..fdes {
        let at = v.len();
        let mut fde = Vec::new();
        fde.extend_from_slice(&((at + 4) as u32).to_le_bytes()); // back to the CIE
        fde.extend_from_slice(&((0x1000 + i as u64 * 64) as i32 - (at + 8) as i32).to_le_bytes());
        fde.extend_from_slice(&(r.size(16) as u32).to_le_bytes());
        fde.push(0);
        for _ in 0..insns {
            match r.below(8) {
                0 => fde.push(0x40 | (r.below(63) as u8 + 1)),
                1 => {
                    fde.push(0x0e);
                    uleb(&mut fde, r.size(20));
                }
                2 => fde.push(0x0a),
                3 => fde.push(0x0b),
                4 => {
                    fde.push(0x86);
                    uleb(&mut fde, r.below(4));
                }
                5 => {
                    fde.push(0x0c);
                    uleb(&mut fde, r.pick(&[6, 7, 16, 99]));
                    uleb(&mut fde, r.size(12));
                }
                6 => {
                    // DW_CFA_def_cfa_expression with junk.
                    fde.push(0x0f);
                    let n = r.below(16);
                    uleb(&mut fde, n);
                    fde.extend((0..n).map(|_| r.next() as u8));
                }
                _ => fde.push(0x02 + (r.below(3) as u8)),
            }
        }
        while !(fde.len() + 4).is_multiple_of(4) {
            fde.push(0);
        }
        v.extend_from_slice(&(fde.len() as u32).to_le_bytes());
        v.extend_from_slice(&fde);
    }
    v
}

/// One ELF file of a random hostile shape.
fn elf(r: &mut Rng) -> (&'static str, Vec<u8>) {
    use crate::stacks::elf::{
        compressed, compressed_zstd, crafted, crafted_linked, symbol_name_bomb, zstd_rle_bomb,
    };
    match r.below(7) {
        0 => {
            // Many sections whose declared sizes lie.
            let n = r.size(10) as usize;
            let names = [
                ".eh_frame",
                ".debug_frame",
                ".eh_frame_hdr",
                ".symtab",
                ".text",
            ];
            let body = vec![0u8; r.size(10) as usize];
            let secs: Vec<(&str, u32, u64, &[u8], u64)> = (0..n)
                .map(|_| {
                    (
                        r.pick(&names),
                        r.pick(&[1u32, 2, 3, 8, 11]),
                        r.pick(&[0u64, 2, 6, 0x800]),
                        &body[..],
                        r.pick(&[0u64, 16, 1 << 20, 1 << 32, u64::MAX]),
                    )
                })
                .collect();
            ("lying sections", crafted(&secs))
        }
        1 => {
            // zlib: a real stream of zeros, declared as anything.
            let inflated = r.size(24) as usize;
            let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            z.write_all(&vec![0u8; inflated]).expect("deflate");
            let mut stream = z.finish().expect("deflate");
            if r.below(4) == 0 {
                stream.truncate(r.below(stream.len() as u64) as usize);
            }
            let declared = r.pick(&[1u64, 4096, inflated as u64, 1 << 24, 1 << 40]);
            let sec = compressed(declared, &stream);
            let name = r.pick(&[".debug_frame", ".eh_frame"]);
            ("zlib", crafted(&[(name, 1, 0x802, &sec, sec.len() as u64)]))
        }
        2 => {
            // zstd: RLE bombs of any size, declared as anything.
            let inflated = r.size(13) << 17;
            let mut stream = zstd_rle_bomb(inflated);
            if r.below(4) == 0 {
                stream.truncate(r.below(stream.len() as u64) as usize);
            }
            let declared = r.pick(&[1u64, 4096, inflated, 1 << 24, 1 << 40]);
            let sec = compressed_zstd(declared, &stream);
            let name = r.pick(&[".debug_frame", ".eh_frame"]);
            ("zstd", crafted(&[(name, 1, 0x802, &sec, sec.len() as u64)]))
        }
        3 => (
            "symbol names",
            symbol_name_bomb(r.size(17) as usize, r.size(16) as usize),
        ),
        4 => {
            // Many tiny entries, or deep programs.
            let (fdes, insns) = if r.below(2) == 0 {
                (r.size(17) as usize, r.below(4) as usize)
            } else {
                (r.size(6) as usize, r.size(14) as usize)
            };
            let cfi = eh_frame(r, fdes, insns);
            (
                "cfi",
                crafted(&[(".eh_frame", 1, 2, &cfi, cfi.len() as u64)]),
            )
        }
        5 => {
            // A symbol table with random entries over a random string table.
            let n = r.size(15) as usize;
            let strtab: Vec<u8> = (0..r.size(14))
                .map(|_| r.pick(&[0u8, b'a', b'_', b'Z']))
                .collect();
            let mut symtab = vec![0u8; 24];
            for _ in 0..n {
                symtab.extend_from_slice(&(r.below(strtab.len() as u64 + 8) as u32).to_le_bytes());
                symtab.push(r.pick(&[0x12, 0x11, 0x02, 0x1a]));
                symtab.push(0);
                symtab.extend_from_slice(&(r.below(4) as u16).to_le_bytes());
                symtab.extend_from_slice(&r.next().to_le_bytes());
                symtab.extend_from_slice(&r.pick(&[0u64, 1, 1 << 40]).to_le_bytes());
            }
            (
                "random symbols",
                crafted_linked(&[
                    (".text", 1, 6, &[0xc3; 16], r.size(30), 0, 0),
                    (".symtab", 2, 0, &symtab, symtab.len() as u64, 3, 24),
                    (".strtab", 3, 0, &strtab, strtab.len() as u64, 0, 0),
                ]),
            )
        }
        _ => {
            // Random bytes after a valid ident.
            let mut v = b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0".to_vec();
            v.extend((0..r.size(16)).map(|_| r.next() as u8));
            ("random", v)
        }
    }
}

/// A maps text of extreme lines.
fn maps(r: &mut Rng) -> Vec<u8> {
    let mut v = Vec::new();
    let lines = r.size(16);
    for i in 0..lines {
        let path_len = r.size(13) as usize;
        let path: String = std::iter::once('/')
            .chain((1..path_len).map(|_| r.pick(&['a', '/', ' ', '\u{e9}'])))
            .collect();
        let _ = writeln!(
            v,
            "{:x}-{:x} {} {:x} {:x}:{:x} {} {}",
            i * 4096,
            r.pick(&[i * 4096 + 4096, 0, u64::MAX]),
            r.pick(&["r-xp", "rw-p", "--xs"]),
            r.next(),
            r.below(256),
            r.below(256),
            r.below(1 << 20),
            path
        );
    }
    v
}

/// Runs `cases` generated inputs from `seed`; each parse's peak must stay within
/// `budget`. Returns the largest peak seen, and its case.
fn run(seed: u64, cases: usize, budget: usize) -> (usize, String) {
    let mut largest = (0, String::new());
    for case in 0..cases {
        let case_seed = seed.wrapping_add(case as u64);
        let mut r = Rng(case_seed);
        let (what, bytes, kinds): (&str, Vec<u8>, Vec<Kind>) = match r.below(10) {
            0 => ("maps", maps(&mut r), vec![Kind::Maps]),
            1 => {
                let mut v = Vec::new();
                for _ in 0..r.size(17) {
                    let _ = writeln!(
                        v,
                        "{:x} {:x} {}",
                        r.next(),
                        r.next(),
                        "n".repeat(r.size(10) as usize)
                    );
                }
                ("perf map", v, Vec::new())
            }
            2 => {
                let mut v = 0xcafec0c0u32.to_be_bytes().to_vec();
                v.extend((0..r.size(16)).map(|_| r.next() as u8));
                ("hsperfdata", v, vec![Kind::Hsperf])
            }
            _ => {
                let (what, v) = elf(&mut r);
                (what, v, vec![Kind::Tables, Kind::Symbols, Kind::Python])
            }
        };
        let check = |kind: &str, peak: usize, largest: &mut (usize, String)| {
            assert!(
                peak <= budget,
                "seed {case_seed} ({what}, {} bytes, {kind}): a parse peaked at {peak} bytes, over the reader's {budget}",
                bytes.len()
            );
            if peak > largest.0 {
                *largest = (peak, format!("seed {case_seed}: {what} as {kind}"));
            }
        };
        if what == "perf map" {
            let (_, peak) = peak_of(|| super::parse(Kind::PerfMap, memfd(&bytes)));
            check("perf map", peak, &mut largest);
            let (_, peak) = peak_of(|| super::parse(Kind::AttachReply, memfd(&bytes)));
            check("attach reply", peak, &mut largest);
            continue;
        }
        for kind in kinds {
            let file = memfd(&bytes);
            let (_, peak) = peak_of(|| super::parse(kind, file));
            check(&format!("{kind:?}"), peak, &mut largest);
        }
    }
    largest
}

fn memfd(data: &[u8]) -> std::fs::File {
    use std::os::fd::FromRawFd;
    // SAFETY: a NUL-terminated name and no flags but close-on-exec.
    let fd = unsafe { libc::memfd_create(c"adversarial".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: the kernel just returned this descriptor to us alone.
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.write_all(data).expect("memfd");
    f
}

/// A thousand generated hostile inputs (each parsed as every kind that reads it: about
/// 2,500 parses), each parse within the reader's data budget.
#[test]
fn every_generated_hostile_input_parses_within_the_readers_budget() {
    let seed = std::env::var("RW_ADVERSARIAL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(crate::procfs::realtime_ns);
    let cases = if std::env::var_os("RW_ADVERSARIAL_SEED").is_some() {
        1
    } else {
        1000
    };
    eprintln!("adversarial inputs from seed {seed} ({cases} cases)");
    let budget = super::serve::DATA_BUDGET as usize;
    let (peak, case) = run(seed, cases, budget);
    eprintln!("largest peak {peak} bytes ({case}), budget {budget}");
}

/// The largest real binary here, Node.js 20's (99 MB, 185,000 function symbols, 7 MiB of
/// names, 2.6 MiB of CFI), parses within the budget: before its string tables were read
/// whole and the answer sized exactly, its symbols peaked at 127 MB.
#[test]
fn a_large_real_binary_parses_within_the_budget() {
    let Some(node) = ["/usr/bin/node", "/usr/local/bin/node"]
        .iter()
        .find(|p| std::path::Path::new(p).is_file())
    else {
        panic!("no Node.js binary on this machine (make deps installs one)");
    };
    for kind in [Kind::Tables, Kind::Symbols] {
        let f = std::fs::File::open(node).expect("node");
        let (out, peak) = peak_of(|| super::parse(kind, f).map(|b| b.len()));
        assert!(out.is_some(), "{node} as {kind:?}: nothing read");
        let budget = super::serve::DATA_BUDGET as usize;
        assert!(peak < budget, "{node} as {kind:?}: peak {peak} bytes");
        assert!(out.unwrap_or(0) <= super::MAX_ANSWER);
    }
}

/// The counting works: a parse that allocates is seen to.
#[test]
fn the_counting_allocator_sees_a_parses_peak() {
    let (_, peak) = peak_of(|| {
        let v = vec![1u8; 3 << 20];
        std::hint::black_box(&v);
    });
    assert!(peak >= 3 << 20, "{peak}");
}
