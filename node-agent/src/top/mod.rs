//! `resourcewatch-agent top`: a live view of the heaviest processes, read from the kernel
//! pipelines instead of polling /proc; `--json` prints one object per interval for scripts,
//! and without a terminal the plain-text view ([`render`]) is printed per interval.

mod view;

pub use resourcewatch_units::parse_duration;
use resourcewatch_units::{format_bytes, format_duration};
use std::{
    io::{IsTerminal, Write},
    sync::{
        Arc, LazyLock,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use ratatui::crossterm::event;

use crate::{
    pipelines::{PipelineError, PipelineOptions, Pipelines},
    snapshot::{Frame, FrameBuilder},
};

pub struct TopOptions {
    pub k: usize,
    pub interval: Duration,
    pub count: Option<u64>,
    pub json: bool,
    /// With `json`: a tracked process's row only when it changed (see
    /// [`crate::snapshot::ChangedRows`]).
    pub changed_rows: bool,
    pub pipelines: PipelineOptions,
    pub target_pids: Vec<u32>,
    pub target_cgroups: Vec<String>,
    pub alloc_pids: Vec<u32>,
    /// Leaks below this confidence are not listed.
    pub leak_min_confidence: u8,
    /// Nor leaks whose growth has held less than this.
    pub leak_min_growing: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error("--target-cgroup {spec}")]
    Target {
        spec: String,
        #[source]
        source: crate::cgroup_resolver::CgroupError,
    },
    #[error("writing output failed")]
    Output(#[from] std::io::Error),
}

/// Set by SIGINT/SIGTERM (signal-hook): the loop ends after the current frame, so the
/// terminal is restored and no JSON line is cut in half.
static STOP: LazyLock<Arc<AtomicBool>> = LazyLock::new(|| Arc::new(AtomicBool::new(false)));

fn install_signal_handlers() -> std::io::Result<()> {
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, STOP.clone())?;
    }
    Ok(())
}

