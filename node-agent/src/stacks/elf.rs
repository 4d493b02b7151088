//! ELF files named by a workload's mappings, read as hostile input.
//!
//! Any pod can map a file of its own making and let its stacks be captured, so what these
//! files declare (section sizes, header counts, compressed sizes, symbol counts) is never
//! trusted:
//! - the file is opened inside the process's own root (`openat2` with `RESOLVE_IN_ROOT`:
//!   an absolute symlink cannot lead to the node's files), without blocking, and only a
//!   regular file, checked on the open descriptor;
//! - it is read with `pread`, never mapped: a workload that truncates a file the agent has
//!   mapped kills the agent with SIGBUS. This is why symbols are read here and not by
//!   blazesym, which mmaps every ELF file it symbolises, decompresses sections without a
//!   bound, and opens files by path;
//! - every read is checked against the real file size and against a per-file budget
//!   *before* anything is allocated (object's own `ReadCache` allocates whatever size is
//!   asked, and keeps a copy per distinct (offset, size): a sparse file declaring a 1 GiB
//!   section, or many sections over one range, would cost the agent that much memory);
//! - a compressed section's declared size is checked against a cap before it is inflated.
//!
//! A file that breaks a bound is simply not read: the process that mapped it loses the
//! names (or the unwind tables) of that file, nothing else.

use std::{
    borrow::Cow, cell::RefCell, collections::HashMap, fs::File, ops::Range, os::unix::fs::FileExt,
};

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, ReadRef, SectionKind};

use crate::reader::wire::{Dec, Enc, Malformed};

/// Bytes one file may cost to read, all reads together (the largest unwind tables seen
/// here: libjvm.so's `.eh_frame`, 2.3 MiB; a Go binary's `.debug_frame`, about 1 MiB;
/// Chromium-sized symbol tables pass 100 MiB and are left unnamed).
pub const FILE_BUDGET: u64 = 32 << 20;
/// The largest section kept, after decompression.
pub const MAX_SECTION: u64 = 16 << 20;
/// The most function symbols kept of one file (Node.js 20's binary has about 150,000;
/// with `MAX_NAME_BYTES`, an answer of the reader's `MAX_ANSWER`).
pub const MAX_SYMBOLS: usize = 1 << 18;
/// The most bytes of distinct symbol names kept of one file (Node.js 20's: about 7 MiB;
/// a name shared by many symbols is kept once: 2^20 symbols naming one 4 KiB string
/// once cost 4 GiB).
pub const MAX_NAME_BYTES: usize = 10 << 20;
/// Longest symbol name demangled (cpp_demangle's cost grows with the name).
const MAX_DEMANGLE: usize = 4096;

/// An open ELF file with a read budget: `&ElfFile` is an `object::ReadRef`.
pub struct ElfFile {
    inner: RefCell<Inner>,
}

struct Inner {
    file: File,
    len: u64,
    budget: u64,
    bufs: HashMap<(u64, u64), Box<[u8]>>,
    strings: HashMap<(u64, u8), Box<[u8]>>,
    /// String tables read whole ([`ElfFile::preload`]): names in them are slices, not
    /// one allocation and map entry each (Node.js's 300,000 names cost the reader's
    /// whole budget so).
    tables: Vec<(u64, Box<[u8]>)>,
    /// Bytes left to look through for the end of a string ([`SCAN_BUDGET`]).
    scan: u64,
    /// Bytes looked through, refused or not (for tests of the bound).
    #[cfg(test)]
    looked: u64,
}

/// The most bytes looked through for the ends of strings in one file. The reads are
/// charged to the file's budget, but a string table read once can be looked through
/// again and again: 2^20 symbols naming one 4 KiB string cost 4 GiB of scanning, seconds
/// of the reader's deadline (hostile.c's name bomb). Node.js 20's 300,000 names take
/// about 12 MiB; past the budget a file's remaining names are unread.
pub const SCAN_BUDGET: u64 = 256 << 20;

impl ElfFile {
    /// The regular file `path` of process `pid`'s mount namespace, opened inside its root.
    pub fn open(pid: u32, path: &str) -> Option<Self> {
        Self::new(crate::procfs::open_regular_in_root(pid, path)?, FILE_BUDGET)
    }

    /// `file`, read with at most `budget` bytes; None unless it is a regular file.
    pub fn new(file: File, budget: u64) -> Option<Self> {
        let meta = file.metadata().ok()?;
        if !meta.is_file() {
            return None;
        }
        Some(Self {
            inner: RefCell::new(Inner {
                file,
                len: meta.len(),
                budget,
                bufs: HashMap::new(),
                strings: HashMap::new(),
                tables: Vec::new(),
                scan: SCAN_BUDGET,
                #[cfg(test)]
                looked: 0,
            }),
        })
    }

