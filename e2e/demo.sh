#!/usr/bin/env bash
# The local demo: brings the single-node cluster up (building Kubernetes once, cached),
# builds and imports the images, installs resourcewatch through config/, starts three
# workloads (a CPU burner, a memory holder, a slow leak) labelled app=api, applies the
# sample ResourceWatch and prints `kubectl get resourcewatch -o wide` once it is filled.
# `make down` stops the cluster and leaves the machine as it was.
set -euo pipefail
cd "$(dirname "$0")/.."
e2e/cluster/up.sh >/dev/null
# shellcheck source=cluster/env.sh
source e2e/cluster/env.sh
K="$KUBECTL"
make -s images
rw_import_images target/images/{operator,agent,workloads,node-workloads}.tar
"$K" apply -k config
"$K" -n resourcewatch-system rollout status deploy/resourcewatch-operator --timeout=120s
"$K" -n resourcewatch-system rollout status ds/resourcewatch-agent --timeout=120s
"$K" create namespace demo --dry-run=client -o yaml | "$K" apply -f -
pod() { # name args... (memory limit 256Mi)
  local name=$1; shift
  local args; args=$(printf '"%s",' "$@"); args="[${args%,}]"
  cat <<YAML | "$K" -n demo apply -f -
apiVersion: v1
kind: Pod
metadata: {name: $name, labels: {app: api}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: localhost/resourcewatch/workloads:0.1.0
      imagePullPolicy: Never
      command: ["/leak-sim"]
      args: $args
      resources: {limits: {memory: 256Mi}}
YAML
}
pod api-burn --pattern burn
pod api-cache --pattern flat --size 150MiB
pod api-leak --pattern leak --baseline 20MiB --rate 1MiB/s --delay 20
"$K" -n demo apply -f config/samples/resourcewatch.yaml
# The table is printed once it shows what the demo is for: the CPU measured over a whole
# interval (the sample's is 30 s) and the leaking pod listed with its OOM ETA. The leak
# starts 20 s into its pod at 1 MiB/s and would be OOM-killed about 4 min later.
echo "waiting for the status to list the leak with its OOM ETA (about 2-3 min)..." >&2
t0=$(date +%s); shown=0
while (( $(date +%s) - t0 < 300 )); do
  s=$("$K" -n demo get resourcewatch api -o jsonpath='{.status.summary.topCPU}|{.status.summary.leaking}|{.status.summary.soonestOOM}|{.status.summary.soonestOOMPod}' 2>/dev/null || true)
  IFS='|' read -r top leaking eta eta_pod <<<"$s"
  if [[ -n "$top" && "$top" != *"(0%)"* && "${leaking:-0}" -ge 1 && -n "$eta" && "$eta_pod" == api-leak* ]]; then shown=1; break; fi
  sleep 2
done
echo "(after $(( $(date +%s) - t0 ))s)" >&2
"$K" -n demo get resourcewatch -o wide
echo
echo "KUBECONFIG=$KUBECONFIG $K -n demo get resourcewatch api -o yaml   # the whole status"
echo "make down                                                            # stop and clean up"
if [[ $shown -eq 0 ]]; then
  echo "demo: the leak was not listed with an OOM ETA within 300s (the status above; make down cleans up)" >&2
  exit 1
fi
