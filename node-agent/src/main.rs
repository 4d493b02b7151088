//! `resourcewatch-agent`: `top` (standalone, no cluster), `profile` (CPU stacks of a
//! process or cgroup), `run` (the DaemonSet's agent, driven by the operator) and `probe`
//! (what this node allows).

use std::{process::ExitCode, time::Duration};

use clap::{Args, Parser, Subcommand};
use resourcewatch_agent::{
    capabilities,
    hashpipe::Geometry,
    pipelines::PipelineOptions,
    profile,
    top::{self, TopOptions, parse_duration},
};

#[derive(Parser)]
#[command(
    name = "resourcewatch-agent",
    version,
    about = "resourcewatch node agent: eBPF Top-K, exact targets, leak prediction"
)]
struct Cli {
    /// Log lines as text or JSON (the filter is RESOURCEWATCH_LOG, e.g. debug).
    #[arg(
        long,
        global = true,
        env = "RESOURCEWATCH_LOG_FORMAT",
        default_value = "text"
    )]
    log_format: resourcewatch_runtime::logging::Format,
    /// Never ask a JVM for its perf map. By default a JVM whose stacks are captured (a
    /// profile, a leak's growth sites) is asked every 5 s through HotSpot's attach
    /// mechanism to write /tmp/perf-<pid>.map (what `jcmd PID Compiler.perfmap` does), so
    /// that its compiled Java methods are named.
    #[arg(long, global = true, env = "RESOURCEWATCH_NO_JVM_PERF_MAPS")]
    no_jvm_perf_maps: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Live view of the heaviest processes by CPU and memory, read from the kernel.
    Top(TopArgs),
    /// Sample the CPU stacks of processes or cgroups and write a flame graph, pprof or
    /// folded stacks.
    Profile(ProfileArgs),
    /// Run as the cluster's node agent: connect to the operator, apply its configuration,
    /// stream reports.
    Run(RunArgs),
    /// Report what this kernel and these privileges allow, and what is missing.
    Probe {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct RunArgs {
    /// This node's name (the downward API's spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The operator's gRPC address, e.g. https://10.96.0.20:9443.
    #[arg(long, env = "RESOURCEWATCH_OPERATOR")]
    operator: String,
    /// The operator's namespace: its certificate is checked against
    /// <operator-service>.<namespace>.svc, whatever address is dialled.
    #[arg(
        long,
        env = "OPERATOR_NAMESPACE",
        default_value = "resourcewatch-system"
    )]
    operator_namespace: String,
    /// The operator's Service name (the operator's --service-name).
    #[arg(long, env = "OPERATOR_SERVICE", default_value = resourcewatch_proto::OPERATOR_SERVICE)]
    operator_service: String,
    /// Directory holding ca.crt, tls.crt and tls.key (the agent Secret).
    #[arg(long, default_value = "/etc/resourcewatch/tls")]
    tls_dir: std::path::PathBuf,
    /// The projected ServiceAccount token proving this node (audience
    /// resourcewatch-operator), re-read at every connect.
    #[arg(long, default_value = "/var/run/secrets/resourcewatch/token")]
    token_path: std::path::PathBuf,
    /// Where to serve /metrics, /healthz and /readyz; "off" serves nothing.
    #[arg(long, default_value = "0.0.0.0:9479", value_parser = metrics_addr)]
    metrics_addr: MetricsAddr,
}

#[derive(Clone, Copy, Debug)]
struct MetricsAddr(Option<std::net::SocketAddr>);

fn metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    if s == "off" {
        return Ok(MetricsAddr(None));
    }
    s.parse()
        .map(|a| MetricsAddr(Some(a)))
        .map_err(|e| format!("{s:?}: {e} (an address like 0.0.0.0:9479, or off)"))
}

#[derive(Args)]
struct ProfileArgs {
    /// Profile this process, all its threads (repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pids: Vec<u32>,
    /// Profile every process of this cgroup: a path in the cgroup hierarchy, a
    /// /sys/fs/cgroup/... directory, or a cgroup id (repeatable).
    #[arg(long = "cgroup", value_name = "CGROUP")]
    cgroups: Vec<String>,
    /// How long to sample, e.g. 10s, 1m (Ctrl-C stops early and still writes the output).
    #[arg(long, short = 'd', default_value = "10s", value_parser = profile_duration)]
    duration: Duration,
    /// Samples per second per CPU (software cpu-clock).
    #[arg(long, short = 'F', default_value_t = 99, value_parser = clap::value_parser!(u64).range(1..=profile::MAX_FREQUENCY_HZ))]
    frequency: u64,
    /// Output format.
    #[arg(long, short = 'f', value_enum, default_value = "svg")]
    format: profile::Format,
    /// Write here instead of standard output.
    #[arg(long, short = 'o')]
    output: Option<std::path::PathBuf>,
    /// Distinct stacks the kernel can hold (512 bytes each).
    #[arg(long, default_value_t = 16384, value_parser = clap::value_parser!(u32).range(64..=1_048_576))]
    stack_entries: u32,
}

