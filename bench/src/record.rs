//! Runs kept: `resourcewatch-bench --repeat N --keep DIR <benchmark> ...` runs the benchmark
//! N times, each in a process of its own, and keeps each run's printed output
//! (`DIR/run-I.txt`) and the figures it recorded (`DIR/run-I.json`: the command, the time,
//! the kernel, the commit, and every figure with its unit), then the median and the range
//! of every figure over all runs (`DIR/summary.json`, `DIR/summary.md`). A run that fails
//! fails the whole invocation, after its output is kept: no run is dropped or picked.
//!
//! A benchmark records a figure with [`figure`]; outside a kept run (no `RW_BENCH_FIGURES`
//! in its environment) that does nothing, so a benchmark run by hand prints what it always
//! printed.

use std::{
    collections::BTreeMap,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde_json::{Value, json};

/// Where a kept run's figures go (one JSON object per line), set by the parent.
const FIGURES_ENV: &str = "RW_BENCH_FIGURES";

/// Records one figure of this run: `name` says what and of what (`agent.percent`,
/// `precision.cpu.k10`), `unit` how it is counted (`%`, `ns`, `s`, `MiB`, `x`).
pub fn figure(name: &str, value: f64, unit: &str) {
    let Some(path) = std::env::var_os(FIGURES_ENV) else {
        return;
    };
    if !value.is_finite() {
        return;
    }
    let line = json!({"name": name, "value": value, "unit": unit}).to_string();
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = written {
        crate::fail(&format!("{}: {e}", Path::new(&path).display()));
    }
}

/// One figure over every run.
#[derive(Debug, PartialEq)]
pub struct Summary {
    pub name: String,
    pub unit: String,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Runs that recorded it (a figure some runs lack says so).
    pub runs: usize,
}

/// The median and range of each figure over `runs` (each a run's figures, in order of
/// first appearance); a figure recorded twice in one run counts each time.
pub fn summarize(runs: &[Vec<(String, f64, String)>]) -> Vec<Summary> {
    let mut order = Vec::new();
    let mut all: BTreeMap<&str, (Vec<f64>, &str, usize)> = BTreeMap::new();
    for run in runs {
        let mut seen_here = std::collections::HashSet::new();
        for (name, value, unit) in run {
            let e = all.entry(name).or_insert_with(|| {
                order.push(name.as_str());
                (Vec::new(), unit.as_str(), 0)
            });
            e.0.push(*value);
            if seen_here.insert(name.as_str()) {
                e.2 += 1;
            }
        }
    }
    order
        .into_iter()
        .map(|name| {
            let (mut v, unit, runs) = all.remove(name).unwrap_or_default();
            v.sort_by(f64::total_cmp);
            let n = v.len();
            let median = if n % 2 == 1 {
                v[n / 2]
            } else {
                (v[n / 2 - 1] + v[n / 2]) / 2.0
            };
            Summary {
                name: name.to_owned(),
                unit: unit.to_owned(),
                median,
                min: v[0],
                max: v[n - 1],
                runs,
            }
        })
        .collect()
}

/// A figure as the reports write it: three significant digits, at most three decimals.
fn num(v: f64) -> String {
    let a = v.abs();
    let decimals = if a >= 100.0 {
        0
    } else if a >= 10.0 {
        1
    } else if a >= 1.0 {
        2
    } else {
        3
    };
    format!("{v:.decimals$}")
}

/// The summary as a Markdown table.
pub fn markdown(s: &[Summary], runs: usize) -> String {
    let mut out = format!(
        "| figure | median of {runs} runs | range (min - max) | unit | runs with it |\n|---|---|---|---|---|\n"
    );
    for f in s {
        out.push_str(&format!(
            "| {} | {} | {} - {} | {} | {} |\n",
            f.name,
            num(f.median),
            num(f.min),
            num(f.max),
            f.unit,
            f.runs
        ));
    }
    out
}

/// What a run's file says of where it ran.
fn conditions() -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_owned();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cgroup = if Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists() {
        "v1 (memory)"
    } else {
        "v2"
    };
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    // Changes to what was measured, not to the reports being written beside the runs.
    let dirty = Command::new("git")
        .args([
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ".",
            ":(exclude)*.md",
            ":(exclude)docs",
            ":(exclude)bench/tables.py",
            // The kept runs themselves: a run's files, rewritten by the run before it.
            ":(exclude)node-agent/bench-runs",
        ])
        .output()
        .is_ok_and(|o| !o.stdout.is_empty());
    json!({
        "kernel": kernel,
        "cpus": cpus,
        "cgroup": cgroup,
        "commit": commit,
        "uncommitted_changes": dirty,
    })
}

/// The arguments of the benchmark itself: ours without `--repeat N` and `--keep DIR`,
/// which come before the benchmark's name (after it, every argument is the benchmark's:
/// `cost` has a `--runs` of its own).
pub fn benchmark_args(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--repeat" | "--keep" => {
                it.next();
            }
            s if s.starts_with("--repeat=") || s.starts_with("--keep=") => {}
            _ => {
                out.push(a.clone());
                out.extend(it.by_ref().cloned());
            }
        }
    }
    out
}