/// Sleeps until `deadline` in short steps; false if a stop was requested meanwhile.
fn sleep_until(deadline: Instant) -> bool {
    loop {
        if STOP.load(Ordering::SeqCst) {
            return false;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

pub fn run(opts: TopOptions) -> Result<(), TopError> {
    install_signal_handlers()?;
    let mut pipes = Pipelines::load(opts.pipelines.clone())?;
    let layout = pipes.cgroup_layout().clone();
    let cgroups = opts
        .target_cgroups
        .iter()
        .map(|s| {
            layout.resolve_target(s).map_err(|source| TopError::Target {
                spec: s.clone(),
                source,
            })
        })
        .collect::<Result<Vec<u64>, _>>()?;
    if !opts.target_pids.is_empty() || !cgroups.is_empty() {
        pipes.set_targets(&opts.target_pids, &cgroups)?;
    }
    for &pid in &opts.alloc_pids {
        pipes.trace_allocations(pid)?;
    }
    let mut builder = FrameBuilder::new(opts.k, Some(layout.clone()));
    builder.watched_cgroups = opts
        .target_cgroups
        .iter()
        .zip(&cgroups)
        .filter_map(|(spec, id)| cgroup_path(&layout, spec).map(|p| (*id, p)))
        .collect();
    builder.leak_min_confidence = opts.leak_min_confidence;
    if opts.changed_rows {
        builder.changed_rows = Some(Default::default());
    }
    builder.leak_min_growing_secs = opts.leak_min_growing.as_secs_f64();
    let interactive = !opts.json && std::io::stdout().is_terminal();
    let mut screen = if interactive {
        Some(Screen::enter(opts.k)?)
    } else {
        None
    };

    // The first epoch starts at load; close it after one interval, then on a fixed
    // schedule so intervals don't drift by the time spent rendering.
    let start = Instant::now();
    let mut n: u64 = 0;
    pipes.close_cpu_epoch();
    loop {
        n += 1;
        let deadline = start + opts.interval * n as u32;
        // Woken each second inside a longer interval: the kernel's samples are drained
        // (the ring never fills) and the watched containers' charges read, a point per
        // second whatever the interval (`FrameBuilder::observe_charges`).
        let go_on = loop {
            let step = deadline.min(Instant::now() + Duration::from_secs(1));
            let go_on = match &mut screen {
                Some(s) => !s.wait_for_quit(step)?,
                None => sleep_until(step),
            };
            if !go_on || step >= deadline {
                break go_on;
            }
            pipes.drain_samples(|s| builder.observe_sample(s));
            builder.observe_charges(crate::procfs::monotonic_ns());
        };
        if !go_on {
            break;
        }
        let epoch = pipes.close_cpu_epoch();
        pipes.drain_samples(|s| builder.observe_sample(s));
        let frame = builder.build(&mut pipes, &epoch);
        if opts.json {
            // One buffer per frame: stdout's own is line-buffered and scans every one of
            // serde's small writes for a newline (a frame of 5,000 tracked processes is
            // ~2 MB; that scan was a tenth of the agent's CPU at 100 ms).
            let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
            serde_json::to_writer(&mut out, &frame).map_err(std::io::Error::other)?;
            out.write_all(b"\n")?;
            out.flush()?;
        } else if let Some(s) = &mut screen {
            s.show(frame)?;
        } else {
            print!("{}", render(&frame, opts.k));
        }
        if opts.count.is_some_and(|c| n >= c) {
            break;
        }
    }
    Ok(())
}

/// A `--target-cgroup` spec as a path inside the hierarchy (None for a bare id).
fn cgroup_path(layout: &crate::cgroup_resolver::CgroupLayout, spec: &str) -> Option<String> {
    if spec.parse::<u64>().is_ok() {
        return None;
    }
    let p = std::path::Path::new(spec);
    match p.strip_prefix(layout.root()) {
        Ok(rel) => Some(format!("/{}", rel.display())),
        Err(_) if p.starts_with("/sys/fs/cgroup") => None,
        Err(_) => Some(format!("/{}", spec.trim_start_matches('/'))),
    }
}

/// The interactive terminal (ratatui: alternate screen, raw mode), restored on drop.
struct Screen {
    term: ratatui::DefaultTerminal,
    view: view::View,
    last: Option<Frame>,
}

impl Screen {
    fn enter(k: usize) -> std::io::Result<Self> {
        let mut s = Self {
            term: ratatui::try_init()?,
            view: view::View::new(k),
            last: None,
        };
        s.redraw()?;
        Ok(s)
    }

    /// Handles keys until `deadline`; true if the user quit.
    fn wait_for_quit(&mut self, deadline: Instant) -> std::io::Result<bool> {
        loop {
            if STOP.load(Ordering::SeqCst) {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            if !event::poll(left.min(Duration::from_millis(50)))? {
                continue;
            }
            match event::read()? {
                event::Event::Key(k) if k.kind == event::KeyEventKind::Press => {
                    match self.view.handle(k, self.last.as_ref()) {
                        view::Action::Quit => return Ok(true),
                        view::Action::Redraw => self.redraw()?,
                        view::Action::Nothing => {}
                    }
                }
                event::Event::Resize(..) => self.redraw()?,
                _ => {}
            }
        }
    }

    fn show(&mut self, frame: Frame) -> std::io::Result<()> {
        self.last = Some(frame);
        self.redraw()
    }

    fn redraw(&mut self) -> std::io::Result<()> {
        let (view, last) = (&mut self.view, self.last.as_ref());
        self.term.draw(|s| view.draw(s, last))?;
        Ok(())
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

/// The text view: CPU and memory Top-K, then exact targets, allocations and leaks.
pub fn render(f: &Frame, k: usize) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "resourcewatch top — interval {:.3}s, top {k}; kernel samples {} (lost {})   q to quit",
        f.interval_ns as f64 / 1e9,
        f.kernel.samples,
        f.kernel.samples_lost
    );
    render_rankings(&mut s, f);
    if !f.targets.is_empty() {
        render_targets(&mut s, f);
    }
    if !f.allocations.is_empty() {
        render_allocations(&mut s, f);
    }
    if !f.leaks.is_empty() {
        render_leaks(&mut s, f);
    }
    if !f.oom_kills.is_empty() {
        render_oom_kills(&mut s, f);
    }
    s
}

/// The first `n` characters of an id, or `-`.
fn short(id: &Option<String>, n: usize) -> String {
    id.as_deref()
        .map(|v| v.chars().take(n).collect())
        .unwrap_or_else(|| "-".to_owned())
}

/// A command name cut like top does, so columns stay aligned (kernel threads have long
/// names).
fn comm(c: &Option<String>) -> String {
    c.as_deref()
        .unwrap_or("<exited>")
        .chars()
        .take(16)
        .collect()
}

/// The CPU and memory Top-K.
fn render_rankings(s: &mut String, f: &Frame) {
    use std::fmt::Write as _;
    let _ = writeln!(s, "\nCPU");
    let _ = writeln!(s, "  PID      CPU%  COMMAND          CONTAINER     POD");
    for r in &f.cpu {
        let _ = writeln!(
            s,
            "  {:<7} {:>6.1}  {:<16} {:<13} {}",
            r.pid,
            r.cpu_percent,
            comm(&r.who.comm),
            short(&r.who.container_id, 12),
            short(&r.who.pod_uid, 36)
        );
    }
    let _ = writeln!(s, "\nMEMORY");
    let _ = writeln!(s, "  PID          RSS  COMMAND          CONTAINER     POD");
    for r in &f.memory {
        let _ = writeln!(
            s,
            "  {:<7} {:>10}  {:<16} {:<13} {}",
            r.pid,
            format_bytes(r.rss_bytes),
            comm(&r.who.comm),
            short(&r.who.container_id, 12),
            short(&r.who.pod_uid, 36)
        );
    }
}

fn render_targets(s: &mut String, f: &Frame) {
    use std::fmt::Write as _;
    let _ = writeln!(s, "\nTARGETS (exact)");
    let _ = writeln!(
        s,
        "  PID      CPU%         RSS        ANON        FILE  COMMAND"
    );
    for r in &f.targets {
        let _ = writeln!(
            s,
            "  {:<7} {:>6.1}  {:>10}  {:>10}  {:>10}  {}{}",
            r.pid,
            r.cpu_percent,
            format_bytes(r.rss_bytes),
            format_bytes(r.anon_bytes),
            format_bytes(r.file_bytes),
            comm(&r.who.comm),
            if r.exited { " (exited)" } else { "" }
        );
    }
}

fn render_allocations(s: &mut String, f: &Frame) {
    use std::fmt::Write as _;
    let _ = writeln!(s, "\nALLOCATIONS (libc uprobes)");
    let _ = writeln!(s, "  PID      OUTSTANDING      ALLOCS       FREES  COMMAND");
    for r in &f.allocations {
        let _ = writeln!(
            s,
            "  {:<7} {:>12}  {:>10}  {:>10}  {}",
            r.pid,
            format_bytes(r.outstanding_bytes.max(0) as u64),
            r.allocs,
            r.frees,
            comm(&r.who.comm)
        );
    }
}

fn render_leaks(s: &mut String, f: &Frame) {
    use std::fmt::Write as _;
    let _ = writeln!(s, "\nLEAKS");
    let _ = writeln!(
        s,
        "  PID     CONF    GROWTH/s         RSS       LIMIT   OOM IN  COMMAND"
    );
    for r in &f.leaks {
        let _ = writeln!(
            s,
            "  {:<7} {:>4}  {:>10}  {:>10}  {:>10}  {:>7}  {}",
            r.pid
                .map(|p| p.to_string())
                .unwrap_or_else(|| "cgroup".into()),
            r.confidence,
            format_bytes(r.growth_bytes_per_sec.max(0.0) as u64),
            format_bytes(r.rss_bytes),
            r.limit_bytes
                .map(format_bytes)
                .unwrap_or_else(|| "none".into()),
            r.time_to_oom_secs
                .map(|t| format_duration(Duration::from_secs_f64(t.max(0.0))))
                .unwrap_or_else(|| "none".into()),
            r.who
                .comm
                .as_deref()
                .or(r.who.cgroup.as_deref())
                .unwrap_or("<exited>")
        );
    }
}

fn render_oom_kills(s: &mut String, f: &Frame) {
    use std::fmt::Write as _;
    let _ = writeln!(s, "\nOOM KILLS (since the last frame)");
    let _ = writeln!(
        s,
        "  PID     SCOPE          RSS       LIMIT  PREDICTED  COMMAND / CGROUP"
    );
    for k in &f.oom_kills {
        let _ = writeln!(
            s,
            "  {:<7} {:<6}  {:>10}  {:>10}  {:<9}  {} {}",
            k.pid,
            if k.system_wide { "node" } else { "cgroup" },
            format_bytes(k.rss_bytes),
            format_bytes(k.limit_bytes),
            if k.predictions.is_empty() {
                "no"
            } else {
                "yes"
            },
            comm(&k.who.comm),
            k.limit_cgroup.as_deref().unwrap_or("")
        );
    }
}
