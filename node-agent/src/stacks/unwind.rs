//! Unwinding copied user stacks with the binaries' own tables (`.eh_frame`, or Go's
//! `.debug_frame`), for code built without frame pointers.
//!
//! The kernel sends, per stack sample, the user registers and the top `STACK_COPY` bytes
//! of the user stack (ebpf/src/stacks.bpf.h); this walks them. Where the copy ends before
//! the stack does, the walk is continued with the kernel's frame-pointer walk of the same
//! sample, from the first frame both have.
//!
//! The tables are workload-chosen files, so they are never parsed here: the reader
//! process (`crate::reader`) turns a file's DWARF CFI into [`Tables`], one [`Rule`] per
//! address range (what production profilers call stack deltas), checked as they are
//! decoded; this side only binary-searches them. The rules and their execution are
//! framehop's x86-64 ones (samply's unwinder, used here before the reader): its
//! translation from CFI rows and its rule executor are not public, and its module index
//! parses the sections in the caller's process, so both are written out below, with the
//! same semantics (an address with no rule, or with one framehop would evaluate
//! generically, is walked by its frame pointer, as framehop's fallback does).
//!
//! Nothing here waits for the reader: a process's tables are asked for when it is first
//! walked, and its samples are held (a bounded while) until they are ready; a walk uses
//! what is ready. Bounded: the tables of at most `MAX_TABLE_BYTES` of files are kept
//! (cleared whole when a new file would pass it), shared by every process that maps the
//! same file (keyed by the identity of the file opened in the process's root); at most
//! `MAX_PROCESSES` processes' module lists, asked again at most every `MAPS_EVERY` when a
//! walk meets an address outside them.

use std::{
    collections::{HashMap, VecDeque},
    ops::Range,
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use crate::reader::wire::{Dec, Enc, Malformed};

/// Rule bytes kept for all files together.
pub const MAX_TABLE_BYTES: usize = 16 << 20;
/// The most rules kept of one file (16 bytes each): libjvm.so has about 170,000.
pub const MAX_RULES: usize = 1 << 19;
/// Processes whose module lists are kept.
pub const MAX_PROCESSES: usize = 256;
/// How soon a process's mappings are asked for again.
const MAPS_EVERY: Duration = Duration::from_secs(2);
/// Frames kept per walk, as the kernel's frame-pointer walk keeps.
const MAX_FRAMES: usize = resourcewatch_ebpf::shared::STACK_DEPTH;

/// How one frame is stepped to its caller (framehop's `UnwindRuleX86_64`, the cases the
/// CFI of real binaries gives). The return address is always at the new stack pointer
/// less 8.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// No row covers the address, or its row is one framehop evaluates generically: the
    /// frame pointer is followed, as framehop's fallback does.
    Fallback,
    /// The return address is undefined: the root of the stack.
    EndOfStack,
    /// (sp, bp) = (sp + 8x, bp)
    OffsetSp { sp_by8: u16 },
    /// (sp, bp) = (sp + 8x, *(sp + 8y))
    OffsetSpAndRestoreBp { sp_by8: u16, bp_by8: i16 },
    /// (sp, bp) = (bp + 16, *bp)
    UseFramePointer,
}

impl Rule {
    fn pack(self) -> u64 {
        match self {
            Rule::Fallback => 0,
            Rule::EndOfStack => 1,
            Rule::OffsetSp { sp_by8 } => 2 | (u64::from(sp_by8) << 8),
            Rule::OffsetSpAndRestoreBp { sp_by8, bp_by8 } => {
                3 | (u64::from(sp_by8) << 8) | (u64::from(bp_by8 as u16) << 24)
            }
            Rule::UseFramePointer => 4,
        }
    }

    fn unpack(v: u64) -> Result<Self, Malformed> {
        let a = (v >> 8) as u16;
        let b = (v >> 24) as u16 as i16;
        Ok(match v & 0xff {
            0 => Rule::Fallback,
            1 => Rule::EndOfStack,
            2 => Rule::OffsetSp { sp_by8: a },
            3 => Rule::OffsetSpAndRestoreBp {
                sp_by8: a,
                bp_by8: b,
            },
            4 => Rule::UseFramePointer,
            _ => return Err(Malformed),
        })
    }

