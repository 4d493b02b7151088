//! The leak corpus: real runtimes (CPython, Node.js/V8, the JVM with G1, Go, glibc malloc)
//! and `leak-sim`, each case labelled leak or not-leak, run live by
//! `resourcewatch-bench corpus` and replayed from the traces it records by the tests
//! (`node-agent/corpus/`). What counts as "not a leak", honestly: growth that stops. A
//! not-leak case is judged from 60 s after its growth stopped, i.e. after the last time its
//! container's charge set a high by more than max(2 MiB, 2 %) (a sawtooth's first peak, a
//! warm-up's end); before that, a detector cannot know and may say "leak".

use std::{collections::BTreeMap, fmt::Write as _};

use resourcewatch_agent::leak::{LeakTracker, MemSample, Seed, SeriesKey, detect};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Truth {
    Leak,
    NotLeak,
}

impl Truth {
    pub fn as_str(self) -> &'static str {
        match self {
            Truth::Leak => "leak",
            Truth::NotLeak => "not-leak",
        }
    }
}

/// One workload of the corpus. `argv[0]` names a program of `node-agent/corpus/programs`
/// (`python3`, `node`, `java`, `go`, `arena`) or `leak-sim`; the bench expands it.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub name: &'static str,
    pub truth: Truth,
    /// Bytes per second, for leaks: the goal depends on it.
    pub rate: u64,
    pub argv: &'static [&'static str],
    /// Memory limit of the case's container, bytes.
    pub limit: Option<u64>,
    /// Cases sharing a pod share its cgroup, where `pod_limit` applies (a sidecar).
    pub pod: Option<&'static str>,
    pub pod_limit: Option<u64>,
    /// Seconds into the process when the leak starts (detection goals count from there).
    pub leak_from: f64,
    pub what: &'static str,
    /// A goal this case misses, measured and explained: the detection time (seconds from
    /// the start) or the time-to-OOM error (fraction) the tests hold it to instead, and why.
    /// LEAKS.md lists every one.
    pub known_misses: &'static [KnownMiss],
}

#[derive(Clone, Copy, Debug)]
pub enum KnownMiss {
    /// Kept >= 60 only from `secs`.
    Detection {
        secs: f64,
        why: &'static str,
    },
    /// Reaches 60 within `first_secs` but, in some runs, is not kept (falls below 50
    /// again before the run ends).
    NotKept {
        first_secs: f64,
        why: &'static str,
    },
    /// Like `NotKept`, in the runs recorded before the agent read JVMs' retained heap
    /// (traces without heap rows, runs 1-4); held to the goal in the others.
    NotKeptWithoutHeap {
        first_secs: f64,
        why: &'static str,
    },
    EtaError {
        fraction: f64,
        why: &'static str,
    },
}

impl Case {
    pub fn by_name(name: &str) -> Option<&'static Case> {
        CASES
            .iter()
            .chain(HELDOUT)
            .chain(HELDOUT_2)
            .find(|c| c.name == name)
    }

    /// When the case is allowed not to keep >= 60 in trace `t`: the deadline for its
    /// first >= 60.
    pub fn not_kept_limit(&self, t: &Trace) -> Option<f64> {
        self.known_misses.iter().find_map(|m| match m {
            KnownMiss::NotKept { first_secs, .. } => Some(*first_secs),
            KnownMiss::NotKeptWithoutHeap { first_secs, .. } if !t.has_heap() => Some(*first_secs),
            _ => None,
        })
    }

    /// The detection deadline the tests hold this case to.
    pub fn detection_limit(&self, t: &Trace) -> f64 {
        self.known_misses
            .iter()
            .find_map(|m| match m {
                KnownMiss::Detection { secs, .. } => Some(*secs),
                _ => None,
            })
            .unwrap_or_else(|| goal_secs(t))
    }

    /// The largest time-to-OOM error at half-way the tests accept for this case.
    pub fn eta_error_limit(&self) -> f64 {
        self.known_misses
            .iter()
            .find_map(|m| match m {
                KnownMiss::EtaError { fraction, .. } => Some(*fraction),
                _ => None,
            })
            .unwrap_or(0.15)
    }
}

const MI: u64 = 1 << 20;
const K: u64 = 1000;
const M: u64 = 1_000_000;

const fn leak(
    name: &'static str,
    rate: u64,
    argv: &'static [&'static str],
    limit: Option<u64>,
    what: &'static str,
) -> Case {
    Case {
        name,
        truth: Truth::Leak,
        rate,
        argv,
        limit,
        pod: None,
        pod_limit: None,
        leak_from: 0.0,
        what,
        known_misses: &[],
    }
}

