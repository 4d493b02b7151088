#!/usr/bin/env bash
# End-to-end tests on a real single-node cluster: builds the images, installs
# resourcewatch through config/ (kubectl apply -k), and runs e2e/tests/cluster/.
# The harness cluster is started (built once, cached), and stopped afterwards; then
# check-clean.sh proves that nothing of it is left on the machine. A KUBECONFIG in the
# environment is ignored: RW_E2E_KUBECONFIG=FILE opts in to another cluster
# (e2e/target-cluster.sh refuses production-looking contexts; the images must be loadable
# there: set RW_E2E_SKIP_IMPORT=1 if you pushed them yourself). On failure: cluster state
# and component logs.
set -euo pipefail
cd "$(dirname "$0")/.."
timings=()
t0=$(date +%s)
lap() { local now; now=$(date +%s); timings+=("$1 $((now - t0))s"); t0=$now; }
# A stage's failed tests do not stop the later stages (each runs its own tests on the same
# cluster): the run ends by naming every failed stage, instead of hiding what came after.
failed_stages=()
tests() { # STAGE CARGO-TEST-ARGS...
  local stage=$1
  shift
  cargo test -p resourcewatch-e2e "$@" || failed_stages+=("$stage")
}
# shellcheck source=target-cluster.sh
source e2e/target-cluster.sh
# shellcheck source=ci-sync.sh
source e2e/ci-sync.sh
rw_target_cluster
started=0
if [[ $RW_E2E_EXTERNAL -eq 0 ]]; then
  e2e/cluster/up.sh >/dev/null
  started=1
  lap "cluster up (incl. build when not cached)"
fi
external_kubeconfig="${KUBECONFIG:-}"
# shellcheck source=cluster/env.sh
source e2e/cluster/env.sh
# env.sh points KUBECONFIG at the harness; an opted-in cluster keeps its own.
[[ -n $external_kubeconfig ]] && export KUBECONFIG="$external_kubeconfig"
export KUBECTL
K="$KUBECTL"

