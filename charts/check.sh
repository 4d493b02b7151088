#!/usr/bin/env bash
# Check charts/resourcewatch without helm (see charts/README.md, "What is and isn't
# verified here"). Exits non-zero on any failure.
#
#   charts/check.sh
#
# Environment:
#   KUBECTL=PATH              kubectl whose `kustomize` renders config/default (default:
#                             the 1.20 one in /var/cache/resourcewatch/k8s-1.20.2/bin, else
#                             kubectl on PATH, else a small python loader; KUBECTL=none
#                             forces the python loader)
#   CHART_CHECK_HELM_SDK=0    skip the comparison with Helm's own engine (helm-python-sdk)
#   KUBECONFIG                when it reaches a cluster: `kubectl apply --dry-run=server`
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
R() { "$HERE/render.sh" "$@"; }

# ---- tools ------------------------------------------------------------------------------
step "tools"
PY=python3
if ! $PY -c 'import yaml, jsonschema' 2>/dev/null; then
  echo "  installing pyyaml and jsonschema (PyPI)"
  $PY -m pip install -q pyyaml jsonschema
fi
CHECK=("$PY" "$HERE/check.py")
# Build (or reuse) the renderer, and run its unit tests.
R --help >/dev/null
CACHE=/var/cache/resourcewatch/chart-render
[[ -w $CACHE ]] || CACHE="$REPO/target/chart-render"
if (cd "$HERE/render" && export GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS='' GOPROXY=off \
      GOCACHE="$CACHE/gocache" && go vet . && go test -count=1 . 2>&1 | sed 's/^/  /'; exit "${PIPESTATUS[0]}"); then
  echo "  ok: renderer builds, go vet is clean, its unit tests pass"
else
  failed "renderer go vet / go test"
fi
[[ -z "$(gofmt -l "$HERE/render")" ]] || failed "gofmt: $(gofmt -l "$HERE/render")"

# ---- (a) renders ------------------------------------------------------------------------
step "(a) render: defaults, remediation.enabled=true, a values file with other images"
NS=resourcewatch-system
cat >"$TMP/custom-values.yaml" <<'EOF'
operator:
  image:
    repository: registry.example.com:5000/rw/operator
    tag: "1.2.3"
    pullPolicy: Always
  replicas: 2
  logLevel: debug
  agentGrace: 45s
  resources:
    requests: {cpu: 100m}
    limits: {memory: 512Mi}
  nodeSelector: {node-role.kubernetes.io/control-plane: ""}
agent:
  image:
    repository: registry.example.com:5000/rw/agent
    tag: ""
    pullPolicy: Never
  tolerations:
    - {key: dedicated, operator: Equal, value: monitoring, effect: NoSchedule}
  nodeSelector: {kubernetes.io/os: linux}
  podAnnotations: {example.com/team: sre}
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
# A second render of the same input is byte-identical (no map-order nondeterminism).
R --namespace "$NS" --show-notes 2>/dev/null | cmp -s - "$TMP/default.yaml" ||
  failed "two renders of the defaults differ"

# ---- (b) every document is a Kubernetes object ------------------------------------------
step "(b) every document parses as YAML with apiVersion, kind, metadata.name"
"${CHECK[@]}" docs "$TMP/default.yaml" --namespace "$NS" || failed "documents of the default render"
"${CHECK[@]}" docs "$TMP/remediation.yaml" --namespace "$NS" || failed "documents of the remediation render"
"${CHECK[@]}" docs "$TMP/custom.yaml" --namespace monitoring || failed "documents of the values-file render"
"${CHECK[@]}" crd "$CHART" "$REPO/crds/resourcewatch.io_resourcewatches.yaml" "$TMP/default.yaml" ||
  failed "crds/"
if grep -q 'resourcewatch-operator (1 replica(s))' "$TMP/default.notes" &&
   grep -q 'Remediation is OFF' "$TMP/default.notes" && grep -q 'Remediation is ON' "$TMP/remediation.notes"; then
  echo "  ok: NOTES.txt renders and follows remediation.enabled"
