//! leak-sim: a process that leaks anonymous memory at a set rate, or one of the stable
//! patterns a leak detector must not flag.
//!
//! leak-sim --pattern leak --rate 1MiB/s [--baseline 10MiB] [--duration 60s]
//! leak-sim --pattern flat|sawtooth|plateau|bursty|pagecache|burn [...]
//! leak-sim ... --listen PORT   also answers each TCP connection on PORT with its hostname
//! leak-sim --probe HOST:PORT   connects, prints the answer, exits 0 (1 if unreachable)
//!
//! The last two are the e2e's network checks across nodes: the image has no shell and
//! no other tool, and `kubectl exec POD -- /leak-sim --probe ...` is all a test needs.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream, ToSocketAddrs},
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
         [--size B] [--period S] [--cap B] [--tau S] [--max-burst B] [--seed N] [--duration S] [--listen PORT]\n       \
         leak-sim --probe HOST:PORT"
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

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}

/// Answers every connection on `port` with "leak-sim HOSTNAME\n" (the pod's name).
fn listen(port: u16) {
    let l = TcpListener::bind(("0.0.0.0", port))
        .unwrap_or_else(|e| usage(&format!("listening on {port}: {e}")));
    std::thread::spawn(move || {
        let answer = format!("leak-sim {}\n", hostname());
        for mut c in l.incoming().flatten() {
            let _ = c.write_all(answer.as_bytes());
        }
    });
}

/// Connects to `to` (5 s), prints what it answers within 2 s (a TLS server answers
/// nothing until spoken to: connecting is what counts), and exits.
fn probe(to: &str) -> ! {
    let addr = to
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| usage(&format!("--probe {to:?}: not HOST:PORT")));
    match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
        Ok(mut c) => {
            let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
            let mut buf = [0u8; 256];
            let n = c.read(&mut buf).unwrap_or(0);
            println!(
                "connected to {to}: {}",
                String::from_utf8_lossy(&buf[..n]).trim()
            );
            std::process::exit(0)
        }
        Err(e) => {
            println!("unreachable {to}: {e}");
            std::process::exit(1)
        }
    }
}

/// Every flag takes one value.
const FLAGS: &[&str] = &[
    "--pattern",
    "--rate",
    "--baseline",
    "--delay",
    "--size",
    "--period",
    "--cap",
    "--tau",
    "--max-burst",
    "--seed",
    "--duration",
    "--listen",
    "--probe",
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        usage("help");
    }
    // An unknown flag is refused: ignored, it ran a leak nobody asked for (`--help` did).
    for pair in args.chunks(2) {
        match pair {
            [flag, _] if FLAGS.contains(&flag.as_str()) => {}
            [flag, _] => usage(&format!("unknown flag {flag:?}")),
            [flag] => usage(&format!("{flag:?} without a value")),
            _ => {}
        }
    }
    let get = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
    };
    if let Some(to) = get("--probe") {
        probe(to);
    }
    if let Some(port) = get("--listen") {
        listen(
            port.parse()
                .unwrap_or_else(|_| usage(&format!("--listen {port:?}"))),
        );
    }
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
