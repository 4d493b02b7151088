#!/usr/bin/env bash
# The Prometheus Operator for real in the e2e cluster, as most clusters scrape: its
# released bundle.yaml (CRDs, RBAC, the operator's Deployment) applied as a user would,
# a Prometheus it runs for resourcewatch, and config/prometheus (ServiceMonitor,
# PodMonitor, PrometheusRule, dashboard) applied exactly as shipped.
#
#   e2e/prometheus/operator.sh build   the operator, its config reloader and Prometheus, built
#                                      from their Go modules at the versions pinned in go/*/go.mod,
#                                      as images; cached; prints the cache directory
#   e2e/prometheus/operator.sh up      installs all of it on the e2e cluster (images imported on
#                                      this machine's node); prints Prometheus's address (IP:9090)
#   e2e/prometheus/operator.sh down    removes it
#
# No image is pulled: the bundle's two image references and the Prometheus image are our
# builds (localhost/resourcewatch-e2e/*), the rest of the bundle is as released. Prometheus
# runs on this machine's node (the VM node is tainted) and reaches the operator's and the
# agents' pods over the pod network, with the TLS settings the shipped monitors carry.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE/../.."
# shellcheck source=e2e/cluster/env.sh
source e2e/cluster/env.sh
# The pins: each go.mod's own require line, read, not repeated here.
pin() { sed -n "s|^\t$2 \(v[^ ]*\).*|\1|p" "$HERE/go/$1/go.mod" | head -1; }
PO_VERSION="$(pin operator github.com/prometheus-operator/prometheus-operator)"
PROM_MODULE="$(pin prometheus github.com/prometheus/prometheus)"
# Prometheus's Go module v0.3XX.Y is its release 3.XX.Y.
PROM_VERSION="v3.$(cut -d. -f2 <<<"$PROM_MODULE" | sed 's/^3//;s/^0//').$(cut -d. -f3 <<<"$PROM_MODULE")"
[[ -n $PO_VERSION && $PROM_VERSION =~ ^v3\.[0-9]+\.[0-9]+$ ]] \
  || { echo "operator.sh: cannot read the pins in $HERE/go/*/go.mod" >&2; exit 1; }
STAMP="$(cat "$HERE"/go/*/go.mod "$HERE"/go/*/go.sum "$0" | sha256sum | cut -c1-12)"
CACHE="/var/cache/resourcewatch/prometheus-operator/$STAMP"
IMG=localhost/resourcewatch-e2e
NS=rw-e2e-monitoring
K="${KUBECTL:-kubectl}"

log() { echo "operator.sh: $*" >&2; }
die() { log "$*"; exit 1; }