fn profile_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_millis(100) || d > Duration::from_secs(3600) {
        return Err(format!("{s}: a profile lasts 100ms to 1h"));
    }
    Ok(d)
}

#[derive(Args)]
struct TopArgs {
    /// How many processes per list.
    #[arg(long, short = 'k', default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    k: u32,
    /// Refresh interval, e.g. 10ms, 500ms, 2s (at least 10ms).
    #[arg(long, short = 'i', default_value = "2s", value_parser = interval)]
    interval: Duration,
    /// Exit after this many intervals.
    #[arg(long, short = 'n')]
    count: Option<u64>,
    /// Print one JSON object per interval instead of the live view.
    #[arg(long)]
    json: bool,
    /// With --json: print an exactly tracked process's row only when its figures changed
    /// since it was last printed (no row: unchanged, no CPU this interval); exits are
    /// always printed. Thousands of sleeping processes then cost no output.
    #[arg(long, requires = "json")]
    changed_rows: bool,
    /// Track this PID exactly, beside the sketch (repeatable).
    #[arg(long = "target-pid", value_name = "PID")]
    target_pids: Vec<u32>,
    /// Track every process of this cgroup exactly: a path in the cgroup hierarchy, a
    /// /sys/fs/cgroup/... directory, or a cgroup id (repeatable).
    #[arg(long = "target-cgroup", value_name = "CGROUP")]
    target_cgroups: Vec<String>,
    /// Allocation mode: trace libc malloc/calloc/realloc/free/mmap/munmap of this PID
    /// (≈1.6 µs per call; repeatable).
    #[arg(long = "alloc-pid", value_name = "PID")]
    alloc_pids: Vec<u32>,
    /// List leaks from this confidence (0-100) up.
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u8).range(0..=100))]
    leak_min_confidence: u8,
    /// List leaks only once their growth has held this long (e.g. 2m: a start-up filling
    /// caches and heaps is not listed; node-agent/LEAKS.md measures the delay it costs).
    #[arg(long, default_value = "0s", value_parser = top::parse_duration)]
    leak_min_growing: std::time::Duration,
    /// HashPipe stages (1-8).
    #[arg(long, default_value_t = 4)]
    sketch_depth: u32,
    /// HashPipe slots per stage (a power of two, 2-65536).
    #[arg(long, default_value_t = 1024)]
    sketch_width: u32,
}

fn interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_millis(10) {
        return Err(format!("{s} is below the 10ms minimum"));
    }
    // A sketch slot holds 2^42 ns of CPU per epoch; with every core busy for a whole
    // interval that bounds the interval (36 min on 2 cores, 34 s on 128).
    let cores = std::thread::available_parallelism()
        .map(|n| n.get() as u64)
        .unwrap_or(1);
    let max = Duration::from_nanos((1u64 << 42) / cores);
    if d > max {
        return Err(format!(
            "{s} is above the {}s maximum on {cores} cores",
            max.as_secs()
        ));
    }
    Ok(d)
}

fn main() -> ExitCode {
    // The reader process (src/reader/): the agent starts this binary again to parse what
    // workloads choose. Dispatched before anything else runs (no thread, no logger):
    // it confines itself first.
    if std::env::args_os().nth(1).is_some_and(|a| a == "reader") {
        let code = resourcewatch_agent::reader::serve::serve();
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    let cli = Cli::parse();
    // The cluster agent logs its life (connections, configurations) by default; the
    // interactive tools only warnings.
    let default = if matches!(cli.command, Command::Run(_)) {
        "info"
    } else {
        "warn"
    };
    if let Err(e) = resourcewatch_runtime::logging::init(cli.log_format, default) {
        eprintln!("resourcewatch-agent: {e}");
        return ExitCode::from(64);
    }
    resourcewatch_agent::stacks::jvm::set_enabled(!cli.no_jvm_perf_maps);
    match cli.command {
        Command::Probe { json } => probe(json),
        Command::Top(args) => run_top(args),
        Command::Profile(args) => run_profile(args),
        Command::Run(args) => run_agent(args),
    }
}

fn probe(json: bool) -> ExitCode {
    let report = capabilities::probe();
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("resourcewatch-agent: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        println!(
            "kernel {}, cgroup {}",
            report.kernel_release,
            report.cgroup_version.as_deref().unwrap_or("unknown")
        );
        for c in &report.checks {
            let mark = if c.ok {
                "ok  "
            } else if c.required {
                "FAIL"
            } else {
                "warn"
            };
            println!("  [{mark}] {:<28} {}", c.name, c.detail);
        }
    }
    if report.fatal().is_some() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}