dump() {
  echo "== cluster state" >&2
  "$K" get nodes,all -A -o wide >&2 2>&1 || true
  "$K" get resourcewatches -A -o yaml >&2 2>&1 | tail -120 || true
  "$K" get events -A --sort-by=.lastTimestamp >&2 2>&1 | tail -60 || true
  for app in resourcewatch-operator resourcewatch-agent; do
    for p in $("$K" -n resourcewatch-system get pods -l app.kubernetes.io/name=$app -o name 2>/dev/null); do
      echo "== logs $p" >&2; "$K" -n resourcewatch-system logs "$p" --tail=80 >&2 2>&1 || true
      "$K" -n resourcewatch-system logs "$p" --previous --tail=40 >&2 2>/dev/null || true
    done
  done
  if [[ $started -eq 1 ]]; then
    for f in "$RW_LOGS"/kubelet.log "$RW_LOGS"/containerd.log "$RW_LOGS"/vm-node.log "$RW_VM_NODE_DIR"/logs/*.log; do
      echo "== $f (tail)" >&2; tail -30 "$f" >&2 || true
    done
  fi
}
cleanup() {
  rc=$?
  # The lap that failed (the tests, usually) gets its own line, not the teardown's.
  [[ $rc -ne 0 ]] && { lap "the step that failed"; dump; }
  if [[ $started -eq 1 ]]; then
    e2e/cluster/down.sh >/dev/null || rc=1
    # Checked against the baseline up.sh recorded, before --purge deletes it.
    if ! e2e/cluster/check-clean.sh; then
      echo "== the harness left something behind (above)" >&2; rc=1
    fi
    # --purge: the next run starts from an empty etcd, with no workload of this one.
    e2e/cluster/down.sh --purge >/dev/null || rc=1
    lap "cluster down + clean check"
  fi
  printf '== timing: %s\n' "${timings[@]}"
  exit $rc
}
trap cleanup EXIT

make -s images
if [[ "${RW_E2E_SKIP_IMPORT:-0}" != 1 ]]; then
  rw_import_images target/images/{operator,agent,workloads,node-workloads,c-workloads,python-workloads,java-workloads}.tar
fi
lap "images built and imported"

"$K" apply -k config
"$K" -n resourcewatch-system rollout status deploy/resourcewatch-operator --timeout=120s
"$K" -n resourcewatch-system rollout status ds/resourcewatch-agent --timeout=120s
# The chart's rendering is accepted by this API server too (server-side dry run).
charts/helm.sh template --namespace resourcewatch-system | "$K" apply --dry-run=server -f - >/dev/null
# Pod Security, judged by the API server's own admission plugin (charts/check.py is the
# offline copy of its rules): in a namespace that enforces "restricted", the operator's pod
# is admitted (a server-side dry run) and the agent's, which needs privileges, is refused.
psa_ns=rw-e2e-pod-security
"$K" create namespace "$psa_ns" --dry-run=client -o yaml \
  | "$K" label --local -f - -o yaml pod-security.kubernetes.io/enforce=restricted \
  | "$K" apply -f - >/dev/null
pod_of() { # KIND: the pod of config/'s KIND as a Pod in $psa_ns
  "$K" kustomize config | python3 -c '
import sys, yaml
kind, ns = sys.argv[1], sys.argv[2]
for d in yaml.safe_load_all(sys.stdin):
    if d and d["kind"] == kind:
        spec = d["spec"]["template"]["spec"]
        spec.pop("serviceAccountName", None)  # its ServiceAccount lives elsewhere
        print(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "psa-" + kind.lower(), "namespace": ns}, "spec": spec}))
        break
else:
    sys.exit("no " + kind + " in config/")' "$1" "$psa_ns"
}
pod_of Deployment | "$K" apply --dry-run=server -f - >/dev/null \
  || { echo "== the API server's PodSecurity admission refuses the operator's pod under 'restricted'" >&2; exit 1; }
if out=$(pod_of DaemonSet | "$K" apply --dry-run=server -f - 2>&1); then
  echo "== the agent's privileged pod was admitted under 'restricted': the check proves nothing" >&2; exit 1
fi
grep -q 'violates PodSecurity "restricted' <<<"$out" || { echo "== unexpected refusal of the agent's pod: $out" >&2; exit 1; }
"$K" delete namespace "$psa_ns" --wait=false >/dev/null
lap "installed through config/ (and the chart dry-run)"

# RW_E2E_ONLY=NAME runs only the tests whose name contains NAME (both suites), for iterating.
# The OTLP test's collector (built from its Go modules once, cached; the test runs it).
if [[ -z ${RW_E2E_ONLY:-} || $RW_E2E_ONLY == *otlp* ]]; then
  RW_OTELCOL="$(e2e/otel/collector.sh build)"
  export RW_OTELCOL
  lap "OpenTelemetry Collector built"
fi
# In make test the unit step runs beside this lane: its duty-cycle tests and these tests'
# burner pods and profiles both measure CPU, so they never overlap (e2e/ci-sync.sh).
rw_ci_wait unit-done
tests "cluster tests" --test cluster -- --ignored --test-threads=1 --nocapture \
  --skip on_the_cgroup_v2_node ${RW_E2E_ONLY:-}
lap "e2e tests"
# The in-VM kernel tests may start beside the metrics and remediation tests (mostly waits).
rw_ci_mark cluster-tests-done
# The metrics test's Prometheus: the Prometheus Operator's, scraping through the shipped
# ServiceMonitor and PodMonitor (built from their Go modules once, cached). After the
# cluster tests, not before: on a fresh machine its build (about 470 s on two CPUs) goes
# on beside them (e2e/prebuild.sh) instead of holding them back.
# (Left out when RW_E2E_ONLY names other tests.)
if [[ -z ${RW_E2E_ONLY:-} || $RW_E2E_ONLY == *prometheus* ]]; then
  e2e/prometheus/operator.sh build >/dev/null
  lap "Prometheus Operator and Prometheus built"
  RW_PROMETHEUS_ADDR="$(KUBECTL="$K" e2e/prometheus/operator.sh up)"
  export RW_PROMETHEUS_ADDR
  lap "Prometheus Operator up"
  tests "metrics tests" --test metrics -- --ignored --test-threads=1 --nocapture \
    ${RW_E2E_ONLY:-}
  lap "metrics e2e tests"
  KUBECTL="$K" e2e/prometheus/operator.sh down
fi
# Remediation: the master switch on (it is off in config/ and in the chart).
"$K" -n resourcewatch-system patch deploy resourcewatch-operator --type=json \
  -p='[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--enable-remediation"}]'
"$K" -n resourcewatch-system rollout status deploy/resourcewatch-operator --timeout=120s
tests "remediation tests" --test remediation -- --ignored --test-threads=1 --nocapture \
  --skip on_the_cgroup_v2_node ${RW_E2E_ONLY:-}
lap "remediation e2e tests"

# The second node: Linux 6.1 with cgroup v2 only, in a QEMU/TCG VM (e2e/cluster/vm-node.sh),
# joined for its own tests (remediation's too: the switch is on by now) and the node view,
# then stopped: its emulation takes most of a core of this 2-CPU machine, which the
# CPU-measuring tests feel (with it running the whole time, a burner pod got 15 % of a
# core and profiles came back short of samples).
# RW_E2E_VM_NODE=0 leaves it out.
if [[ $started -eq 1 && "${RW_E2E_VM_NODE:-1}" != 0 ]]; then
  # Not beside the in-VM kernel tests: two emulated VMs on two CPUs starve both.
  rw_ci_wait vm-kernel-done
  e2e/cluster/vm-node.sh up
  lap "VM node up (cgroup v2, Linux 6.1, emulated)"
  # Only what its tests run: every image is unpacked under emulation there.
  e2e/cluster/vm-node.sh import target/images/{agent,workloads,c-workloads}.tar
  # Its agent loads its programs under emulation: a minute or more.
  "$K" -n resourcewatch-system rollout status ds/resourcewatch-agent --timeout=300s
  lap "VM node: images imported, agent ready"
  # RW_E2E_VM_ONLY=NAME runs only the VM node's tests whose name contains NAME.
  # shellcheck disable=SC2086 # the filters are words
  tests "VM node cluster tests" --test cluster -- --ignored --test-threads=1 --nocapture \
    ${RW_E2E_VM_ONLY:-on_the_cgroup_v2_node the_node_view}
  # shellcheck disable=SC2086
  tests "VM node remediation tests" --test remediation -- --ignored --test-threads=1 --nocapture \
    ${RW_E2E_VM_ONLY:-on_the_cgroup_v2_node}
  e2e/cluster/vm-node.sh down
  lap "VM node e2e tests"
fi

# The Helm chart, installed for real by Helm's engine where config/ was.
"$K" delete -k config --wait=true --timeout=180s >/dev/null
KUBECTL="$K" charts/install-check.sh
lap "chart installed and uninstalled by Helm's engine"
if ((${#failed_stages[@]})); then
  echo "run-cluster-tests: failed: $(IFS=,; echo "${failed_stages[*]}" | sed 's/,/, /g')" >&2
  exit 1
fi
