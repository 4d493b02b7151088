//! Benchmarks behind node-agent/BENCHMARKS.md (root only):
//! - `precision`: Top-K precision of the sketches against /proc ground truth sampled at the
//!   same instants, on >= 200 processes of skewed CPU and RSS plus churn;
//! - `cost`: ns per event of each program (kernel.bpf_stats_enabled) and the median ratio of
//!   `perf bench sched pipe` with and without the pipelines attached;
//! - `agent`: CPU and RSS of `resourcewatch-agent top --json` at a given interval;
//! - `unwind`: what copying and walking user stacks with unwind tables costs per CPU-profile
//!   sample, against the frame-pointer walk alone, on the programs given.

use std::{
    collections::{HashMap, HashSet},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use clap::{Parser, Subcommand};

mod compare;
mod corpus;
use resourcewatch_agent::{
    hashpipe::{self, Geometry},
    pipelines::{PipelineOptions, Pipelines},
    procfs,
    top::parse_duration,
};

#[derive(Parser)]
#[command(about = "resourcewatch benchmarks (root only)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Capture {
    Other,
    #[value(name = "self")]
    Own,
}

#[derive(Subcommand)]
enum Cmd {
    /// Top-K precision for CPU and memory against /proc.
    Precision {
        #[arg(long, default_value_t = 200)]
        procs: usize,
        /// Short-lived processes started per second.
        #[arg(long, default_value_t = 20)]
        churn: u32,
        #[arg(long, default_value_t = 30)]
        intervals: u32,
        #[arg(long, default_value = "2s", value_parser = parse_duration)]
        interval: Duration,
        #[arg(long, default_value_t = 4)]
        depth: u32,
        #[arg(long, default_value_t = 1024)]
        width: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[command(flatten)]
        skew: Skew,
        /// Memory that moves after the agent loads: each long-lived process allocates
        /// and frees in 1 MiB mmaps between 20 % and 100 % of its size, on a cycle of this
        /// length with a phase of its own (the memory ranks change every few seconds).
        /// Without it, each process touches its memory at start and holds it.
        #[arg(long, value_parser = parse_duration)]
        memory_cycle: Option<Duration>,
    },
    /// Kernel cost per event and the perf-bench ratio.
    Cost {
        /// Rounds of three perf-bench runs: without, with the pipelines, with only the
        /// empty programs (0: only the per-event table).
        #[arg(long, default_value_t = 11)]
        runs: usize,
        #[arg(long, default_value_t = 200_000)]
        loops: u64,
        /// Pin both perf-bench processes to this CPU (taskset): every message is then a
        /// context switch on one CPU, without the cross-CPU wake-up noise of a VM.
        #[arg(long)]
        pin_cpu: Option<u32>,
        /// With a growth-site capture running: `other` (on an idle process: what every
        /// other process's events pay while the agent names a leak's sites), or `self`
        /// (on the faulting process, whose every event is then a new high with a stack
        /// walk: the captured process's own worst case).
        #[arg(long, value_enum)]
        capture: Option<Capture>,
    },
    /// Leak detection: time to confidence >= 60 per leak rate, the highest confidence of
    /// each stable pattern, all run at once for `duration`.
    Leaks {
        #[arg(long, default_value = "600s", value_parser = parse_duration)]
        duration: Duration,
    },
    /// The leak corpus (node-agent/corpus/): real runtimes and leak-sim, leaks and
    /// not-leaks, all at once for `duration`, with the table of node-agent/LEAKS.md.
    Corpus {
        #[arg(long, default_value = "660s", value_parser = parse_duration)]
        duration: Duration,
        /// Only the cases whose name contains this.
        #[arg(long)]
        only: Option<String>,
        /// Write each case's trace (TSV) into this directory, e.g. node-agent/corpus/traces.
        #[arg(long)]
        record: Option<std::path::PathBuf>,
        /// Run nothing: replay the traces of this directory through the detectors.
        #[arg(long, conflicts_with = "record")]
        replay: Option<std::path::PathBuf>,
        /// With --replay: print every evaluation (second, container charge, confidence,
        /// time to OOM and its lower bound) of each case before the table.
        #[arg(long, requires = "replay")]
        steps: bool,
        /// With --replay: instead of the table, what each `leakDetection.minGrowingTime`
        /// costs in detection time and buys in warm-ups not listed.
        #[arg(long, requires = "replay")]
        warmup: bool,
        /// With --replay: evaluate once per agent report of this many seconds (a watch
        /// with `interval` 2x that), every alert counted from each process's start.
        #[arg(
            long,
            requires = "replay",
            conflicts_with = "warmup",
            value_name = "SECONDS"
        )]
        production: Option<f64>,
        /// The held-out cases (`leak::corpus::HELDOUT`), never used to tune the detector.
        #[arg(long)]
        heldout: bool,
    },
    /// Time-to-OOM accuracy: a process leaking at `rate` in a memory cgroup limited to
    /// `limit`; the prediction made at half-way is compared with the real OOM kill.
    Oom {
        #[arg(long, default_value = "256MiB")]
        limit: String,
        #[arg(long, default_value = "2MiB/s")]
        rate: String,
    },
    /// Per-epoch CPU accuracy of a CPU hog against /proc while short-lived processes
    /// (each touching 50 MiB) start every `churn` period: how many epochs are off.
    Epochs {
        #[arg(long, default_value_t = 200)]
        epochs: u32,
        #[arg(long, default_value = "200ms", value_parser = parse_duration)]
        epoch: Duration,
        #[arg(long, default_value = "50ms", value_parser = parse_duration)]
        churn: Duration,
    },
    /// What a CPU profile costs the profiled process: a fixed amount of work, pinned to the
    /// last CPU, timed with and without `profile` sampling it, in alternating pairs.
    Profile {
        #[arg(long, default_value_t = 10)]
        pairs: usize,
        #[arg(long, default_value_t = 99)]
        frequency: u64,
        /// Iterations of the worker's loop per run (about 1.5 s here at 600 M).
        #[arg(long, default_value_t = 600_000_000)]
        work: u64,
    },
    /// Per-sample cost of stacks walked with unwind tables (a 16 KiB copy of the user
    /// stack in the kernel, a walk in user space) against the kernel's frame-pointer walk
    /// alone: each `--cmd` (a shell command, started and killed here) is profiled for
    /// `seconds` in both modes, alternating.
    Unwind {
        #[arg(long, required = true)]
        cmd: Vec<String>,
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        #[arg(long, default_value_t = 99)]
        frequency: u64,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// The agent's total cost (user + system + eBPF kernel time) against a /proc poller
    /// and a per-container cgroup reader producing the same figures at the same interval,
    /// each alone on one workload (node-agent/BENCHMARKS.md, "Against the alternatives").
    Compare {
        /// Long-lived processes (the first 50 busy, the rest asleep).
        #[arg(long, default_value_t = 5000)]
        procs: usize,
        /// Of them, processes that wake every 20 ms (mostly busy workloads): the first 50
        /// burn a geometric share of a core, the rest 6 us each wake-up; the others sleep
        /// and wake once a second. Each wakes 50 times a second: 3,000 of them saturated
        /// this 2-vCPU VM (load average 2,700; the run did not end), a few hundred do not.
        #[arg(long, default_value_t = 50)]
        busy: usize,
        /// Memory cgroups the processes are spread over, all tracked exactly by the agent.
        #[arg(long, default_value_t = 200)]
        containers: usize,
        /// Short-lived processes started per second.
        #[arg(long, default_value_t = 20)]
        churn: u32,
        #[arg(short, long, default_value_t = 30)]
        k: usize,
        #[arg(long, default_value = "100ms", value_parser = parse_duration)]
        interval: Duration,
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        duration: Duration,
        /// Also run the agent without exact tracking (the sketches alone).
        #[arg(long)]
        untargeted: bool,
        /// Also run the agent printing only the tracked rows that changed
        /// (`top --json --changed-rows`).
        #[arg(long)]
        changed_rows: bool,
    },
    /// User-space cost of reading a JVM's retained heap (leak/jvm.rs): starts a JVM
    /// (`java` on PATH), then times `reads` reads of its hsperfdata file.
    JvmHeap {
        #[arg(long, default_value_t = 20_000)]
        reads: u32,
    },
    /// User-space cost of `resourcewatch-agent top --json`.
    Agent {
        #[arg(long, default_value = "2s", value_parser = parse_duration)]
        interval: Duration,
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        duration: Duration,
        /// Run the precision workload meanwhile (200 processes + churn).
        #[arg(long)]
        with_workload: bool,
    },
}

