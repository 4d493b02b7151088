#!/usr/bin/env bash
# What the later steps of `make test` build and no earlier step needs, started with the
# steps (.ci/steps), in the order the steps need them. The chain the cluster's lane waits
# for, at normal priority: the Kubernetes, containerd, runc, CNI and etcd binaries (e2e-api,
# e2e), then the images' static release build (e2e); when both are done it writes the mark
# `chain` (e2e/ci-sync.sh), which the unit step waits for so that its CPU-measuring tests
# neither slow this chain nor run starved beside it. Then, at the lowest CPU and I/O
# priority, beside the unit tests (a Collector built at normal priority beside them halved
# a CPU-sampling test's burner): the OpenTelemetry Collector (e2e's cluster tests, which
# wait for the unit tests anyway), the VM's kernel and QEMU (vm-kernel, the VM node) and
# the Prometheus Operator (e2e's metrics test, after the cluster
# tests: on a fresh machine this build goes on beside them). Measured: docs/development.md.
#
# Each part runs the command its step runs, into the same caches: a step finds its part
# done, waits for it (the build scripts hold a lock, cargo locks its target directory), or
# builds what is missing itself. So nothing here fails the run: a part that failed is
# built again by its step, which fails loudly if it cannot. Nothing built here uses the
# dev profile's target directory, which the lint, unit and API steps use meanwhile.
set -uo pipefail
cd "$(dirname "$0")/.."
for d in /usr/local/go/bin "$HOME/.cargo/bin"; do
  [[ -d $d && ":$PATH:" != *":$d:"* ]] && export PATH="$d:$PATH"
done
# shellcheck source=ci-sync.sh
source e2e/ci-sync.sh
part() { # NICE COMMAND...
  local t=$SECONDS rc=0 n=$1
  shift
  if ((n > 0)); then
    nice -n "$n" ionice -c 3 "$@" >/dev/null 2>&1 || rc=$?
  else
    "$@" >/dev/null 2>&1 || rc=$?
  fi
  printf 'prebuild: %-40s nice %2d, exit %d, %4d s (done at %d s)\n' "$*" "$n" "$rc" \
    "$((SECONDS - t))" "$((SECONDS - start))"
}
start=$SECONDS
part 0 e2e/cluster/build.sh
part 0 make -s images
rw_ci_mark chain
part 19 e2e/otel/collector.sh build
part 19 e2e/cluster/vm.sh fetch
part 19 e2e/prometheus/operator.sh build
echo "prebuild: done in $((SECONDS - start)) s"