else
  failed "NOTES.txt"
fi

# ---- (c) same objects as config/ --------------------------------------------------------
step "(c) default render == kubectl kustomize config/default (less the Namespace and Helm's labels)"
KUBECTL_PICK="${KUBECTL:-}"
if [[ $KUBECTL_PICK == none ]]; then
  KUBECTL_PICK=""
elif [[ -z $KUBECTL_PICK ]]; then
  for k in /var/cache/resourcewatch/k8s-1.20.2/bin/kubectl "$(command -v kubectl || true)"; do
    [[ -n $k && -x $k ]] || continue
    if timeout 60 "$k" kustomize "$REPO/config/default" >"$TMP/kustomize.yaml" 2>"$TMP/kustomize.err"; then
      KUBECTL_PICK=$k; break
    fi
    echo "  note: $k kustomize config/default fails, trying the next: $(head -c 300 "$TMP/kustomize.err")"
  done
else
  timeout 60 "$KUBECTL_PICK" kustomize "$REPO/config/default" >"$TMP/kustomize.yaml"
fi
"${CHECK[@]}" kustomize "$REPO/config/default" >"$TMP/kustomize-fallback.yaml"
if [[ -n $KUBECTL_PICK ]]; then
  REF="$TMP/kustomize.yaml"
  REF_NAME="kubectl kustomize config/default ($KUBECTL_PICK, $("$KUBECTL_PICK" version --client 2>/dev/null | head -1 || true))"
  echo "  reference: $REF_NAME"
  # Keep the fallback loader honest: it must agree with the real kustomize.
  if "${CHECK[@]}" compare "$TMP/kustomize-fallback.yaml" "$REF" --reference-name kustomize --include-namespace >"$TMP/fallback.txt"; then
    echo "  ok: the python fallback loader agrees with it"
  else
    echo "  WARNING: the python fallback loader disagrees with kubectl kustomize (only matters without kubectl):"
    sed 's/^/    /' "$TMP/fallback.txt"
  fi
else
  REF="$TMP/kustomize-fallback.yaml"
  REF_NAME="config/default via the python fallback loader (no kubectl found)"
  echo "  reference: $REF_NAME"
fi
"${CHECK[@]}" compare "$TMP/default.yaml" "$REF" --reference-name "config/default" ||
  failed "default render differs from config/default"

# ---- (d) remediation switch -------------------------------------------------------------
step "(d) remediation master switch"
"${CHECK[@]}" remediation "$TMP/default.yaml" "$TMP/remediation.yaml" || failed "remediation switch"
"${CHECK[@]}" values-file "$TMP/custom.yaml" || failed "values file"

# ---- (e) schema -------------------------------------------------------------------------
step "(e) values.schema.json"
"${CHECK[@]}" schema "$CHART" || failed "schema (python jsonschema)"
BAD_SETS=(operator.replicas=two remediation.enabled=yes remediation.enable=true
          operator.agentGrace=20 operator.image.pullPolicy=Sometimes operator.image.tag=2
          agent.tolerations=linux)
n=0
for s in "${BAD_SETS[@]}"; do
  if R --set "$s" >/dev/null 2>"$TMP/err"; then
    failed "the renderer accepts --set $s"
  elif ! grep -q "values don't meet the specifications of the schema" "$TMP/err"; then
    failed "--set $s fails, but not by the schema: $(cat "$TMP/err")"
  else
    n=$((n + 1))
  fi
done
echo "  ok: the renderer (gojsonschema, as Helm 3) rejects $n bad --set values, e.g.:"
R --set operator.replicas=two 2>&1 >/dev/null | sed 's/^/    /' || true
if R --set-string operator.image.tag=2 >/dev/null; then
  echo "  ok: --set-string operator.image.tag=2 is accepted"
else
  failed "--set-string operator.image.tag=2 rejected"
fi