    /// Reads the `size` bytes at `offset` whole, charged to the budget, so that strings
    /// found there are slices of them (a string table); false if refused.
    pub fn preload(&self, offset: u64, size: u64) -> bool {
        let inner = &mut *self.inner.borrow_mut();
        let Some(end) = offset.checked_add(size) else {
            return false;
        };
        let Ok(n) = inner.charge(&(offset..end), size) else {
            return false;
        };
        let mut bytes = vec![0u8; n].into_boxed_slice();
        if inner.file.read_exact_at(&mut bytes, offset).is_err() {
            inner.budget += size;
            return false;
        }
        inner.tables.push((offset, bytes));
        true
    }

    /// Bytes left of the budget.
    pub fn budget_left(&self) -> u64 {
        self.inner.borrow().budget
    }
}

impl Inner {
    /// Takes `size` bytes of the budget for a read of `range`, or refuses it before any
    /// allocation.
    fn charge(&mut self, range: &Range<u64>, size: u64) -> Result<usize, ()> {
        if range.start > range.end || range.end > self.len || size > self.budget {
            return Err(());
        }
        self.budget -= size;
        usize::try_from(size).map_err(|_| ())
    }
}

impl<'a> ReadRef<'a> for &'a ElfFile {
    fn len(self) -> Result<u64, ()> {
        Ok(self.inner.borrow().len)
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        if size == 0 {
            return Ok(&[]);
        }
        let inner = &mut *self.inner.borrow_mut();
        let buf: &[u8] = match inner.bufs.get(&(offset, size)) {
            Some(b) => b,
            None => {
                let end = offset.checked_add(size).ok_or(())?;
                let n = inner.charge(&(offset..end), size)?;
                let mut bytes = vec![0u8; n].into_boxed_slice();
                inner
                    .file
                    .read_exact_at(&mut bytes, offset)
                    .map_err(|_| ())?;
                inner.bufs.entry((offset, size)).or_insert(bytes)
            }
        };
        // SAFETY: the boxed slice is never mutated, moved out or removed while `self`
        // lives (entries are only ever added), so its bytes live as long as `'a`; the
        // same argument as object's own `ReadCache`.
        Ok(unsafe { std::mem::transmute::<&[u8], &'a [u8]>(buf) })
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        let inner = &mut *self.inner.borrow_mut();
        if let Some((at, table)) = inner
            .tables
            .iter()
            .find(|(at, t)| *at <= range.start && range.start < at + t.len() as u64)
        {
            let from = (range.start - at) as usize;
            let end = range.end.min(at + table.len() as u64).saturating_sub(*at) as usize;
            // Names are short: at most 4 KiB is looked at, as below.
            let bytes = table.get(from..end.min(from + 4096)).ok_or(())?;
            // Never more than what is left of the scan budget.
            let bytes = &bytes[..bytes.len().min(inner.scan as usize)];
            let found = memchr::memchr(delimiter, bytes);
            let looked = found.map_or(bytes.len(), |n| n + 1) as u64;
            #[cfg(test)]
            {
                inner.looked += looked;
            }
            inner.scan -= looked;
            let len = found.ok_or(())?;
            // SAFETY: as below: the table's box is never removed or moved while `self`
            // lives.
            return Ok(unsafe { std::mem::transmute::<&[u8], &'a [u8]>(&bytes[..len]) });
        }
        let buf: &[u8] = match inner.strings.get(&(range.start, delimiter)) {
            Some(b) => b,
            None => {
                // Names are short: at most 4 KiB is looked at, as object's ReadCache does.
                let end = range.end.min(range.start.saturating_add(4096));
                // A range the file's tables make end before it starts is refused (a
                // release build wrapped it to a size the budget refused; a checked one
                // panicked: found by the elf_file fuzz target).
                let size = end.checked_sub(range.start).ok_or(())?;
                let n = inner.charge(&(range.start..end), size)?;
                let mut bytes = vec![0u8; n];
                let got = inner
                    .file
                    .read_at(&mut bytes, range.start)
                    .map_err(|_| ())?;
                let got = got.min(inner.scan as usize);
                let found = memchr::memchr(delimiter, &bytes[..got]);
                let looked = found.map_or(got, |n| n + 1) as u64;
                #[cfg(test)]
                {
                    inner.looked += looked;
                }
                inner.scan -= looked;
                let len = found.ok_or(())?;
                bytes.truncate(len);
                // What was not kept goes back to the budget.
                inner.budget += (n - len) as u64;
                inner
                    .strings
                    .entry((range.start, delimiter))
                    .or_insert(bytes.into_boxed_slice())
            }
        };
        // SAFETY: as in `read_bytes_at`.
        Ok(unsafe { std::mem::transmute::<&[u8], &'a [u8]>(buf) })
    }
}

/// A section's bytes, decompressed, or None when its size in the file or its declared
/// uncompressed size is over `cap` (checked before anything is read), or when it inflates
/// to more than it declared. Inflated here, not by `object`'s `decompress()`, which
/// reads a zstd stream to its end whatever size was declared (a 32 KiB frame of RLE
/// blocks declaring 4 KiB inflated to 1 GiB and OOM-killed the agent).
pub fn section_data<'a, S: ObjectSection<'a>>(s: &S, cap: u64) -> Option<Cow<'a, [u8]>> {
    use object::CompressionFormat;
    if s.kind() == SectionKind::UninitializedData {
        return None;
    }
    let range = s.compressed_file_range().ok()?;
    if range.uncompressed_size > cap || range.compressed_size > cap {
        return None;
    }
    let c = s.compressed_data().ok()?;
    let size = usize::try_from(c.uncompressed_size).ok()?;
    match c.format {
        CompressionFormat::None => Some(Cow::Borrowed(c.data)),
        CompressionFormat::Zlib => {
            // decompress_vec never writes past the capacity it is given.
            let mut out = Vec::with_capacity(size);
            let mut z = flate2::Decompress::new(true);
            let status = z
                .decompress_vec(c.data, &mut out, flate2::FlushDecompress::Finish)
                .ok()?;
            (status == flate2::Status::StreamEnd && out.len() == size).then_some(Cow::Owned(out))
        }
        CompressionFormat::Zstandard => {
            // Into a buffer of the declared size, never grown, 64 KiB a read (the
            // decoder buffers all one read asks for: a read of the whole section doubled
            // the peak, found by reader::adversarial); one byte more than declared
            // refuses the section.
            let mut out = vec![0u8; size];
            let mut filled = 0;
            let mut input = c.data;
            while !input.is_empty() {
                let mut decoder = ruzstd::decoding::StreamingDecoder::new(&mut input).ok()?;
                loop {
                    if filled == size {
                        let mut one = [0u8; 1];
                        if std::io::Read::read(&mut decoder, &mut one).ok()? > 0 {
                            return None;
                        }
                        break;
                    }
                    // In small reads: the decoder buffers what one read asks for.
                    let end = size.min(filled + (64 << 10));
                    match std::io::Read::read(&mut decoder, &mut out[filled..end]).ok()? {
                        0 => break,
                        n => filled += n,
                    }
                }
            }
            (filled == size).then_some(Cow::Owned(out))
        }
        _ => None,
    }
}

/// The first file of `pid`'s maps whose name `is_lib` accepts, opened inside its root,
/// and the file offsets of the symbols named `want` (`matches(name, wanted)`), one per
/// entry, in order (None if one is missing): what a uprobe is attached at, through
/// `/proc/self/fd/N` of the open file, so neither the path nor the ELF parse leaves the
/// process's root or the bounds. The maps and the symbols are parsed by the reader
/// process (`crate::reader`); this waits for them up to `within`.
pub fn mapped_symbol_offsets(
    pid: u32,
    is_lib: impl Fn(&str) -> bool,
    want: &[&str],
    matches: fn(&str, &str) -> bool,
    within: std::time::Duration,
) -> Option<(File, Vec<u64>)> {
    let loader = crate::reader::loader();
    let maps = loader.maps(pid, within)?;
    let path = maps
        .iter()
        .map(|m| &m.path)
        .find(|p| is_lib(p.rsplit('/').next().unwrap_or("")))?;
    let file = crate::procfs::open_regular_in_root(pid, path)?;
    let symbols = loader.symbols(pid, path, within).ok()?;
    let offsets = want
        .iter()
        .map(|w| symbols.offset_of(|n| matches(n, w)))
        .collect::<Option<Vec<u64>>>()?;
    Some((file, offsets))
}

/// Where a file's loadable segments sit: (file offset, virtual address, file size).
pub fn loads<'a>(elf: &object::File<'a, &'a ElfFile>) -> Vec<(u64, u64, u64)> {
    elf.segments()
        .map(|s| {
            let (off, size) = s.file_range();
            (off, s.address(), size)
        })
        .collect()
}

/// One function of a symbol table.
#[derive(Clone, Copy, Debug)]
struct Func {
    start: u64,
    end: u64,
    /// Where its name is in `Symbols::names`.
    name: (u32, u32),
}

/// The function symbols of one file (`.symtab` and `.dynsym`), and its PLT ranges.
pub struct Symbols {
    funcs: Vec<Func>,
    /// Functions at an address another one names first.
    aliases: Vec<Func>,
    names: String,
    loads: Vec<(u64, u64, u64)>,
    /// Virtual address ranges of the PLT sections (`.plt`, `.plt.sec`, `.plt.got`): stubs
    /// with no symbol of their own, which the nearest sizeless symbol below them
    /// (`_init`) would otherwise name (9 % of a CPython profile's leaves read so).
    plt: Vec<Range<u64>>,
    /// The GNU build ID (`.note.gnu.build-id`), lowercase hex: what symbol servers and
    /// pprof's mappings identify a binary by.
    pub build_id: Option<String>,
}

/// The most bytes of a build ID kept (GNU's are 20: SHA-1; a longer note is a workload's
/// own choice).
const MAX_BUILD_ID: usize = 64;

impl Symbols {
    /// Reads the symbols of an open file; None if it is not an ELF file or breaks a bound.
    pub fn read(file: &ElfFile) -> Option<Self> {
        let elf = object::File::parse(file).ok()?;
        // The names' tables read whole, up to a section's bound each.
        for name in [".strtab", ".dynstr"] {
            if let Some(s) = elf.section_by_name(name)
                && let Some((off, size)) = s.file_range()
                && size <= MAX_SECTION
            {
                file.preload(off, size);
            }
        }
        let mut sections: HashMap<usize, Range<u64>> = HashMap::new();
        let mut plt = Vec::new();
        for s in elf.sections() {
            let r = s.address()..s.address().saturating_add(s.size());
            if matches!(s.name(), Ok(".plt" | ".plt.sec" | ".plt.got")) {
                plt.push(r.clone());
            }
            if s.kind() == SectionKind::Text {
                sections.insert(s.index().0, r);
            }
        }
        let mut funcs = Vec::new();
        // At most the names' tables' size, bounded: no doubling past what is needed.
        let table_bytes: u64 = [".strtab", ".dynstr"]
            .iter()
            .filter_map(|n| elf.section_by_name(n)?.file_range())
            .map(|(_, size)| size)
            .sum();
        let mut names = String::with_capacity(table_bytes.min(MAX_NAME_BYTES as u64) as usize);
        // Where each distinct name (by where the file's string table holds it: `ElfFile`
        // hands out one buffer per string) already is in `names`.
        let mut placed: HashMap<(usize, usize), (u32, u32)> = HashMap::new();
        for sym in elf.symbols().chain(elf.dynamic_symbols()) {
            let Some(section) = sym.section_index().and_then(|i| sections.get(&i.0)) else {
                continue;
            };
            let text = sym.kind() == object::SymbolKind::Text;
            if !(text || sym.kind() == object::SymbolKind::Unknown) || sym.address() == 0 {
                continue;
            }
            let Ok(name) = sym.name() else { continue };
            if name.is_empty() || funcs.len() >= MAX_SYMBOLS {
                continue;
            }
            let start = sym.address();
            // A sizeless symbol (hand-written assembly) reaches the next symbol, or its
            // section's end: set below, once sorted.
            let end = if sym.size() > 0 {
                start.saturating_add(sym.size())
            } else {
                section.end
            };
            let key = (name.as_ptr() as usize, name.len());
            let name = match placed.get(&key) {
                Some(&n) => n,
                None => {
                    if names.len() + name.len() > MAX_NAME_BYTES {
                        continue;
                    }
                    let n = (
                        u32::try_from(names.len()).ok()?,
                        u32::try_from(name.len()).ok()?,
                    );
                    names.push_str(name);
                    placed.insert(key, n);
                    n
                }
            };
            funcs.push(Func { start, end, name });
        }
        // Sized symbols before sizeless ones at one address (aliases: the first is kept).
        funcs.sort_by_key(|f| (f.start, std::cmp::Reverse(f.end)));
        // The other names at one address are kept apart, for `offset_of` only (glibc's
        // `malloc` is `__libc_malloc`'s alias, and a uprobe is found by either).
        let mut aliases = Vec::new();
        let mut kept: Vec<Func> = Vec::with_capacity(funcs.len());
        for f in funcs {
            match kept.last() {
                Some(k) if k.start == f.start => aliases.push(f),
                _ => kept.push(f),
            }
        }
        let mut funcs = kept;
        for i in 0..funcs.len().saturating_sub(1) {
            let next = funcs[i + 1].start;
            if funcs[i].end > next {
                // Overlapping or sizeless: it cannot reach into the next function.
                funcs[i].end = funcs[i].end.min(next).max(funcs[i].start + 1);
            }
        }
        funcs.shrink_to_fit();
        names.shrink_to_fit();
        let build_id = elf
            .build_id()
            .ok()
            .flatten()
            .filter(|id| !id.is_empty() && id.len() <= MAX_BUILD_ID)
            .map(|id| id.iter().map(|b| format!("{b:02x}")).collect());
        aliases.shrink_to_fit();
        Some(Self {
            funcs,
            aliases,
            names,
            loads: loads(&elf),
            plt,
            build_id,
        })
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        (self.funcs.len() + self.aliases.len()) * std::mem::size_of::<Func>() + self.names.len()
    }

    /// The virtual address (as the file states it) at file offset `offset`.
    pub fn address_of(&self, offset: u64) -> Option<u64> {
        self.loads
            .iter()
            .find(|&&(o, _, size)| o <= offset && offset < o.saturating_add(size))
            .map(|&(o, vaddr, _)| vaddr.wrapping_add(offset - o))
    }

    /// The demangled name of the function at file offset `offset`, None outside every
    /// function or in a PLT stub.
    pub fn name_at(&self, offset: u64) -> Option<String> {
        let addr = self.address_of(offset)?;
        if self.plt.iter().any(|r| r.contains(&addr)) {
            return None;
        }
        let i = self
            .funcs
            .partition_point(|f| f.start <= addr)
            .checked_sub(1)?;
        let f = self.funcs[i];
        if addr >= f.end {
            return None;
        }
        let (at, len) = (f.name.0 as usize, f.name.1 as usize);
        Some(demangle(self.names.get(at..at + len)?))
    }
}

impl Symbols {
    /// The file offset of the first function whose (mangled) name `matches`.
    pub fn offset_of(&self, matches: impl Fn(&str) -> bool) -> Option<u64> {
        let f = self.funcs.iter().chain(&self.aliases).find(|f| {
            let (at, len) = (f.name.0 as usize, f.name.1 as usize);
            self.names.get(at..at + len).is_some_and(&matches)
        })?;
        self.loads
            .iter()
            .find(|&&(_, vaddr, size)| vaddr <= f.start && f.start < vaddr.saturating_add(size))
            .map(|&(off, vaddr, _)| f.start - vaddr + off)
    }

    /// The exact size of [`Self::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        8 + (self.funcs.len() + self.aliases.len()) * 24
            + 4
            + self.names.len()
            + 4
            + self.loads.len() * 24
            + 4
            + self.plt.len() * 16
            + 4
            + self.build_id.as_ref().map_or(0, String::len)
    }

    pub fn encode(&self, e: &mut Enc) {
        e.0.reserve_exact(self.encoded_len());
        for list in [&self.funcs, &self.aliases] {
            e.u32(list.len() as u32);
            for f in list {
                e.u64(f.start).u64(f.end).u32(f.name.0).u32(f.name.1);
            }
        }
        e.bytes(self.names.as_bytes());
        e.u32(self.loads.len() as u32);
        for &(o, v, s) in &self.loads {
            e.u64(o).u64(v).u64(s);
        }
        e.u32(self.plt.len() as u32);
        for r in &self.plt {
            e.u64(r.start).u64(r.end);
        }
        e.bytes(self.build_id.as_deref().unwrap_or("").as_bytes());
    }

    /// Decoded and checked: sorted functions whose names lie in `names` at char
    /// boundaries, at most `MAX_SYMBOLS` of them and `MAX_NAME_BYTES` of names.
    pub fn decode(d: &mut Dec<'_>) -> Result<Self, Malformed> {
        let n = d.count(24)?;
        if n > MAX_SYMBOLS {
            return Err(Malformed);
        }
        let mut funcs = Vec::with_capacity(n);
        for _ in 0..n {
            let f = Func {
                start: d.u64()?,
                end: d.u64()?,
                name: (d.u32()?, d.u32()?),
            };
            if funcs.last().is_some_and(|l: &Func| l.start >= f.start) || f.end <= f.start {
                return Err(Malformed);
            }
            funcs.push(f);
        }
        let n = d.count(24)?;
        if n > MAX_SYMBOLS {
            return Err(Malformed);
        }
        let mut aliases = Vec::with_capacity(n);
        for _ in 0..n {
            aliases.push(Func {
                start: d.u64()?,
                end: d.u64()?,
                name: (d.u32()?, d.u32()?),
            });
        }
        let names = d.bytes()?;
        if names.len() > MAX_NAME_BYTES {
            return Err(Malformed);
        }
        let names = std::str::from_utf8(names)
            .map_err(|_| Malformed)?
            .to_owned();
        if funcs.iter().chain(&aliases).any(|f| {
            let (at, len) = (f.name.0 as usize, f.name.1 as usize);
            names.get(at..at + len).is_none()
        }) {
            return Err(Malformed);
        }
        let n = d.count(24)?;
        let mut loads = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            loads.push((d.u64()?, d.u64()?, d.u64()?));
        }
        let n = d.count(16)?;
        let mut plt = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            plt.push(d.u64()?..d.u64()?);
        }
        let id = d.bytes()?;
        if id.len() > MAX_BUILD_ID * 2 || !id.iter().all(u8::is_ascii_hexdigit) {
            return Err(Malformed);
        }
        let build_id = (!id.is_empty()).then(|| String::from_utf8_lossy(id).into_owned());
        Ok(Self {
            funcs,
            aliases,
            names,
            loads,
            plt,
            build_id,
        })
    }
}

