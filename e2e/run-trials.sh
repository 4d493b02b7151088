#!/usr/bin/env bash
# The remediation trials of operator/REMEDIATION.md, end to end on the harness cluster:
# starts it (built once, cached), builds and imports the images, installs resourcewatch
# through config/ with the operator's master switch on (--enable-remediation), runs
# resourcewatch-trials, writes its output (which names its own versions and command) to
# operator/trials/YYYY-MM-DD.md, and stops the cluster, leaving the machine as it was.
#
#   e2e/run-trials.sh [TRIALS ARGS...]     default: --trials 10 --rates 8,2,0.5
#
# About 15 minutes on 2 CPUs with the images built. Run it on an otherwise idle machine:
# the advance warnings are times.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) -eq 0 ]] || { echo "run-trials: needs root (it starts the cluster)" >&2; exit 1; }
args=("$@")
((${#args[@]})) || args=(--trials 10 --rates 8,2,0.5)
out="operator/trials/$(date -u +%F).md"
e2e/cluster/up.sh >/dev/null
# shellcheck source=cluster/env.sh
source e2e/cluster/env.sh
K="$KUBECTL"
cleanup() {
  rc=$?
  e2e/cluster/down.sh >/dev/null || rc=1
  e2e/cluster/check-clean.sh || rc=1
  e2e/cluster/down.sh --purge >/dev/null || rc=1
  exit $rc
}
trap cleanup EXIT
make -s images
rw_import_images target/images/{operator,agent,workloads}.tar
"$K" apply -k config >/dev/null
"$K" -n resourcewatch-system patch deploy resourcewatch-operator --type=json \
  -p='[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--enable-remediation"}]' >/dev/null
"$K" -n resourcewatch-system rollout status deploy/resourcewatch-operator --timeout=120s
"$K" -n resourcewatch-system rollout status ds/resourcewatch-agent --timeout=120s
cargo build --release -p resourcewatch-e2e --bin resourcewatch-trials
tmp="$(mktemp)"
target/release/resourcewatch-trials "${args[@]}" | tee "$tmp"
mv "$tmp" "$out"
echo "run-trials: written to $out" >&2
