#!/usr/bin/env bash
# Check charts/resourcewatch with Helm's own engine (charts/helm.sh: helm-python-sdk, Helm
# v4's Go SDK), against config/ (see charts/README.md, "What is verified here"). Exits
# non-zero on any failure.
#
#   charts/check.sh
#
# Environment:
#   KUBECTL=PATH              kubectl whose `kustomize` renders config/ (default:
#                             the e2e harness's (e2e/cluster/env.sh's $KUBECTL), else
#                             kubectl on PATH, else a small python loader; KUBECTL=none
#                             forces the python loader)
#   RW_E2E_KUBECONFIG         `kubectl apply --dry-run=server` against that cluster (default:
#                             the harness cluster's, when it runs; an exported KUBECONFIG is
#                             not used, as for the e2e tests)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
CHART="$HERE/resourcewatch"
cd "$REPO"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
FAILED=()
step() { printf '\n== %s\n' "$*"; }
failed() { echo "  FAIL: $*"; FAILED+=("$*"); }
R() { "$HERE/helm.sh" template "$@"; }

# ---- tools ------------------------------------------------------------------------------
step "tools"
PY=python3
if ! $PY -c 'import yaml, jsonschema' 2>/dev/null; then
  echo "  installing pyyaml and jsonschema (PyPI)"
  $PY -m pip install -q pyyaml==6.0.2 jsonschema==4.23.0
fi
CHECK=("$PY" "$HERE/check.py")
# Helm's engine (installs the pinned SDK on first use).
R --help >/dev/null
if "$HERE/helm.sh" lint --strict --kube-version v1.37.2 >"$TMP/lint.txt" 2>&1; then
  echo "  ok: helm lint --strict: $(grep -c '^\[' "$TMP/lint.txt" || true) message(s), no warning or error"
else
  sed 's/^/    /' "$TMP/lint.txt"; failed "helm lint --strict"
fi

# ---- (a) renders ------------------------------------------------------------------------
step "(a) render: defaults, remediation.enabled=true, a values file with other images"
NS=resourcewatch-system
cat >"$TMP/custom-values.yaml" <<'EOF'
logFormat: json
operator:
  image:
    registry: registry.example.com:5000
    repository: rw/operator
    tag: "1.2.3"
    digest: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
    pullPolicy: Always
  podLabels: {example.com/team: sre}
  extraArgs: [--reconcile-interval=1m]
  extraEnv:
    - name: RESOURCEWATCH_SECRET_REF
      valueFrom: {secretKeyRef: {name: s, key: k}}
  replicas: 2
  logLevel: debug
  agentGrace: 45s
  resources:
    requests: {cpu: 100m}
    limits: {memory: 512Mi}
  nodeSelector: {node-role.kubernetes.io/control-plane: ""}
agent:
  logLevel: debug,aya=warn
  image:
    repository: registry.example.com:5000/rw/agent
    tag: ""
    pullPolicy: Never
  tolerations:
    - {key: dedicated, operator: Equal, value: monitoring, effect: NoSchedule}
  nodeSelector: {kubernetes.io/os: linux, kubernetes.io/arch: amd64}
  podAnnotations: {example.com/team: sre}
  podLabels: {example.com/cost-center: "42", app.kubernetes.io/name: ignored}
  extraArgs: [--metrics-addr=off]
  extraEnv:
    - {name: RESOURCEWATCH_EXTRA, value: "1"}
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchExpressions: [{key: example.com/pool, operator: NotIn, values: [gpu]}]
  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 10%}}
imagePullSecrets:
  - name: regcred
