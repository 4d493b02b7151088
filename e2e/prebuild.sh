#!/usr/bin/env bash
# What the later steps of `make test` build and no earlier step needs, built while the
# earlier steps run, at the lowest CPU and I/O priority, in the order the steps need them:
# the VM's kernel and QEMU (vm-kernel), the Kubernetes, containerd, runc, CNI and etcd
# binaries (e2e-api, e2e), the images' static release build (e2e), the OpenTelemetry
# Collector (e2e's cluster tests) and the Prometheus Operator (e2e's metrics test, which
# runs after the cluster tests, so on a fresh machine this build goes on beside them). On
# two CPUs the unit step's compiles leave a core idle while they link, and its kernel tests,
# the API tests and the cluster tests mostly wait; this fills those gaps instead of leaving
# the builds to start cold in their own steps (measured: docs/development.md).
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
part() {
  local t=$SECONDS rc=0
  nice -n 19 ionice -c 3 "$@" >/dev/null 2>&1 || rc=$?
  printf 'prebuild: %-40s exit %d, %4d s\n' "$*" "$rc" "$((SECONDS - t))"
}
start=$SECONDS
part e2e/cluster/vm.sh fetch
part e2e/cluster/build.sh
part make -s images
part e2e/otel/collector.sh build
part e2e/prometheus/operator.sh build
echo "prebuild: done in $((SECONDS - start)) s"
