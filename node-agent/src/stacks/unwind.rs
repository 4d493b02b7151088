//! Unwinding copied user stacks with the binaries' own tables (`.eh_frame`, or Go's
//! `.debug_frame`), for code built without frame pointers.
//!
//! The kernel sends, per stack sample, the user registers and the top `STACK_COPY` bytes
//! of the user stack (ebpf/src/stacks.bpf.h); this walks them with framehop (samply's
//! unwinder: DWARF CFI through `.eh_frame_hdr`, a frame-pointer rule where a module has
//! no entry, as for JIT code). Where the copy ends before the stack does, the walk is
//! continued with the kernel's frame-pointer walk of the same sample, from the first
//! frame both have.
//!
//! Bounded: the tables of at most `MAX_TABLE_BYTES` of files are kept (cleared whole
//! when a new file would pass it), read once per (device, inode) through the process's
//! root; at most `MAX_PROCESSES` processes' module lists, re-read at most every
//! `MAPS_EVERY` when a walk meets an address outside them.

use std::{
    collections::HashMap,
    ops::{Deref, Range},
    sync::Arc,
    time::{Duration, Instant},
};

use object::{Object, ObjectSection};

/// Unwind-table bytes kept for all files together.
pub const MAX_TABLE_BYTES: usize = 64 << 20;
/// Processes whose module lists are kept.
pub const MAX_PROCESSES: usize = 256;
/// How soon a process's mappings are read again.
const MAPS_EVERY: Duration = Duration::from_secs(2);
/// Frames kept per walk, as the kernel's frame-pointer walk keeps.
const MAX_FRAMES: usize = resourcewatch_ebpf::shared::STACK_DEPTH;

/// Section bytes shared by every process that maps the file.
#[derive(Clone)]
pub struct Bytes(Arc<[u8]>);

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// What unwinding needs of one ELF file: its unwind sections and where its loadable
/// segments sit in the file (to place a mapping's addresses).
struct Tables {
    sections: Vec<(&'static [u8], Range<u64>, Bytes)>,
    /// PT_LOAD segments: (file offset, virtual address, file size).
    loads: Vec<(u64, u64, u64)>,
    bytes: usize,
}

impl Tables {
    /// The tables of `path` in `pid`'s root, read within the bounds of `super::elf`.
    fn read(pid: u32, path: &str) -> Option<Self> {
        Self::from_file(&super::elf::ElfFile::open(pid, path)?)
    }

    fn from_file(file: &super::elf::ElfFile) -> Option<Self> {
        let elf = object::File::parse(file).ok()?;
        let mut sections = Vec::new();
        let mut bytes = 0;
        // .eh_frame with its index when there is one; Go writes only .debug_frame
        // (compressed), which framehop indexes itself.
        let names: &[&'static [u8]] = if elf.section_by_name(".eh_frame").is_some() {
            &[b".eh_frame", b".eh_frame_hdr"]
        } else {
            &[b".debug_frame"]
        };
        for &name in names {
            let Some(s) = elf.section_by_name_bytes(name) else {
                continue;
            };
            let Some(data) = super::elf::section_data(&s, super::elf::MAX_SECTION) else {
                continue;
            };
            bytes += data.len();
            sections.push((
                name,
                s.address()..s.address() + s.size(),
                Bytes(Arc::from(&*data)),
            ));
        }
        if let Some(text) = elf.section_by_name(".text") {
            // Its range only: it tells framehop where instruction analysis would apply.
            sections.push((
                b".text",
                text.address()..text.address() + text.size(),
                Bytes(Arc::from(&[][..])),
            ));
        }
        let loads = super::elf::loads(&elf);
        Some(Self {
            sections,
            loads,
            bytes,
        })
    }