fn main() {
    let cli = Cli::parse();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "resourcewatch-bench needs root (it loads BPF programs and sets kernel.bpf_stats_enabled)"
        );
        std::process::exit(2);
    }
    match cli.cmd {
        Cmd::Precision {
            procs,
            churn,
            intervals,
            interval,
            depth,
            width,
            seed,
            skew,
            memory_cycle,
        } => precision(
            procs,
            churn,
            intervals,
            interval,
            Geometry::new(depth, width).unwrap_or_else(|e| fail(&e)),
            seed,
            Shape { skew, memory_cycle },
        ),
        Cmd::Cost {
            runs,
            loops,
            pin_cpu,
            capture,
        } => cost(runs, loops, pin_cpu, capture),
        Cmd::Profile {
            pairs,
            frequency,
            work,
        } => profile_cost(pairs, frequency, work),
        Cmd::Unwind {
            cmd,
            seconds,
            frequency,
            rounds,
        } => unwind_cost(&cmd, seconds, frequency, rounds),
        Cmd::Agent {
            interval,
            duration,
            with_workload,
        } => agent(interval, duration, with_workload),
        Cmd::Compare {
            procs,
            busy,
            containers,
            churn,
            k,
            interval,
            duration,
            untargeted,
            changed_rows,
        } => compare::compare(
            compare::Mix {
                procs,
                busy,
                containers,
                churn,
            },
            k,
            interval,
            duration,
            untargeted,
            changed_rows,
        ),
        Cmd::JvmHeap { reads } => jvm_heap(reads),
        Cmd::Leaks { duration } => leaks(duration),
        Cmd::Corpus {
            duration,
            only,
            record,
            replay: Some(dir),
            steps,
            warmup,
            production,
            heldout,
        } => {
            let _ = (duration, record);
            let view = match (warmup, production) {
                (true, _) => corpus::View::Warmup,
                (false, Some(every_secs)) => corpus::View::Production { every_secs },
                (false, None) => corpus::View::Table,
            };
            corpus::replay_dir(&dir, only, steps, view, heldout)
        }
        Cmd::Corpus {
            duration,
            only,
            record,
            replay: None,
            steps: _,
            warmup: _,
            production: _,
            heldout,
        } => corpus::corpus(duration, only, record, heldout),
        Cmd::Epochs {
            epochs,
            epoch,
            churn,
        } => epochs_under_churn(epochs, epoch, churn),
        Cmd::Oom { limit, rate } => oom(
            resourcewatch_workloads::parse_bytes(&limit).unwrap_or_else(|e| fail(&e)),
            resourcewatch_workloads::parse_bytes(&rate).unwrap_or_else(|e| fail(&e)),
        ),
    }
}

fn fail(e: &dyn std::fmt::Display) -> ! {
    eprintln!("resourcewatch-bench: {e}");
    std::process::exit(1)
}

// ---- workload ------------------------------------------------------------------------

/// Forked children that are killed (and die with us) when dropped.
struct Workload {
    pids: Vec<u32>,
}

impl Drop for Workload {
    fn drop(&mut self) {
        for &p in &self.pids {
            // SAFETY: signalling and reaping our own children.
            unsafe {
                libc::kill(p as i32, libc::SIGKILL);
                libc::waitpid(p as i32, std::ptr::null_mut(), 0);
            }
        }
    }
}

fn fork(work: impl FnOnce()) -> u32 {
    // SAFETY: the child runs `work` (busy loops, mmap, fork) and _exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        fail(&std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: prctl and _exit with constant arguments.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        work();
        unsafe { libc::_exit(0) };
    }
    pid as u32
}

fn epochs_under_churn(epochs: u32, epoch: Duration, churn: Duration) {
    let hog = fork(|| {
        loop {
            std::hint::spin_loop();
        }
    });
    let churner = fork(move || {
        loop {
            let kid = fork(|| touch_anon(50 << 20));
            // SAFETY: reaping our own child.
            unsafe { libc::waitpid(kid as i32, std::ptr::null_mut(), 0) };
            std::thread::sleep(churn);
        }
    });
    let _workload = Workload {
        pids: vec![hog, churner],
    };
    let pipes = Pipelines::load(PipelineOptions::default()).unwrap_or_else(|e| fail(&e));
    pipes.close_cpu_epoch();
    let mut prev = procfs::cpu_ns(hog).unwrap_or_else(|| fail(&"the hog exited"));
    let (mut off, mut worst) = (0, 1.0f64);
    for _ in 0..epochs {
        std::thread::sleep(epoch);
        let truth = procfs::cpu_ns(hog).unwrap_or_else(|| fail(&"the hog exited"));
        let got = pipes
            .close_cpu_epoch()
            .per_tgid
            .get(&hog)
            .copied()
            .unwrap_or(0);
        let ratio = got as f64 / (truth - prev).max(1) as f64;
        if (ratio - 1.0).abs() > 0.10 {
            off += 1;
        }
        if (ratio - 1.0).abs() > (worst - 1.0).abs() {
            worst = ratio;
        }
        prev = truth;
    }
    let k = pipes.kernel_stats();
    println!(
        "{epochs} epochs of {epoch:?}, churn every {churn:?}: {off} off by more than 10 % \
         against /proc (worst ratio {worst:.3}); switch-ins unseen {}, rw_cpu_sync failures {}",
        k.switch_ins_unseen, k.cpu_sync_failures
    );
}