EOF
render_case() { # NAME ARGS... : render + notes + coalesced values into $TMP/NAME.*
  local name=$1; shift
  if R "$@" --show-notes >"$TMP/$name.yaml" 2>"$TMP/$name.notes" &&
     R "$@" --print-values >"$TMP/$name.values.yaml" &&
     R "$@" --skip-crds >"$TMP/$name.nocrds.yaml"; then
    echo "  ok: $name: $(grep -c '^# Source:' "$TMP/$name.yaml") documents ($*)"
  else
    failed "$name: render failed: $(cat "$TMP/$name.notes")"
  fi
}
render_case default --namespace "$NS"
render_case remediation --namespace "$NS" --set remediation.enabled=true
render_case custom --name rw-test --namespace monitoring -f "$TMP/custom-values.yaml"
render_case grants --namespace "$NS" --set 'remediation.namespaces={team-a,team-b}' --set 'profiles.namespaces={team-a}'
# A second render of the same input is byte-identical (no map-order nondeterminism).
R --namespace "$NS" --show-notes 2>/dev/null | cmp -s - "$TMP/default.yaml" ||
  failed "two renders of the defaults differ"

# ---- (b) every document is a Kubernetes object ------------------------------------------
step "(b) every document parses as YAML with apiVersion, kind, metadata.name"
"${CHECK[@]}" docs "$TMP/default.yaml" --namespace "$NS" || failed "documents of the default render"
"${CHECK[@]}" docs "$TMP/remediation.yaml" --namespace "$NS" || failed "documents of the remediation render"
"${CHECK[@]}" docs "$TMP/custom.yaml" --namespace monitoring || failed "documents of the values-file render"
"${CHECK[@]}" crd "$CHART" "$REPO/crds" "$TMP/default.yaml" ||
  failed "crds/"
if grep -q 'resourcewatch-operator (1 replica(s))' "$TMP/default.notes" &&
   grep -q 'Remediation is OFF' "$TMP/default.notes" && grep -q 'Remediation is ON' "$TMP/remediation.notes"; then
  echo "  ok: NOTES.txt renders and follows remediation.enabled"
else
  failed "NOTES.txt"
fi

# ---- (c) config/ is the render ---------------------------------------------------------
# The kubectl the e2e harness builds (its version is the cluster's), if built.
HARNESS_KUBECTL=$(source "$REPO/e2e/cluster/env.sh" >/dev/null 2>&1 && echo "$KUBECTL") || HARNESS_KUBECTL=""
step "(c) config/ is the chart's render (charts/config.py --check), and kustomize builds it"
$PY "$HERE/config.py" --check | sed 's/^/  /'
[[ ${PIPESTATUS[0]} == 0 ]] || failed "config/ is not the chart's render: run make generate"
KUBECTL_PICK="${KUBECTL:-}"
[[ $KUBECTL_PICK == none ]] && KUBECTL_PICK=""
[[ -n $KUBECTL_PICK || ${KUBECTL:-} == none ]] || for k in "$HARNESS_KUBECTL" "$(command -v kubectl || true)"; do
  [[ -n $k && -x $k ]] && { KUBECTL_PICK=$k; break; }
done
if [[ -z $KUBECTL_PICK ]]; then
  echo "  note: no kubectl: kubectl kustomize config not run (the kustomizations list every file: checked above)"
elif timeout 60 "$KUBECTL_PICK" kustomize "$REPO/config" >"$TMP/kustomize.yaml" 2>"$TMP/kustomize.err"; then
  # Every object of the default render (less helm test's Pod) and the Namespace.
  want=$(( $(grep -c '^# Source:' "$TMP/default.yaml") - $(grep -c '^# Source: .*/templates/tests/' "$TMP/default.yaml") + 1 ))
  got=$(grep -c '^kind:' "$TMP/kustomize.yaml")
  if [[ $got == "$want" ]]; then
    echo "  ok: $KUBECTL_PICK kustomize config: $got objects, the render's and the Namespace"
  else
    failed "kubectl kustomize config gives $got objects, the render $want (with the Namespace)"
  fi
else
  failed "kubectl kustomize config: $(head -c 300 "$TMP/kustomize.err")"
fi