# ---- Helm's own engine ------------------------------------------------------------------
step "Helm's own engine (helm-python-sdk: Helm v4 Go SDK in a shared library)"
HELM_PY=""
if [[ ${CHART_CHECK_HELM_SDK:-1} != 0 ]]; then
  VENV="$CACHE/helm-sdk-venv"
  if [[ ! -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c 'import helm_python, yaml' 2>/dev/null; then
    echo "  installing helm-python-sdk 0.2.2 (PyPI, hash-pinned) into $VENV"
    printf '%s\n' \
      'helm-python-sdk==0.2.2 --hash=sha256:28cc13abaf134c3a7e37f070c939be8d9cdc9825c3c8b8b2d35161073bcd4578' \
      >"$TMP/helm-sdk-req.txt"
    if $PY -m venv "$VENV" >/dev/null &&
       "$VENV/bin/pip" install -q --require-hashes --only-binary :all: -r "$TMP/helm-sdk-req.txt" &&
       "$VENV/bin/pip" install -q pyyaml; then :; else
      echo "  SKIP: helm-python-sdk could not be installed"
    fi
  fi
  "$VENV/bin/python" -c 'import helm_python, yaml' 2>/dev/null && HELM_PY="$VENV/bin/python"
else
  echo "  SKIP: CHART_CHECK_HELM_SDK=0"
fi
if [[ -n $HELM_PY ]]; then
  STRVALS=('agent.tolerations=null' 'operator.replicas=3,remediation.enabled=TRUE'
           'operator.image.tag=0.2,agent.image.tag=0' 'x.y[1].z=a\,b,l={a,2,true}'
           'operator.podAnnotations.example\.com/k=v' 'operator.resources=null,n=012')
  strval_args=()
  i=0
  for s in "${STRVALS[@]}"; do
    R --set "$s" --print-values >"$TMP/strvals-$i.yaml"
    strval_args+=("$s" "$TMP/strvals-$i.yaml")
    i=$((i + 1))
  done
  $PY - "$TMP" "$CHART" "$NS" "${#BAD_SETS[@]}" "${BAD_SETS[@]}" "${strval_args[@]}" <<'EOF'
import json, sys
tmp, chart, ns, nbad = sys.argv[1:5]
bad, strvals = sys.argv[5:5 + int(nbad)], sys.argv[5 + int(nbad):]
def sc(name, release, namespace, files, sets, base):
    return {"name": name, "release": release, "namespace": namespace, "values_files": files,
            "sets": sets, "render": f"{tmp}/{base}.yaml", "notes": f"{tmp}/{base}.notes",
            "values": f"{tmp}/{base}.values.yaml"}
json.dump({
    "chart": chart, "kube_version": "v1.20.2",
    "scenarios": [
        sc("defaults", "resourcewatch", ns, [], [], "default"),
        sc("remediation.enabled=true", "resourcewatch", ns, [], ["remediation.enabled=true"], "remediation"),
        sc("values file", "rw-test", "monitoring", [f"{tmp}/custom-values.yaml"], [], "custom"),
    ],
    "strvals": [strvals[i:i + 2] for i in range(0, len(strvals), 2)],
    "bad_sets": bad,
}, open(f"{tmp}/oracle.json", "w"), indent=1)
EOF
  "$HELM_PY" "$HERE/check.py" helm-oracle "$TMP/oracle.json" || failed "comparison with Helm's engine"
fi

# ---- (f) server-side dry run ------------------------------------------------------------
step "(f) kubectl apply --dry-run=server (only with a reachable cluster)"
K="${KUBECTL_PICK:-}"
[[ -n $K ]] || for k in /var/cache/resourcewatch/k8s-1.20.2/bin/kubectl "$(command -v kubectl || true)"; do
  [[ -n $k && -x $k ]] && { K=$k; break; }
done
if [[ -z ${KUBECONFIG:-} && ! -f $HOME/.kube/config ]]; then
  echo "  SKIP: no KUBECONFIG and no ~/.kube/config"
elif [[ -z $K ]]; then
  echo "  SKIP: no kubectl"
elif ! timeout 20 "$K" get --raw /readyz >/dev/null 2>&1; then
  echo "  SKIP: no cluster reachable through ${KUBECONFIG:-~/.kube/config}"
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
