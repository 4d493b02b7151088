#!/usr/bin/env bash
# The runs behind node-agent/BENCHMARKS.md: every table's command, each run RW_BENCH_RUNS
# times (3 unless set) as processes of their own, every run kept in
# node-agent/bench-runs/<table>/ (its printed output, its figures as JSON with the
# command, time, kernel and commit, and the median and range of each figure over all
# runs: summary.md). The report quotes those summaries; nothing is picked.
#
#   bench/reports.sh                 # every table (about 90 minutes on 2 vCPUs)
#   bench/reports.sh compare-idle    # the tables whose name contains a word given
#   bench/reports.sh --list          # the tables and their commands
#
# Root only (the benchmarks load BPF programs). Run it on an otherwise idle machine: the
# figures are CPU times and ratios, and another process's load moves them.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RW_BENCH_RUNS:-3}
out=node-agent/bench-runs
bin=${CARGO_TARGET_DIR:-target}/release/resourcewatch-bench
stacks=${CARGO_TARGET_DIR:-target}/tmp/bench-stacks
fix=node-agent/tests/fixtures/stacks
py312=${RW_BENCH_PYTHON312:-$HOME/.pyenv/versions/3.12.1/bin/python3.12}

# The unwind table's programs, one --cmd each (in this order: the report numbers them).
unwind_cmds=(
  "$stacks/burn-c-nofp" "$stacks/burn-c" "$stacks/burn-rs" "$stacks/burn-go"
  "/usr/bin/python3.11 $fix/burn.py"
  "$py312 -X perf $fix/burn.py"
  "node --perf-basic-prof --interpreted-frames-native-stack $fix/burn.js"
)

# name | arguments (the table in BENCHMARKS.md that quotes it says which), the figures
# of record first: a run cut short keeps those.
tables=(
  "compare-idle-100ms|compare --interval 100ms --duration 30s --changed-rows --untargeted"
  "compare-churn-100ms|compare --churn 200 --interval 100ms --duration 30s --changed-rows --untargeted"
  "compare-busy-100ms|compare --procs 500 --busy 400 --interval 100ms --duration 30s --changed-rows --untargeted"
  "compare-idle-2s|compare --interval 2s --duration 30s --changed-rows --untargeted"
  "precision-default|precision --intervals 30"
  "cost-per-event|cost --runs 0"
  "cost-perf-pipe-pinned|cost --runs 11 --pin-cpu 1"
  "agent-2s|agent --interval 2s --duration 60s --with-workload"
  "agent-10ms|agent --interval 10ms --duration 30s --with-workload"
  "precision-k100-5000|precision --procs 5000 --intervals 15 --cpu-top 0.04 --cpu-skew 0.97 --mem-top-mib 64 --mem-skew 0.97 --memory-cycle 20s"
  "precision-pressure-default-16384|precision --procs 16384 --memory-cycle 20s --intervals 10"
  "precision-pressure-2x256|precision --procs 600 --memory-cycle 20s --depth 2 --width 256 --intervals 10"
  "epochs|epochs"
  "profile|profile --pairs 10"
  "jvm-heap|jvm-heap"
  "cost-capture-other|cost --runs 0 --capture other"
  "cost-capture-self|cost --runs 0 --capture self"
  "unwind|unwind --seconds 4 --rounds 1"
  "reader|reader --rounds 5 --file /usr/lib/x86_64-linux-gnu/libc.so.6 --file /usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so --file /usr/bin/node"
  "oom-2mib|oom --limit 256MiB --rate 2MiB/s"
  "precision-churn-50|precision --intervals 30 --churn 50"
  "precision-k100-1000|precision --procs 1000 --intervals 15 --cpu-top 0.04 --cpu-skew 0.97 --mem-top-mib 64 --mem-skew 0.97 --memory-cycle 20s"
  "precision-pressure-2x64|precision --procs 600 --memory-cycle 20s --depth 2 --width 64 --intervals 10"
  "compare-churn-2s|compare --churn 200 --interval 2s --duration 30s --changed-rows --untargeted"
  "compare-busy-2s|compare --procs 500 --busy 400 --interval 2s --duration 30s --changed-rows --untargeted"
  "cost-perf-pipe-unpinned|cost --runs 7"
)

if [[ ${1:-} == --list ]]; then
  for t in "${tables[@]}"; do printf '%-34s resourcewatch-bench %s\n' "${t%%|*}" "${t#*|}"; done
  for c in "${unwind_cmds[@]}"; do printf '%-34s   --cmd "%s"\n' "" "$c"; done
  exit 0
fi
[[ $(id -u) == 0 ]] || { echo "bench/reports.sh: root only (BPF programs)" >&2; exit 1; }

wanted() {
  (( $# == 0 )) && return 0
  local name=$1; shift
  for w in "$@"; do [[ $name == *"$w"* ]] && return 0; done
  return 1
}

# The unwind table's programs: each language's burner built as its compiler ships.
build_stacks() {
  mkdir -p "$stacks"
  cc -O2 -fomit-frame-pointer -o "$stacks/burn-c-nofp" "$fix/burn.c"
  cc -O2 -fno-omit-frame-pointer -o "$stacks/burn-c" "$fix/burn.c"
  rustc -O -o "$stacks/burn-rs" "$fix/burn.rs"
  GO111MODULE=off GOCACHE="$PWD/$stacks/gocache" go build -o "$stacks/burn-go" "$fix/burn.go"
  [[ -x $py312 ]] || { echo "bench/reports.sh: $py312 (CPython 3.12, for -X perf) not found; RW_BENCH_PYTHON312=PATH" >&2; exit 1; }
}

failed=()
for t in "${tables[@]}"; do
  name=${t%%|*}
  wanted "$name" "$@" || continue
  [[ $name == unwind ]] && build_stacks
  read -r -a args <<<"${t#*|}"
  if [[ $name == unwind ]]; then
    for c in "${unwind_cmds[@]}"; do args+=(--cmd "$c"); done
  fi
  rm -rf "${out:?}/$name"
  echo "== $name: resourcewatch-bench --repeat $runs ${args[*]}"
  if ! "$bin" --repeat "$runs" --keep "$out/$name" "${args[@]}"; then
    failed+=("$name")
  fi
done
if (( ${#failed[@]} )); then
  echo "bench/reports.sh: failed: ${failed[*]} (their runs are kept in $out/)" >&2
  exit 1
fi
