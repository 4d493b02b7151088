#!/usr/bin/env bash
# The operator at cluster scale (e2e/src/bin/scale.rs: nodes, pods, watches, simulated
# agents, churn, a restart) against a real kube-apiserver: the harness's (etcd,
# kube-apiserver, kube-controller-manager; started here and stopped afterwards, whatever
# the outcome) unless RW_E2E_KUBECONFIG opts in to another cluster (e2e/target-cluster.sh).
#   e2e/run-scale.sh            the report: 1,000 nodes, 2k/5k/10k/20k pods, 500 watches;
#                               writes e2e/scale/scale.csv and the plot e2e/scale/scale.png
#   e2e/run-scale.sh --ci       100 nodes, 1k/2k pods, 50 watches (a few minutes); fails on
#                               a figure over x2 its e2e/scale/baseline-ci.json, and lowers
#                               there every figure it beat (commit the file: the baseline
#                               only moves down on its own, up only by hand with a reason)
#   e2e/run-scale.sh -- ARGS    resourcewatch-scale with these arguments
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=target-cluster.sh
source e2e/target-cluster.sh
rw_target_cluster
mode=report
case "${1:-}" in
  --ci) mode=ci ;;
  --) mode=args; shift ;;
  "") ;;
  *) echo "usage: $0 [--ci | -- ARGS]" >&2; exit 64 ;;
esac
started=0
if [[ $RW_E2E_EXTERNAL -eq 0 && -z "${RW_SCALE_CLUSTER_UP:-}" ]]; then
  e2e/cluster/up.sh --apiserver-only
  started=1
fi
# shellcheck source=cluster/env.sh
[[ $RW_E2E_EXTERNAL -eq 1 ]] || source e2e/cluster/env.sh
export KUBECONFIG
cleanup() {
  rc=$?
  if [[ $rc -ne 0 ]]; then
    for f in /tmp/resourcewatch-operator-*.log; do
      [[ -f "$f" ]] || continue
      echo "== $f (tail)" >&2; tail -30 "$f" >&2
    done
  fi
  if [[ $started -eq 1 ]]; then
    # --purge: no kubelet finishes the deletion of 20,000 pods; a fresh etcd is quicker.
    e2e/cluster/down.sh --purge >/dev/null || rc=1
    e2e/cluster/check-clean.sh || rc=1
  fi
  exit $rc
}
trap cleanup EXIT
rm -f /tmp/resourcewatch-operator-*.log
# Release builds: the figures are the product's, not a debug build's.
cargo build --release -p resourcewatch-operator -p resourcewatch-e2e \
  --bin resourcewatch-operator --bin resourcewatch-scale
bin=target/release/resourcewatch-scale
case $mode in
  ci)
    "$bin" --nodes 100 --pods 1000,2000 --watches 50 --big-watches 2 --big-size 400 \
      --window-secs 30 --baseline e2e/scale/baseline-ci.json --lower-baseline ;;
  args)
    "$bin" "$@" ;;
  report)
    # The committed report is replaced only by a run that finished (pipefail stops here
    # otherwise): a failed run's report is on the terminal and in $report.
    report=$(mktemp /tmp/resourcewatch-scale-report.XXXXXX)
    "$bin" --csv e2e/scale/scale.csv | tee "$report"
    mv "$report" e2e/scale/last-report.md
    .ci/install-deps --plot
    # Debian's interpreter: the one python3-matplotlib is installed for.
    /usr/bin/python3 e2e/scale/plot.py e2e/scale/scale.csv e2e/scale/scale.png 384 ;;
esac