fn touch_anon(bytes: usize) {
    // Held for the process's lifetime on purpose.
    std::mem::forget(resourcewatch_workloads::Chunk::new(bytes as u64));
}

/// `duty_cycle` with memory that moves: after each busy part the process allocates or
/// frees 1 MiB mmaps towards `rss x (0.6 + 0.4 sin(2 pi (t / cycle + phase)))`.
fn moving_memory(duty: f64, period: Duration, rss: usize, cycle: Duration, phase: f64) -> ! {
    const CHUNK: usize = 1 << 20;
    let busy = period.mul_f64(duty).as_nanos() as u64;
    let start = Instant::now();
    let mut held: Vec<resourcewatch_workloads::Chunk> = Vec::new();
    let mut next = start;
    loop {
        let t0 = thread_cpu_ns();
        while thread_cpu_ns() - t0 < busy {
            std::hint::spin_loop();
        }
        let x = start.elapsed().as_secs_f64() / cycle.as_secs_f64() + phase;
        let want = rss as f64 * (0.6 + 0.4 * (std::f64::consts::TAU * x).sin());
        let chunks = (want / CHUNK as f64).round() as usize;
        while held.len() < chunks {
            match resourcewatch_workloads::Chunk::new(CHUNK as u64) {
                Some(c) => held.push(c),
                None => break,
            }
        }
        held.truncate(chunks);
        next += period;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

/// Spends `duty` of each period on the CPU. The busy part is measured in the thread's own
/// CPU time, so being preempted does not shorten it: each process gets the share asked
/// for as long as the machine is not saturated.
fn duty_cycle(duty: f64, period: Duration) -> ! {
    let busy = period.mul_f64(duty).as_nanos() as u64;
    let mut next = Instant::now();
    loop {
        let start = thread_cpu_ns();
        while thread_cpu_ns() - start < busy {
            std::hint::spin_loop();
        }
        next += period;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// xorshift64*, so runs are reproducible from a seed without a rand dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// `procs` long-lived processes: rank i busy 10% x 0.93^i of a core (geometric, so
/// neighbouring ranks differ by 7%, well above measurement noise) and holding
/// 160 MiB x 0.92^j of touched memory, j a seeded permutation of i (CPU and memory ranks
/// are independent). Plus a spawner starting `churn` short-lived processes per second,
/// each touching 1-4 MiB and busy 1-5 ms.
/// The long-lived processes' skew: rank *i* busy `cpu_top` x `cpu_skew`^*i* of a core and
/// holding `mem_top_mib` x `mem_skew`^*j* MiB, *j* a seeded permutation of *i*.
#[derive(Clone, Copy, Debug, clap::Args)]
struct Skew {
    #[arg(long, default_value_t = 0.10)]
    cpu_top: f64,
    #[arg(long, default_value_t = 0.93)]
    cpu_skew: f64,
    #[arg(long, default_value_t = 160.0)]
    mem_top_mib: f64,
    #[arg(long, default_value_t = 0.92)]
    mem_skew: f64,
}

impl Default for Skew {
    fn default() -> Self {
        Self {
            cpu_top: 0.10,
            cpu_skew: 0.93,
            mem_top_mib: 160.0,
            mem_skew: 0.92,
        }
    }
}

/// The precision workload's shape: its skews, and whether its memory moves.
#[derive(Clone, Copy)]
struct Shape {
    skew: Skew,
    memory_cycle: Option<Duration>,
}

fn spawn_workload(procs: usize, churn: u32, seed: u64, shape: Shape) -> Workload {
    let skew = shape.skew;
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut perm: Vec<usize> = (0..procs).collect();
    for i in (1..procs).rev() {
        perm.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let mut pids = Vec::new();
    for (i, &j) in perm.iter().enumerate() {
        let duty = skew.cpu_top * skew.cpu_skew.powi(i as i32);
        let rss = (skew.mem_top_mib * 1048576.0 * skew.mem_skew.powi(j as i32)) as usize;
        // Every 20 ms, or, for the lightest, less often (at most once a second) with at
        // least 200 µs of work each time: thousands of processes waking every 20 ms for
        // a few µs each would be a scheduler benchmark, not a node.
        let period = Duration::from_secs_f64((200e-6 / duty.max(1e-9)).clamp(0.02, 1.0));
        let phase = (rng.next() % 1000) as f64 / 1000.0;
        pids.push(match shape.memory_cycle {
            None => fork(move || {
                touch_anon(rss);
                duty_cycle(duty, period);
            }),
            Some(cycle) => fork(move || moving_memory(duty, period, rss, cycle, phase)),
        });
    }
    if churn > 0 {
        let gap = Duration::from_secs(1) / churn;
        pids.push(fork(move || {
            let mut r = Rng(seed ^ 0xDEAD_BEEF);
            loop {
                let mb = 1 + (r.next() % 4) as usize;
                let busy = Duration::from_micros(1000 + r.next() % 4000);
                fork(move || {
                    touch_anon(mb << 20);
                    let t = Instant::now();
                    while t.elapsed() < busy {
                        std::hint::spin_loop();
                    }
                });
                // Reap whatever has finished.
                // SAFETY: non-blocking reaping of our children.
                while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
                std::thread::sleep(gap);
            }
        }));
    }
    Workload { pids }
}

// ---- precision ---------------------------------------------------------------------------

struct Truth {
    cpu: HashMap<u32, u64>,
    mem: HashMap<u32, u64>,
}

fn sample_truth() -> Truth {
    let page = procfs::page_size();
    let mut cpu = HashMap::new();
    let mut mem = HashMap::new();
    for pid in procfs::pids() {
        if let Some(ns) = procfs::process_cpu_clock_ns(pid) {
            cpu.insert(pid, ns);
        }
        if let Some(p) = procfs::resident_pages(pid).filter(|&p| p > 0) {
            mem.insert(pid, p * page);
        }
    }
    Truth { cpu, mem }
}

fn midpoint(a: &Truth, b: &Truth) -> Truth {
    let mid = |x: &HashMap<u32, u64>, y: &HashMap<u32, u64>| -> HashMap<u32, u64> {
        x.iter()
            .filter_map(|(p, v)| y.get(p).map(|w| (*p, v / 2 + w / 2)))
            .collect()
    };
    Truth {
        cpu: mid(&a.cpu, &b.cpu),
        mem: mid(&a.mem, &b.mem),
    }
}

fn overlap(a: &[(u32, u64)], b: &[(u32, u64)]) -> usize {
    let sa: HashSet<u32> = a.iter().map(|x| x.0).collect();
    b.iter().filter(|x| sa.contains(&x.0)).count()
}

fn precision(
    procs: usize,
    churn: u32,
    intervals: u32,
    interval: Duration,
    geo: Geometry,
    seed: u64,
    shape: Shape,
) {
    const KS: [usize; 6] = [1, 5, 10, 20, 30, 100];
    let ks: Vec<usize> = KS.into_iter().filter(|&k| k <= procs).collect();
    eprintln!("starting {procs} processes + {churn}/s churn; warming up");
    let _w = spawn_workload(procs, churn, seed, shape);
    std::thread::sleep(Duration::from_secs(5));
    let pipes = Pipelines::load(PipelineOptions {
        cpu: geo,
        mem: geo,
        ..Default::default()
    })
    .unwrap_or_else(|e| fail(&e));
    let mut prev = sample_truth();
    pipes.close_cpu_epoch();
    let mut hits_cpu = [0usize; KS.len()];
    let mut hits_mem = [0usize; KS.len()];
    let start = Instant::now();
    for n in 1..=intervals {
        std::thread::sleep((start + interval * n).saturating_duration_since(Instant::now()));
        // Reading /proc for every process takes tens of ms, so it is read once before and
        // once after the epoch closes and each process's value is taken halfway: the
        // truth window is then centred on the sketch's, not shifted by the read time.
        let before = sample_truth();
        let epoch = pipes.close_cpu_epoch();
        let mem = pipes.memory();
        let after = sample_truth();
        let truth = midpoint(&before, &after);
        let cpu_truth: HashMap<u32, u64> = truth
            .cpu
            .iter()
            .filter_map(|(p, v)| prev.cpu.get(p).map(|old| (*p, v.saturating_sub(*old))))
            .collect();
        if std::env::var_os("RW_BENCH_DEBUG").is_some() {
            let (t, s) = (
                hashpipe::top_k(&cpu_truth, 6),
                hashpipe::top_k(&epoch.per_tgid, 6),
            );
            if t[0].0 != s[0].0 {
                let name = |p: u32| procfs::comm(p).unwrap_or_default();
                eprintln!(
                    "interval {n}: truth {:?}\n            sketch {:?}",
                    t.iter()
                        .map(|(p, v)| (name(*p), p, v / 1000))
                        .collect::<Vec<_>>(),
                    s.iter()
                        .map(|(p, v)| (name(*p), p, v / 1000))
                        .collect::<Vec<_>>()
                );
            }
        }
        for (i, &k) in ks.iter().enumerate() {
            hits_cpu[i] += overlap(
                &hashpipe::top_k(&cpu_truth, k),
                &hashpipe::top_k(&epoch.per_tgid, k),
            );
            hits_mem[i] += overlap(&hashpipe::top_k(&truth.mem, k), &hashpipe::top_k(&mem, k));
        }
        prev = truth;
    }
    let sketch_bytes = (2 * geo.slots() + geo.slots()) * 8;
    let maps = pipes.map_memory_bytes();
    let total: u64 = maps.iter().map(|m| m.1).sum();
    println!("| K | CPU precision | memory precision |");
    println!("|---|---|---|");
    for (i, &k) in ks.iter().enumerate() {
        let d = (k * intervals as usize) as f64;
        println!(
            "| {k} | {:.1} % | {:.1} % |",
            100.0 * hits_cpu[i] as f64 / d,
            100.0 * hits_mem[i] as f64 / d
        );
    }
    println!(
        "\nsketch: depth {} x width {}; CPU (two epochs) + memory slots = {} B; all maps (kernel memlock) = {} B",
        geo.depth,
        geo.width(),
        sketch_bytes,
        total
    );
    for (name, b) in maps {
        println!("  {name}: {b} B");
    }
}

// ---- kernel cost ---------------------------------------------------------------------------

struct SysctlGuard {
    path: &'static str,
    old: String,
}

impl SysctlGuard {
    fn set(path: &'static str, value: &str) -> SysctlGuard {
        let old = std::fs::read_to_string(path).unwrap_or_else(|e| fail(&format!("{path}: {e}")));
        std::fs::write(path, value).unwrap_or_else(|e| fail(&format!("{path}: {e}")));
        SysctlGuard { path, old }
    }
}

impl Drop for SysctlGuard {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path, self.old.trim());
    }
}

fn perf_pipe(loops: u64, pin: Option<u32>) -> f64 {
    let mut cmd = match pin {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.args(["-c", &cpu.to_string(), "perf"]);
            c
        }
        None => Command::new("perf"),
    };
    let out = cmd
        .args(["bench", "sched", "pipe", "-l", &loops.to_string()])
        .stderr(Stdio::null())
        .output()
        .unwrap_or_else(|e| fail(&format!("perf bench (install linux-perf): {e}")));
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Total time:")
                .and_then(|r| r.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or_else(|| fail(&format!("unexpected perf output: {text}")))
}

/// Page-fault heavy work: map, touch and unmap 64 MiB, `rounds` times.
fn fault_storm(rounds: usize) {
    let pid = fork(move || {
        for _ in 0..rounds {
            drop(resourcewatch_workloads::Chunk::new(64 << 20));
        }
    });
    // SAFETY: waiting for our child.
    unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), 0) };
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[m - 1] + v[m]) / 2.0
    } else {
        v[m]
    }
}