const fn calm(name: &'static str, argv: &'static [&'static str], what: &'static str) -> Case {
    Case {
        name,
        truth: Truth::NotLeak,
        rate: 0,
        argv,
        limit: None,
        pod: None,
        pod_limit: None,
        leak_from: 0.0,
        what,
        known_misses: &[],
    }
}

/// Every case of the corpus. Leaks start with their process unless said otherwise.
pub const CASES: &[Case] = &[
    // ---- leaks ------------------------------------------------------------------------
    leak(
        "sim-8MB-128Mi",
        8 * M,
        &[
            "leak-sim",
            "--pattern",
            "leak",
            "--rate",
            "8MB/s",
            "--baseline",
            "4MiB",
        ],
        Some(128 * MI),
        "leak-sim, 8 MB/s from start into 128Mi",
    ),
    leak(
        "sim-1MB-256Mi",
        M,
        &[
            "leak-sim",
            "--pattern",
            "leak",
            "--rate",
            "1MB/s",
            "--baseline",
            "10MiB",
        ],
        Some(256 * MI),
        "leak-sim, 1 MB/s from start into 256Mi",
    ),
    leak(
        "sim-10KB",
        10 * K,
        &[
            "leak-sim",
            "--pattern",
            "leak",
            "--rate",
            "10KB/s",
            "--baseline",
            "10MiB",
        ],
        None,
        "leak-sim, 10 KB/s from start",
    ),
    leak(
        "py-10MB-512Mi",
        10 * M,
        &["python3", "leak", "rate=10m"],
        Some(512 * MI),
        "CPython, small objects (pymalloc) at 10 MB/s into 512Mi",
    ),
    leak(
        "py-100KB",
        100 * K,
        &["python3", "leak", "rate=100k"],
        None,
        "CPython, 100 KB/s of small objects",
    ),
    leak(
        "py-stairs-200KB",
        200 * K,
        &["python3", "leak", "rate=200k", "every=10"],
        None,
        "CPython, 2 MB at once every 10 s (stair steps)",
    ),
    leak(
        "py-1GiB-64KB-jitter",
        64 * K,
        &["python3", "leak", "rate=64k", "base=1Gi", "jitter=4Mi"],
        None,
        "CPython, 1 GiB heap, 0-4 MiB scratch per request, leaking 64 KB/s",
    ),
    leak(
        "py-1GiB-10KB-jitter",
        10 * K,
        &["python3", "leak", "rate=10k", "base=1Gi", "jitter=4Mi"],
        None,
        "CPython, 1 GiB heap, 0-4 MiB scratch, leaking 10 KB/s",
    ),
    leak(
        "py-4GiB-30KB-jitter",
        30 * K,
        &["python3", "leak", "rate=30k", "base=4Gi", "jitter=8Mi"],
        None,
        "CPython, 4 GiB heap, 0-8 MiB scratch, leaking 30 KB/s",
    ),
    leak(
        "py-child-1MB-200Mi",
        M,
        &["python3", "child", "rate=1m"],
        Some(200 * MI),
        "CPython worker process (forked child) leaking 1 MB/s into 200Mi",
    ),
    Case {
        known_misses: &[KnownMiss::EtaError {
            fraction: 0.30,
            why: "the JVM's growth speeds up near its limit (G1 expands the heap faster as it fills, collections work harder): 2.7 MB/s at half-way, 5.8 MB/s in the last 15 s; at half-way the point was within 9 % in four runs and 25 % late in one (its lower bound 39 s for 36 s)",
        }],
        ..leak(
            "java-2MB-384Mi",
            2 * M,
            &["java", "leak", "rate=2m"],
            Some(384 * MI),
            "JVM (G1, -Xmx1g), 2 MB/s kept in a list into 384Mi, request garbage meanwhile",
        )
    },
    Case {
        known_misses: &[KnownMiss::NotKeptWithoutHeap {
            first_secs: 30.0,
            why: "read from the resident size alone (runs 1-4, before the agent read the JVM's retained heap): G1 commits heap in steps, and the resident size stays flat for 40-100 s at a time while the leak fills heap already committed, in one run for 5 minutes after G1 committed 72 MiB in 20 s; >= 60 at 6-24 s, kept from 44 s, 147 s and 191 s in three runs, not kept in the fourth",
        }],
        ..leak(
            "java-100KB",
            100 * K,
            &["java", "leak", "rate=100k"],
            None,
            "JVM (G1), 100 KB/s with request garbage",
        )
    },
    leak(
        "node-1MB-256Mi",
        M,
        &["node", "leak", "rate=1m"],
        Some(256 * MI),
        "Node.js, 1 MB/s of records kept, request garbage, into 256Mi",
    ),
    Case {
        leak_from: 60.0,
        known_misses: &[KnownMiss::Detection {
            secs: 600.0,
            why: "V8's major collections free 20 MB every ~105 s, 10x what the leak adds per minute: >= 60 from 12 s after the leak starts, but each collection drops it; it is told from a collector's cycle by rising troughs, which takes four collections (kept from 386-494 s after start)",
        }],
        ..leak(
            "node-warm-then-200KB",
            200 * K,
            &["node", "leak", "rate=200k", "delay=60"],
            None,
            "Node.js, 60 s of service, then 200 KB/s (a leak in a running process)",
        )
    },
    leak(
        "go-5MB-256Mi",
        5 * M,
        &["go", "leak", "rate=5m"],
        Some(256 * MI),
        "Go, 5 MB/s appended to a global slice into 256Mi (GOGC cycles under it)",
    ),
    leak(
        "go-300KB-gc",
        300 * K,
        &["go", "leak", "rate=300k", "churn=20m"],
        None,
        "Go, 300 KB/s on top of 20 MB/s of garbage (GOGC sawtooth)",
    ),
    Case {
        pod: Some("sidecar-pod"),
        pod_limit: Some(160 * MI),
        known_misses: &[KnownMiss::EtaError {
            fraction: 0.50,
            why: "predicted at half-way (11-20 s after start) from a rate Node's start-up steps inflated: 7-12 s for 13-22 s (36-47 % early, never late)",
        }],
        ..leak(
            "sidecar-3MB",
            3 * M,
            &["node", "leak", "rate=3m", "churn=0"],
            None,
            "a Node.js sidecar leaking 3 MB/s; the pod's 160Mi limit",
        )
    },
    // ---- not leaks --------------------------------------------------------------------
    Case {
        pod: Some("sidecar-pod"),
        pod_limit: Some(160 * MI),
        ..calm(
            "sidecar-main",
            &["python3", "flat", "size=30Mi"],
            "the sidecar's main container: 30 MiB held",
        )
    },
    calm(
        "java-warmup-150MB",
        &["java", "warmup", "target=150m", "secs=120"],
        "JVM (G1): a cache filled over 120 s, the heap expanding, then request garbage only",
    ),
    calm(
        "java-steady",
        &["java", "steady", "live=50m", "churn=20m"],
        "JVM (G1): 50 MB live, 20 MB/s of garbage",
    ),
    calm(
        "node-warmup-100s",
        &["node", "warmup", "target=120m", "secs=100"],
        "Node.js: a cache warmed over 100 s, then request garbage only",
    ),
    calm(
        "node-steady",
        &["node", "steady", "live=30m", "churn=10m"],
        "Node.js: 30 MB live, 10 MB/s of garbage",
    ),
    calm(
        "node-cycle-120s",
        &["node", "cycle", "rate=500k", "period=120"],
        "Node.js: 500 KB/s kept for 120 s, then dropped (a 120 s cycle)",
    ),
    calm(
        "go-steady",
        &["go", "steady", "live=64m", "churn=30m"],
        "Go: 64 MB live, 30 MB/s of garbage (GOGC=100)",
    ),
    calm(
        "go-burst-150s",
        &["go", "burst", "size=200Mi", "period=150", "hold=20"],
        "Go: 200 MiB for 20 s every 150 s, returned by the scavenger",
    ),
    calm(
        "py-warmup-180s",
        &["python3", "warmup", "target=120Mi", "secs=180"],
        "CPython: 120 MiB approached over 3 minutes, then held",
    ),
    calm(
        "py-lru-150MB",
        &["python3", "lru", "cap=150m", "rate=1m"],
        "CPython: a bounded LRU cache filled at 1 MB/s up to 150 MB",
    ),
    calm(
        "py-batch-90s",
        &["python3", "batch", "rate=1m", "period=90"],
        "CPython: 1 MB/s kept for 90 s, then dropped",
    ),
    calm(
        "py-batch-240s",
        &["python3", "batch", "rate=500k", "period=240"],
        "CPython: 500 KB/s kept for 240 s, then dropped (a 4-minute cycle)",
    ),
    calm(
        "py-mapfile-400MiB",
        &["python3", "mapfile", "size=400Mi", "rate=4Mi"],
        "CPython: a 400 MiB file mapped and read at 4 MiB/s, again and again",
    ),
    calm(
        "c-arenas",
        &["arena", "4", "24"],
        "glibc malloc: 4 threads (arenas), 24 MiB live each, random sizes, fragmenting",
    ),
    calm(
        "sim-sawtooth-60s",
        &[
            "leak-sim",
            "--pattern",
            "sawtooth",
            "--baseline",
            "50MiB",
            "--rate",
            "1MiB/s",
            "--period",
            "60s",
        ],
        "leak-sim: +1 MiB/s for 60 s, then freed, repeated",
    ),
    calm(
        "sim-bursty",
        &[
            "leak-sim",
            "--pattern",
            "bursty",
            "--baseline",
            "100MiB",
            "--max-burst",
            "50MiB",
        ],
        "leak-sim: 10-50 MiB held 0.2-3 s every 1-5 s",
    ),
];

/// Workloads the detector was never tuned on, recorded after it was frozen (commit
/// 0ea27e4's detector) to judge it: other collectors (Parallel, ZGC) and heap sizes, glibc
/// arenas of other shapes, leaks that start late in a warm process, several processes in
/// one container. Nothing in `detect` may be changed to fit them: they are replayed by
/// `resourcewatch-bench corpus --heldout --replay ... --production`, not by the tests'
/// goals. `java:FLAGS` runs the JVM with those flags; `sh` runs a shell line in which
/// `$SRC` is the programs' directory and `$BIN` the built ones'.
pub const HELDOUT: &[Case] = &[
    // ---- leaks ------------------------------------------------------------------------
    leak(
        "java-parallel-1MB-256Mi",
        M,
        &[
            "java:-XX:+UseParallelGC -Xmx512m",
            "leak",
            "rate=1m",
            "churn=8m",
        ],
        Some(256 * MI),
        "JVM (Parallel GC, -Xmx512m), 1 MB/s kept, 8 MB/s garbage, into 256Mi",
    ),
    leak(
        "java-zgc-2MB-512Mi",
        2 * M,
        &["java:-XX:+UseZGC -Xmx1g", "leak", "rate=2m"],
        Some(512 * MI),
        "JVM (ZGC, -Xmx1g), 2 MB/s kept into 512Mi",
    ),
    Case {
        leak_from: 120.0,
        ..leak(
            "java-late-1MB-320Mi",
            M,
            &[
                "java:-XX:+UseG1GC -Xmx256m",
                "leak",
                "rate=1m",
                "delay=120",
                "churn=10m",
            ],
            Some(320 * MI),
            "JVM (G1, -Xmx256m): 120 s of service (10 MB/s garbage), then 1 MB/s kept, into 320Mi",
        )
    },
    Case {
        leak_from: 150.0,
        ..leak(
            "go-late-2MB-256Mi",
            2 * M,
            &["go", "leak", "rate=2m", "delay=150", "churn=10m"],
            Some(256 * MI),
            "Go: 150 s of service (10 MB/s garbage), then 2 MB/s kept, into 256Mi",
        )
    },
    Case {
        leak_from: 180.0,
        ..leak(
            "py-late-300KB",
            300 * K,
            &[
                "python3",
                "leak",
                "rate=300k",
                "delay=180",
                "base=200Mi",
                "jitter=2Mi",
            ],
            None,
            "CPython: 200 MiB heap, 0-2 MiB scratch, 180 s of service, then 300 KB/s kept",
        )
    },
    leak(
        "node-700KB-384Mi",
        700 * K,
        &["node", "leak", "rate=700k", "churn=5m"],
        Some(384 * MI),
        "Node.js, 700 KB/s of records kept, 5 MB/s garbage, into 384Mi",
    ),
    leak(
        "multi-py-500KB-300Mi",
        500 * K,
        &[
            "sh",
            "-c",
            "python3 $SRC/mem.py flat size=80Mi & python3 $SRC/mem.py leak rate=500k & exec python3 $SRC/mem.py flat size=20Mi",
        ],
        Some(300 * MI),
        "one container, three CPython processes: 80 MiB and 20 MiB flat, one leaking 500 KB/s, into 300Mi",
    ),
    leak(
        "multi-go-node-1MB-256Mi",
        M,
        &[
            "sh",
            "-c",
            "node $SRC/mem.js steady live=40m churn=5m & exec $BIN/gomem leak rate=1m churn=5m",
        ],
        Some(256 * MI),
        "one container, a steady Node.js process beside a Go process leaking 1 MB/s, into 256Mi",
    ),
    // ---- not leaks --------------------------------------------------------------------
    calm(
        "java-parallel-warmup-120MB",
        &[
            "java:-XX:+UseParallelGC -Xmx512m",
            "warmup",
            "target=120m",
            "secs=90",
        ],
        "JVM (Parallel GC): a cache filled over 90 s, then request garbage only",
    ),
    calm(
        "java-zgc-steady",
        &[
            "java:-XX:+UseZGC -Xmx512m",
            "steady",
            "live=80m",
            "churn=30m",
        ],
        "JVM (ZGC): 80 MB live, 30 MB/s of garbage",
    ),
    calm(
        "java-g1-256m-steady",
        &[
            "java:-XX:+UseG1GC -Xmx256m",
            "steady",
            "live=100m",
            "churn=40m",
        ],
        "JVM (G1, -Xmx256m): 100 MB live, 40 MB/s of garbage",
    ),
    calm(
        "c-arenas-8x16",
        &["arena", "8", "16"],
        "glibc malloc: 8 threads (arenas), 16 MiB live each, fragmenting",
    ),
    calm(
        "c-arenas-2x96",
        &["arena", "2", "96"],
        "glibc malloc: 2 threads, 96 MiB live each, fragmenting",
    ),
    calm(
        "go-steady-200MB",
        &["go", "steady", "live=200m", "churn=50m"],
        "Go: 200 MB live, 50 MB/s of garbage",
    ),
    calm(
        "node-warmup-200s",
        &["node", "warmup", "target=200m", "secs=200"],
        "Node.js: a cache warmed over 200 s, then request garbage only",
    ),
    calm(
        "py-warmup-60s-300Mi",
        &["python3", "warmup", "target=300Mi", "secs=60"],
        "CPython: 300 MiB approached over a minute, then held",
    ),
    calm(
        "multi-steady",
        &[
            "sh",
            "-c",
            "node $SRC/mem.js steady live=30m churn=5m & python3 $SRC/mem.py lru cap=60m rate=500k & exec $BIN/gomem steady live=50m churn=10m",
        ],
        "one container, three runtimes: Node.js steady, a CPython LRU cache filling to 60 MB, Go steady",
    ),
];

/// A second held-out set, written on 28 November 2026 after the detector gained the
/// charge and JVM-heap rules (commit 032de4a) and recorded after them: workloads neither
/// set above has, a G1 heap free to grow to 1 GiB among them. The same rule as `HELDOUT`:
/// nothing in `detect` or `leak` may be changed to fit them.
pub const HELDOUT_2: &[Case] = &[
    // ---- leaks ------------------------------------------------------------------------
    leak(
        "java-g1-1g-500KB-640Mi",
        500 * K,
        &["java:-XX:+UseG1GC -Xmx1g", "leak", "rate=500k", "churn=20m"],
        Some(640 * MI),
        "JVM (G1, heap free to grow to 1 GiB), 500 KB/s kept, 20 MB/s garbage, into 640Mi",
    ),
    leak(
        "py-1500KB-320Mi",
        1500 * K,
        &["python3", "leak", "rate=1500k", "base=50Mi", "jitter=8Mi"],
        Some(320 * MI),
        "CPython: 50 MiB heap, 0-8 MiB scratch, 1.5 MB/s kept, into 320Mi",
    ),
    leak(
        "node-2MB-300Mi",
        2 * M,
        &["node", "leak", "rate=2m", "churn=10m"],
        Some(300 * MI),
        "Node.js: 2 MB/s of records kept, 10 MB/s garbage, into 300Mi",
    ),
    leak(
        "go-150KB",
        150 * K,
        &["go", "leak", "rate=150k", "churn=40m"],
        None,
        "Go: 150 KB/s kept under 40 MB/s of garbage, no limit",
    ),
    Case {
        leak_from: 90.0,
        ..leak(
            "node-late-1MB-256Mi",
            M,
            &["node", "leak", "rate=1m", "delay=90", "churn=5m"],
            Some(256 * MI),
            "Node.js: 90 s of service (5 MB/s garbage), then 1 MB/s kept, into 256Mi",
        )
    },
    leak(
        "multi-java-py-400KB-512Mi",
        400 * K,
        &[
            "sh",
            "-c",
            "java -XX:+UseG1GC -Xmx256m -cp $BIN Mem steady live=60m churn=10m & exec python3 $SRC/mem.py leak rate=400k",
        ],
        Some(512 * MI),
        "one container: a steady JVM (G1) beside a CPython process leaking 400 KB/s, into 512Mi",
    ),
    // ---- not leaks --------------------------------------------------------------------
    calm(
        "java-g1-1g-steady",
        &[
            "java:-XX:+UseG1GC -Xmx1g",
            "steady",
            "live=300m",
            "churn=80m",
        ],
        "JVM (G1, heap free to grow to 1 GiB): 300 MB live, 80 MB/s of garbage",
    ),
    calm(
        "java-g1-1g-warmup-250MB",
        &[
            "java:-XX:+UseG1GC -Xmx1g",
            "warmup",
            "target=250m",
            "secs=60",
        ],
        "JVM (G1, -Xmx1g): a cache of 250 MB filled over 60 s, then request garbage only",
    ),
    calm(
        "java-parallel-1g-steady",
        &[
            "java:-XX:+UseParallelGC -Xmx1g",
            "steady",
            "live=150m",
            "churn=50m",
        ],
        "JVM (Parallel, -Xmx1g): 150 MB live, 50 MB/s of garbage",
    ),
    calm(
        "py-lru-80MB",
        &["python3", "lru", "cap=80m", "rate=2m"],
        "CPython: an LRU cache filling to 80 MB at 2 MB/s, then evicting",
    ),
    calm(
        "node-warmup-60s-150MB",
        &["node", "warmup", "target=150m", "secs=60"],
        "Node.js: a cache of 150 MB over 60 s, then request garbage",
    ),
    calm(
        "go-burst-90s",
        &["go", "burst", "size=120Mi", "period=90", "hold=30"],
        "Go: a 120 MiB batch every 90 s, held 30 s, returned by the scavenger",
    ),
    calm(
        "c-arenas-4x64",
        &["arena", "4", "64"],
        "glibc malloc: 4 threads (arenas), 64 MiB live each, fragmenting",
    ),
    calm(
        "multi-java-py-steady",
        &[
            "sh",
            "-c",
            "java -XX:+UseG1GC -Xmx512m -cp $BIN Mem steady live=100m churn=30m & exec python3 $SRC/mem.py flat size=60Mi",
        ],
        "one container: a steady JVM (G1, -Xmx512m) beside a flat CPython process",
    ),
];

/// A case's recorded series, one point per second per series: what the agent's tracker
/// held at the end of each interval (the kernel's samples and the sketch's heartbeat).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    pub name: String,
    pub truth: Option<Truth>,
    pub rate: u64,
    /// Seconds into the process when the leak starts.
    pub leak_from: f64,
    pub limit: Option<u64>,
    /// Seconds from the case's start to its OOM kill, if the kernel killed it.
    pub oom_at: Option<f64>,
    /// (seconds from start, series, sample); series "cg" is the container's charge, "pN"
    /// the Nth process seen in it, "hN" that process's retained heap if it is a JVM (one
    /// row per young collection; `rss` and `anon` both hold it).
    pub rows: Vec<(f64, String, TraceSample)>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TraceSample {
    pub rss: u64,
    pub anon: u64,
    /// Bytes left before the tightest limit (container rows only).
    pub headroom: Option<u64>,
    /// The page cache charged to that limit (container rows of traces recorded since the
    /// column was added; older ones replay with the container's own file pages).
    pub reclaimable: Option<u64>,
}

impl Trace {
    pub fn to_tsv(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# case\t{}", self.name);
        let _ = writeln!(s, "# truth\t{}", self.truth.map_or("?", Truth::as_str));
        let _ = writeln!(s, "# rate\t{}", self.rate);
        let _ = writeln!(s, "# leak-from\t{}", self.leak_from);
        let _ = writeln!(
            s,
            "# limit\t{}",
            self.limit.map_or("none".into(), |l| l.to_string())
        );
        let _ = writeln!(
            s,
            "# oom\t{}",
            self.oom_at.map_or("none".into(), |t| format!("{t:.1}"))
        );
        let _ = writeln!(
            s,
            "# t\tseries\trss_kib\tanon_kib\theadroom_kib\treclaimable_kib"
        );
        let kib = |v: Option<u64>| v.map_or("-".into(), |h| (h >> 10).to_string());
        for (t, series, x) in &self.rows {
            let _ = writeln!(
                s,
                "{t:.1}\t{series}\t{}\t{}\t{}\t{}",
                x.rss >> 10,
                x.anon >> 10,
                kib(x.headroom),
                kib(x.reclaimable)
            );
        }
        s
    }

    pub fn parse(text: &str) -> Result<Trace, String> {
        let mut t = Trace::default();
        for (n, line) in text.lines().enumerate() {
            let bad = |what: &str| format!("line {}: {what}: {line:?}", n + 1);
            if let Some(h) = line.strip_prefix("# ") {
                let (k, v) = h.split_once('\t').unwrap_or((h, ""));
                match k {
                    "case" => t.name = v.to_string(),
                    "truth" => {
                        t.truth = match v {
                            "leak" => Some(Truth::Leak),
                            "not-leak" => Some(Truth::NotLeak),
                            _ => return Err(bad("truth")),
                        }
                    }
                    "rate" => t.rate = v.parse().map_err(|_| bad("rate"))?,
                    "leak-from" => t.leak_from = v.parse().map_err(|_| bad("leak-from"))?,
                    "limit" => t.limit = v.parse().ok(),
                    "oom" => t.oom_at = v.parse().ok(),
                    _ => {}
                }
                continue;
            }
            let f: Vec<&str> = line.split('\t').collect();
            if f.len() != 5 && f.len() != 6 {
                return Err(bad("5 or 6 fields"));
            }
            let num = |i: usize| f[i].parse::<u64>().map_err(|_| bad("number"));
            let opt = |i: usize| match f.get(i) {
                None | Some(&"-") => Ok(None),
                Some(_) => num(i).map(|v| Some(v << 10)),
            };
            t.rows.push((
                f[0].parse().map_err(|_| bad("time"))?,
                f[1].to_string(),
                TraceSample {
                    rss: num(2)? << 10,
                    anon: num(3)? << 10,
                    headroom: opt(4)?,
                    reclaimable: opt(5)?,
                },
            ));
        }
        if t.name.is_empty() || t.truth.is_none() {
            return Err("no `# case` or `# truth` header".into());
        }
        Ok(t)
    }

    /// Whether the trace holds JVM heap rows (recorded since the agent reads them).
    pub fn has_heap(&self) -> bool {
        self.rows.iter().any(|(_, s, _)| s.starts_with('h'))
    }

    /// When growth stopped: the last time the container's charge set a high by more than
    /// max(2 MiB, 2 %). None when the trace has no container series.
    pub fn growth_stopped_at(&self) -> Option<f64> {
        let mut high = 0u64;
        let mut at = None;
        for (t, s, x) in &self.rows {
            if s != "cg" {
                continue;
            }
            if at.is_none() || x.rss > high + (2 * MI).max(high / 50) {
                high = x.rss;
                at = Some(*t);
            }
        }
        at
    }
}

/// What the detectors made of a trace, evaluated every second as the agent does.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Seconds from the start to the first confidence >= 60 on any of the case's series.
    pub first_60: Option<f64>,
    /// Seconds from the start to the first confidence >= 60 that is kept: never below 50
    /// afterwards. A start-up allocation can reach 60 and fall back; this is when the
    /// leak itself was found.
    pub held_from: Option<f64>,
    /// Highest confidence from 60 s after growth stopped (not-leak cases).
    pub max_after_settle: Option<u8>,
    pub max_confidence: u8,
    /// (seconds from start, predicted seconds to OOM, lower bound) for each prediction made
    /// at confidence >= 60 before the kill.
    pub predictions: Vec<(f64, f64, f64)>,
}

