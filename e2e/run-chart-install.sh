#!/usr/bin/env bash
# `make chart-install`: the Helm chart installed, upgraded and uninstalled by Helm's engine
# (charts/install-check.sh) on the local harness cluster. The cluster is started when it
# is not running (and stopped again afterwards), the images built and imported. Like the
# e2e tests, an exported KUBECONFIG is ignored; RW_E2E_KUBECONFIG=FILE opts in to another
# cluster (e2e/target-cluster.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=target-cluster.sh
source e2e/target-cluster.sh
rw_target_cluster
external_kubeconfig="${KUBECONFIG:-}"
# shellcheck source=cluster/env.sh
source e2e/cluster/env.sh
[[ -n $external_kubeconfig ]] && export KUBECONFIG="$external_kubeconfig"
started=0
if [[ $RW_E2E_EXTERNAL -eq 0 ]] && ! "$KUBECTL" get --raw /readyz >/dev/null 2>&1; then
  e2e/cluster/up.sh >/dev/null
  started=1
  trap 'e2e/cluster/down.sh >/dev/null' EXIT
fi
make -s images
if [[ $RW_E2E_EXTERNAL -eq 0 ]]; then
  rw_import_images target/images/{operator,agent}.tar
fi
KUBECTL="$KUBECTL" charts/install-check.sh
[[ $started -eq 1 ]] && echo "(the cluster this started is stopped again)"
exit 0
