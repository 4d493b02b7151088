//! Benchmarks behind node-agent/BENCHMARKS.md and LEAKS.md (root only), one module per
//! subcommand: `precision`, `cost` (and `profile`), `agent`, `compare`, `leaks` (and
//! `epochs`), `oom`, `jvm`, `unwind`, `reader`, `corpus`; `workload` runs the processes they measure.
//! Each module's own documentation says what it measures.

use std::time::Duration;

use clap::{Parser, Subcommand};

mod agent;
mod compare;
mod corpus;
mod cost;
mod jvm;
mod leaks;
mod oom;
mod precision;
mod reader;
mod record;
mod unwind;
mod workload;
use resourcewatch_agent::{hashpipe::Geometry, top::parse_duration};

#[derive(Parser)]
#[command(about = "resourcewatch benchmarks (root only)")]
struct Cli {
    /// Run the benchmark this many times, each a process of its own, and print the median
    /// and range of every figure over all of them (the reports quote these).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    repeat: Option<u16>,
    /// Keep every run here: its printed output, its figures as JSON with the command,
    /// time, kernel and commit, and the summary (node-agent/bench-runs/ holds the
    /// reports' own). Without --repeat: one run.
    #[arg(long, value_name = "DIR")]
    keep: Option<std::path::PathBuf>,
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
        skew: workload::Skew,
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
        /// (on the faulting process, whose every event is then a page of growth, with a
        /// stack sent about every 256 KiB: the captured process's own worst case).
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
        /// The held-out cases, never used to tune the detector: `--heldout` (or
        /// `--heldout 1`) `leak_corpus::HELDOUT`, `--heldout 2` `leak_corpus::HELDOUT_2`.
        #[arg(long, num_args = 0..=1, default_missing_value = "1", value_name = "SET",
              value_parser = clap::value_parser!(u8).range(1..=2))]
        heldout: Option<u8>,
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
    /// The reader process's round trip per request kind and file, cold and warm.
    Reader {
        /// ELF files to read (their rules and their symbols).
        #[arg(long, required = true)]
        file: Vec<String>,
        #[arg(long, default_value_t = 5)]
        rounds: usize,
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
    if cli.repeat.is_some() || cli.keep.is_some() {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let runs = usize::from(cli.repeat.unwrap_or(1));
        let dir = cli.keep.unwrap_or_else(|| {
            std::env::temp_dir().join(format!("resourcewatch-bench-{}", std::process::id()))
        });
        record::keep_runs(runs, &dir, &record::benchmark_args(&args));
    }
    run_benchmark(cli.cmd);
}

/// The precision and cost benchmarks; the others go to [`run_leak_benchmark`].
fn run_benchmark(cmd: Cmd) {
    match cmd {
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
        } => precision::precision(
            procs,
            churn,
            intervals,
            interval,
            Geometry::new(depth, width).unwrap_or_else(|e| fail(&e)),
            seed,
            workload::Shape { skew, memory_cycle },
        ),
        Cmd::Cost {
            runs,
            loops,
            pin_cpu,
            capture,
        } => cost::cost(runs, loops, pin_cpu, capture),
        Cmd::Profile {
            pairs,
            frequency,
            work,
        } => cost::profile_cost(pairs, frequency, work),
        Cmd::Reader { file, rounds } => reader::reader_cost(&file, rounds),
        Cmd::Unwind {
            cmd,
            seconds,
            frequency,
            rounds,
        } => unwind::unwind_cost(&cmd, seconds, frequency, rounds),
        Cmd::Agent {
            interval,
            duration,
            with_workload,
        } => agent::agent(interval, duration, with_workload),
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
        other => run_leak_benchmark(other),
    }
}

/// The leak and OOM benchmarks: `jvm-heap`, `leaks`, `corpus`, `epochs`, `oom`.
fn run_leak_benchmark(cmd: Cmd) {
    match cmd {
        Cmd::JvmHeap { reads } => jvm::jvm_heap(reads),
        Cmd::Leaks { duration } => leaks::leaks(duration),
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
        } => workload::epochs_under_churn(epochs, epoch, churn),
        Cmd::Oom { limit, rate } => oom::oom(
            resourcewatch_workloads::parse_bytes(&limit).unwrap_or_else(|e| fail(&e)),
            resourcewatch_workloads::parse_bytes(&rate).unwrap_or_else(|e| fail(&e)),
        ),
        _ => unreachable!("run_benchmark takes the others"),
    }
}

fn fail(e: &dyn std::fmt::Display) -> ! {
    eprintln!("resourcewatch-bench: {e}");
    std::process::exit(1)
}