impl Outcome {
    /// The prediction made when the container's charge first reached half its limit.
    pub fn at_half(&self, trace: &Trace) -> Option<(f64, f64, f64)> {
        let limit = trace.limit.or_else(|| {
            trace
                .rows
                .iter()
                .find_map(|(_, s, x)| (s == "cg").then_some(x.headroom? + x.rss))
        })?;
        let half_t = trace
            .rows
            .iter()
            .find(|(_, s, x)| s == "cg" && x.rss >= limit / 2)
            .map(|r| r.0)?;
        self.predictions.iter().copied().find(|p| p.0 >= half_t)
    }
}

/// One evaluation: seconds from the start, the highest confidence among the case's
/// series, and that series' time-to-OOM prediction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Step {
    pub t: f64,
    pub confidence: u8,
    pub eta: Option<detect::Eta>,
    /// How long that series' growth has held at leak level (the verdict's `growing_secs`).
    pub growing_secs: f64,
}

/// The steps as a watch with `leakDetection.minGrowingTime: min_growing_secs` sees them:
/// a verdict whose growth has not held that long is not listed (its confidence is capped
/// below 60).
pub fn gated(steps: &[Step], min_growing_secs: f64) -> Vec<Step> {
    steps
        .iter()
        .map(|s| {
            let mut s = *s;
            if s.growing_secs < min_growing_secs {
                s.confidence = s.confidence.min(59);
            }
            s
        })
        .collect()
}

