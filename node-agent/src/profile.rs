//! CPU profiles of chosen processes or cgroups: a software cpu-clock perf event on every
//! CPU at a low frequency runs `rw_profile` (ebpf/src/stacks.bpf.h), which counts the
//! stacks of the profiled tasks only. `resourcewatch-agent profile` is its command line.
//!
//! Software cpu-clock rather than a hardware cycles event: it exists on every machine,
//! VMs without a PMU included (this project's CI), and samples wall time on the CPU,
//! which is what "where does the time go" means for a user.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use aya::{
    Btf, Ebpf,
    maps::{HashMap as BpfHashMap, MapData, RingBuf},
    programs::{
        PerfEvent,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use resourcewatch_ebpf::{maps, programs as progs};

use crate::{
    bpf::{PipelineError, map_err},
    cgroup_resolver::CgroupLayout,
    pipelines::{PipelineOptions, load_object},
    procfs,
    stacks::{self, RawStack, perfmap::PerfMap},
};

/// Highest sampling frequency accepted: 999 Hz is what perf's default of 4000 Hz is
/// mostly throttled to in VMs, and a profiler meant to run in production needs far less.
pub const MAX_FREQUENCY_HZ: u64 = 999;

/// How long the JVMs a profile sampled have, once it ends, to write their perf maps once
/// more (stacks/jvm.rs): an attached JVM answers in milliseconds; one that cannot is
/// named from what it answered during the profile.
pub const LAST_PERF_MAP_WAIT: Duration = Duration::from_secs(2);

/// What to profile.
#[derive(Clone, Debug, Default)]
pub struct ProfileTarget {
    pub pids: Vec<u32>,
    /// Cgroup ids (the inode numbers of their directories, as [`CgroupLayout::cgroup_id`]).
    pub cgroups: Vec<u64>,
}

/// Samples taken, and how.
#[derive(Clone, Debug)]
pub struct Profile {
    pub stacks: Vec<RawStack>,
    pub frequency_hz: u64,
    pub duration: Duration,
    /// Stacks the kernel could not store (maps full); 0 in a complete profile.
    pub lost: u64,
    /// Samples whose user stack was copied and walked with unwind tables (the others
    /// have the kernel's frame-pointer walk only), and the user-space time it took.
    pub walked: u64,
    pub walk_time: Duration,
    /// Unwind-table bytes read for the walks (stacks/unwind.rs).
    pub table_bytes: usize,
    /// The perf maps of the JVMs sampled, as they answered during the profile and at its
    /// end (stacks/jvm.rs): what names their JIT-compiled frames.
    pub jvm_maps: HashMap<u32, Arc<PerfMap>>,
}

impl Profile {
    pub fn samples(&self) -> u64 {
        self.stacks.iter().map(|s| s.value).sum()
    }

    /// A symboliser for these stacks: JIT-compiled Java frames named from the maps the
    /// JVMs answered while they were sampled.
    pub fn symbolizer(&self) -> stacks::Symbolizer {
        stacks::Symbolizer::new().with_perf_maps(self.jvm_maps.clone())
    }

    /// CPU time one sample stands for.
    pub fn period_ns(&self) -> i64 {
        (1_000_000_000 / self.frequency_hz.max(1)) as i64
    }
}

/// The loaded profiling program (not attached between profiles).
pub struct Profiler {
    /// Stack samples to unwind in user space (taken out of `bpf`; dropped before it).
    samples: RingBuf<MapData>,
    unwinder: stacks::unwind::Unwinder,
    /// CPython processes listed for the kernel's frame walk, JVMs asked for perf maps.
    runtimes: stacks::Runtimes,
    bpf: Ebpf,
    ncpus: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error("the sampling frequency must be 1..={MAX_FREQUENCY_HZ} Hz, not {0}")]
    Frequency(u64),
    #[error("nothing to profile: give a PID or a cgroup")]
    NoTarget,
    #[error("more than 64 {0} to profile")]
    TooMany(&'static str),
    /// `why` names the OS error and, when the kernel refused, what allows it: the profile's
    /// status shows this message alone, and aya's error keeps the errno in its source.
    #[error("perf_event_open of cpu-clock on CPU {cpu} failed: {why}")]
    Attach {
        cpu: u32,
        why: String,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
}

/// Why perf_event_open was refused, in words a node's admin can act on. Debian's and
/// Ubuntu's kernels add `kernel.perf_event_paranoid` levels above 2 (Debian's 6.1 defaults
/// to 3) under which only CAP_SYS_ADMIN may open a perf event, whatever CAP_PERFMON says:
/// measured on the e2e's Debian 6.1 node, where the agent's profiles failed with EACCES.
fn attach_failure(e: &aya::programs::ProgramError) -> String {
    let io = std::error::Error::source(e).and_then(|s| s.downcast_ref::<std::io::Error>());
    let os = io.map_or_else(|| e.to_string(), |io| io.to_string());
    let refused = io
        .and_then(std::io::Error::raw_os_error)
        .is_some_and(|c| c == libc::EACCES || c == libc::EPERM);
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|v| v.trim().parse::<i32>().ok());
    match paranoid {
        Some(level) if refused && level > 2 => format!(
            "{os}: kernel.perf_event_paranoid is {level}, a distribution's level above 2 that \
             allows perf events only with CAP_SYS_ADMIN; set it to 2 on the node (sysctl), or \
             give the agent CAP_SYS_ADMIN"
        ),
        Some(level) if refused => {
            format!("{os} (kernel.perf_event_paranoid {level}; the agent needs CAP_PERFMON)")
        }
        _ => os,
    }
}

impl Profiler {
    /// Loads the object with stack maps of `stack_entries` and the profiling program.
    pub fn load(stack_entries: u32) -> Result<Self, ProfileError> {
        // 256 samples: 50 ms of a profile at 999 Hz on 5 CPUs.
        Self::load_with(stack_entries, 4 << 20)
    }

    /// A profiler that walks by frame pointers only, as before stacks were copied: its
    /// ring buffer (one page) holds no sample. For measuring what the copies cost.
    pub fn load_frame_pointers_only(stack_entries: u32) -> Result<Self, ProfileError> {
        Self::load_with(stack_entries, procfs::page_size() as u32)
    }

    fn load_with(stack_entries: u32, stack_sample_bytes: u32) -> Result<Self, ProfileError> {
        let btf = Btf::from_sys_fs().map_err(PipelineError::NoBtf)?;
        let ncpus = procfs::possible_cpus().map_err(PipelineError::Cpus)?;
        let layout = CgroupLayout::detect().map_err(PipelineError::from)?;
        let opts = PipelineOptions {
            stack_entries,
            stack_sample_bytes,
            ..Default::default()
        };
        let mut bpf = load_object(&opts, &btf, ncpus, &layout)?;
        let program = progs::PROFILE;
        let prog: &mut PerfEvent = bpf
            .program_mut(program)
            .ok_or(PipelineError::MissingProgram(program))?
            .try_into()
            .map_err(|e| program_err(program, e))?;
        prog.load().map_err(|e| program_err(program, e))?;
        let samples = RingBuf::try_from(
            bpf.take_map(maps::STACK_SAMPLES)
                .ok_or(PipelineError::MissingMap(maps::STACK_SAMPLES))?,
        )
        .map_err(crate::bpf::map_err(maps::STACK_SAMPLES))?;
        let mut runtimes = stacks::Runtimes::take(&mut bpf)?;
        runtimes.keep_jvm_maps();
        Ok(Self {
            samples,
            unwinder: stacks::unwind::Unwinder::new(),
            runtimes,
            bpf,
            ncpus,
        })
    }

    /// Samples `target` at `frequency_hz` for `duration` (or until `stop` is set), then
    /// detaches and returns the stacks, still unnamed.
    pub fn run(
        &mut self,
        target: &ProfileTarget,
        frequency_hz: u64,
        duration: Duration,
        stop: &AtomicBool,
    ) -> Result<Profile, ProfileError> {
        if !(1..=MAX_FREQUENCY_HZ).contains(&frequency_hz) {
            return Err(ProfileError::Frequency(frequency_hz));
        }
        if target.pids.is_empty() && target.cgroups.is_empty() {
            return Err(ProfileError::NoTarget);
        }
        self.set_targets(target)?;
        let lost_before = self.stacks_lost();
        let ncpus = self.ncpus;
        let prog = self.program()?;
        let mut links = Vec::new();
        for cpu in 0..ncpus {
            match prog.attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(frequency_hz),
                false,
            ) {
                Ok(link) => links.push(link),
                // A possible but offline CPU runs nothing.
                Err(e) if offline(&e) => {}
                Err(e) => {
                    for l in links {
                        let _ = prog.detach(l);
                    }
                    return Err(ProfileError::Attach {
                        cpu,
                        why: attach_failure(&e),
                        source: Box::new(e),
                    });
                }
            }
        }
        const HELD_WAIT: Duration = Duration::from_secs(5);
        let start = Instant::now();
        // Samples are walked as they come, while the processes (and their mappings) are
        // there: every 50 ms, well before the ring buffer (256 samples) fills at 999 Hz
        // on a few CPUs.
        let mut walked = HashMap::new();
        let mut walk_time = Duration::ZERO;
        while start.elapsed() < duration && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(
                Duration::from_millis(50).min(duration.saturating_sub(start.elapsed())),
            );
            walk_time += self.read_samples(&mut walked)?;
        }
        let elapsed = start.elapsed();
        let prog = self.program()?;
        for l in links {
            let _ = prog.detach(l);
        }
        walk_time += self.read_samples(&mut walked)?;
        // Samples of processes whose tables were still being read: walked with them
        // when they come in time (a profile is not the agent's engine: it may wait).
        let t = Instant::now();
        self.unwinder.wait_loaded(HELD_WAIT);
        stacks::settle(
            &mut self.unwinder,
            &mut self.runtimes,
            &mut walked,
            None,
            true,
        );
        walk_time += t.elapsed();
        // Asked once more now: code compiled since the last answer is in no map yet.
        let jvm_maps = self.runtimes.jvm_maps(LAST_PERF_MAP_WAIT);
        let mut stacks = stacks::sampled(walked);
        let walked: u64 = stacks.iter().map(|s| s.value).sum();
        let table_bytes = self.unwinder.table_bytes();
        // What the walks cached (tables, mappings) is not kept from one profile to the next.
        self.unwinder = stacks::unwind::Unwinder::new();
        self.runtimes.clear();
        stacks.extend(stacks::drain(
            &mut self.bpf,
            maps::PROFILE_COUNTS,
            maps::PROFILE_STACKS,
        )?);
        Ok(Profile {
            stacks,
            frequency_hz,
            duration: elapsed,
            lost: self.stacks_lost().saturating_sub(lost_before),
            walked,
            walk_time,
            table_bytes,
            jvm_maps,
        })
    }

    /// Walks the stack samples waiting in the ring buffer into `walked`; the time it took.
    fn read_samples(&mut self, walked: &mut stacks::Walked) -> Result<Duration, PipelineError> {
        let t = Instant::now();
        stacks::read_samples(
            &mut self.samples,
            &self.bpf,
            maps::PROFILE_STACKS,
            &mut self.unwinder,
            &mut self.runtimes,
            walked,
            None,
        )?;
        Ok(t.elapsed())
    }

    /// Leaves CPython's frames unwalked (the native walk only): for measuring what the
    /// kernel's walk of them costs per sample.
    pub fn without_python_frames(&mut self) {
        self.runtimes.clear();
        self.runtimes.python.enabled = false;
    }

    /// The loaded profiling program.
    fn program(&mut self) -> Result<&mut PerfEvent, PipelineError> {
        let program = progs::PROFILE;
        self.bpf
            .program_mut(program)
            .ok_or(PipelineError::MissingProgram(program))?
            .try_into()
            .map_err(|e| program_err(program, e))
    }

    fn set_targets(&mut self, target: &ProfileTarget) -> Result<(), ProfileError> {
        if target.pids.len() > 64 {
            return Err(ProfileError::TooMany("processes"));
        }
        if target.cgroups.len() > 64 {
            return Err(ProfileError::TooMany("cgroups"));
        }
        replace_keys(&mut self.bpf, maps::PROFILE_PIDS, &target.pids)?;
        // A CPython process named is listed for the frame walk before its first sample,
        // a JVM asked for its perf map (one in a profiled cgroup is, at its first sample).
        for &pid in &target.pids {
            self.runtimes.seen_within(pid, Duration::from_secs(5));
            // Its unwind rules asked for now, and waited for below: its first samples
            // are walked with them, not held (a profile is not the agent's engine).
            self.unwinder.refresh(pid, 0);
        }
        self.unwinder.wait_loaded(Duration::from_secs(10));
        replace_keys(&mut self.bpf, maps::PROFILE_CGROUPS, &target.cgroups)?;
        Ok(())
    }

    /// The profiling program's run count and total run time, from the kernel's own
    /// accounting (counted only while `kernel.bpf_stats_enabled=1`).
    pub fn program_stats(&self) -> (u64, u64) {
        use std::os::fd::{AsFd, AsRawFd};
        let Some(fd) = self
            .bpf
            .program(progs::PROFILE)
            .and_then(|p| p.fd().ok())
            .map(|fd| fd.as_fd().as_raw_fd())
        else {
            return (0, 0);
        };
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap_or_default();
        let field = |k: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        (field("run_cnt:"), field("run_time_ns:"))
    }

    fn stacks_lost(&self) -> u64 {
        crate::bpf::read_stat(&self.bpf, resourcewatch_ebpf::shared::stat::STACKS_LOST)
    }
}