/// Runs the benchmark `args` `runs` times, keeps each run in `out`, prints the summary.
pub fn keep_runs(runs: usize, out: &Path, args: &[String]) -> ! {
    std::fs::create_dir_all(out)
        .unwrap_or_else(|e| crate::fail(&format!("{}: {e}", out.display())));
    let exe = std::env::current_exe().unwrap_or_else(|e| crate::fail(&e));
    let command = format!("resourcewatch-bench {}", args.join(" "));
    let mut figures = Vec::new();
    let mut failed = Vec::new();
    for i in 1..=runs {
        let text = out.join(format!("run-{i}.txt"));
        let jsonl: PathBuf = out.join(format!(".run-{i}.figures"));
        let _ = std::fs::remove_file(&jsonl);
        eprintln!("resourcewatch-bench: run {i} of {runs}: {command}");
        let started = unix_now();
        let log = std::fs::File::create(&text)
            .unwrap_or_else(|e| crate::fail(&format!("{}: {e}", text.display())));
        let err = log.try_clone().unwrap_or_else(|e| crate::fail(&e));
        let status = Command::new(&exe)
            .args(args)
            .env(FIGURES_ENV, &jsonl)
            .stdout(log)
            .stderr(err)
            .status()
            .unwrap_or_else(|e| crate::fail(&format!("{}: {e}", exe.display())));
        let run: Vec<(String, f64, String)> = std::fs::read_to_string(&jsonl)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| {
                Some((
                    v["name"].as_str()?.to_owned(),
                    v["value"].as_f64()?,
                    v["unit"].as_str()?.to_owned(),
                ))
            })
            .collect();
        let _ = std::fs::remove_file(&jsonl);
        let record = json!({
            "command": command,
            "run": i,
            "of": runs,
            "started_unix": started,
            "seconds": unix_now() - started,
            "exit_code": status.code(),
            "conditions": conditions(),
            "output": format!("run-{i}.txt"),
            "figures": run.iter().map(|(n, v, u)| json!({"name": n, "value": v, "unit": u})).collect::<Vec<_>>(),
        });
        write(&out.join(format!("run-{i}.json")), &pretty(&record));
        if !status.success() {
            failed.push(i);
        } else if run.is_empty() {
            // A run that printed no figure measured nothing this tool can keep.
            failed.push(i);
        }
        figures.push(run);
    }
    let summary = summarize(&figures);
    let table = markdown(&summary, runs);
    let head = format!(
        "`{command}`, {runs} runs, each a process of its own; every run kept (run-I.txt, run-I.json).\n\n"
    );
    write(&out.join("summary.md"), &format!("{head}{table}"));
    let json_summary = json!({
        "command": command,
        "runs": runs,
        "failed_runs": failed,
        "conditions": conditions(),
        "figures": summary.iter().map(|s| json!({
            "name": s.name, "unit": s.unit, "median": s.median, "min": s.min, "max": s.max, "runs": s.runs,
        })).collect::<Vec<_>>(),
    });
    write(&out.join("summary.json"), &pretty(&json_summary));
    print!("{head}{table}");
    if !failed.is_empty() {
        crate::fail(&format!(
            "run(s) {failed:?} of {runs} failed or recorded no figure (their output: {})",
            out.display()
        ));
    }
    std::process::exit(0)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default() + "\n"
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| crate::fail(&format!("{}: {e}", path.display())));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(f: &[(&str, f64)]) -> Vec<(String, f64, String)> {
        f.iter()
            .map(|(n, v)| ((*n).to_owned(), *v, "%".to_owned()))
            .collect()
    }

    /// Median and range over every run, odd and even counts, a figure only some runs
    /// have counted as such, and first-seen order kept.
    #[test]
    fn every_run_counts_in_the_median_and_the_range() {
        let s = summarize(&[
            run(&[("b", 3.0), ("a", 10.0)]),
            run(&[("b", 1.0), ("a", 30.0)]),
            run(&[("b", 2.0), ("a", 20.0), ("c", 5.0)]),
            run(&[("b", 100.0)]),
        ]);
        let names: Vec<_> = s.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["b", "a", "c"]);
        assert_eq!(
            (s[0].median, s[0].min, s[0].max, s[0].runs),
            (2.5, 1.0, 100.0, 4)
        );
        assert_eq!(
            (s[1].median, s[1].min, s[1].max, s[1].runs),
            (20.0, 10.0, 30.0, 3)
        );
        assert_eq!((s[2].median, s[2].runs), (5.0, 1));
        let md = markdown(&s, 4);
        assert!(md.contains("| b | 2.50 | 1.00 - 100 | % | 4 |"), "{md}");
    }

    #[test]
    fn the_benchmark_runs_without_the_keeping_arguments() {
        let a: Vec<String> = [
            "--repeat", "3", "--keep=d", "cost", "--runs", "5", "--keep", "x",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        assert_eq!(benchmark_args(&a), ["cost", "--runs", "5", "--keep", "x"]);
    }
}