/// A Rust or C++ symbol demangled (Rust's without its hash), as blazesym did; other names
/// as they are.
pub fn demangle(name: &str) -> String {
    if name.len() > MAX_DEMANGLE {
        return name.to_owned();
    }
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return format!("{d:#}");
    }
    if name.starts_with("_Z")
        && let Ok(sym) = cpp_demangle::Symbol::new(name)
        && let Ok(d) = sym.demangle()
    {
        return d;
    }
    name.to_owned()
}

/// Crafted ELF files for tests and fuzz seeds: a header, the sections given (name,
/// type, flags, the bytes in the file, and the size declared, which may be far larger),
/// their headers at the end.
#[cfg(test)]
pub(crate) fn crafted(sections: &[(&str, u32, u64, &[u8], u64)]) -> Vec<u8> {
    let linked: Vec<_> = sections
        .iter()
        .map(|&(n, t, f, b, s)| (n, t, f, b, s, 0u32, 0u64))
        .collect();
    crafted_linked(&linked)
}

/// A crafted section: name, type, flags, the bytes in the file, the size declared,
/// `sh_link` and `sh_entsize`.
#[cfg(test)]
pub(crate) type CraftedSection<'a> = (&'a str, u32, u64, &'a [u8], u64, u32, u64);

/// As [`crafted`], each section also with its `sh_link` and `sh_entsize`.
#[cfg(test)]
pub(crate) fn crafted_linked(sections: &[CraftedSection<'_>]) -> Vec<u8> {
    let mut names = vec![0u8];
    let mut name_at = Vec::new();
    for (n, ..) in sections
        .iter()
        .chain([&(".shstrtab", 3, 0, &[][..], 0, 0, 0)])
    {
        name_at.push(names.len() as u32);
        names.extend_from_slice(n.as_bytes());
        names.push(0);
    }
    let mut out = vec![0u8; 64];
    let mut placed = Vec::new();
    for (_, _, _, bytes, ..) in sections {
        placed.push(out.len() as u64);
        out.extend_from_slice(bytes);
    }
    let names_at = out.len() as u64;
    out.extend_from_slice(&names);
    while !out.len().is_multiple_of(8) {
        out.push(0);
    }
    let shoff = out.len() as u64;
    out.extend_from_slice(&[0u8; 64]);
    let mut sh = |name: u32, ty: u32, flags: u64, off: u64, size: u64, link: u32, ent: u64| {
        out.extend_from_slice(&name.to_le_bytes());
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&0x1000u64.to_le_bytes()); // sh_addr
        out.extend_from_slice(&off.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&link.to_le_bytes());
        out.extend_from_slice(&[0u8; 4]); // info
        out.extend_from_slice(&1u64.to_le_bytes()); // addralign
        out.extend_from_slice(&ent.to_le_bytes());
    };
    for (i, (_, ty, flags, _, size, link, ent)) in sections.iter().enumerate() {
        sh(name_at[i], *ty, *flags, placed[i], *size, *link, *ent);
    }
    sh(
        name_at[sections.len()],
        3,
        0,
        names_at,
        names.len() as u64,
        0,
        0,
    );
    let mut h = Vec::new();
    h.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    h.extend_from_slice(&3u16.to_le_bytes()); // ET_DYN
    h.extend_from_slice(&62u16.to_le_bytes()); // x86-64
    h.extend_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&0u64.to_le_bytes()); // entry
    h.extend_from_slice(&0u64.to_le_bytes()); // phoff
    h.extend_from_slice(&shoff.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    for v in [
        64u16,
        56,
        0,
        64,
        sections.len() as u16 + 2,
        sections.len() as u16 + 1,
    ] {
        h.extend_from_slice(&v.to_le_bytes());
    }
    out[..64].copy_from_slice(&h);
    out
}