fn program_err(program: &'static str, e: aya::programs::ProgramError) -> PipelineError {
    PipelineError::Program {
        program,
        tracepoint: "perf_event cpu-clock",
        source: Box::new(e),
    }
}

fn offline(e: &aya::programs::ProgramError) -> bool {
    match e {
        aya::programs::ProgramError::SyscallError(s) => {
            matches!(s.io_error.raw_os_error(), Some(libc::ENODEV | libc::ENXIO))
        }
        _ => false,
    }
}

/// Output formats of `resourcewatch-agent profile`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Folded stacks, one line per stack: `comm;root;...;leaf count`.
    Folded,
    /// An SVG flame graph (inferno).
    Svg,
    /// A gzipped pprof protobuf (`go tool pprof`, Pyroscope, Grafana).
    Pprof,
}

/// `resourcewatch-agent profile`, resolved from the command line.
#[derive(Clone, Debug)]
pub struct CommandOptions {
    pub pids: Vec<u32>,
    /// Cgroups as `top --target-cgroup` takes them: a path in the hierarchy, a
    /// /sys/fs/cgroup/... directory, or an id.
    pub cgroups: Vec<String>,
    pub duration: Duration,
    pub frequency_hz: u64,
    pub format: Format,
    pub stack_entries: u32,
}

