#!/usr/bin/env bash
# The OpenTelemetry Collector the e2e tests send profiles to (OTLP, gRPC), built from its
# Go modules at the release e2e/otel/collector/go.mod pins (the OTLP receiver, the debug
# exporter), as the cluster's components are built.
#
#   e2e/otel/collector.sh build   builds it (cached); prints the binary's path
#
# The test runs it on this machine (e2e/tests/cluster/otlp.rs,
# a_profile_is_sent_to_the_clusters_otlp_collector_with_its_pods_labels), with the
# service.profilesSupport feature gate (profiles are in development in OTLP).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE/../.."
# shellcheck source=e2e/cluster/env.sh
source e2e/cluster/env.sh
pin() { sed -n "s|^\t$1 \(v[^ ]*\).*|\1|p" "$HERE/collector/go.mod" | head -1; }
VERSION="$(pin go.opentelemetry.io/collector/otelcol)"
[[ -n $VERSION ]] || { echo "collector.sh: no otelcol pin in $HERE/collector/go.mod" >&2; exit 1; }
STAMP="$(cat "$HERE"/collector/go.mod "$HERE"/collector/go.sum "$HERE"/collector/main.go "$0" | sha256sum | cut -c1-12)"
CACHE="/var/cache/resourcewatch/otelcol/$STAMP"

log() { echo "collector.sh: $*" >&2; }
die() { log "$*"; exit 1; }

build() {
  # One build at a time (e2e/prebuild.sh may run one beside the e2e step's).
  mkdir -p "$(dirname "$CACHE")"
  exec 8>"$(dirname "$CACHE")/.build.lock"
  flock 8
  if [[ -f $CACHE/.done ]]; then echo "$CACHE/otelcol-rw-e2e"; return; fi
  rm -rf "$CACHE.tmp" && mkdir -p "$CACHE.tmp"
  for d in /usr/local/go/bin; do [[ -d $d && ":$PATH:" != *":$d:"* ]] && export PATH="$d:$PATH"; done
  # As e2e/cluster/build.sh builds the cluster: the machine's Go, the go.sum checked, the
  # module and build caches shared with the other Go builds.
  export GOTOOLCHAIN=local GOFLAGS=-mod=readonly GOMODCACHE="${RW_GO_CACHE}/mod" \
    GOCACHE="${RW_GO_CACHE}/build" CGO_ENABLED=0
  local t=$SECONDS
  (cd "$HERE/collector" && go build -trimpath -ldflags "-s -w" -o "$CACHE.tmp/otelcol-rw-e2e" .) \
    >"$CACHE.tmp/build.log" 2>&1 \
    || { tail -30 "$CACHE.tmp/build.log" >&2; die "go build of the OpenTelemetry Collector $VERSION failed"; }
  touch "$CACHE.tmp/.done"
  rm -rf "$CACHE" && mv "$CACHE.tmp" "$CACHE"
  log "built the OpenTelemetry Collector $VERSION in $((SECONDS - t)) s"
  echo "$CACHE/otelcol-rw-e2e"
}

case "${1:-}" in
  build) build ;;
  *) echo "usage: $0 build" >&2; exit 2 ;;
esac