build() {
  # One build at a time (e2e/prebuild.sh may run one beside the e2e step's).
  mkdir -p "$(dirname "$CACHE")"
  exec 8>"$(dirname "$CACHE")/.build.lock"
  flock 8
  if [[ -f $CACHE/.done ]]; then echo "$CACHE"; return; fi
  rm -rf "$CACHE.tmp" && mkdir -p "$CACHE.tmp/bin" "$CACHE.tmp/images"
  for d in /usr/local/go/bin; do [[ -d $d && ":$PATH:" != *":$d:"* ]] && export PATH="$d:$PATH"; done
  # As e2e/cluster/build.sh builds the cluster: the machine's Go, the go.sum checked, the
  # module and build caches shared with the cluster's build (client-go and friends).
  export GOTOOLCHAIN=local GOFLAGS=-mod=readonly GOMODCACHE="${RW_GO_CACHE}/mod" \
    GOCACHE="${RW_GO_CACHE}/build" CGO_ENABLED=0
  local t=$SECONDS log="$CACHE.tmp/build.log"
  (cd "$HERE/go/operator" && go build -trimpath -ldflags "-s -w \
    -X github.com/prometheus/common/version.Version=${PO_VERSION#v}" -o "$CACHE.tmp/bin/" \
    github.com/prometheus-operator/prometheus-operator/cmd/operator \
    github.com/prometheus-operator/prometheus-operator/cmd/prometheus-config-reloader) >"$log" 2>&1 \
    || { tail -30 "$log" >&2; die "go build of the Prometheus Operator $PO_VERSION failed"; }
  # Only Kubernetes service discovery: the other providers' SDKs (cloud APIs) are most of
  # Prometheus's build and nothing here uses them (Prometheus's own build tags).
  (cd "$HERE/go/prometheus" && go build -trimpath -tags remove_all_sd,enable_kubernetes_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=${PROM_VERSION#v}" \
    -o "$CACHE.tmp/bin/" github.com/prometheus/prometheus/cmd/prometheus) >>"$log" 2>&1 \
    || { tail -30 "$log" >&2; die "go build of Prometheus $PROM_VERSION failed"; }
  local src
  src="$(cd "$HERE/go/operator" && go list -m -f '{{.Dir}}' github.com/prometheus-operator/prometheus-operator)"
  cp "$src/bundle.yaml" "$CACHE.tmp/"
  # Where the operator's Deployment and the StatefulSets it makes expect them.
  e2e/cluster/image.sh --path /bin/operator "$IMG/prometheus-operator:$PO_VERSION" \
    "$CACHE.tmp/images/prometheus-operator.tar" "$CACHE.tmp/bin/operator" >/dev/null
  e2e/cluster/image.sh --path /bin/prometheus-config-reloader \
    "$IMG/prometheus-config-reloader:$PO_VERSION" "$CACHE.tmp/images/prometheus-config-reloader.tar" \
    "$CACHE.tmp/bin/prometheus-config-reloader" >/dev/null
  e2e/cluster/image.sh --path /bin/prometheus "$IMG/prometheus:$PROM_VERSION" \
    "$CACHE.tmp/images/prometheus.tar" "$CACHE.tmp/bin/prometheus" >/dev/null
  touch "$CACHE.tmp/.done"
  rm -rf "$CACHE" && mv "$CACHE.tmp" "$CACHE"
  log "built the Prometheus Operator $PO_VERSION and Prometheus $PROM_VERSION in $((SECONDS - t)) s"
  echo "$CACHE"
}

# The released bundle with its two image references replaced by our builds: the operator's
# container image and its --prometheus-config-reloader argument. Nothing else changes.
bundle() {
  python3 - "$CACHE/bundle.yaml" "$IMG" "$PO_VERSION" <<'EOF'
import re, sys
path, img, version = sys.argv[1:]
text = open(path).read()
# Edited as text: the bundle's CRDs hold YAML that PyYAML's safe loader refuses ("=" keys).
subs = [
    (r"(\n\s+image: )\S+/prometheus-operator:" + re.escape(version) + r"\n",
     r"\g<1>" + f"{img}/prometheus-operator:{version}\n"),
    (r"--prometheus-config-reloader=\S+",
     f"--prometheus-config-reloader={img}/prometheus-config-reloader:{version}"),
]
for pattern, repl in subs:
    text, n = re.subn(pattern, repl, text)
    if n != 1:
        sys.exit(f"operator.sh: the bundle's Deployment is not shaped as expected ({pattern}: {n})")
sys.stdout.write(text)
EOF
}

up() {
  build >/dev/null
  rw_import_images "$CACHE"/images/*.tar
  bundle | "$K" apply --server-side --force-conflicts -f - >/dev/null
  "$K" wait --for=condition=Established --timeout=60s \
    crd/prometheuses.monitoring.coreos.com crd/servicemonitors.monitoring.coreos.com \
    crd/podmonitors.monitoring.coreos.com crd/prometheusrules.monitoring.coreos.com >/dev/null
  "$K" -n default rollout status deploy/prometheus-operator --timeout=120s >/dev/null \
    || die "the Prometheus Operator did not become ready: $("$K" -n default describe pod -l app.kubernetes.io/name=prometheus-operator | tail -20)"
  # What the shipped monitors need of Prometheus (docs/operations.md, Metrics and alerts):
  # discovery of the operator's EndpointSlice and the agents' pods, and the ClusterRole
  # resourcewatch-metrics-reader for the operator's /metrics.
  "$K" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: $NS}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: prometheus, namespace: $NS}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: rw-e2e-prometheus}
rules:
  - apiGroups: [""]
    resources: [nodes, nodes/metrics, services, endpoints, pods]
    verbs: [get, list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [get, list, watch]
  - apiGroups: [""]
    resources: [configmaps]
    verbs: [get]
  - nonResourceURLs: [/metrics]
    verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: rw-e2e-prometheus}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: rw-e2e-prometheus}
subjects: [{kind: ServiceAccount, name: prometheus, namespace: $NS}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: rw-e2e-prometheus-resourcewatch-metrics}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: resourcewatch-metrics-reader}
subjects: [{kind: ServiceAccount, name: prometheus, namespace: $NS}]
---
apiVersion: monitoring.coreos.com/v1
kind: Prometheus
metadata: {name: rw, namespace: $NS}
spec:
  image: $IMG/prometheus:$PROM_VERSION
  version: $PROM_VERSION
  replicas: 1
  serviceAccountName: prometheus
  serviceMonitorSelector: {}
  serviceMonitorNamespaceSelector: {}
  podMonitorSelector: {}
  podMonitorNamespaceSelector: {}
  ruleSelector: {}
  ruleNamespaceSelector: {}
  evaluationInterval: 5s
  nodeSelector: {kubernetes.io/hostname: $(hostname | tr '[:upper:]' '[:lower:]')}
  resources: {requests: {memory: 200Mi}}
EOF
  # The shipped objects, as a user applies them.
  "$K" apply -k config/prometheus >/dev/null
  local ip=""
  for _ in $(seq 120); do
    ip="$("$K" -n "$NS" get pod prometheus-rw-0 -o jsonpath='{.status.podIP}' 2>/dev/null || true)"
    [[ -n $ip ]] && "$K" -n "$NS" wait --for=condition=Ready pod/prometheus-rw-0 --timeout=1s >/dev/null 2>&1 && break
    ip=""
    sleep 1
  done
  [[ -n $ip ]] || die "Prometheus did not become ready: $("$K" -n "$NS" describe pod prometheus-rw-0 2>&1 | tail -25)"
  log "the Prometheus Operator $PO_VERSION runs Prometheus $PROM_VERSION at $ip:9090"
  echo "$ip:9090"
}

down() {
  "$K" delete -k config/prometheus --ignore-not-found --wait=false >/dev/null 2>&1 || true
  "$K" delete namespace "$NS" --ignore-not-found --timeout=120s >/dev/null 2>&1 || true
  "$K" delete clusterrolebinding rw-e2e-prometheus rw-e2e-prometheus-resourcewatch-metrics \
    --ignore-not-found >/dev/null 2>&1 || true
  "$K" delete clusterrole rw-e2e-prometheus --ignore-not-found >/dev/null 2>&1 || true
  [[ -f $CACHE/bundle.yaml ]] && bundle | "$K" delete --ignore-not-found --wait=false -f - >/dev/null 2>&1 || true
}

case "${1:-}" in
  build) build ;;
  up) up ;;
  down) down ;;
  *) echo "usage: $0 build | up | down" >&2; exit 2 ;;
esac