/// What a profile found, for the summary printed beside the output.
#[derive(Clone, Debug)]
pub struct Summary {
    pub samples: u64,
    pub stacks: usize,
    pub lost: u64,
    pub duration: Duration,
    /// The functions most often on top of the user stack (the "self" time), with samples.
    pub hottest: Vec<(String, u64)>,
    /// Samples walked with unwind tables, the time the walks took and the tables' bytes.
    pub walked: u64,
    pub walk_time: Duration,
    pub table_bytes: usize,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} samples in {:.1} s, {} distinct stacks",
            self.samples,
            self.duration.as_secs_f64(),
            self.stacks
        )?;
        if self.lost > 0 {
            write!(
                f,
                ", {} stacks lost (maps full: raise --stack-entries)",
                self.lost
            )?;
        }
        if self.walked > 0 {
            write!(
                f,
                "; {} walked with unwind tables ({:.1} us each, {:.1} MiB of tables)",
                self.walked,
                self.walk_time.as_secs_f64() * 1e6 / self.walked as f64,
                self.table_bytes as f64 / f64::from(1 << 20)
            )?;
        }
        for (name, n) in &self.hottest {
            write!(
                f,
                "\n  {:5.1} %  {name}",
                *n as f64 * 100.0 / self.samples.max(1) as f64
            )?;
        }
        Ok(())
    }
}