/// The zlib compression header of a compressed section (ELF64 `Elf64_Chdr`) declaring
/// `size` bytes once inflated, then `stream`.
#[cfg(test)]
pub(crate) fn compressed(size: u64, stream: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&1u32.to_le_bytes()); // ELFCOMPRESS_ZLIB
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&size.to_le_bytes());
    v.extend_from_slice(&1u64.to_le_bytes());
    v.extend_from_slice(stream);
    v
}

/// As [`compressed`], for zstd (`ELFCOMPRESS_ZSTD`).
#[cfg(test)]
pub(crate) fn compressed_zstd(size: u64, stream: &[u8]) -> Vec<u8> {
    let mut v = compressed(size, stream);
    v[..4].copy_from_slice(&2u32.to_le_bytes());
    v
}

/// A zstd frame of RLE blocks that inflates to `size` bytes (a multiple of 128 KiB)
/// from 4 bytes per 128 KiB: 1 GiB from 32 KiB.
#[cfg(test)]
pub(crate) fn zstd_rle_bomb(size: u64) -> Vec<u8> {
    let block: u32 = 128 << 10;
    let n = size / u64::from(block);
    // Magic, a descriptor without content size, a 128 KiB window.
    let mut v = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x38];
    for i in 0..n {
        let last = u32::from(i + 1 == n);
        let head = (block << 3) | (1 << 1) | last;
        v.extend_from_slice(&head.to_le_bytes()[..3]);
        v.push(0);
    }
    v
}