fn run_agent(a: RunArgs) -> ExitCode {
    if a.node_name.is_empty() {
        eprintln!("resourcewatch-agent run: --node-name (or NODE_NAME) is empty");
        return ExitCode::from(64);
    }
    if a.operator.contains("$(") {
        eprintln!(
            "resourcewatch-agent run: --operator {:?} still holds a $(VAR): the operator's Service did not exist when this pod started; it is picked up at the next restart",
            a.operator
        );
        return ExitCode::from(64);
    }
    let opts = resourcewatch_agent::daemon::RunOptions {
        server_name: resourcewatch_proto::operator_server_name(
            &a.operator_service,
            &a.operator_namespace,
        ),
        node_name: a.node_name,
        operator: a.operator,
        tls_dir: a.tls_dir,
        token_path: a.token_path,
        metrics_addr: a.metrics_addr.0,
    };
    match resourcewatch_agent::daemon::run(opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "resourcewatch-agent run: {}",
                resourcewatch_runtime::error_chain(&e)
            );
            ExitCode::FAILURE
        }
    }
}

fn run_top(a: TopArgs) -> ExitCode {
    let report = capabilities::probe();
    if let Some(why) = report.fatal() {
        eprintln!("resourcewatch-agent top cannot run here: {why}.");
        return ExitCode::from(2);
    }
    let geometry = |depth, width| Geometry::new(depth, width);
    let (cpu, mem) = match (
        geometry(a.sketch_depth, a.sketch_width),
        geometry(a.sketch_depth, a.sketch_width),
    ) {
        (Ok(c), Ok(m)) => (c, m),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("resourcewatch-agent: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = TopOptions {
        k: a.k as usize,
        interval: a.interval,
        count: a.count,
        json: a.json,
        changed_rows: a.changed_rows,
        pipelines: PipelineOptions {
            cpu,
            mem,
            allocation_mode: !a.alloc_pids.is_empty(),
            ..Default::default()
        },
        target_pids: a.target_pids,
        target_cgroups: a.target_cgroups,
        alloc_pids: a.alloc_pids,
        leak_min_confidence: a.leak_min_confidence,
        leak_min_growing: a.leak_min_growing,
    };
    match top::run(opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "resourcewatch-agent top: {}",
                resourcewatch_runtime::error_chain(&e)
            );
            ExitCode::from(2)
        }
    }
}

fn run_profile(a: ProfileArgs) -> ExitCode {
    if a.pids.is_empty() && a.cgroups.is_empty() {
        eprintln!("resourcewatch-agent profile: give --pid or --cgroup");
        return ExitCode::from(2);
    }
    let report = capabilities::probe();
    if let Some(why) = report.fatal() {
        eprintln!("resourcewatch-agent profile cannot run here: {why}.");
        return ExitCode::from(2);
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            eprintln!("resourcewatch-agent profile: installing a signal handler failed: {e}");
            return ExitCode::from(2);
        }
    }
    let opts = profile::CommandOptions {
        pids: a.pids,
        cgroups: a.cgroups,
        duration: a.duration,
        frequency_hz: a.frequency,
        format: a.format,
        stack_entries: a.stack_entries,
    };
    let (bytes, summary) = match profile::command(&opts, &stop) {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "resourcewatch-agent profile: {}",
                resourcewatch_runtime::error_chain(&e)
            );
            return ExitCode::from(2);
        }
    };
    let written = match &a.output {
        Some(path) => std::fs::write(path, &bytes),
        None => std::io::Write::write_all(&mut std::io::stdout().lock(), &bytes),
    };
    if let Err(e) = written {
        eprintln!("resourcewatch-agent profile: writing the output failed: {e}");
        return ExitCode::from(1);
    }
    eprintln!("{summary}");
    if summary.samples == 0 {
        eprintln!(
            "resourcewatch-agent profile: no sample: the target did not run on a CPU (or is gone)"
        );
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