/// The empty programs (ebpf/src/floor.bpf.c) attached to the tracepoints ours use;
/// detached when dropped.
fn attach_floor() -> aya::Ebpf {
    let btf = aya::Btf::from_sys_fs().unwrap_or_else(|e| fail(&e));
    let mut bpf = aya::Ebpf::load(resourcewatch_ebpf::FLOOR_OBJECT).unwrap_or_else(|e| fail(&e));
    for (name, tp) in [
        ("floor_sched_switch", "sched_switch"),
        ("floor_rss_stat", "rss_stat"),
    ] {
        let p: &mut aya::programs::BtfTracePoint = bpf
            .program_mut(name)
            .and_then(|p| p.try_into().ok())
            .unwrap_or_else(|| fail(&name));
        p.load(tp, &btf).unwrap_or_else(|e| fail(&e));
        p.attach().unwrap_or_else(|e| fail(&e));
    }
    bpf
}

/// ns/event of the empty programs: the measurement floor.
fn floor(loops: u64) -> Vec<(String, f64)> {
    use std::os::fd::{AsFd, AsRawFd};
    let bpf = attach_floor();
    perf_pipe(loops, None);
    fault_storm(20);
    let mut out = Vec::new();
    for (name, prog) in bpf.programs() {
        let Ok(fd) = prog.fd() else { continue };
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_fd().as_raw_fd()))
            .unwrap_or_default();
        let f = |k: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        if f("run_cnt:") > 0.0 {
            out.push((name.to_owned(), f("run_time_ns:") / f("run_cnt:")));
        }
    }
    out
}