    /// Steps `regs` to the caller's frame: the return address, None at the root, Err
    /// when the stack cannot be read or the step goes nowhere (framehop's `exec`).
    fn exec(
        self,
        first: bool,
        regs: &mut Regs,
        read: &mut impl FnMut(u64) -> Result<u64, ()>,
    ) -> Result<Option<u64>, ()> {
        let sp = regs.sp;
        let (new_sp, new_bp) = match self {
            Rule::EndOfStack => return Ok(None),
            Rule::OffsetSp { sp_by8 } => {
                (sp.checked_add(u64::from(sp_by8) * 8).ok_or(())?, regs.bp)
            }
            Rule::OffsetSpAndRestoreBp { sp_by8, bp_by8 } => {
                let new_sp = sp.checked_add(u64::from(sp_by8) * 8).ok_or(())?;
                let at = sp.checked_add_signed(i64::from(bp_by8) * 8).ok_or(())?;
                let bp = match read(at) {
                    Ok(v) => v,
                    // Epilogues pop registers whose rows still say "saved below sp": the
                    // copy starts at sp, so the caller's bp is the one in the register.
                    Err(()) if first && at < sp => regs.bp,
                    Err(()) => return Err(()),
                };
                (new_sp, bp)
            }
            Rule::Fallback | Rule::UseFramePointer => {
                let bp = regs.bp;
                if bp == 0 {
                    return Ok(None);
                }
                let new_sp = bp.checked_add(16).ok_or(())?;
                if new_sp <= sp {
                    return Err(());
                }
                (new_sp, read(bp)?)
            }
        };
        let ra = read(new_sp.checked_sub(8).ok_or(())?)?;
        if ra == 0 {
            return Ok(None);
        }
        if new_sp == sp && ra == regs.ip {
            return Err(());
        }
        *regs = Regs {
            ip: ra,
            sp: new_sp,
            bp: new_bp,
        };
        Ok(Some(ra))
    }
}

/// The registers a walk tracks.
#[derive(Clone, Copy, Debug)]
struct Regs {
    ip: u64,
    sp: u64,
    bp: u64,
}

/// What unwinding needs of one ELF file, as the reader built it: rules by address (as
/// the file states addresses), and where its loadable segments sit in the file (to
/// place a mapping's addresses).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tables {
    /// Sorted; `rules[i]` holds from `starts[i]` to `starts[i + 1]`.
    starts: Vec<u64>,
    rules: Vec<Rule>,
    /// PT_LOAD segments: (file offset, virtual address, file size).
    loads: Vec<(u64, u64, u64)>,
}

/// The most loadable segments read of one file.
const MAX_LOADS: usize = 64;

