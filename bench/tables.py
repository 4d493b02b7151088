#!/usr/bin/env python3
"""node-agent/BENCHMARKS.md's tables, made from the runs kept in node-agent/bench-runs/.

Each table in the report sits between `<!-- runs: NAME -->` and `<!-- /runs -->`; this
writes it from the runs `bench/reports.sh` kept (every run-I.json of the tables it
reads): each cell is the median of all runs and, beside it, their range; a ratio is
taken within each run first (both tools measured minutes apart in one invocation), then
its median and range over the runs. Nothing is picked: every kept run counts.

  bench/tables.py            rewrite the tables in node-agent/BENCHMARKS.md
  bench/tables.py --check    fail (with a diff) if the report differs from its runs

Standard library only (run by `make lint`).
"""

import datetime
import difflib
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "node-agent" / "bench-runs"
REPORT = ROOT / "node-agent" / "BENCHMARKS.md"


def runs_of(table):
    """Every run of a table: a dict of figure name -> list of values (a figure recorded
    more than once in a run, e.g. once per round, keeps each)."""
    out = []
    for f in sorted((RUNS / table).glob("run-*.json"), key=lambda p: int(p.stem[4:])):
        run = json.loads(f.read_text())
        figs = {}
        for fig in run["figures"]:
            figs.setdefault(fig["name"], []).append(fig["value"])
        out.append((run, figs))
    if not out:
        raise SystemExit(f"bench/tables.py: no runs kept in {RUNS / table} (bench/reports.sh {table})")
    return out


def has_runs(table):
    return any((RUNS / table).glob("run-*.json"))


def per_run(table, f):
    """f(figures of one run) for each run, None where a run lacks what f reads."""
    vals = []
    for _, figs in runs_of(table):
        try:
            vals.append(f(figs))
        except (KeyError, ZeroDivisionError):
            vals.append(None)
    return [v for v in vals if v is not None]


def one(name):
    """A figure recorded once per run (the median if a run recorded it several times)."""
    return lambda figs: statistics.median(figs[name])


def num(v, digits=None):
    if digits is None:
        a = abs(v)
        digits = 0 if a >= 100 else 1 if a >= 10 else 2 if a >= 1 else 3
    return f"{v:,.{digits}f}"


def cell(values, unit="", digits=None, bold=False):
    """Median (range) of every run's value."""
    if not values:
        return "-"
    m = num(statistics.median(values), digits) + unit
    if bold:
        m = f"**{m}**"
    if len(values) == 1:
        return m + " (1 run)"
    return f"{m} ({num(min(values), digits)}-{num(max(values), digits)})"


def n_runs(*tables):
    counts = sorted({len(runs_of(t)) for t in tables})
    return "/".join(str(c) for c in counts)


def conditions(*tables):
    """Where and when the runs were made, from their own files: one group per machine
    and day (runs of different days may be on different kernels), each commit marked if
    it had changes not yet committed."""
    groups = {}
    for t in tables:
        for run, _ in runs_of(t):
            c = run["conditions"]
            started = datetime.datetime.fromtimestamp(run["started_unix"], datetime.timezone.utc)
            key = (started.strftime("%Y-%m-%d"), f"kernel {c['kernel']}, {c['cpus']} CPUs, cgroup {c['cgroup']}")
            commit = c["commit"] or "?"
            if c.get("uncommitted_changes"):
                commit += " (with changes not yet committed)"
            groups.setdefault(key, (started.strftime("%d %B %Y"), set()))[1].add(commit)
    return "; ".join(
        f"{kernel}, commit {', '.join(sorted(commits))}, {day}"
        for (_, kernel), (day, commits) in sorted(groups.items())
    )


# --- the tables ---------------------------------------------------------------------


COMPARE = [
    ("compare-idle-100ms", "mostly idle: 5,000 processes (50 waking every 20 ms, the rest once a second), 200 containers, 20 short-lived/s", "100 ms"),
    ("compare-churn-100ms", "churning: as above, 200 short-lived/s (1 MiB, 2 ms each)", "100 ms"),
    ("compare-busy-100ms", "mostly busy: 500 processes (400 waking every 20 ms), 200 containers, 20 short-lived/s", "100 ms"),
    ("compare-idle-2s", "mostly idle", "2 s"),
    ("compare-churn-2s", "churning", "2 s"),
    ("compare-busy-2s", "mostly busy", "2 s"),
]