/// One run of the profiled worker: a forked child pinned to `cpu` runs `work` iterations
/// of a multiply-add loop and reports its wall time through a pipe. With `profiler`, the
/// child is sampled at `frequency` for its whole run.
fn profiled_run(
    cpu: usize,
    work: u64,
    profiler: Option<(&mut resourcewatch_agent::profile::Profiler, u64)>,
) -> (Duration, u64) {
    let mut fds = [0; 2];
    // SAFETY: a pipe into a local array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: the child only computes, writes to the pipe and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: pinning this child; plain arithmetic; writing 8 bytes; _exit.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
            // Wait for the profiler to be attached (or not): 200 ms.
            std::thread::sleep(Duration::from_millis(200));
            let start = Instant::now();
            let mut x = 0u64;
            for i in 0..work {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            let ns = start.elapsed().as_nanos() as u64;
            libc::write(fds[1], (&ns as *const u64).cast(), 8);
            libc::_exit((x & 1) as i32);
        }
    }
    let pid = pid as u32;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let samples = std::thread::scope(|scope| {
        let stop = &stop;
        let sampler = profiler.map(|(p, freq)| {
            scope.spawn(move || {
                p.run(
                    &resourcewatch_agent::profile::ProfileTarget {
                        pids: vec![pid],
                        cgroups: vec![],
                    },
                    freq,
                    Duration::from_secs(600),
                    stop,
                )
                .map(|prof| prof.samples())
                .unwrap_or_else(|e| fail(&format!("profile: {e}")))
            })
        });
        let mut ns = 0u64;
        // SAFETY: reading 8 bytes from our pipe.
        let n = unsafe { libc::read(fds[0], (&mut ns as *mut u64).cast(), 8) };
        assert_eq!(n, 8, "the worker's time");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: reaping our child.
        unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), 0) };
        (
            Duration::from_nanos(ns),
            sampler.map_or(0, |h| h.join().expect("sampler")),
        )
    });
    // SAFETY: closing our pipe.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    samples
}

fn profile_cost(pairs: usize, frequency: u64, work: u64) {
    let mut profiler = resourcewatch_agent::profile::Profiler::load(16384)
        .unwrap_or_else(|e| fail(&format!("loading the profiler: {e}")));
    let cpu = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
    println!(
        "profiled worker: {work} iterations pinned to CPU {cpu}, sampled at {frequency} Hz; {pairs} pairs, the order alternating"
    );
    println!("| pair | without | with | samples | ratio |\n|---|---|---|---|---|");
    let mut ratios = Vec::new();
    for i in 0..pairs {
        let mut without = Duration::ZERO;
        let mut with = (Duration::ZERO, 0);
        for first in [i % 2 == 0, i % 2 != 0] {
            if first {
                without = profiled_run(cpu, work, None).0;
            } else {
                with = profiled_run(cpu, work, Some((&mut profiler, frequency)));
            }
        }
        let ratio = with.0.as_secs_f64() / without.as_secs_f64();
        ratios.push(ratio);
        println!(
            "| {} | {:.3} s | {:.3} s | {} | x{ratio:.4} |",
            i + 1,
            without.as_secs_f64(),
            with.0.as_secs_f64(),
            with.1
        );
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "median ratio x{:.4} (min x{:.4}, max x{:.4})",
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1]
    );
}

/// A process for a growth-site capture to list: idle, or the fault storm itself (it
/// sleeps 300 ms so the capture is in place before its first fault).
fn capture_target(pipes: &mut Pipelines, capture: Capture) -> Workload {
    let pid = match capture {
        Capture::Other => fork(|| std::thread::sleep(Duration::from_secs(3600))),
        Capture::Own => fork(|| {
            std::thread::sleep(Duration::from_millis(300));
            // One growing round: every resident-page increment is a new high.
            drop(resourcewatch_workloads::Chunk::new(256 << 20));
        }),
    };
    std::thread::sleep(Duration::from_millis(50));
    pipes.capture_growth_sites(pid).unwrap_or_else(|e| fail(&e));
    Workload { pids: vec![pid] }
}