impl Tables {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.starts.len() * 16 + self.loads.len() * 24 + std::mem::size_of::<Self>()
    }

    /// The rules of an open ELF file, built from its CFI (in the reader). None when it is
    /// not an ELF file; a file without CFI, or whose CFI breaks a bound, gives no rules.
    pub fn from_file(file: &super::elf::ElfFile) -> Option<Self> {
        use object::{Object, ObjectSection};
        let elf = object::File::parse(file).ok()?;
        let loads: Vec<_> = super::elf::loads(&elf)
            .into_iter()
            .take(MAX_LOADS)
            .collect();
        let mut rows = Vec::new();
        let text = elf.section_by_name(".text").map_or(0, |s| s.address());
        let got = elf.section_by_name(".got").map_or(0, |s| s.address());
        // .eh_frame when there is one; Go writes only .debug_frame (compressed).
        if let Some(s) = elf.section_by_name(".eh_frame") {
            if let Some(data) = super::elf::section_data(&s, super::elf::MAX_SECTION) {
                let bases = gimli::BaseAddresses::default()
                    .set_eh_frame(s.address())
                    .set_text(text)
                    .set_got(got);
                let mut section = gimli::EhFrame::new(&data, gimli::LittleEndian);
                section.set_address_size(8);
                cfi_rows(&section, &bases, &mut rows);
            }
        } else if let Some(s) = elf.section_by_name(".debug_frame")
            && let Some(data) = super::elf::section_data(&s, super::elf::MAX_SECTION)
        {
            let bases = gimli::BaseAddresses::default().set_text(text);
            let mut section = gimli::DebugFrame::new(&data, gimli::LittleEndian);
            section.set_address_size(8);
            cfi_rows(&section, &bases, &mut rows);
        }
        Some(Self::from_rows(rows, loads))
    }

    /// Rows (start, rule; `Rule::Fallback` also marks where an entry ends) sorted into
    /// ranges, equal neighbours merged.
    fn from_rows(mut rows: Vec<(u64, Rule)>, loads: Vec<(u64, u64, u64)>) -> Self {
        // A real row before an entry's end at the same address (adjacent entries).
        rows.sort_by_key(|&(start, rule)| (start, rule == Rule::Fallback));
        rows.dedup_by_key(|r| r.0);
        rows.dedup_by_key(|r| r.1);
        let (starts, rules) = rows.into_iter().unzip();
        Self {
            starts,
            rules,
            loads,
        }
    }

    /// The rule at address `svma` of the file.
    fn rule_at(&self, svma: u64) -> Rule {
        match self.starts.partition_point(|&s| s <= svma).checked_sub(1) {
            Some(i) => self.rules[i],
            None => Rule::Fallback,
        }
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
            .filter(|&&(o, _, size)| {
                o / page * page <= offset && offset < o.saturating_add(size.max(1))
            })
            .max_by_key(|&&(o, _, _)| o)?;
        // The mapping's first byte is at this virtual address of the file.
        let svma = p_vaddr.wrapping_add(offset).wrapping_sub(p_off);
        Some(start.wrapping_sub(svma))
    }

    pub fn encode(&self, e: &mut Enc) {
        e.0.reserve_exact(8 + self.loads.len() * 24 + self.starts.len() * 16);
        e.u32(self.loads.len() as u32);
        for &(o, v, s) in &self.loads {
            e.u64(o).u64(v).u64(s);
        }
        e.u32(self.starts.len() as u32);
        for (s, r) in self.starts.iter().zip(&self.rules) {
            e.u64(*s).u64(r.pack());
        }
    }

    /// Decoded and checked: at most `MAX_LOADS` segments and `MAX_RULES` rules, sorted.
    pub fn decode(d: &mut Dec<'_>) -> Result<Self, Malformed> {
        let n = d.count(24)?;
        if n > MAX_LOADS {
            return Err(Malformed);
        }
        let mut loads = Vec::with_capacity(n);
        for _ in 0..n {
            loads.push((d.u64()?, d.u64()?, d.u64()?));
        }
        let n = d.count(16)?;
        if n > MAX_RULES {
            return Err(Malformed);
        }
        let (mut starts, mut rules) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            let s = d.u64()?;
            if starts.last().is_some_and(|&l| l >= s) {
                return Err(Malformed);
            }
            starts.push(s);
            rules.push(Rule::unpack(d.u64()?)?);
        }
        Ok(Self {
            starts,
            rules,
            loads,
        })
    }
}

/// Every row of every entry of a CFI section, as rules, each entry's end marked, at most
/// `MAX_RULES` (past it the rest of the file is walked by frame pointers). An entry that
/// does not parse is skipped.
fn cfi_rows<'a, S>(section: &S, bases: &gimli::BaseAddresses, rows: &mut Vec<(u64, Rule)>)
where
    S: gimli::UnwindSection<gimli::EndianSlice<'a, gimli::LittleEndian>>,
{
    use gimli::CieOrFde;
    let mut ctx = Box::new(gimli::UnwindContext::new());
    let mut entries = section.entries(bases);
    let mut cies = HashMap::new();
    loop {
        let entry = match entries.next() {
            Ok(Some(e)) => e,
            // A section that does not parse past here: what was read is kept.
            Ok(None) | Err(_) => break,
        };
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(|s, b, o| {
            // A CIE shared by many entries is parsed once (a hostile file can point
            // thousands of entries at one large CIE).
            let at: usize = gimli::UnwindOffset::into(o);
            if let Some(c) = cies.get(&at) {
                return Ok(std::clone::Clone::clone(c));
            }
            let c = s.cie_from_offset(b, o)?;
            if cies.len() < 4096 {
                cies.insert(at, c.clone());
            }
            Ok(c)
        }) else {
            continue;
        };
        let Ok(mut table) = fde.rows(section, bases, &mut ctx) else {
            continue;
        };
        loop {
            if rows.len() >= MAX_RULES - 1 {
                return;
            }
            match table.next_row() {
                Ok(Some(row)) => rows.push((row.start_address(), translate(row))),
                Ok(None) | Err(_) => break,
            }
        }
        rows.push((fde.end_address(), Rule::Fallback));
    }
}