/// Runs a profile and renders it; stops early (and still renders) when `stop` is set.
pub fn command(
    opts: &CommandOptions,
    stop: &AtomicBool,
) -> Result<(Vec<u8>, Summary), CommandError> {
    let mut profiler = Profiler::load(opts.stack_entries)?;
    let layout = CgroupLayout::detect().map_err(PipelineError::from)?;
    let cgroups = opts
        .cgroups
        .iter()
        .map(|s| {
            layout
                .resolve_target(s)
                .map_err(|source| CommandError::Cgroup {
                    spec: s.clone(),
                    source,
                })
        })
        .collect::<Result<Vec<u64>, _>>()?;
    let target = ProfileTarget {
        pids: opts.pids.clone(),
        cgroups,
    };
    let profile = profiler.run(&target, opts.frequency_hz, opts.duration, stop)?;
    let rendered = Rendered::new(&profile, &profile.symbolizer());
    let out = match opts.format {
        Format::Folded => rendered.folded().into_bytes(),
        Format::Svg => rendered.svg().map_err(CommandError::Render)?,
        Format::Pprof => rendered
            .pprof(|_| Vec::new())
            .map_err(CommandError::Render)?,
    };
    Ok((out, rendered.summary))
}

/// A profile with its frames named, ready for any of the three formats.
pub struct Rendered {
    pub named: Vec<stacks::Stack>,
    pub summary: Summary,
    frequency_hz: u64,
    period_ns: i64,
}