fn cost(runs: usize, loops: u64, pin: Option<u32>, capture: Option<Capture>) {
    {
        let _stats = SysctlGuard::set("/proc/sys/kernel/bpf_stats_enabled", "1");
        // One method for every figure: the kernel's run_time_ns / run_cnt of our program,
        // and of an empty program on the same tracepoint under the same load, measured in
        // the same invocation; the difference is our programs' own work (the empty one is
        // what the accounting itself reports, two clock reads around each run).
        let floors = floor(loops);
        let mut pipes = Pipelines::load(PipelineOptions::default()).unwrap_or_else(|e| fail(&e));
        let mut target = capture.map(|c| capture_target(&mut pipes, c));
        perf_pipe(loops, None);
        match (capture, &mut target) {
            (Some(Capture::Own), Some(t)) => {
                // SAFETY: waiting for our own child (its storm ends it); reaped, it is no
                // longer the Workload's to kill.
                unsafe { libc::waitpid(t.pids[0] as i32, std::ptr::null_mut(), 0) };
                t.pids.clear();
            }
            _ => fault_storm(20),
        }
        std::thread::sleep(Duration::from_millis(200));
        if let Some(c) = capture {
            println!(
                "with a growth-site capture running on {c:?} (RW_STAT stacks lost: {})",
                pipes.kernel_stats().stacks_lost
            );
        }
        println!("| program | events | ns/event | empty program, same tracepoint | over it |");
        println!("|---|---|---|---|---|");
        for s in pipes.program_stats().iter().filter(|s| s.run_cnt > 0) {
            let ns = s.run_time_ns as f64 / s.run_cnt as f64;
            let empty = s
                .name
                .strip_prefix("rw_")
                .and_then(|t| {
                    floors
                        .iter()
                        .find(|(f, _)| f.strip_prefix("floor_") == Some(t))
                })
                .map(|(_, f)| *f);
            match empty {
                Some(f) => println!(
                    "| {} | {} | {ns:.1} | {f:.1} | {:.1} |",
                    s.name,
                    s.run_cnt,
                    ns - f
                ),
                None => println!("| {} | {} | {ns:.1} | | |", s.name, s.run_cnt),
            }
        }
    }
    if runs == 0 {
        return;
    }
    // Stats accounting itself costs time per event, so it is off for the ratio runs.
    // Each round runs the benchmark three times: alone, with the agent's pipelines, and
    // with only the empty programs on the same tracepoints (the floor: what any eBPF
    // program there costs). The order rotates from round to round, so a drift of the
    // machine during a round favours none of the three.
    #[derive(Clone, Copy, PartialEq)]
    enum Arm {
        Without,
        Agent,
        Floor,
    }
    let arms = [Arm::Without, Arm::Agent, Arm::Floor];
    let (mut with, mut without, mut floored) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ratios, mut floor_ratios) = (Vec::new(), Vec::new());
    perf_pipe(loops, pin); // warm-up
    for round in 0..runs {
        let mut t = [0.0; 3];
        for i in 0..3 {
            let arm = arms[(round + i) % 3];
            t[arm as usize] = match arm {
                Arm::Without => perf_pipe(loops, pin),
                Arm::Agent => {
                    let mut pipes =
                        Pipelines::load(PipelineOptions::default()).unwrap_or_else(|e| fail(&e));
                    let target = capture.map(|_| capture_target(&mut pipes, Capture::Other));
                    let t = perf_pipe(loops, pin);
                    drop(target);
                    drop(pipes);
                    t
                }
                Arm::Floor => {
                    let empty = attach_floor();
                    let t = perf_pipe(loops, pin);
                    drop(empty);
                    t
                }
            };
        }
        let [base, agent, empty] = t;
        ratios.push(agent / base);
        floor_ratios.push(empty / base);
        with.push(agent);
        without.push(base);
        floored.push(empty);
    }
    let rounded = |v: &[f64]| {
        v.iter()
            .map(|r| (r * 1000.0).round() / 1000.0)
            .collect::<Vec<_>>()
    };
    println!(
        "\nperf bench sched pipe -l {loops}{}, {runs} rounds (without, agent, empty programs; order rotating): \
         medians without {:.3}s, agent {:.3}s, empty programs {:.3}s\n\
         agent: median ratio x{:.3}; ratios {:?}\n\
         empty programs (the floor): median ratio x{:.3}; ratios {:?}",
        pin.map(|c| format!(" pinned to CPU {c}"))
            .unwrap_or_default(),
        median(without),
        median(with),
        median(floored),
        median(ratios.clone()),
        rounded(&ratios),
        median(floor_ratios.clone()),
        rounded(&floor_ratios),
    );
}

// ---- agent cost ---------------------------------------------------------------------------

fn proc_cpu_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = s.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn status_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| procfs::kib_field(&s, key))
        .unwrap_or(0)
        / 1024
}

fn agent(interval: Duration, duration: Duration, with_workload: bool) {
    let _w = with_workload.then(|| {
        spawn_workload(
            200,
            20,
            1,
            Shape {
                skew: Skew::default(),
                memory_cycle: None,
            },
        )
    });
    let exe = std::env::current_exe().unwrap_or_else(|e| fail(&e));
    let agent = exe.with_file_name("resourcewatch-agent");
    let ms = format!("{}ms", interval.as_millis());
    let mut child = Command::new(&agent)
        .args(["top", "--json", "-k", "30", "--interval", &ms])
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| fail(&format!("{}: {e}", agent.display())));
    let pid = child.id();
    // The programs' own run time is counted only while this is on; it runs in the context
    // of whatever task hit the tracepoint, so the agent's utime + stime never include it.
    let _stats = SysctlGuard::set("/proc/sys/kernel/bpf_stats_enabled", "1");
    // Skip start-up (loading, verification, seeding) and measure the steady state.
    std::thread::sleep(Duration::from_secs(5));
    let tick = 100.0; // USER_HZ
    let t0 = Instant::now();
    let c0 = proc_cpu_ticks(pid).unwrap_or_else(|| fail(&"the agent exited early"));
    let k0 = bpf_run_time_ns(pid);
    std::thread::sleep(duration);
    let c1 = proc_cpu_ticks(pid).unwrap_or_else(|| fail(&"the agent exited early"));
    let k1 = bpf_run_time_ns(pid);
    let secs = t0.elapsed().as_secs_f64();
    let rss = status_kb(pid, "VmRSS:");
    let hwm = status_kb(pid, "VmHWM:");
    let _ = child.kill();
    let _ = child.wait();
    let user_system = 100.0 * (c1 - c0) as f64 / tick / secs;
    let programs = 100.0 * k1.saturating_sub(k0) as f64 / 1e9 / secs;
    println!(
        "agent at --interval {ms}{}: CPU {:.3} % of a core over {secs:.0}s = {user_system:.3} % user + system (/proc/PID/stat) + {programs:.3} % its eBPF programs (run_time_ns of the programs it holds, kernel.bpf_stats_enabled=1); RSS {:.1} MiB (peak {:.1} MiB)",
        if with_workload {
            " with 200 processes + churn"
        } else {
            ""
        },
        user_system + programs,
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
}

/// Total run time of the BPF programs process `pid` holds open (their fdinfo's
/// `run_time_ns`, counted while kernel.bpf_stats_enabled=1).
fn bpf_run_time_ns(pid: u32) -> u64 {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return 0;
    };
    fds.filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter(|info| info.lines().any(|l| l.starts_with("prog_id:")))
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("run_time_ns:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .sum()
}

// ---- leak detection ------------------------------------------------------------------------

fn fork_pattern(p: resourcewatch_workloads::Pattern) -> u32 {
    fork(move || resourcewatch_workloads::run(&p, &|| false))
}

/// One top-like step: close the epoch, feed samples, build a frame with every verdict.
fn frame(
    pipes: &mut Pipelines,
    builder: &mut resourcewatch_agent::snapshot::FrameBuilder,
) -> resourcewatch_agent::snapshot::Frame {
    let epoch = pipes.close_cpu_epoch();
    pipes.drain_samples(|s| builder.observe_sample(s));
    builder.build(pipes, &epoch)
}