/// One CFI row as a rule, as framehop translates it (`x86_64/dwarf.rs`).
fn translate<T: gimli::ReaderOffset, S: gimli::UnwindContextStorage<T>>(
    row: &gimli::UnwindTableRow<T, S>,
) -> Rule {
    use gimli::{CfaRule, RegisterRule, X86_64};
    let saved_at = |r: Option<RegisterRule<T>>| match r {
        None | Some(RegisterRule::Undefined | RegisterRule::SameValue) => Ok(None),
        Some(RegisterRule::Offset(o)) => Ok(Some(o)),
        _ => Err(()),
    };
    match row.register(X86_64::RA) {
        None | Some(RegisterRule::Undefined) => return Rule::EndOfStack,
        Some(RegisterRule::Offset(-8)) => {}
        _ => return Rule::Fallback,
    }
    let Ok(bp) = saved_at(row.register(X86_64::RBP)) else {
        return Rule::Fallback;
    };
    match *row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } if register == X86_64::RSP => {
            let Ok(sp_by8) = u16::try_from(offset / 8) else {
                return Rule::Fallback;
            };
            match bp {
                None => Rule::OffsetSp { sp_by8 },
                Some(b) => match i16::try_from(offset.saturating_add(b) / 8) {
                    Ok(bp_by8) => Rule::OffsetSpAndRestoreBp { sp_by8, bp_by8 },
                    Err(_) => Rule::Fallback,
                },
            }
        }
        CfaRule::RegisterAndOffset { register, offset }
            if register == X86_64::RBP && offset == 16 && bp == Some(-16) =>
        {
            Rule::UseFramePointer
        }
        _ => Rule::Fallback,
    }
}

/// One executable file mapping of a process, with its file's rules when they were read.
struct Module {
    range: Range<u64>,
    /// Where the file's address 0 is in the process.
    base: u64,
    tables: Arc<Tables>,
}

/// A process's modules, as the reader answered.
struct Process {
    modules: Vec<Module>,
    /// Every executable file mapping, tables or not (a plausible code address).
    ranges: Vec<Range<u64>>,
    read_at: Instant,
    /// Return addresses in code outside any file, and the stack bytes their code pops
    /// before `ret` (None: not such a stub).
    stubs: HashMap<u64, Option<u64>>,
}

impl Process {
    fn in_file(&self, addr: u64) -> bool {
        self.ranges.iter().any(|r| r.contains(&addr))
    }

    fn rule_at(&self, lookup: u64) -> Rule {
        self.modules
            .iter()
            .find(|m| m.range.contains(&lookup))
            .map_or(Rule::Fallback, |m| {
                m.tables.rule_at(lookup.wrapping_sub(m.base))
            })
    }

    /// One step through generated code that keeps no frame pointer and has no table, when
    /// the code at the return address `ra` only drops a fixed number of stack bytes and
    /// returns: `add $n, %rsp; ret` or `ret`. CPython's perf trampolines (3.12+, `-X perf`)
    /// are `sub $8, %rsp; call *%rcx; add $8, %rsp; ret`: the Python function each one
    /// stands for is named by the perf map, and the walk goes on into the interpreter
    /// that called it. Five bytes of the process's memory, matched against two fixed
    /// patterns, once per address.
    fn stub_return(
        &mut self,
        pid: u32,
        ra: u64,
        regs: &mut Regs,
        read: &mut impl FnMut(u64) -> Result<u64, ()>,
    ) -> Result<Option<u64>, ()> {
        let pops = *self.stubs.entry(ra).or_insert_with(|| {
            let mut code = [0u8; 5];
            if !crate::procfs::read_process_memory(pid, ra, &mut code) {
                return None;
            }
            match code {
                [0x48, 0x83, 0xc4, n, 0xc3] if n < 0x80 => Some(u64::from(n)),
                [0xc3, ..] => Some(0),
                _ => None,
            }
        });
        let pops = pops.ok_or(())?;
        let next = read(regs.sp + pops)?;
        regs.sp += pops + 8;
        regs.ip = next;
        Ok(Some(next))
    }
}

/// A walk of one sample: frames innermost first (the leaf's address, then return
/// addresses), and whether it reached the stack's root.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Walk {
    pub frames: Vec<u64>,
    pub complete: bool,
}

/// Where a process's tables stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// Asked of the reader, not answered yet.
    Loading,
}