# ---- (d) remediation switch -------------------------------------------------------------
step "(d) remediation master switch; the operator's RBAC follows the opt-ins"
"${CHECK[@]}" remediation "$TMP/default.yaml" "$TMP/remediation.yaml" || failed "remediation switch"
"${CHECK[@]}" rbac "$TMP/default.yaml" "$TMP/grants.yaml" || failed "operator RBAC"
"${CHECK[@]}" values-file "$TMP/custom.yaml" || failed "values file"
# agent.jvmPerfMaps=false: the agent loses CAP_KILL and CAP_DAC_OVERRIDE and is told not
# to ask JVMs; the default keeps both (what config/ ships, compared above).
R --set agent.jvmPerfMaps=false >"$TMP/nojvm.yaml" || failed "render with agent.jvmPerfMaps=false"
if grep -A2 'name: RESOURCEWATCH_NO_JVM_PERF_MAPS' "$TMP/nojvm.yaml" | grep -q '"true"' \
  && ! grep -E '^ +add: \["BPF".*("KILL"|"DAC_OVERRIDE")' "$TMP/nojvm.yaml" >/dev/null \
  && grep -E '^ +add: \["BPF".*"KILL", "DAC_OVERRIDE"' "$TMP/default.yaml" >/dev/null \
  && ! grep -q RESOURCEWATCH_NO_JVM_PERF_MAPS "$TMP/default.yaml"; then
  echo "  ok: agent.jvmPerfMaps=false drops CAP_KILL and CAP_DAC_OVERRIDE and sets RESOURCEWATCH_NO_JVM_PERF_MAPS"
else
  failed "agent.jvmPerfMaps switch"
fi

# ---- (e) schema -------------------------------------------------------------------------
step "(e) values.schema.json"
"${CHECK[@]}" schema "$CHART" || failed "schema (python jsonschema)"
BAD_SETS=(operator.replicas=two remediation.enabled=yes remediation.enable=true
          fullnameOverride=Acme fullnameOverride=-rw nameOverride=rw_1
          operator.agentGrace=20 operator.image.pullPolicy=Sometimes operator.image.tag=2
          agent.tolerations=linux)
n=0
for s in "${BAD_SETS[@]}"; do
  if R --set "$s" >/dev/null 2>"$TMP/err"; then
    failed "Helm accepts --set $s"
  elif ! grep -q "values don't meet the specifications of the schema" "$TMP/err"; then
    failed "--set $s fails, but not by the schema: $(cat "$TMP/err")"
  else
    n=$((n + 1))
  fi
done
echo "  ok: Helm's schema validation rejects $n bad --set values, e.g.:"
R --set operator.replicas=two 2>&1 >/dev/null | sed 's/^/    /' || true
if R --set-string operator.image.tag=2 >/dev/null; then
  echo "  ok: --set-string operator.image.tag=2 is accepted"
else
  failed "--set-string operator.image.tag=2 rejected"
fi

# ---- Prometheus objects, Pod Security ----------------------------------------------------
step "metrics.*: ServiceMonitor, PodMonitor, PrometheusRule; Pod Security levels"
R --namespace "$NS" --set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true \
  --set metrics.prometheusRule.enabled=true --set metrics.prometheusRule.labels.release=kps \
  --set metrics.grafanaDashboard.enabled=true \
  >"$TMP/monitoring.yaml" 2>/dev/null || failed "render with metrics.* enabled"
"${CHECK[@]}" monitoring "$TMP/monitoring.yaml" || failed "metrics.* objects"
cat >"$TMP/monitoring-values.yaml" <<'EOF'
metrics:
  serviceMonitor:
    enabled: true
    authorization: {secretName: prom-token, key: token}
    relabelings: [{targetLabel: cluster, replacement: east}]
    metricRelabelings: [{sourceLabels: [__name__], regex: go_.*, action: drop}]
  podMonitor:
    enabled: true
    relabelings: [{targetLabel: cluster, replacement: east}]
  prometheusRule:
    enabled: true
    disabled: [ResourceWatchAgentLosingSamples, ResourceWatchAPIServerErrors]
    additionalLabels: {team: sre}
    runbookBaseURL: https://runbooks.example.com/resourcewatch/
EOF
R --namespace "$NS" -f "$TMP/monitoring-values.yaml" >"$TMP/monitoring-settings.yaml" 2>"$TMP/monitoring-settings.err" ||
  failed "render with the monitoring settings: $(head -c 300 "$TMP/monitoring-settings.err")"