/// Leaks begin this long after their process starts, as a leak in a running service does;
/// detection times are measured from the leak's start.
const LEAK_DELAY: Duration = Duration::from_secs(30);

fn leaks(duration: Duration) {
    use resourcewatch_workloads::{MIB, Pattern};
    let mut pipes = Pipelines::load(PipelineOptions::default()).unwrap_or_else(|e| fail(&e));
    let layout = pipes.cgroup_layout().clone();
    let mut builder = resourcewatch_agent::snapshot::FrameBuilder::new(1000, Some(layout));
    builder.leak_min_confidence = 0;
    let rates = [
        ("10 MB/s", 10_000_000u64),
        ("1 MB/s", 1_000_000),
        ("100 KB/s", 100_000),
        ("10 KB/s", 10_000),
    ];
    let stable = [
        ("flat", Pattern::Flat { size: 100 * MIB }),
        (
            "sawtooth",
            Pattern::Sawtooth {
                baseline: 100 * MIB,
                rate: 2 * MIB,
                period: Duration::from_secs(10),
            },
        ),
        (
            "plateau",
            Pattern::Plateau {
                baseline: 50 * MIB,
                cap: 60 * MIB,
                tau: Duration::from_secs(10),
            },
        ),
        (
            "bursty",
            Pattern::Bursty {
                baseline: 100 * MIB,
                max_burst: 50 * MIB,
                seed: 7,
            },
        ),
        (
            "pagecache",
            Pattern::PageCache {
                size: 500 * MIB,
                rate: 5 * MIB,
            },
        ),
    ];
    let start = Instant::now();
    // (name, pid, (seconds to detection, measured rate) once detected)
    type Leaker<'a> = (&'a str, u32, Option<(f64, f64)>);
    let mut leakers: Vec<Leaker> = rates
        .iter()
        .map(|(name, rate)| {
            (
                *name,
                fork_pattern(Pattern::Leak {
                    baseline: 10 * MIB,
                    rate: *rate,
                    delay: LEAK_DELAY,
                }),
                None,
            )
        })
        .collect();
    let calm: Vec<(&str, u32)> = stable
        .iter()
        .map(|(n, p)| (*n, fork_pattern(p.clone())))
        .collect();
    let mut worst: HashMap<u32, u8> = HashMap::new();
    let mut n = 0u64;
    while start.elapsed() < duration {
        n += 1;
        std::thread::sleep(
            (start + Duration::from_secs(n)).saturating_duration_since(Instant::now()),
        );
        let f = frame(&mut pipes, &mut builder);
        let t = start.elapsed().as_secs_f64();
        for row in &f.leaks {
            if row.confidence >= 60
                && let Some(l) = leakers
                    .iter_mut()
                    .find(|l| Some(l.1) == row.pid && l.2.is_none())
            {
                l.2 = Some((t - LEAK_DELAY.as_secs_f64(), row.growth_bytes_per_sec));
                // A detected leak has made its point; stop it before it eats the machine.
                // SAFETY: killing our own child.
                unsafe { libc::kill(l.1 as i32, libc::SIGKILL) };
            }
            if let Some(pid) = row.pid
                && calm.iter().any(|c| c.1 == pid)
            {
                let w = worst.entry(pid).or_default();
                *w = (*w).max(row.confidence);
            }
        }
    }
    println!("| leak rate | time to confidence >= 60 | measured growth |");
    println!("|---|---|---|");
    for (name, _, got) in &leakers {
        match got {
            Some((t, g)) => println!("| {name} | {t:.0} s | {:.1} KB/s |", g / 1000.0),
            None => println!(
                "| {name} | not within {:.0} s | - |",
                duration.as_secs_f64()
            ),
        }
    }
    println!(
        "\n| stable pattern ({:.0} s) | highest confidence |",
        duration.as_secs_f64()
    );
    println!("|---|---|");
    for (name, pid) in &calm {
        println!("| {name} | {} |", worst.get(pid).copied().unwrap_or(0));
    }
    let all: Vec<u32> = leakers
        .iter()
        .map(|l| l.1)
        .chain(calm.iter().map(|c| c.1))
        .collect();
    drop(Workload { pids: all });
}

fn oom(limit: u64, rate: u64) {
    use resourcewatch_workloads::{MIB, Pattern};
    let mut pipes = Pipelines::load(PipelineOptions::default()).unwrap_or_else(|e| fail(&e));
    let layout = pipes.cgroup_layout().clone();
    let dir = layout
        .root()
        .join(format!("rw-oom-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| fail(&format!("{}: {e}", dir.display())));
    let limit_file = if dir.join("memory.max").exists() {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    std::fs::write(dir.join(limit_file), limit.to_string()).unwrap_or_else(|e| fail(&e));
    let mut builder = resourcewatch_agent::snapshot::FrameBuilder::new(1000, Some(layout.clone()));
    builder.leak_min_confidence = 0;
    // The child waits on a pipe until it is inside the cgroup.
    let mut p = [0i32; 2];
    // SAFETY: creating a pipe.
    unsafe { libc::pipe(p.as_mut_ptr()) };
    let gate = p[0];
    let pid = fork(move || {
        let mut b = [0u8; 1];
        // SAFETY: blocking read on our pipe end.
        unsafe { libc::read(gate, b.as_mut_ptr().cast(), 1) };
        resourcewatch_workloads::run(
            &Pattern::Leak {
                baseline: 10 * MIB,
                rate,
                delay: Duration::ZERO,
            },
            &|| false,
        );
    });
    std::fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap_or_else(|e| fail(&e));
    let start = Instant::now();
    // SAFETY: releasing the child.
    unsafe { libc::write(p[1], b"x".as_ptr().cast(), 1) };
    let mut half: Option<(f64, f64)> = None;
    let killed_at;
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let mut status = 0;
        // SAFETY: non-blocking check on our child.
        if unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) } == pid as i32 {
            killed_at = start.elapsed().as_secs_f64();
            let sig = if libc::WIFSIGNALED(status) {
                libc::WTERMSIG(status)
            } else {
                0
            };
            println!(
                "child ended at {killed_at:.1} s, signal {sig} (9 = SIGKILL from the OOM killer)"
            );
            break;
        }
        let f = frame(&mut pipes, &mut builder);
        let usage = resourcewatch_agent::leak::memory_limit::read_one(&dir)
            .map(|l| l.usage_bytes)
            .unwrap_or(0);
        if half.is_none()
            && usage >= limit / 2
            && let Some(row) = f.leaks.iter().find(|r| r.pid == Some(pid))
            && let Some(tto) = row.time_to_oom_secs
        {
            let t = start.elapsed().as_secs_f64();
            println!(
                "half-way at {t:.1} s: usage {} MiB of {} MiB, confidence {}, growth {:.2} MiB/s, predicted OOM in {tto:.0} s",
                usage >> 20,
                limit >> 20,
                row.confidence,
                row.growth_bytes_per_sec / 1048576.0
            );
            half = Some((t, tto));
        }
        if start.elapsed() > Duration::from_secs(3600) {
            fail(&"no OOM kill within an hour");
        }
    }
    let _ = std::fs::remove_dir(&dir);
    match half {
        Some((t, tto)) => {
            let real = killed_at - t;
            println!(
                "predicted {tto:.1} s, real {real:.1} s from half-way: error {:.1} %",
                100.0 * (tto - real).abs() / real
            );
        }
        None => println!("no prediction was made before half-way"),
    }
}

