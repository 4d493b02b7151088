#!/usr/bin/env bash
# The fuzz targets (cargo-fuzz, libFuzzer with AddressSanitizer) of what the agent reads
# from workloads (node-agent/fuzz/) and what the operator reads from agents and users
# (operator/fuzz/), each run for SECONDS (default 20) from its committed corpus
# (<crate>/fuzz/corpus/<target>/, seeds included; what a run finds is added with
# --keep). An allocation over 64 MiB (libFuzzer's -malloc_limit_mb) is a finding: what a
# workload declares must never size one. A crash fails the run; its input is left in
# <crate>/fuzz/artifacts/<target>/, to be made a regression test.
#
#   e2e/run-fuzz.sh [--keep] [SECONDS]
#   e2e/run-fuzz.sh --build-only          builds the bounded run's targets only
#
# cargo-fuzz needs nightly flags (-Z sanitizer); the machine's stable Rust takes them
# with RUSTC_BOOTSTRAP=1, so no second toolchain is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
for d in /usr/local/go/bin "$HOME/.cargo/bin"; do
  [[ -d $d && ":$PATH:" != *":$d:"* ]] && export PATH="$d:$PATH"
done
keep=0 build_only=0
[[ ${1:-} == --keep ]] && { keep=1; shift; }
[[ ${1:-} == --build-only ]] && { build_only=1; shift; }
seconds=${1:-20}
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz@0.13.2
export RUSTC_BOOTSTRAP=1
# One target directory for both fuzz workspaces: the dependencies they share (object,
# prost, serde, tokio...) are built once with the sanitizer's flags, not once per crate.
fuzz_target="$(readlink -f "${CARGO_TARGET_DIR:-target}")/fuzz"
# The bounded run (make test) builds without optimisation: 15 s per target replays the
# corpus and mutates from it either way, and the optimised build (cargo-fuzz's one
# codegen unit per crate) took 16 of CI's minutes on two CPUs, cold. Runs that keep their
# findings (make fuzz) are optimised.
mode=-O
((keep)) || mode=--dev
failed=()
for crate in node-agent operator; do
  fz=(cargo +stable fuzz)
  "${fz[@]}" build "$mode" --fuzz-dir "$crate/fuzz" --target-dir "$fuzz_target" || { echo "run-fuzz: $crate's targets do not build" >&2; exit 1; }
  ((build_only)) && continue
  for target in $("${fz[@]}" list --fuzz-dir "$crate/fuzz"); do
    corpus="$crate/fuzz/corpus/$target"
    mkdir -p "$corpus"
    work="$corpus"
    if ((!keep)); then
      # Findings of a bounded run are not committed: libFuzzer writes new inputs to the
      # first corpus directory, here a scratch one.
      work="$(mktemp -d)"
    fi
    echo "== fuzz $crate/$target for ${seconds}s"
    log="$(mktemp)"
    rc=0
    "${fz[@]}" run "$mode" --fuzz-dir "$crate/fuzz" --target-dir "$fuzz_target" "$target" "$work" "$corpus" -- \
      -max_total_time="$seconds" -malloc_limit_mb=64 -rss_limit_mb=1024 -max_len=262144 \
      >"$log" 2>&1 || rc=$?
    grep -E "^#[0-9]+[[:space:]]+DONE|^==[0-9]+==|^SUMMARY|Test unit written|panicked at|malloc\(" "$log" | head -20 || true
    if ((rc)); then
      tail -40 "$log" >&2
      echo "run-fuzz: $crate/$target failed ($rc); inputs: $crate/fuzz/artifacts/$target/" >&2
      failed+=("$crate/$target")
    fi
    rm -f "$log"
    ((keep)) || rm -rf "$work"
  done
done
((build_only)) && exit 0
if ((${#failed[@]})); then
  echo "run-fuzz: crashes in ${failed[*]}" >&2
  exit 1
fi
echo "== fuzz: no crash"