    /// The address this file's image is based at when file offset `offset` is mapped at
    /// `start` (ELF addresses are relative to a base of 0).
    fn base_avma(&self, start: u64, offset: u64) -> Option<u64> {
        // Mappings start at a page boundary: the segment is the one starting latest at or
        // before `offset` once rounded down to its page (lld puts the code segment in the
        // page where the read-only one ends).
        let page = crate::procfs::page_size();
        let &(p_off, p_vaddr, _) = self
            .loads
            .iter()
            .filter(|&&(o, _, size)| o / page * page <= offset && offset < o + size.max(1))
            .max_by_key(|&&(o, _, _)| o)?;
        // The mapping's first byte is at this virtual address of the file.
        let svma = p_vaddr.wrapping_add(offset).wrapping_sub(p_off);
        Some(start.wrapping_sub(svma))
    }
}

/// What the unwinder would keep of an ELF file (for the fuzz targets): its table bytes,
/// and where a mapping at `start` of file offset `offset` would place it.
#[doc(hidden)]
pub fn tables_of_file(
    file: &super::elf::ElfFile,
    start: u64,
    offset: u64,
) -> Option<(usize, Option<u64>)> {
    let t = Tables::from_file(file)?;
    #[cfg(target_arch = "x86_64")]
    {
        // framehop indexes the sections as the unwinder would (a malformed .eh_frame_hdr
        // must not panic here either).
        let mut u = Native::new();
        if let Some(base) = t.base_avma(start, offset) {
            framehop::Unwinder::add_module(
                &mut u,
                framehop::Module::new(
                    String::new(),
                    start..start.saturating_add(0x10000),
                    base,
                    Sections(&t),
                ),
            );
        }
    }
    Some((t.bytes, t.base_avma(start, offset)))
}

/// `framehop::ModuleSectionInfo` over cached tables.
struct Sections<'a>(&'a Tables);

impl framehop::ModuleSectionInfo<Bytes> for Sections<'_> {
    fn base_svma(&self) -> u64 {
        0
    }
    fn section_svma_range(&mut self, name: &[u8]) -> Option<Range<u64>> {
        self.0
            .sections
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, r, _)| r.clone())
    }
    fn section_data(&mut self, name: &[u8]) -> Option<Bytes> {
        self.0
            .sections
            .iter()
            .find(|(n, _, d)| *n == name && !d.is_empty())
            .map(|(_, _, d)| d.clone())
    }
}

#[cfg(target_arch = "x86_64")]
type Native = framehop::x86_64::UnwinderX86_64<Bytes>;
#[cfg(target_arch = "x86_64")]
type NativeCache = framehop::x86_64::CacheX86_64;

#[cfg(target_arch = "x86_64")]
struct Process {
    unwinder: Native,
    /// Executable mappings added, by start address.
    ranges: Vec<Range<u64>>,
    read_at: Instant,
    /// Return addresses in code outside any file, and the stack bytes their code pops
    /// before `ret` (None: not such a stub).
    stubs: HashMap<u64, Option<u64>>,
}

#[cfg(target_arch = "x86_64")]
impl Process {
    fn in_file(&self, addr: u64) -> bool {
        self.ranges.iter().any(|r| r.contains(&addr))
    }

    /// One step through generated code that keeps no frame pointer and has no table, when
    /// the code at the return address `ra` only drops a fixed number of stack bytes and
    /// returns: `add $n, %rsp; ret` or `ret`. CPython's perf trampolines (3.12+, `-X perf`)
    /// are `sub $8, %rsp; call *%rcx; add $8, %rsp; ret`: the Python function each one
    /// stands for is named by the perf map, and the walk goes on into the interpreter
    /// that called it. Read from the process's memory once per address.
    fn stub_return(
        &mut self,
        pid: u32,
        ra: u64,
        regs: &mut framehop::x86_64::UnwindRegsX86_64,
        read: &mut impl FnMut(u64) -> Result<u64, ()>,
    ) -> Result<Option<u64>, ()> {
        let pops = *self.stubs.entry(ra).or_insert_with(|| {
            let code = read_memory::<5>(pid, ra)?;
            match code {
                [0x48, 0x83, 0xc4, n, 0xc3] if n < 0x80 => Some(u64::from(n)),
                [0xc3, ..] => Some(0),
                _ => None,
            }
        });
        let pops = pops.ok_or(())?;
        let sp = regs.sp();
        let next = read(sp + pops)?;
        regs.set_sp(sp + pops + 8);
        regs.set_ip(next);
        Ok(Some(next))
    }
}

