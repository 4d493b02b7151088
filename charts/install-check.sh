#!/usr/bin/env bash
# The chart installed for real by Helm's engine (charts/helm.sh) on the cluster KUBECONFIG
# names, with its images already loadable there: both workloads must become ready (the
# agent's readiness means its kernel pipelines are loaded and it built a report); an
# upgrade rolls the operator and the Service must route to the new leader; an upgrade
# that changes a CRD changes it in the cluster and a rollback restores it; then Helm
# uninstalls what it installed, the CRDs excepted (kept); then all again with every object
# renamed (fullnameOverride), agents reporting to the renamed operator. Nothing of
# resourcewatch may be installed before (Helm refuses to adopt config/'s objects).
# Run by e2e/run-cluster-tests.sh and `make chart-install`.
set -euo pipefail
cd "$(dirname "$0")/.."
K="${KUBECTL:-kubectl}"
NS=resourcewatch-system

if "$K" -n "$NS" get deploy/resourcewatch-operator >/dev/null 2>&1; then
  echo "resourcewatch is already installed in $NS (kubectl delete -k config first)" >&2
  exit 1
fi
# The agent needs Pod Security "privileged"; --create-namespace would make the namespace
# without the label (README, Pod Security).
"$K" create namespace "$NS" --dry-run=client -o yaml | "$K" apply -f - >/dev/null
"$K" label namespace "$NS" --overwrite pod-security.kubernetes.io/enforce=privileged >/dev/null
charts/helm.sh install resourcewatch charts/resourcewatch -n "$NS" --wait --timeout 180 | sed -n '1,4p'
"$K" -n "$NS" rollout status deploy/resourcewatch-operator --timeout=60s
"$K" -n "$NS" rollout status ds/resourcewatch-agent --timeout=60s
# helm test: the leader answers /readyz through its Service with the published CA.
charts/helm.sh test resourcewatch -n "$NS" --timeout 120
# An upgrade rolls the operator: the new replica is Ready as a standby, the old one
# releases the Lease on SIGTERM, the new one takes it and publishes its own address as the
# Service's one EndpointSlice (the Service has no selector: operator/shell/src/leader.rs
# says why), so the Service routes to the Lease's holder again.
charts/helm.sh upgrade resourcewatch charts/resourcewatch -n "$NS" \
  --set operator.logLevel=debug --wait --timeout 180 | sed -n '3,4p'
"$K" -n "$NS" rollout status deploy/resourcewatch-operator --timeout=60s
leader_ep="" seen="" holder=""
for _ in $(seq 60); do
  seen=$("$K" -n "$NS" get endpointslice resourcewatch-operator \
    -o jsonpath='{.endpoints[0].targetRef.name}' 2>/dev/null || true)
  holder=$("$K" -n "$NS" get lease resourcewatch-operator \
    -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)
  if [[ -n $seen && $seen == "$holder" ]] && "$K" -n "$NS" get pod "$seen" >/dev/null 2>&1; then
    leader_ep=$seen
    break
  fi
  sleep 1
done
[[ -n $leader_ep ]] || {
  echo "no leader behind the operator Service 60 s after the upgrade (slice names '${seen}', Lease '${holder}')" >&2
  "$K" -n "$NS" get endpointslice,lease -o yaml >&2 || true
  exit 1
}
echo "after the upgrade the Service routes to the new leader $leader_ep"

# The CRDs are templates: a chart whose ResourceWatch CRD changed (one more short name)
# changes the cluster's on `helm upgrade`, and `helm rollback` puts the old one back.
crd=resourcewatches.resourcewatch.io
short_names() { "$K" get crd "$crd" -o jsonpath='{.spec.names.shortNames}'; }
newer="$(mktemp -d)"
trap 'rm -rf "$newer"' EXIT
cp -r charts/resourcewatch "$newer/"
f="$newer/resourcewatch/files/crds/resourcewatch.io_resourcewatches.yaml"
grep -q '^    - rw$' "$f" || { echo "the CRD's short names moved: update this check" >&2; exit 1; }
sed -i 's/^    - rw$/    - rw\n    - rwupgraded/' "$f"
before=$(short_names)
[[ $before != *rwupgraded* ]] || { echo "short names before the upgrade: $before" >&2; exit 1; }
charts/helm.sh upgrade resourcewatch "$newer/resourcewatch" -n "$NS" --wait --timeout 180 | sed -n '3,4p'
after=$(short_names)
[[ $after == *rwupgraded* ]] ||
  { echo "helm upgrade did not change the CRD: short names $after" >&2; exit 1; }
echo "helm upgrade changed the CRD: short names $before -> $after"
charts/helm.sh rollback resourcewatch -n "$NS" --wait --timeout 180
rolled=$(short_names)
[[ $rolled == "$before" ]] ||
  { echo "helm rollback left the CRD at short names $rolled (want $before)" >&2; exit 1; }
