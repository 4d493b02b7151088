//! leak-sim: a process that leaks anonymous memory at a set rate, or one of the stable
//! patterns a leak detector must not flag.
//!
//! leak-sim --pattern leak --rate 1MiB/s [--baseline 10MiB] [--duration 60s]
//! leak-sim --pattern flat|sawtooth|plateau|bursty|pagecache|burn [...]

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use resourcewatch_workloads::{MIB, Pattern, parse_bytes, run};

fn usage(msg: &str) -> ! {
    eprintln!("leak-sim: {msg}");
    eprintln!(
        "usage: leak-sim --pattern leak|flat|sawtooth|plateau|bursty|pagecache|burn [--rate R/s] [--baseline B] [--delay S] \
         [--size B] [--period S] [--cap B] [--tau S] [--seed N] [--duration S]"
    );
    std::process::exit(64)
}

/// The workspace's duration grammar (`500ms`, `90s`, `2m30s`), and a bare number as
/// seconds, like sleep(1): scripts and pod specs pass `--delay 20`.
fn secs(v: &str) -> Duration {
    let bare = v.parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0);
    bare.map(Duration::from_secs_f64).unwrap_or_else(|| {
        resourcewatch_units::parse_duration(v).unwrap_or_else(|e| usage(&e.to_string()))
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let get = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
    };
    let bytes = |name: &str, default: u64| {
        get(name)
            .map(|v| parse_bytes(v).unwrap_or_else(|e| usage(&e.to_string())))
            .unwrap_or(default)
    };
    let pattern = match get("--pattern").unwrap_or("leak") {
        "leak" => Pattern::Leak {
            baseline: bytes("--baseline", 10 * MIB),
            rate: bytes("--rate", MIB),
            delay: get("--delay").map(secs).unwrap_or(Duration::ZERO),
        },
        "flat" => Pattern::Flat {
            size: bytes("--size", 100 * MIB),
        },
        "sawtooth" => Pattern::Sawtooth {
            baseline: bytes("--baseline", 100 * MIB),
            rate: bytes("--rate", 2 * MIB),
            period: get("--period").map(secs).unwrap_or(Duration::from_secs(10)),
        },
        "plateau" => Pattern::Plateau {
            baseline: bytes("--baseline", 50 * MIB),
            cap: bytes("--cap", 60 * MIB),
            tau: get("--tau").map(secs).unwrap_or(Duration::from_secs(10)),
        },
        "bursty" => Pattern::Bursty {
            baseline: bytes("--baseline", 100 * MIB),
            max_burst: bytes("--max-burst", 50 * MIB),
            seed: get("--seed").and_then(|s| s.parse().ok()).unwrap_or(1),
        },
        "pagecache" => Pattern::PageCache {
            size: bytes("--size", 500 * MIB),
            rate: bytes("--rate", 5 * MIB),
        },
        "burn" => Pattern::Burn {
            size: bytes("--size", 4 * MIB),
        },
        other => usage(&format!("unknown pattern {other:?}")),
    };
    let deadline = get("--duration").map(|d| Instant::now() + secs(d));
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            usage(&format!("installing a signal handler: {e}"));
        }
    }
    println!("leak-sim pid {} {:?}", std::process::id(), pattern);
    run(&pattern, &|| {
        stop.load(Ordering::SeqCst) || deadline.is_some_and(|d| Instant::now() >= d)
    });
}
