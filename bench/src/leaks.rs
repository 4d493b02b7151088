//! `leaks` and `epochs`: leak detection on live workload patterns (time to first alert, false alarms on stable ones).

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use resourcewatch_agent::pipelines::{PipelineOptions, Pipelines};

use crate::{
    fail,
    workload::{Workload, fork},
};

pub(crate) fn fork_pattern(p: resourcewatch_workloads::Pattern) -> u32 {
    fork(move || resourcewatch_workloads::run(&p, &|| false))
}

/// One top-like step: close the epoch, feed samples, build a frame with every verdict.
pub(crate) fn frame(
    pipes: &mut Pipelines,
    builder: &mut resourcewatch_agent::snapshot::FrameBuilder,
) -> resourcewatch_agent::snapshot::Frame {
    let epoch = pipes.close_cpu_epoch();
    pipes.drain_samples(|s| builder.observe_sample(s));
    builder.build(pipes, &epoch)
}

/// Leaks begin this long after their process starts, as a leak in a running service does;
/// detection times are measured from the leak's start.
pub(crate) const LEAK_DELAY: Duration = Duration::from_secs(30);

/// A leaking workload: its name, its PID, and once detected the seconds to detection and
/// the measured rate.
type Leaker<'a> = (&'a str, u32, Option<(f64, f64)>);

pub(crate) fn leaks(duration: Duration) {
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
    let stable = stable_patterns();
    let start = Instant::now();
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
    print_tables(&leakers, &calm, &worst, duration);
    let all: Vec<u32> = leakers
        .iter()
        .map(|l| l.1)
        .chain(calm.iter().map(|c| c.1))
        .collect();
    drop(Workload { pids: all });
}

/// The leaks' detection times and the stable patterns' highest confidence, as tables.
fn print_tables(
    leakers: &[Leaker<'_>],
    calm: &[(&str, u32)],
    worst: &HashMap<u32, u8>,
    duration: Duration,
) {
    println!("| leak rate | time to confidence >= 60 | measured growth |");
    println!("|---|---|---|");
    for (name, _, got) in leakers {
        match got {
            Some((t, g)) => {
                crate::record::figure(&format!("time_to_60.{name}"), *t, "s");
                println!("| {name} | {t:.0} s | {:.1} KB/s |", g / 1000.0)
            }
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
    for (name, pid) in calm {
        let c = worst.get(pid).copied().unwrap_or(0);
        crate::record::figure(&format!("highest_confidence.{name}"), f64::from(c), "0-100");
        println!("| {name} | {c} |");
    }
}

/// The patterns that are not leaks: memory that stays flat, cycles, levels off, bursts,
/// or is page cache.
fn stable_patterns() -> [(&'static str, resourcewatch_workloads::Pattern); 5] {
    use resourcewatch_workloads::{MIB, Pattern};
    [
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
    ]
}