charts/helm.sh history resourcewatch -n "$NS" | tr '\n' ' '
echo
"$K" -n "$NS" rollout status deploy/resourcewatch-operator --timeout=60s
"$K" -n "$NS" rollout status ds/resourcewatch-agent --timeout=60s
echo "helm rollback restored the CRD (short names $rolled); operator and agents ready"

# helm test fails when no operator answers.
"$K" -n "$NS" scale deploy/resourcewatch-operator --replicas=0 >/dev/null
"$K" -n "$NS" wait --for=delete pod -l app.kubernetes.io/name=resourcewatch-operator --timeout=60s >/dev/null 2>&1 || true
if charts/helm.sh test resourcewatch -n "$NS" --timeout 60 >/tmp/rw-helm-test.$$ 2>&1; then
  echo "helm test passed with no operator running:" >&2; cat /tmp/rw-helm-test.$$ >&2; rm -f /tmp/rw-helm-test.$$; exit 1
fi
# It must fail for the right reason: its pod ran and found no /readyz to answer.
"$K" -n "$NS" logs resourcewatch-operator-test-ready 2>/dev/null | grep -q 'check-ready: https://.*/readyz' || {
  echo "helm test failed, but not because /readyz went unanswered:" >&2
  cat /tmp/rw-helm-test.$$ >&2
  "$K" -n "$NS" describe pod resourcewatch-operator-test-ready >&2 || true
  rm -f /tmp/rw-helm-test.$$; exit 1
}
rm -f /tmp/rw-helm-test.$$
echo "helm test fails with no operator running, as it must"

charts/helm.sh uninstall resourcewatch -n "$NS" --wait
if "$K" -n "$NS" get deploy/resourcewatch-operator ds/resourcewatch-agent >/dev/null 2>&1; then
  echo "helm uninstall left the workloads behind" >&2; exit 1
fi
# The CRDs stay (helm.sh/resource-policy: keep): deleting one deletes every watch.
"$K" get crd "$crd" >/dev/null ||
  { echo "helm uninstall deleted the CRD $crd (it must keep it)" >&2; exit 1; }
echo "the chart installed, upgraded, its CRD upgraded and rolled back, and uninstalled (CRDs kept) by Helm's engine"

# Renamed (fullnameOverride): every object is rw-*, the binaries are told the names, the
# agents find and verify the operator by its renamed Service, and the operator accepts
# them as ServiceAccount rw-agent: a node view (every node) must get reports. The release
# keeps its name: the CRDs it kept are its own.
P=rw
charts/helm.sh install resourcewatch charts/resourcewatch -n "$NS" --set fullnameOverride=$P \
  --wait --timeout 180 | sed -n '1,4p'
"$K" -n "$NS" rollout status deploy/$P-operator --timeout=60s
"$K" -n "$NS" rollout status ds/$P-agent --timeout=60s
charts/helm.sh test resourcewatch -n "$NS" --timeout 120
printf '%s\n' 'apiVersion: resourcewatch.io/v1alpha1' 'kind: ClusterResourceWatch' \
  'metadata: {name: install-check-renamed}' 'spec: {topK: 3, interval: 5s}' | "$K" apply -f - >/dev/null
nodes=$("$K" get nodes -o name | wc -l)
reporting=""
for _ in $(seq 90); do
  reporting=$("$K" get crw install-check-renamed -o jsonpath='{.status.reportingNodes}' 2>/dev/null || true)
  [[ $reporting == "$nodes" ]] && break
  sleep 1
done
"$K" delete crw install-check-renamed --wait=false >/dev/null
[[ $reporting == "$nodes" ]] || {
  echo "renamed: ${reporting:-no} of $nodes nodes report to $P-operator after 90 s" >&2
  "$K" -n "$NS" logs ds/$P-agent --tail=20 >&2 || true
  "$K" -n "$NS" logs deploy/$P-operator --tail=20 >&2 || true
  exit 1
}
# What Helm made is renamed; what the operator made at run time too (the first install's
# Secrets and Lease stay in the namespace: Helm never owned them).
left=$("$K" -n "$NS" get deploy,ds,svc,sa,role,rolebinding -o name | grep '/resourcewatch-' || true)
[[ -z $left ]] || { echo "objects named resourcewatch-* with fullnameOverride=$P: $left" >&2; exit 1; }
"$K" -n "$NS" get secret/$P-ca secret/$P-agent-tls secret/$P-metrics-client configmap/$P-ca-bundle \
  lease/$P-operator -o name >/dev/null
echo "renamed to $P-*: no workload, Service or RBAC object named resourcewatch-*; the operator made its Secrets, CA bundle and Lease as $P-*; helm test passes; $reporting of $nodes nodes report to $P-operator"
charts/helm.sh uninstall resourcewatch -n "$NS" --wait
if "$K" -n "$NS" get deploy/$P-operator ds/$P-agent >/dev/null 2>&1; then
  echo "helm uninstall left the renamed workloads behind" >&2; exit 1
fi
