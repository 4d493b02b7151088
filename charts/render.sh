#!/usr/bin/env bash
# Render charts/resourcewatch offline, the way `helm template --include-crds` would, with
# charts/render (Go text/template + sprig + helm's include/tpl/required/toYaml...). No helm
# binary and no network: the Go libraries come from Debian packages (GOPATH mode over
# /usr/share/gocode), installed here when missing.
#
#   charts/render.sh [--name NAME] [--namespace NS] [-f values.yaml]... [--set k=v]...
#                    [--set-string k=v]... [--kube-version v1.20.2] [--skip-crds]
#                    [--show-notes] [--print-values] [CHART_DIR]
#
# CHART_DIR defaults to charts/resourcewatch. The binary is cached in
# /var/cache/resourcewatch/chart-render/ (or target/chart-render/ when that is not
# writable) and rebuilt when charts/render/*.go change.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"

DEB_PKGS=(golang-go golang-github-masterminds-sprig-dev golang-k8s-sigs-yaml-dev
          golang-github-xeipuuv-gojsonschema-dev)
need_install=()
command -v go >/dev/null 2>&1 || need_install+=(golang-go)
for d in github.com/Masterminds/sprig sigs.k8s.io/yaml github.com/xeipuuv/gojsonschema; do
  [[ -d /usr/share/gocode/src/$d ]] || { need_install=("${DEB_PKGS[@]}"); break; }
done
if ((${#need_install[@]})); then
  echo "render.sh: installing ${need_install[*]} (Debian)" >&2
  SUDO=""; [[ $(id -u) == 0 ]] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -qq "${need_install[@]}" >&2 ||
    { $SUDO apt-get update -qq >&2 && $SUDO apt-get install -y -qq "${need_install[@]}" >&2; }
fi

CACHE=/var/cache/resourcewatch/chart-render
mkdir -p "$CACHE" 2>/dev/null && [[ -w $CACHE ]] || CACHE="$REPO/target/chart-render"
mkdir -p "$CACHE"
BIN="$CACHE/render"
STAMP="$(cat "$HERE"/render/*.go | sha256sum | cut -c1-16)-$(go version | tr -d ' ')"
if [[ ! -x $BIN || "$(cat "$BIN.stamp" 2>/dev/null)" != "$STAMP" ]]; then
  # GOPATH mode: imports resolve in Debian's /usr/share/gocode, nothing is downloaded.
  (cd "$HERE/render" &&
    GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS='' GOPROXY=off GOCACHE="$CACHE/gocache" \
      go build -o "$BIN.tmp" .)
  mv "$BIN.tmp" "$BIN"
  echo "$STAMP" >"$BIN.stamp"
fi

# Default chart unless a positional argument (one not a flag's value) is given.
has_chart=0
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --name|-n|--namespace|-f|--values|--set|--set-string|--kube-version) i=$((i + 1)) ;;
    -*) ;;
    *) has_chart=1 ;;
  esac
done
((has_chart)) || args+=("$HERE/resourcewatch")
exec "$BIN" "${args[@]}"