def compare():
    kept = [c for c in COMPARE if has_runs(c[0])]
    rows = [
        "| workload | interval | agent | agent `--changed-rows` | agent, Top-K only | /proc poller | competent poller | cgroup reader | competent ÷ agent (every row / changed rows) | runs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for table, workload, interval in kept:
        pct = lambda tool: per_run(table, one(f"{tool}.percent_of_a_core"))
        ratio = lambda tool: per_run(
            table,
            lambda f: statistics.median(f["competent_poller.percent_of_a_core"])
            / statistics.median(f[f"{tool}.percent_of_a_core"]),
        )
        rows.append(
            f"| {workload} | {interval} | {cell(pct('agent'), ' %', bold=True)} | {cell(pct('agent_changed_rows'), ' %')} "
            f"| {cell(pct('agent_topk_only'), ' %')} | {cell(pct('proc_poller'), ' %')} | {cell(pct('competent_poller'), ' %')} "
            f"| {cell(pct('cgroup_reader'), ' %')} | {cell(ratio('agent'), digits=1, bold=True)} / {cell(ratio('agent_changed_rows'), digits=1)} "
            f"| {len(runs_of(table))} |"
        )
    rows.append("")
    rows.append("What the agent is made of, and its own account of the work (medians of the same runs):")
    rows.append("")
    rows.append("| workload | interval | agent user + system CPU | its eBPF programs | ns per program run | RSS (peak) | processes tracked | spilled | dropped |")
    rows.append("|---|---|---|---|---|---|---|---|---|")
    for table, workload, interval in kept:
        v = lambda name: per_run(table, one(f"agent.{name}"))
        rows.append(
            f"| {workload.split(':')[0]} | {interval} | {cell(v('user_system_cpu'), ' s')} | {cell(v('ebpf_time'), ' s')} "
            f"| {cell(v('ebpf_ns_per_run'), digits=0)} | {cell(v('rss'), ' MiB', 1)}; peak {cell(v('peak_rss'), ' MiB', 1)} "
            f"| {cell(v('processes_tracked'), digits=0)} | {cell(v('spilled'), digits=0)} | {cell(v('dropped'), digits=0)} |"
        )
    rows.append("")
    rows.append(f"Conditions (from the runs' own files): {conditions(*(c[0] for c in kept))}.")
    return rows


PRECISION = [
    ("precision-default", "default sketch (4 x 1,024), 200 processes, 20/s churn"),
    ("precision-churn-50", "default sketch, 50/s churn"),
]


def precision_table(sets, ks, mem_label="memory"):
    kept = [s for s in sets if has_runs(s[0])]
    head = "| K | " + " | ".join(f"CPU, {label} | {mem_label}, {label}" for _, label in kept) + " |"
    rows = [head, "|---" * (1 + 2 * len(kept)) + "|"]
    for k in ks:
        cells = []
        for table, _ in kept:
            cells.append(cell(per_run(table, one(f"cpu_precision.k{k}")), " %", 1))
            cells.append(cell(per_run(table, one(f"memory_precision.k{k}")), " %", 1))
        rows.append(f"| {k} | " + " | ".join(cells) + " |")
    rows.append("")
    rows.append(f"Runs: {n_runs(*(s[0] for s in kept))} per column. Conditions: {conditions(*(s[0] for s in kept))}.")
    return rows


def precision():
    rows = precision_table(PRECISION, [1, 5, 10, 20, 30], mem_label="memory (seeded from /proc, never moves)")
    if has_runs("precision-default"):
        rows.append("")
        rows.append(
            "Every map of the object together (kernel `memlock`, default geometry): "
            + cell(per_run("precision-default", one("maps_memlock")), " B", 0)
            + "."
        )
    return rows


def precision_k100():
    return precision_table(
        [("precision-k100-1000", "1,000 processes"), ("precision-k100-5000", "5,000 processes")],
        [1, 5, 10, 30, 100],
    )


def precision_pressure():
    return precision_table(
        [
            ("precision-pressure-2x64", "2 x 64 on 600"),
            ("precision-pressure-2x256", "2 x 256 on 600"),
            ("precision-pressure-default-16384", "default 4 x 1,024 on 16,384"),
        ],
        [1, 5, 10, 20, 30, 100],
    )


def per_event(tables, label):
    rows = [
        "| program | runs | " + " | ".join(f"ns/event{l} | empty program{l} | over it{l}" for _, l in tables) + " |",
        "|---|---" + "|---" * (3 * len(tables)) + "|",
    ]
    programs = []
    for t, _ in tables:
        for _, figs in runs_of(t):
            for name in figs:
                p = name.split(".")[0]
                if name.endswith(".ns_per_event") and p not in programs:
                    programs.append(p)
    for p in programs:
        cells = []
        for t, _ in tables:
            cells += [
                cell(per_run(t, one(f"{p}.ns_per_event")), digits=1),
                cell(per_run(t, one(f"{p}.empty_program_ns")), digits=1),
                cell(per_run(t, one(f"{p}.over_empty_ns")), digits=1, bold=True),
            ]
        rows.append(f"| {p} | {n_runs(*(t for t, _ in tables))} | " + " | ".join(cells) + " |")
    rows.append("")
    rows.append(f"Conditions: {conditions(*(t for t, _ in tables))}.")
    return rows


def cost():
    return per_event([("cost-per-event", "")], "")


def capture():
    return per_event(
        [("cost-capture-other", ", capture on another process"), ("cost-capture-self", ", capture on the faulting process")],
        "",
    )


def perf_pipe():
    rows = [
        "| command | runs | agent, median ratio | empty programs (floor), median ratio | agent over the floor |",
        "|---|---|---|---|---|",
    ]
    for t, cmd in [("cost-perf-pipe-pinned", "`cost --runs 11 --pin-cpu 1`"), ("cost-perf-pipe-unpinned", "`cost --runs 7` (unpinned)")]:
        if not has_runs(t):
            continue
        rows.append(
            f"| {cmd} | {len(runs_of(t))} | {cell(per_run(t, one('perf_pipe.agent_median_ratio')), digits=3, bold=True)} "
            f"| {cell(per_run(t, one('perf_pipe.empty_programs_median_ratio')), digits=3)} "
            f"| {cell(per_run(t, one('perf_pipe.agent_over_empty')), digits=3, bold=True)} |"
        )
    rows.append("")
    rows.append(f"Each cell: the median over the runs of each run's median over its rounds, and the range of those. Conditions: {conditions(*(t for t in ['cost-perf-pipe-pinned', 'cost-perf-pipe-unpinned'] if has_runs(t)))}.")
    return rows


def agent():
    rows = [
        "| interval | runs | CPU total (% of one core) | of which user + system | of which eBPF programs | RSS | peak RSS |",
        "|---|---|---|---|---|---|---|",
    ]
    for t, interval in [("agent-2s", "2 s"), ("agent-10ms", "10 ms")]:
        if not has_runs(t):
            continue
        v = lambda n: per_run(t, one(f"agent.{n}"))
        rows.append(
            f"| {interval} | {len(runs_of(t))} | {cell(v('percent_of_a_core'), ' %', 3, True)} | {cell(v('user_system'), ' %', 3)} "
            f"| {cell(v('ebpf_programs'), ' %', 3)} | {cell(v('rss'), ' MiB', 1)} | {cell(v('peak_rss'), ' MiB', 1)} |"
        )
    rows.append("")
    rows.append(f"Conditions: {conditions(*(t for t in ['agent-2s', 'agent-10ms'] if has_runs(t)))}.")
    return rows


def small():
    rows = ["| benchmark | runs | figure | median (range) |", "|---|---|---|---|"]
    items = [
        ("epochs", "`epochs`: epochs of 200 ms off by more than 10 % against /proc, of 200", "epochs_off_by_over_10_percent", "", 0),
        ("epochs", "`epochs`: worst ratio to /proc", "worst_ratio", "", 3),
        ("profile", "`profile --pairs 10`: a 99 Hz profile, median ratio of the profiled program's time with/without", "profiled.median_ratio", "", 4),
        ("jvm-heap", "`jvm-heap`: one read of a JVM's hsperfdata, inside its root", "jvm_heap.read", " µs", 1),
        ("oom-2mib", "`oom --limit 256MiB --rate 2MiB/s`: time to OOM predicted at half-way", "oom.predicted_at_half_way", " s", 1),
        ("oom-2mib", "... real time from half-way to the OOM kill", "oom.real_from_half_way", " s", 1),
        ("oom-2mib", "... error of the prediction", "oom.error", " %", 1),
    ]
    kept = []
    for t, what, name, unit, d in items:
        if not has_runs(t):
            continue
        kept.append(t)
        rows.append(f"| {t} | {len(runs_of(t))} | {what} | {cell(per_run(t, one(name)), unit, d)} |")
    rows.append("")
    rows.append(f"Conditions: {conditions(*sorted(set(kept)))}.")
    return rows


UNWIND_CMDS = [
    "C `-O2 -fomit-frame-pointer`",
    "C `-O2 -fno-omit-frame-pointer`",
    "Rust release (no frame pointers)",
    "Go 1.26",
    "Debian's CPython 3.11, no flag",
    "CPython 3.12 `-X perf`",
    "Node.js 20 `--perf-basic-prof`",
]


def unwind():
    t = "unwind"
    rows = [
        "| program | user frames per sample: frame pointers only → tables (+ Python frames) | kernel µs/sample: frame pointers only → tables | user-space µs per walked sample |",
        "|---|---|---|---|",
    ]
    for i, name in enumerate(UNWIND_CMDS, 1):
        v = lambda mode, what, scale=1.0: [x * scale for x in per_run(t, one(f"cmd{i}.{mode}.{what}"))]
        rows.append(
            f"| {name} | {cell(v('frame_pointers', 'user_frames_per_sample'), digits=1)} → {cell(v('tables', 'user_frames_per_sample'), digits=1, bold=True)} "
            f"| {cell(v('frame_pointers', 'kernel_ns_per_sample', 1e-3), digits=1)} → {cell(v('tables', 'kernel_ns_per_sample', 1e-3), digits=1)} "
            f"| {cell(v('tables', 'user_space_us_per_walked_sample'), digits=1)} |"
        )
    rows.append("")
    rows.append(f"Runs: {len(runs_of(t))}, one round each. Conditions: {conditions(t)}.")
    return rows


READER_FILES = [
    ("maps", "this process's `/proc/PID/maps`", ["Maps"]),
    ("libc_so_6", "Debian 12's libc.so.6 (2 MB)", ["Tables", "Symbols"]),
    ("libjvm_so", "OpenJDK 17's libjvm.so (24 MB)", ["Tables", "Symbols"]),
    ("node", "Node.js 20's node (99 MB)", ["Tables", "Symbols"]),
]


def reader():
    t = "reader"
    rows = [
        "| file | request | round trip, a new reader (ms) | round trip, a warm reader (ms) | answer (KiB) |",
        "|---|---|---|---|---|",
    ]
    for key, name, kinds in READER_FILES:
        for kind in kinds:
            v = lambda what: per_run(t, one(f"reader.{key}.{kind}.{what}"))
            rows.append(
                f"| {name} | {kind} | {cell(v('cold_ms'))} | {cell(v('warm_ms'), bold=True)} | {cell(v('answer_kib'), digits=0)} |"
            )
    rows.append("")
    rows.append(
        f"A reader at rest (started, confined, one maps request answered): "
        f"{cell(per_run(t, one('reader.idle_rss_mib')))} MiB resident; the loader ends it after "
        "30 s without a request, so an idle agent holds none of it."
    )
    rows.append("")
    rows.append(f"Runs: {len(runs_of(t))}, five rounds each. Conditions: {conditions(t)}.")
    return rows


TABLES = {
    "compare": compare,
    "precision": precision,
    "precision-k100": precision_k100,
    "precision-pressure": precision_pressure,
    "cost": cost,
    "perf-pipe": perf_pipe,
    "capture": capture,
    "agent": agent,
    "small": small,
    "unwind": unwind,
    "reader": reader,
}

MARK = re.compile(r"(<!-- runs: ([a-z0-9-]+) -->\n)(.*?)(<!-- /runs -->)", re.S)


def render(text):
    def one_table(m):
        name = m.group(2)
        if name not in TABLES:
            raise SystemExit(f"bench/tables.py: {REPORT.name} names a table this does not make: {name}")
        return m.group(1) + "\n".join(TABLES[name]()) + "\n" + m.group(4)

    return MARK.sub(one_table, text)


def main():
    text = REPORT.read_text()
    new = render(text)
    if "--check" in sys.argv[1:]:
        if new != text:
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True), str(REPORT), "from node-agent/bench-runs"))
            print(f"\n{REPORT.relative_to(ROOT)} differs from the runs it quotes: bench/tables.py", file=sys.stderr)
            sys.exit(1)
        return
    REPORT.write_text(new)


if __name__ == "__main__":
    main()