/// An ELF file whose `.symtab` holds `count` functions all named by one string of
/// `name_len` bytes (2^20 such symbols once cost 4 GiB).
#[cfg(test)]
pub(crate) fn symbol_name_bomb(count: usize, name_len: usize) -> Vec<u8> {
    let mut strtab = vec![0u8];
    strtab.extend(std::iter::repeat_n(b'f', name_len));
    strtab.push(0);
    let mut symtab = vec![0u8; 24];
    for i in 0..count as u64 {
        symtab.extend_from_slice(&1u32.to_le_bytes()); // st_name
        symtab.push(0x12); // global function
        symtab.push(0);
        symtab.extend_from_slice(&1u16.to_le_bytes()); // .text
        symtab.extend_from_slice(&(0x1000 + i * 16).to_le_bytes());
        symtab.extend_from_slice(&16u64.to_le_bytes());
    }
    let text_size = count as u64 * 16 + 16;
    crafted_linked(&[
        (".text", 1, 6, &[0xc3; 16], text_size, 0, 0),
        (".symtab", 2, 0, &symtab, symtab.len() as u64, 3, 24),
        (".strtab", 3, 0, &strtab, strtab.len() as u64, 0, 0),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Compressed sections that lie about their size are refused, whatever the format,
    /// before they cost more than they declared: a zstd frame declaring 4 KiB that
    /// inflates to 1 GiB, the same for zlib, and a stream shorter than declared.
    #[test]
    fn compressed_sections_cost_at_most_what_they_declare() {
        let zstd = zstd_rle_bomb(1 << 30);
        assert!(zstd.len() <= 33 << 10);
        // It is a real bomb: a decoder gives as much as it is let.
        let mut input = &zstd[..];
        let d = ruzstd::decoding::StreamingDecoder::new(&mut input).expect("a zstd frame");
        let n = std::io::copy(&mut std::io::Read::take(d, 8 << 20), &mut std::io::sink())
            .expect("inflated");
        assert_eq!(n, 8 << 20);
        let zlib = {
            let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
            z.write_all(&vec![0u8; 8 << 20]).expect("deflate");
            z.finish().expect("deflate")
        };
        let honest = {
            let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
            z.write_all(&[7u8; 5000]).expect("deflate");
            z.finish().expect("deflate")
        };
        let section = |bytes: Vec<u8>| {
            let file = crafted(&[(".debug_frame", 1, 0x800, &bytes, bytes.len() as u64)]);
            let (path, f) = temp(&format!("c{}", bytes.len()), &file);
            let elf = ElfFile::new(f, FILE_BUDGET).expect("regular");
            let parsed = object::File::parse(&elf).expect("elf");
            let s = parsed.section_by_name(".debug_frame").expect("section");
            let out = section_data(&s, MAX_SECTION).map(|d| d.len());
            let _ = std::fs::remove_file(path);
            out
        };
        let before = crate::procfs::peak_rss_bytes(std::process::id()).expect("VmHWM");
        assert_eq!(section(compressed_zstd(4096, &zstd)), None);
        assert_eq!(section(compressed(4096, &zlib)), None);
        assert_eq!(section(compressed(9000, &honest)), None);
        assert_eq!(section(compressed(5000, &honest)), Some(5000));
        let grown = crate::procfs::peak_rss_bytes(std::process::id())
            .expect("VmHWM")
            .saturating_sub(before);
        assert!(grown < 16 << 20, "peak grew by {grown} bytes");
    }

    /// One name shared by many symbols is kept once.
    #[test]
    fn a_name_shared_by_many_symbols_is_kept_once() {
        let (path, f) = temp("names", &symbol_name_bomb(20_000, 4000));
        let elf = ElfFile::new(f, FILE_BUDGET).expect("regular");
        let syms = Symbols::read(&elf).expect("symbols");
        assert_eq!(syms.funcs.len(), 20_000);
        assert!(syms.names.len() == 4000, "{}", syms.names.len());
        let _ = std::fs::remove_file(path);
    }

    /// 2^20 symbols naming one string just under the 4 KiB looked at (hostile.c's name
    /// bomb): the ends of their names are looked for through at most the scan budget, not
    /// the 4 GiB it once took (seconds past the reader's deadline), and the names read
    /// before it ran out are kept.
    #[test]
    fn a_name_bomb_is_looked_through_within_the_scan_budget() {
        let (path, f) = temp("scan", &symbol_name_bomb(1 << 20, 4000));
        let elf = ElfFile::new(f, FILE_BUDGET).expect("regular");
        let syms = Symbols::read(&elf).expect("symbols");
        let looked = elf.inner.borrow().looked;
        assert!(
            looked <= SCAN_BUDGET + 4096,
            "looked through {looked} bytes"
        );
        assert!(
            looked >= SCAN_BUDGET - 4096,
            "the budget ran out: {looked} bytes"
        );
        let named = (SCAN_BUDGET / 4001) as usize;
        assert!(
            syms.funcs.len() >= named - 1 && syms.funcs.len() <= named + 1,
            "{} functions named",
            syms.funcs.len()
        );
        let _ = std::fs::remove_file(path);
    }

    fn temp(name: &str, bytes: &[u8]) -> (std::path::PathBuf, File) {
        let dir = std::env::temp_dir().join(format!("rw-elf-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let mut f = File::create(&dir).expect("create");
        f.write_all(bytes).expect("write");
        (dir.clone(), File::open(&dir).expect("open"))
    }

    #[test]
    fn reads_past_the_file_or_the_budget_are_refused_before_allocating() {
        let (path, file) = temp("small", &[7u8; 100]);
        let elf = ElfFile::new(file, 64).expect("a regular file");
        let r = &elf;
        assert_eq!(r.read_bytes_at(0, 10), Ok(&[7u8; 10][..]));
        // Inside the file, but past what is left of the budget.
        assert!(r.read_bytes_at(10, 60).is_err());
        // Past the file's end, and a size that would wrap.
        assert!(r.read_bytes_at(90, 20).is_err());
        assert!(r.read_bytes_at(u64::MAX - 1, 4).is_err());
        assert!(r.read_bytes_at(0, u64::MAX).is_err());
        // A cached read costs nothing again.
        assert_eq!(r.read_bytes_at(0, 10), Ok(&[7u8; 10][..]));
        assert_eq!(elf.budget_left(), 54);
        // A string whose range ends before it starts (as a hostile file's tables make it).
        let (start, end) = (50, 20);
        assert!(r.read_bytes_at_until(start..end, 0).is_err());
        assert_eq!(elf.budget_left(), 54);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_sparse_file_declaring_a_huge_section_costs_its_budget_at_most() {
        // A 1 GiB sparse file: reading all of it would take 1 GiB of memory.
        let (path, _) = temp("sparse", b"\x7fELF");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(1 << 30))
            .expect("set_len");
        let file = File::open(&path).expect("open");
        let elf = ElfFile::new(file, FILE_BUDGET).expect("regular");
        assert!((&elf).read_bytes_at(0, 1 << 30).is_err());
        assert_eq!(elf.budget_left(), FILE_BUDGET);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn directories_and_fifos_are_not_opened_as_elf_files() {
        let me = std::process::id();
        assert!(ElfFile::open(me, "/proc").is_none());
        let fifo = std::env::temp_dir().join(format!("rw-elf-fifo-{me}"));
        let _ = std::fs::remove_file(&fifo);
        let c = std::ffi::CString::new(fifo.to_string_lossy().as_bytes()).expect("path");
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Would block forever if it were opened for reading without O_NONBLOCK.
        assert!(ElfFile::open(me, &fifo.to_string_lossy()).is_none());
        let _ = std::fs::remove_file(fifo);
    }

    #[inline(never)]
    fn a_named_function_here() -> u64 {
        std::hint::black_box(7)
    }

    #[test]
    fn this_test_binary_names_its_own_functions() {
        let exe = std::env::current_exe().expect("exe");
        let elf = ElfFile::open(std::process::id(), &exe.to_string_lossy()).expect("open");
        let syms = Symbols::read(&elf).expect("symbols");
        // Its address in this process to its file offset, through /proc/self/maps.
        let addr = a_named_function_here as *const () as u64 + 1;
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let offset = maps
            .lines()
            .filter_map(super::super::maps::Mapping::parse)
            .find(|m| m.range.contains(&addr))
            .map(|m| addr - m.range.start + m.offset)
            .expect("mapped");
        let name = syms.name_at(offset).expect("named");
        assert!(name.contains("a_named_function_here"), "{name}");
        assert!(!name.contains("::h"), "demangled without its hash: {name}");
        assert!(syms.bytes() > 0);
    }

    #[test]
    fn names_are_demangled_as_blazesym_did() {
        assert_eq!(
            demangle("_ZN11AllocTracer27send_allocation_in_new_tlabEP5KlassP8HeapWordmmP6Thread"),
            "AllocTracer::send_allocation_in_new_tlab(Klass*, HeapWord*, unsigned long, unsigned long, Thread*)"
        );
        assert_eq!(
            demangle("_ZN3std2rt10lang_start17h0123456789abcdefE"),
            "std::rt::lang_start"
        );
        assert_eq!(demangle("burn_here"), "burn_here");
        assert_eq!(demangle(&"_Z".repeat(5000)), "_Z".repeat(5000));
    }
}
