//! `precision`: Top-K precision of the sketches against /proc ground truth sampled at the same instants.

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use resourcewatch_agent::{
    hashpipe::{self, Geometry},
    pipelines::{PipelineOptions, Pipelines},
    procfs,
};

use crate::{
    fail,
    workload::{Shape, spawn_workload},
};

pub(crate) struct Truth {
    cpu: HashMap<u32, u64>,
    mem: HashMap<u32, u64>,
}

pub(crate) fn sample_truth() -> Truth {
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

pub(crate) fn midpoint(a: &Truth, b: &Truth) -> Truth {
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

pub(crate) fn overlap(a: &[(u32, u64)], b: &[(u32, u64)]) -> usize {
    let sa: HashSet<u32> = a.iter().map(|x| x.0).collect();
    b.iter().filter(|x| sa.contains(&x.0)).count()
}

pub(crate) fn precision(
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
            debug_top(n, &cpu_truth, &epoch.per_tgid);
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
    print_precision(&ks, &hits_cpu, &hits_mem, intervals, geo, &pipes);
}

/// `RW_BENCH_DEBUG`: the truth's and the sketch's top 6 of interval `n` when they
/// disagree on the first.
fn debug_top(n: u32, truth: &HashMap<u32, u64>, sketch: &HashMap<u32, u64>) {
    let (t, s) = (hashpipe::top_k(truth, 6), hashpipe::top_k(sketch, 6));
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

/// The precision table at each K, and what the sketch and the maps hold.
fn print_precision(
    ks: &[usize],
    hits_cpu: &[usize],
    hits_mem: &[usize],
    intervals: u32,
    geo: Geometry,
    pipes: &Pipelines,
) {
    let sketch_bytes = (2 * geo.slots() + geo.slots()) * 8;
    let maps = pipes.map_memory_bytes();
    let total: u64 = maps.iter().map(|m| m.1).sum();
    println!("| K | CPU precision | memory precision |");
    println!("|---|---|---|");
    for (i, &k) in ks.iter().enumerate() {
        let d = (k * intervals as usize) as f64;
        let (cpu, mem) = (
            100.0 * hits_cpu[i] as f64 / d,
            100.0 * hits_mem[i] as f64 / d,
        );
        println!("| {k} | {cpu:.1} % | {mem:.1} % |");
        crate::record::figure(&format!("cpu_precision.k{k}"), cpu, "%");
        crate::record::figure(&format!("memory_precision.k{k}"), mem, "%");
    }
    crate::record::figure("maps_memlock", total as f64, "B");
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
