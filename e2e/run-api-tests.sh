#!/usr/bin/env bash
# The operator's API tests (e2e/tests/api.rs) against a real kube-apiserver.
# The harness starts etcd, kube-apiserver and kube-controller-manager (building
# Kubernetes once, cached) and stops them afterwards, whatever the outcome. A KUBECONFIG
# in the environment is ignored; RW_E2E_KUBECONFIG=FILE opts in to another cluster, where
# nothing is started or stopped (e2e/target-cluster.sh: production-looking contexts refused).
# On failure it prints the cluster's state and the operator logs the tests kept.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=target-cluster.sh
source e2e/target-cluster.sh
rw_target_cluster
started=0
if [[ $RW_E2E_EXTERNAL -eq 0 ]]; then
  e2e/cluster/up.sh --apiserver-only
  # shellcheck source=cluster/env.sh
  source e2e/cluster/env.sh
  export KUBECONFIG KUBECTL
  started=1
fi
cleanup() {
  rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "== API tests failed: cluster state" >&2
    "${KUBECTL:-kubectl}" get resourcewatches,pods,events -A -o wide 2>&1 | tail -80 >&2 || true
    for f in /tmp/resourcewatch-operator-*.log; do
      [[ -f "$f" ]] || continue
      echo "== $f (tail)" >&2; tail -40 "$f" >&2
    done
  fi
  if [[ $started -eq 1 ]]; then
    e2e/cluster/down.sh || rc=1
    e2e/cluster/check-clean.sh || rc=1
    e2e/cluster/down.sh --purge >/dev/null || rc=1
  fi
  exit $rc
}
trap cleanup EXIT
rm -f /tmp/resourcewatch-operator-*.log
cargo build -p resourcewatch-operator -p kubectl-resourcewatch
cargo test -p resourcewatch-e2e --test api -- --ignored --test-threads=1
cargo test -p resourcewatch-e2e --test plugin -- --ignored --test-threads=1
cargo test -p resourcewatch-e2e --test trust -- --ignored --test-threads=1
cargo test -p resourcewatch-e2e --test lease -- --ignored --test-threads=1
