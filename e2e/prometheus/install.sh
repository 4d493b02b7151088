#!/usr/bin/env bash
# Prints the directory holding Debian's promtool (2.42), taken from the prometheus package
# with `apt-get download` + `dpkg -x` and cached: installing the package would start a
# server and add a user; check-rules.sh needs only `promtool test rules`. (The metrics e2e
# runs a Prometheus of its own: operator.sh.)
set -euo pipefail
# Pinned: a newer Debian revision changes nothing here until this line moves with it; one
# that is gone from the archive fails loudly below.
VERSION=2.42.0+ds-5+deb12u1
CACHE=/var/cache/resourcewatch/prometheus
mkdir -p "$CACHE" 2>/dev/null && [[ -w $CACHE ]] ||
  CACHE="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/target/prometheus"
BIN="$CACHE/usr/bin"
if [[ ! -x $BIN/promtool || "$(cat "$CACHE/.version" 2>/dev/null)" != "$VERSION" ]]; then
  mkdir -p "$CACHE"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && { apt-get download "prometheus=$VERSION" >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null && apt-get download "prometheus=$VERSION" >/dev/null; }; }) ||
    { echo "install.sh: could not download Debian's prometheus package, version $VERSION" >&2; exit 1; }
  dpkg -x "$tmp"/prometheus_*.deb "$tmp/x"
  mkdir -p "$BIN"
  cp "$tmp/x/usr/bin/promtool" "$BIN/"
  echo "$VERSION" >"$CACHE/.version"
fi
"$BIN/promtool" --version >/dev/null
echo "$BIN"