impl Step {
    /// Whether this series' verdict is the case's rather than `other`'s: the more
    /// confident, and on a tie the more urgent (the lower bound that would be acted on
    /// first), so that a replay is repeatable.
    pub fn outranks(&self, other: &Step) -> bool {
        let low = |s: &Step| s.eta.map_or(f64::INFINITY, |e| e.low_secs);
        self.confidence > other.confidence
            || (self.confidence == other.confidence && low(self) < low(other))
    }
}

impl Outcome {
    pub fn from_steps(steps: &[Step], trace: &Trace) -> Outcome {
        let settle = match trace.truth {
            Some(Truth::NotLeak) => trace.growth_stopped_at().map(|t| t + 60.0),
            _ => None,
        };
        let mut out = Outcome::default();
        for s in steps.iter().rev() {
            if s.confidence < 50 {
                break;
            }
            if s.confidence >= 60 {
                out.held_from = Some(s.t);
            }
        }
        for s in steps {
            out.max_confidence = out.max_confidence.max(s.confidence);
            if s.confidence >= 60 && out.first_60.is_none() {
                out.first_60 = Some(s.t);
            }
            if settle.is_some_and(|at| s.t >= at) {
                out.max_after_settle = Some(out.max_after_settle.unwrap_or(0).max(s.confidence));
            }
            if s.confidence >= 60
                && trace.oom_at.is_some_and(|k| s.t < k)
                && let Some(e) = s.eta
            {
                out.predictions.push((s.t, e.secs, e.low_secs));
            }
        }
        out
    }
}