/// `N` bytes of process `pid`'s memory at `addr`.
#[cfg(target_arch = "x86_64")]
fn read_memory<const N: usize>(pid: u32, addr: u64) -> Option<[u8; N]> {
    let mut buf = [0u8; N];
    crate::procfs::read_process_memory(pid, addr, &mut buf).then_some(buf)
}

/// A walk of one sample: frames innermost first (the leaf's address, then return
/// addresses), and whether it reached the stack's root.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Walk {
    pub frames: Vec<u64>,
    pub complete: bool,
}

/// Unwinds the stack samples of any number of processes, caching what it reads.
#[derive(Default)]
pub struct Unwinder {
    tables: HashMap<(u64, u64), Option<Arc<Tables>>>,
    table_bytes: usize,
    #[cfg(target_arch = "x86_64")]
    procs: HashMap<u32, Process>,
    #[cfg(target_arch = "x86_64")]
    cache: Option<Box<NativeCache>>,
}

impl Unwinder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Walks `stack` (the bytes from `sp` up) of process `pid`, interrupted at `ip` with
    /// frame register `bp`.
    #[cfg(target_arch = "x86_64")]
    pub fn walk(&mut self, pid: u32, ip: u64, sp: u64, bp: u64, stack: &[u8]) -> Walk {
        use framehop::{FrameAddress, Unwinder as _};
        self.refresh(pid, ip);
        let Some(proc) = self.procs.get_mut(&pid) else {
            // Gone before its sample was read: its leaf is all that is known.
            return Walk {
                frames: vec![ip],
                complete: false,
            };
        };
        let cache = self
            .cache
            .get_or_insert_with(|| Box::new(NativeCache::new()));
        let mut read = |addr: u64| -> Result<u64, ()> {
            let off = usize::try_from(addr.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
            let word = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_le_bytes(word.try_into().map_err(|_| ())?))
        };
        let mut regs = framehop::x86_64::UnwindRegsX86_64::new(ip, sp, bp);
        let mut at = FrameAddress::from_instruction_pointer(ip);
        let mut walk = Walk::default();
        // Frame by frame rather than framehop's iterator: a step it cannot take in code
        // outside any file gets one more chance below.
        while walk.frames.len() < MAX_FRAMES {
            walk.frames.push(at.address());
            let step = match proc.unwinder.unwind_frame(at, &mut regs, cache, &mut read) {
                Ok(next) => Ok(next),
                Err(_) if at.is_return_address() && !proc.in_file(at.address()) => {
                    proc.stub_return(pid, at.address(), &mut regs, &mut read)
                }
                Err(_) => Err(()),
            };
            match step {
                Ok(Some(ra)) => match FrameAddress::from_return_address(ra) {
                    Some(next) => at = next,
                    None => {
                        walk.complete = true;
                        break;
                    }
                },
                Ok(None) => {
                    walk.complete = true;
                    break;
                }
                Err(()) => break,
            }
        }
        walk
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn walk(&mut self, _pid: u32, ip: u64, _sp: u64, _bp: u64, _stack: &[u8]) -> Walk {
        Walk {
            frames: vec![ip],
            complete: false,
        }
    }

    /// Reads `pid`'s executable mappings when it is new, or when `ip` is outside them and
    /// they were read more than `MAPS_EVERY` ago (a library loaded since).
    #[cfg(target_arch = "x86_64")]
    fn refresh(&mut self, pid: u32, ip: u64) {
        use framehop::Unwinder as _;
        if let Some(p) = self.procs.get(&pid)
            && (p.ranges.iter().any(|r| r.contains(&ip)) || p.read_at.elapsed() < MAPS_EVERY)
        {
            return;
        }
        if self.procs.len() >= MAX_PROCESSES && !self.procs.contains_key(&pid) {
            self.procs.clear();
        }
        let Some(maps) = super::maps::read(pid) else {
            self.procs.remove(&pid);
            return;
        };
        let mut unwinder = Native::new();
        let mut ranges = Vec::new();
        for m in super::maps::executable(&maps) {
            let Some(tables) = self.tables_of(pid, &m) else {
                continue;
            };
            let Some(base) = tables.base_avma(m.range.start, m.offset) else {
                continue;
            };
            unwinder.add_module(framehop::Module::new(
                m.path.to_owned(),
                m.range.clone(),
                base,
                Sections(&tables),
            ));
            ranges.push(m.range);
        }
        self.procs.insert(
            pid,
            Process {
                unwinder,
                ranges,
                read_at: Instant::now(),
                stubs: HashMap::new(),
            },
        );
    }

    fn tables_of(&mut self, pid: u32, m: &super::maps::Mapping<'_>) -> Option<Arc<Tables>> {
        let key = (m.dev, m.inode);
        if let Some(t) = self.tables.get(&key) {
            return t.clone();
        }
        let t = Tables::read(pid, m.path).map(Arc::new);
        let bytes = t.as_ref().map_or(0, |t| t.bytes);
        if self.table_bytes + bytes > MAX_TABLE_BYTES {
            // Cleared whole: the files of the processes being captured now come back.
            self.tables.clear();
            self.table_bytes = 0;
            #[cfg(target_arch = "x86_64")]
            self.procs.clear();
        }
        self.table_bytes += bytes;
        self.tables.insert(key, t.clone());
        t
    }

    /// Bytes of unwind tables held.
    pub fn table_bytes(&self) -> usize {
        self.table_bytes
    }
}