impl Rendered {
    pub fn new(profile: &Profile, sym: &stacks::Symbolizer) -> Self {
        let named = stacks::name(&profile.stacks, sym, procfs::comm);
        let mut self_time: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
        for s in &named {
            // The leaf of the user part: kernel frames sit above it.
            let user = s.frames.len() - s.kernel_frames;
            if let Some(f) = s.frames[..user].last() {
                *self_time.entry(f.as_str()).or_default() += s.value;
            }
        }
        let mut hottest: Vec<(String, u64)> = self_time
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        hottest.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        hottest.truncate(5);
        let summary = Summary {
            samples: profile.samples(),
            stacks: named.len(),
            lost: profile.lost,
            duration: profile.duration,
            hottest,
            walked: profile.walked,
            walk_time: profile.walk_time,
            table_bytes: profile.table_bytes,
        };
        Self {
            named,
            summary,
            frequency_hz: profile.frequency_hz,
            period_ns: profile.period_ns(),
        }
    }

    pub fn folded(&self) -> String {
        stacks::output::folded(&self.named)
    }

    pub fn svg(&self) -> std::io::Result<Vec<u8>> {
        let title = format!(
            "CPU: {} samples at {} Hz over {:.1} s",
            self.summary.samples,
            self.frequency_hz,
            self.summary.duration.as_secs_f64()
        );
        stacks::output::svg(&self.named, &title, "samples")
    }

    /// pprof, each sample labelled with its process (`pid`, `process`) and the labels
    /// `more` gives its stack (the pod and container of a cluster profile).
    pub fn pprof(
        &self,
        more: impl Fn(&stacks::Stack) -> Vec<stacks::output::Label>,
    ) -> std::io::Result<Vec<u8>> {
        use stacks::output::Label;
        stacks::output::pprof(
            &self.named,
            stacks::output::PprofKind {
                sample_type: "samples",
                sample_unit: "count",
                scaled: Some(("cpu", "nanoseconds", self.period_ns)),
                duration: self.summary.duration,
            },
            |s| {
                let mut labels = vec![Label::Number("pid", s.tgid.into())];
                if let Some(c) = &s.comm {
                    labels.push(Label::Text("process", c.clone()));
                }
                labels.extend(more(s));
                labels
            },
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Profile(#[from] ProfileError),
    #[error("--cgroup {spec}")]
    Cgroup {
        spec: String,
        #[source]
        source: crate::cgroup_resolver::CgroupError,
    },
    #[error("rendering the profile failed")]
    Render(#[source] std::io::Error),
}

impl From<PipelineError> for CommandError {
    fn from(e: PipelineError) -> Self {
        Self::Profile(ProfileError::Pipeline(e))
    }
}

/// Makes the hash map `name` hold exactly `keys` (each with the value 1): the filter
/// sets the perf-event program checks.
fn replace_keys<K: aya::Pod + Copy>(
    bpf: &mut aya::Ebpf,
    name: &'static str,
    keys: &[K],
) -> Result<(), PipelineError> {
    let mut map: BpfHashMap<_, K, u32> =
        BpfHashMap::try_from(bpf.map_mut(name).ok_or(PipelineError::MissingMap(name))?)
            .map_err(map_err(name))?;
    let old: Vec<K> = map.keys().filter_map(Result::ok).collect();
    for k in old {
        let _ = map.remove(&k);
    }
    for k in keys {
        map.insert(*k, 1, 0).map_err(map_err(name))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The status of a refused profile names the errno, and on a kernel above paranoid
    /// level 2 (Debian's 6.1 default) what allows it; aya's own text says only
    /// "`perf_event_open` failed".
    #[test]
    fn a_refused_perf_event_is_explained() {
        let refused = aya::programs::ProgramError::SyscallError(aya::sys::SyscallError {
            call: "perf_event_open",
            io_error: std::io::Error::from_raw_os_error(libc::EACCES),
        });
        let why = attach_failure(&refused);
        assert!(why.contains("Permission denied"), "{why}");
        let level: i32 = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
            .expect("perf_event_paranoid")
            .trim()
            .parse()
            .expect("a level");
        assert_eq!(why.contains("CAP_SYS_ADMIN"), level > 2, "{why}");
        assert!(why.contains("perf_event_paranoid"), "{why}");
        let other = aya::programs::ProgramError::SyscallError(aya::sys::SyscallError {
            call: "perf_event_open",
            io_error: std::io::Error::from_raw_os_error(libc::EMFILE),
        });
        assert!(!attach_failure(&other).contains("paranoid"));
    }
}