/// Replays a trace through a fresh tracker with `params`, evaluating every second.
pub fn replay(trace: &Trace, params: detect::Params) -> Vec<Step> {
    replay_every(trace, params, 1.0)
}

/// [`replay`] evaluated every `every` seconds (an agent's report interval) instead of
/// every second; the samples between evaluations are all observed.
pub fn replay_every(trace: &Trace, params: detect::Params, every: f64) -> Vec<Step> {
    let mut tracker = LeakTracker::new(params);
    let mut keys: BTreeMap<String, SeriesKey> = BTreeMap::new();
    let mut steps = Vec::new();
    let mut headroom: Option<u64> = None;
    let mut reclaimable = 0u64;
    let mut i = 0;
    let end = trace.rows.last().map_or(0.0, |r| r.0);
    let mut now = every;
    while now <= end + 0.5 {
        while i < trace.rows.len() && trace.rows[i].0 <= now + 1e-6 {
            let (t, series, x) = &trace.rows[i];
            i += 1;
            if let Some(n) = series.strip_prefix('h') {
                // A JVM's retained heap after a collection: process `pN`'s.
                if let Some(SeriesKey::Process { tgid }) = keys.get(&format!("p{n}")) {
                    tracker.observe_heap(*tgid, (t * 1e9) as u64, x.rss);
                }
                continue;
            }
            let n = keys.len() as u32;
            let key = *keys.entry(series.clone()).or_insert(if series == "cg" {
                SeriesKey::Cgroup { id: 1 }
            } else {
                SeriesKey::Process { tgid: 1000 + n }
            });
            if series == "cg" {
                headroom = x.headroom;
                // Traces from before the column: the container's own file pages (a lower
                // estimate when the limit is its pod's).
                reclaimable = x.reclaimable.unwrap_or(x.rss.saturating_sub(x.anon));
            }
            tracker.observe_seeded(
                key,
                MemSample {
                    ts_ns: (t * 1e9) as u64,
                    anon_bytes: x.anon,
                    file_bytes: x.rss.saturating_sub(x.anon),
                    ..Default::default()
                },
                Seed {
                    started_ns: Some(0),
                    ..Default::default()
                },
            );
        }
        let now_ns = (now * 1e9) as u64;
        let mut best: Option<Step> = None;
        for key in tracker.keys() {
            // Each process is one of the container's (its charge is series "cg").
            let container = keys.get("cg").copied();
            let members: Vec<u32> = keys
                .values()
                .filter_map(|k| match k {
                    SeriesKey::Process { tgid } => Some(*tgid),
                    SeriesKey::Cgroup { .. } => None,
                })
                .collect();
            if let Some((v, _)) = tracker.assess_in(
                key,
                container,
                &members,
                now_ns,
                headroom.map(|h| h as f64),
                reclaimable as f64,
            ) {
                let step = Step {
                    t: now,
                    confidence: v.confidence,
                    eta: v.eta,
                    growing_secs: v.growing_secs,
                };
                if best.is_none_or(|b| step.outranks(&b)) {
                    best = Some(step);
                }
            }
        }
        steps.push(best.unwrap_or(Step {
            t: now,
            confidence: 0,
            eta: None,
            growing_secs: 0.0,
        }));
        now += every;
    }
    steps
}

/// The goal for a leak case: seconds from the start to a kept confidence >= 60: within
/// 10 s of the leak's start for >= 1 MB/s, 60 s for >= 100 KB/s, 10 minutes below; and
/// before half its time to the OOM kill has passed.
pub fn goal_secs(t: &Trace) -> f64 {
    let g = t.leak_from + detection_goal_secs(t.rate);
    match t.oom_at {
        Some(k) => g.min(t.leak_from + (k - t.leak_from) / 2.0),
        None => g,
    }
}

/// Seconds to confidence >= 60 for a leak of `rate` bytes/s.
pub fn detection_goal_secs(rate: u64) -> f64 {
    match rate {
        r if r >= M => 10.0,
        r if r >= 100 * K => 60.0,
        _ => 600.0,
    }
}