/// Joins a walk of the copied window with the kernel's frame-pointer walk of the same
/// sample: a complete walk stands alone; one cut short by the window's end goes on with
/// the frame-pointer frames after the first address both have.
pub fn stitch(walk: &Walk, fp: &[u64]) -> Vec<u64> {
    let mut out = walk.frames.clone();
    if walk.complete {
        return out;
    }
    if let Some(&last) = out.last()
        && let Some(at) = fp.iter().position(|&a| a == last)
    {
        out.extend(
            fp[at + 1..]
                .iter()
                .take(MAX_FRAMES.saturating_sub(out.len())),
        );
    } else if out.len() <= 1 && fp.len() > out.len() {
        // Nothing walked past the leaf (a process gone, an address in no module and no
        // frame pointer): the kernel's walk is all there is.
        return fp.to_vec();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Peak resident memory of this process (VmHWM), bytes.
    fn peak() -> u64 {
        crate::procfs::peak_rss_bytes(std::process::id()).expect("VmHWM")
    }

    /// Files as a hostile pod would map them cost the unwinder nothing past its bounds:
    /// a section declaring 1 GiB in a sparse file (the old reader allocated and zeroed the
    /// declared size), a zlib section declaring 1 TiB once inflated, a zlib bomb just
    /// under a real size, a truncated header, a thousand headers over one range.
    #[test]
    fn hostile_unwind_tables_cost_no_more_than_the_bounds() {
        use super::super::elf::{compressed, crafted};
        let dir = std::env::temp_dir().join(format!("rw-hostile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let write = |name: &str, bytes: &[u8], len: Option<u64>| {
            let p = dir.join(name);
            std::fs::write(&p, bytes).expect("write");
            if let Some(len) = len {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&p)
                    .and_then(|f| f.set_len(len))
                    .expect("sparse");
            }
            p.to_string_lossy().into_owned()
        };
        // 64 MiB of zeros, deflated (~64 KiB), declared as 64 MiB: over MAX_SECTION.
        let bomb = {
            use std::io::Write as _;
            let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
            z.write_all(&vec![0u8; 64 << 20]).expect("deflate");
            z.finish().expect("deflate")
        };
        let cases = [
            write(
                "huge-section",
                &crafted(&[(".eh_frame", 1, 2, &[0u8; 16], 1 << 30)]),
                Some((1 << 30) + 4096),
            ),
            write(
                "tera-zlib",
                &crafted(&[(
                    ".debug_frame",
                    1,
                    0x800,
                    &compressed(1 << 40, &bomb[..1024]),
                    1048,
                )]),
                None,
            ),
            write(
                "zlib-bomb",
                &crafted(&[(
                    ".debug_frame",
                    1,
                    0x800,
                    &compressed(64 << 20, &bomb),
                    bomb.len() as u64 + 24,
                )]),
                None,
            ),
            write(
                "truncated",
                &crafted(&[(".eh_frame", 1, 2, &[1u8; 64], 64)])[..40],
                None,
            ),
            write(
                "many-headers",
                &crafted(&vec![(".eh_frame_hdr", 1, 2, &[0u8; 8][..], 8u64); 1000]),
                None,
            ),
        ];
        let before = peak();
        for c in &cases {
            let t = Tables::read(std::process::id(), c);
            assert!(
                t.as_ref()
                    .is_none_or(|t| t.bytes <= super::super::elf::MAX_SECTION as usize * 2),
                "{c}"
            );
        }
        let grown = peak().saturating_sub(before);
        assert!(
            grown < 48 << 20,
            "reading hostile files grew the peak RSS by {grown} bytes"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_walk_cut_short_goes_on_with_the_frame_pointer_walk() {
        let cut = Walk {
            frames: vec![1, 2, 3],
            complete: false,
        };
        assert_eq!(stitch(&cut, &[1, 9, 3, 4, 5]), vec![1, 2, 3, 4, 5]);
        // Nothing in common: the walk stays as it is (the frame-pointer frames of code
        // without frame pointers are garbage).
        assert_eq!(stitch(&cut, &[7, 8]), vec![1, 2, 3]);
        let whole = Walk {
            frames: vec![1, 2],
            complete: true,
        };
        assert_eq!(stitch(&whole, &[1, 2, 3]), vec![1, 2]);
        let leaf_only = Walk {
            frames: vec![1],
            complete: false,
        };
        assert_eq!(stitch(&leaf_only, &[1, 6, 7]), vec![1, 6, 7]);
    }

    /// This test binary's own stack, copied as the kernel copies one, walks back to the
    /// test's caller through tables (the test profile keeps frame pointers or not: the
    /// tables do not care).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_copied_stack_of_this_process_walks_through_its_callers() {
        #[inline(never)]
        fn inner(u: &mut Unwinder) -> Walk {
            let (ip, sp, bp): (u64, u64, u64);
            // SAFETY: reads three registers, writes nothing else.
            unsafe {
                std::arch::asm!(
                    "lea {ip}, [rip]",
                    "mov {sp}, rsp",
                    "mov {bp}, rbp",
                    ip = out(reg) ip,
                    sp = out(reg) sp,
                    bp = out(reg) bp,
                );
            }
            // SAFETY: the 8 KiB above the stack pointer are this thread's stack (the test
            // harness's frames lie there), read as the kernel would copy them.
            let stack = unsafe { std::slice::from_raw_parts(sp as *const u8, 8192) }.to_vec();
            u.walk(std::process::id(), ip, sp, bp, &stack)
        }
        #[inline(never)]
        fn outer(u: &mut Unwinder) -> Walk {
            std::hint::black_box(inner(u))
        }
        let mut u = Unwinder::new();
        let walk = outer(&mut u);
        assert!(walk.frames.len() >= 3, "{walk:?}");
        let sym = super::super::Symbolizer::new();
        let names = sym.user(std::process::id(), &walk.frames[1..], true);
        assert!(
            names.iter().any(|n| n.contains("outer")),
            "the walk names its caller: {names:?}"
        );
        assert!(u.table_bytes() > 0);
    }
}