/// What the loader answers for one process: its executable mappings and the tables of
/// the files it could read (`crate::reader::Loader::load_process`).
pub struct Loaded {
    pub pid: u32,
    /// (mapping's range, file offset, the file's tables if read).
    pub modules: Vec<(Range<u64>, u64, Option<Arc<Tables>>)>,
}

/// Unwinds the stack samples of any number of processes with tables the reader built.
pub struct Unwinder {
    /// Ring items waiting for their process's tables (`super::read_samples`).
    pub(crate) held: Held<super::RingItem>,
    procs: HashMap<u32, Process>,
    loading: HashMap<u32, Instant>,
    answers: mpsc::Receiver<Loaded>,
    tx: mpsc::Sender<Loaded>,
    table_bytes: usize,
}

impl Default for Unwinder {
    fn default() -> Self {
        Self::new()
    }
}

/// How long a load may stay unanswered before it is asked again.
const LOAD_AGAIN_AFTER: Duration = Duration::from_secs(10);

impl Unwinder {
    pub fn new() -> Self {
        let (tx, answers) = mpsc::channel();
        Self {
            held: Held::default(),
            procs: HashMap::new(),
            loading: HashMap::new(),
            answers,
            tx,
            table_bytes: 0,
        }
    }

    /// Takes up what the reader answered since the last call (never waits).
    fn take_answers(&mut self) {
        while let Ok(loaded) = self.answers.try_recv() {
            self.install(loaded);
        }
    }

    fn install(&mut self, loaded: Loaded) {
        self.loading.remove(&loaded.pid);
        if self.procs.len() >= MAX_PROCESSES && !self.procs.contains_key(&loaded.pid) {
            self.procs.clear();
        }
        let mut modules = Vec::new();
        let mut ranges = Vec::new();
        for (range, offset, tables) in loaded.modules {
            if let Some(tables) = tables
                && let Some(base) = tables.base_avma(range.start, offset)
            {
                modules.push(Module {
                    range: range.clone(),
                    base,
                    tables,
                });
            }
            ranges.push(range);
        }
        self.table_bytes = crate::reader::loader().table_bytes();
        self.procs.insert(
            loaded.pid,
            Process {
                modules,
                ranges,
                read_at: Instant::now(),
                stubs: HashMap::new(),
            },
        );
    }

    /// Asks for `pid`'s tables when it is new, or when `ip` is outside its mappings and
    /// they were read more than `MAPS_EVERY` ago (a library loaded since). Never waits.
    pub fn refresh(&mut self, pid: u32, ip: u64) -> Readiness {
        self.take_answers();
        if let Some(at) = self.loading.get(&pid) {
            if at.elapsed() < LOAD_AGAIN_AFTER {
                // Asked again (a library loaded since): walked with the mappings known
                // until the new ones come, not held.
                return if self.procs.contains_key(&pid) {
                    Readiness::Ready
                } else {
                    Readiness::Loading
                };
            }
            self.loading.remove(&pid);
        }
        if let Some(p) = self.procs.get(&pid)
            && (ip == 0 || p.in_file(ip) || p.read_at.elapsed() < MAPS_EVERY)
        {
            return Readiness::Ready;
        }
        self.loading.insert(pid, Instant::now());
        crate::reader::loader().load_process(pid, self.tx.clone());
        if self.procs.contains_key(&pid) {
            // Walked with the mappings known until the new ones come.
            Readiness::Ready
        } else {
            Readiness::Loading
        }
    }