"${CHECK[@]}" monitoring-settings "$TMP/monitoring-settings.yaml" || failed "monitoring settings"
R --namespace "$NS" --set operator.serviceAccount.create=false --set operator.serviceAccount.name=ops \
  --set agent.serviceAccount.name=node-agents >"$TMP/accounts.yaml" 2>/dev/null || failed "render with named accounts"
R --namespace "$NS" --set rbac.create=false >"$TMP/norbac.yaml" 2>/dev/null || failed "render with rbac.create=false"
"${CHECK[@]}" accounts "$TMP/accounts.yaml" "$TMP/norbac.yaml" || failed "accounts and RBAC switches"
"${CHECK[@]}" podsecurity "$TMP/default.yaml" "$REPO/config/namespace.yaml" || failed "Pod Security"
R --namespace "$NS" --set operator.replicas=2 --set operator.priorityClassName=system-cluster-critical \
  --set agent.priorityClassName=system-node-critical >"$TMP/two.yaml" 2>/dev/null || failed "render with 2 replicas"
R --namespace "$NS" --set operator.replicas=2 \
  --set 'operator.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool' \
  --set 'operator.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists' \
  >"$TMP/user-affinity.yaml" 2>/dev/null || failed "render with a user's affinity"
"${CHECK[@]}" production "$TMP/default.yaml" "$TMP/two.yaml" "$TMP/user-affinity.yaml" || failed "replicas, budget, spread, priority"
R --namespace "$NS" --set fullnameOverride=acme --set metrics.serviceMonitor.enabled=true \
  --set metrics.podMonitor.enabled=true --set metrics.prometheusRule.enabled=true \
  --set metrics.grafanaDashboard.enabled=true --set operator.replicas=2 \
  --set 'remediation.namespaces={team-a}' --set 'profiles.namespaces={team-a}' \
  >"$TMP/renamed.yaml" 2>/dev/null || failed "render with fullnameOverride"
"${CHECK[@]}" renamed "$TMP/renamed.yaml" acme || failed "fullnameOverride"

# ---- (f) server-side dry run ------------------------------------------------------------
step "(f) kubectl apply --dry-run=server (only with a reachable cluster)"
K="${KUBECTL_PICK:-}"
[[ -n $K ]] || for k in "$HARNESS_KUBECTL" "$(command -v kubectl || true)"; do
  [[ -n $k && -x $k ]] && { K=$k; break; }
done
export KUBECONFIG="${RW_E2E_KUBECONFIG:-/var/lib/resourcewatch-e2e/admin.kubeconfig}"
if [[ ! -f $KUBECONFIG ]]; then
  echo "  SKIP: the harness cluster is not up and RW_E2E_KUBECONFIG is not set (make e2e runs this dry run)"
elif [[ -z $K ]]; then
  echo "  SKIP: no kubectl"
elif ! timeout 20 "$K" get --raw /readyz >/dev/null 2>&1; then
  echo "  SKIP: no cluster reachable through $KUBECONFIG"
else
  # Namespaced objects need their namespace to exist, even in a dry run.
  DRY_NS=$NS
  timeout 20 "$K" get namespace "$NS" >/dev/null 2>&1 || DRY_NS=default
  R --namespace "$DRY_NS" >"$TMP/dry.yaml"
  R --namespace "$DRY_NS" --set remediation.enabled=true >"$TMP/dry-rem.yaml"
  if timeout 120 "$K" apply --dry-run=server -f "$TMP/dry.yaml" | sed 's/^/  /' &&
     timeout 120 "$K" apply --dry-run=server -f "$TMP/dry-rem.yaml" >/dev/null; then
    echo "  ok: the API server accepts both renders (namespace $DRY_NS)"
  else
    failed "kubectl apply --dry-run=server"
  fi
fi

echo
if ((${#FAILED[@]})); then
  echo "charts/check.sh: ${#FAILED[@]} failure(s):"
  printf '  - %s\n' "${FAILED[@]}"
  exit 1
fi
echo "charts/check.sh: all chart checks passed"