/// Times what the agent does once a second per tracked JVM: open, read and parse its
/// hsperfdata file.
fn jvm_heap(reads: u32) {
    let dir = std::env::temp_dir().join(format!("rw-jvm-heap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| fail(&e));
    let src = dir.join("Idle.java");
    std::fs::write(
        &src,
        "class Idle { public static void main(String[] a) throws Exception { Thread.sleep(600000); } }",
    )
    .unwrap_or_else(|e| fail(&e));
    let mut java = Command::new("java")
        .args(["-Xmx64m"])
        .arg(&src)
        .spawn()
        .unwrap_or_else(|e| fail(&format!("java: {e}")));
    let pid = java.id();
    let proc_root = std::path::Path::new("/proc");
    let deadline = Instant::now() + Duration::from_secs(30);
    let path = loop {
        if let Some(p) = resourcewatch_agent::leak::jvm::find(proc_root, pid)
            && resourcewatch_agent::leak::jvm::read(&p).is_some()
        {
            break p;
        }
        if Instant::now() > deadline {
            let _ = java.kill();
            fail(&format!("no readable hsperfdata for JVM {pid} within 30 s"));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // Let the JVM's start-up (class loading, JIT) finish: it shares the CPUs.
    std::thread::sleep(Duration::from_secs(5));
    let size = std::fs::metadata(&path).map_or(0, |m| m.len());
    let start = Instant::now();
    let mut sum = 0u64;
    for _ in 0..reads {
        sum = sum.wrapping_add(
            resourcewatch_agent::leak::jvm::read(&path)
                .unwrap_or_else(|| fail(&"the hsperfdata file stopped parsing"))
                .retained_bytes,
        );
    }
    let each = start.elapsed().as_secs_f64() / f64::from(reads.max(1));
    let _ = java.kill();
    let _ = java.wait();
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{reads} reads of {} ({} bytes): {:.1} us each, {:.5} % of a core at one read per second (retained sum {sum})",
        path.display(),
        size,
        each * 1e6,
        each * 100.0
    );
}

/// One profile of `pid` for `seconds`: (samples, walked, kernel ns per sample, user-space
/// us per walked sample, mean user frames per sample, table MiB).
fn unwind_run(
    profiler: &mut resourcewatch_agent::profile::Profiler,
    pid: u32,
    seconds: u64,
    frequency: u64,
) -> (u64, u64, f64, f64, f64, f64) {
    let (cnt0, ns0) = profiler.program_stats();
    let prof = profiler
        .run(
            &resourcewatch_agent::profile::ProfileTarget {
                pids: vec![pid],
                cgroups: vec![],
            },
            frequency,
            Duration::from_secs(seconds),
            &std::sync::atomic::AtomicBool::new(false),
        )
        .unwrap_or_else(|e| fail(&format!("profile: {e}")));
    let (cnt1, ns1) = profiler.program_stats();
    let samples = prof.samples();
    // Every CPU's invocations are in the run time; the target's samples are what it buys.
    let _invocations = cnt1 - cnt0;
    let frames: u64 = prof
        .stacks
        .iter()
        .map(|s| s.user.len() as u64 * s.value)
        .sum();
    (
        samples,
        prof.walked,
        (ns1 - ns0) as f64 / samples.max(1) as f64,
        prof.walk_time.as_secs_f64() * 1e6 / prof.walked.max(1) as f64,
        frames as f64 / samples.max(1) as f64,
        prof.table_bytes as f64 / f64::from(1 << 20),
    )
}

fn unwind_cost(cmds: &[String], seconds: u64, frequency: u64, rounds: usize) {
    let _stats = SysctlGuard::set("/proc/sys/kernel/bpf_stats_enabled", "1");
    let mut tables = resourcewatch_agent::profile::Profiler::load(16384)
        .unwrap_or_else(|e| fail(&format!("loading the profiler: {e}")));
    let mut fp = resourcewatch_agent::profile::Profiler::load_frame_pointers_only(16384)
        .unwrap_or_else(|e| fail(&format!("loading the profiler: {e}")));
    // The same as `tables` but for CPython's frames, which it leaves unwalked: what the
    // kernel's walk of them (ebpf/src/python.bpf.h) adds is the difference.
    let mut no_py = resourcewatch_agent::profile::Profiler::load(16384)
        .unwrap_or_else(|e| fail(&format!("loading the profiler: {e}")));
    no_py.without_python_frames();
    println!(
        "{seconds} s profiles at {frequency} Hz, {rounds} rounds per mode, alternating; kernel ns per sample = the profiling program's run_time_ns over the target's samples (its early returns on other CPUs included, the same in both modes)"
    );
    println!(
        "| program | mode | samples | walked | kernel ns/sample | user-space us/walked sample | user frames/sample | tables MiB |\n|---|---|---|---|---|---|---|---|"
    );
    for cmd in cmds {
        let mut child = Command::new("sh")
            .args(["-c", &format!("exec {cmd}")])
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| fail(&format!("{cmd}: {e}")));
        // Past start-up (a runtime's JIT and perf map).
        std::thread::sleep(Duration::from_secs(2));
        let pid = child.id();
        for round in 0..rounds {
            let order = if round % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
            for m in order {
                let (profiler, mode) = match m {
                    0 => (&mut tables, "copy + tables (+ Python frames)"),
                    1 => (&mut no_py, "copy + tables, Python frames off"),
                    _ => (&mut fp, "frame pointers only"),
                };
                let (samples, walked, kns, uus, frames, mib) =
                    unwind_run(profiler, pid, seconds, frequency);
                let uus = if walked > 0 {
                    format!("{uus:.1}")
                } else {
                    "-".to_owned()
                };
                println!(
                    "| `{cmd}` | {mode} | {samples} | {walked} | {kns:.0} | {uus} | {frames:.1} | {mib:.2} |"
                );
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