    /// Waits up to `within` for every process asked for to be answered (for a capture's
    /// end, never on the agent's engine).
    pub fn wait_loaded(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.loading.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.answers.recv_timeout(left) {
                Ok(loaded) => self.install(loaded),
                Err(_) => break,
            }
        }
    }

    /// Walks `stack` (the bytes from `sp` up) of process `pid`, interrupted at `ip` with
    /// frame register `bp`, with the tables ready now.
    pub fn walk(&mut self, pid: u32, ip: u64, sp: u64, bp: u64, stack: &[u8]) -> Walk {
        let Some(proc) = self.procs.get_mut(&pid) else {
            // Gone, or its tables not read: its leaf is all that is known.
            return Walk {
                frames: vec![ip],
                complete: false,
            };
        };
        let mut read = |addr: u64| -> Result<u64, ()> {
            let off = usize::try_from(addr.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
            let word = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_le_bytes(word.try_into().map_err(|_| ())?))
        };
        let mut regs = Regs { ip, sp, bp };
        let mut walk = Walk::default();
        let mut at = ip;
        let mut first = true;
        while walk.frames.len() < MAX_FRAMES {
            walk.frames.push(at);
            // A return address is looked up inside its call instruction.
            let lookup = if first { at } else { at.saturating_sub(1) };
            let step = match proc.rule_at(lookup).exec(first, &mut regs, &mut read) {
                Ok(next) => Ok(next),
                Err(()) if !first && !proc.in_file(at) => {
                    proc.stub_return(pid, at, &mut regs, &mut read)
                }
                Err(()) => Err(()),
            };
            match step {
                Ok(Some(ra)) => {
                    at = ra;
                    first = false;
                }
                Ok(None) => {
                    walk.complete = true;
                    break;
                }
                Err(()) => break,
            }
        }
        walk
    }

    /// Forgets `pid`'s modules (its capture ended).
    pub fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
        self.loading.remove(&pid);
    }

    /// Bytes of unwind tables the loader holds for all captures.
    pub fn table_bytes(&self) -> usize {
        self.table_bytes
    }
}

/// Samples held until their process's tables are ready: at most this many per process
/// and in all (each holds a 16 KiB stack copy), and for at most `HOLD_FOR`.
pub const HOLD_PER_PROCESS: usize = 256;
pub const HOLD_TOTAL: usize = 512;
pub const HOLD_FOR: Duration = Duration::from_secs(5);

/// Items of the stack ring held in order per process while its tables load.
pub struct Held<T> {
    queues: HashMap<u32, VecDeque<(Instant, T)>>,
    total: usize,
}

impl<T> Default for Held<T> {
    fn default() -> Self {
        Self {
            queues: HashMap::new(),
            total: 0,
        }
    }
}

impl<T> Held<T> {
    pub fn push(&mut self, pid: u32, item: T) {
        self.queues
            .entry(pid)
            .or_default()
            .push_back((Instant::now(), item));
        self.total += 1;
    }

    /// The items to handle now, in order per process: every process's when `all`, else
    /// those of processes `ready` says are ready, held too long, or over the bounds.
    pub fn release(&mut self, all: bool, mut ready: impl FnMut(u32) -> bool) -> Vec<(u32, T)> {
        let over = self.total > HOLD_TOTAL;
        let pids: Vec<u32> = self
            .queues
            .iter()
            .filter(|(pid, q)| {
                all || over
                    || q.len() > HOLD_PER_PROCESS
                    || q.front().is_some_and(|(t, _)| t.elapsed() >= HOLD_FOR)
                    || ready(**pid)
            })
            .map(|(pid, _)| *pid)
            .collect();
        let mut out = Vec::new();
        for pid in pids {
            if let Some(q) = self.queues.remove(&pid) {
                self.total -= q.len();
                out.extend(q.into_iter().map(|(_, item)| (pid, item)));
            }
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
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

    #[test]
    fn rules_survive_the_wire_and_bad_tables_are_refused() {
        let rules = [
            Rule::Fallback,
            Rule::EndOfStack,
            Rule::OffsetSp { sp_by8: 7 },
            Rule::OffsetSpAndRestoreBp {
                sp_by8: 65535,
                bp_by8: -3,
            },
            Rule::UseFramePointer,
        ];
        let t = Tables {
            starts: (0..rules.len() as u64).map(|i| 0x1000 + i * 16).collect(),
            rules: rules.to_vec(),
            loads: vec![(0, 0, 0x5000)],
        };
        let mut e = Enc::default();
        t.encode(&mut e);
        assert_eq!(Tables::decode(&mut Dec(&e.0)), Ok(t));
        // Unsorted starts, an unknown rule, a short message.
        for bad in [
            {
                let mut e = Enc::default();
                e.u32(0).u32(2).u64(5).u64(0).u64(5).u64(0);
                e.0
            },
            {
                let mut e = Enc::default();
                e.u32(0).u32(1).u64(5).u64(9);
                e.0
            },
            vec![0, 0, 0, 0, 1, 0],
        ] {
            assert_eq!(Tables::decode(&mut Dec(&bad)), Err(Malformed));
        }
    }

    #[test]
    fn rows_become_ranges_and_an_address_between_entries_falls_back() {
        let t = Tables::from_rows(
            vec![
                (0x100, Rule::OffsetSp { sp_by8: 1 }),
                (0x104, Rule::OffsetSp { sp_by8: 2 }),
                (0x110, Rule::Fallback),
                (0x110, Rule::OffsetSp { sp_by8: 1 }),
                (0x120, Rule::Fallback),
                (0x130, Rule::OffsetSp { sp_by8: 1 }),
                (0x134, Rule::OffsetSp { sp_by8: 1 }),
                (0x140, Rule::Fallback),
            ],
            Vec::new(),
        );
        assert_eq!(t.rule_at(0xff), Rule::Fallback);
        assert_eq!(t.rule_at(0x100), Rule::OffsetSp { sp_by8: 1 });
        assert_eq!(t.rule_at(0x10f), Rule::OffsetSp { sp_by8: 2 });
        assert_eq!(t.rule_at(0x110), Rule::OffsetSp { sp_by8: 1 });
        assert_eq!(t.rule_at(0x125), Rule::Fallback);
        assert_eq!(t.rule_at(0x13f), Rule::OffsetSp { sp_by8: 1 });
        assert_eq!(t.rule_at(0x140), Rule::Fallback);
        // Equal neighbours merged.
        assert_eq!(t.starts, [0x100, 0x104, 0x110, 0x120, 0x130, 0x140]);
    }

    #[test]
    fn rules_step_as_framehops_do() {
        let stack = [
            1u64, 2, 0x100300, 4, 0x40, 0x100200, 5, 6, 0x70, 0x100100, 7, 8, 9, 10, 0, 0,
        ];
        let mut read = |addr: u64| stack.get((addr / 8) as usize).copied().ok_or(());
        let mut regs = Regs {
            ip: 0x100400,
            sp: 0x10,
            bp: 0x20,
        };
        let r = Rule::OffsetSp { sp_by8: 1 }.exec(true, &mut regs, &mut read);
        assert_eq!(r, Ok(Some(0x100300)));
        assert_eq!((regs.ip, regs.sp, regs.bp), (0x100300, 0x18, 0x20));
        let r = Rule::UseFramePointer.exec(false, &mut regs, &mut read);
        assert_eq!(r, Ok(Some(0x100200)));
        assert_eq!((regs.sp, regs.bp), (0x30, 0x40));
        let r = Rule::UseFramePointer.exec(false, &mut regs, &mut read);
        assert_eq!(r, Ok(Some(0x100100)));
        assert_eq!((regs.sp, regs.bp), (0x50, 0x70));
        assert_eq!(
            Rule::UseFramePointer.exec(false, &mut regs, &mut read),
            Ok(None)
        );
        assert_eq!(Rule::EndOfStack.exec(false, &mut regs, &mut read), Ok(None));
        // A bp of -1 (code using it as a general register) overflows without a panic.
        let mut regs = Regs {
            ip: 1,
            sp: u64::MAX / 8 * 8,
            bp: u64::MAX,
        };
        for r in [
            Rule::OffsetSp { sp_by8: 1 },
            Rule::UseFramePointer,
            Rule::OffsetSpAndRestoreBp {
                sp_by8: 1,
                bp_by8: 2,
            },
        ] {
            assert_eq!(r.exec(true, &mut regs, &mut read), Err(()));
        }
    }

    #[test]
    fn held_items_keep_their_order_and_leave_when_ready_or_over_bounds() {
        let mut h = Held::default();
        for i in 0..3 {
            h.push(7, i);
            h.push(8, 10 + i);
        }
        assert!(h.release(false, |_| false).is_empty());
        assert_eq!(h.release(false, |p| p == 8), [(8, 10), (8, 11), (8, 12)]);
        for i in 3..=HOLD_PER_PROCESS as i32 {
            h.push(7, i);
        }
        let out = h.release(false, |_| false);
        assert_eq!(out.len(), HOLD_PER_PROCESS + 1);
        assert!(out.windows(2).all(|w| w[0].1 < w[1].1));
        assert!(h.is_empty());
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
    /// test's caller through the tables the reader process built.
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
            let me = std::process::id();
            assert_eq!(u.refresh(me, ip), Readiness::Loading);
            u.wait_loaded(Duration::from_secs(20));
            assert_eq!(u.refresh(me, ip), Readiness::Ready);
            u.walk(me, ip, sp, bp, &stack)
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
