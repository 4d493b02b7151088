#!/usr/bin/env bash
# Build the e2e cluster's components from their Go modules at the versions pinned in
# e2e/cluster/go/*/go.mod (+ go.sum): Kubernetes (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy, kubectl), containerd 2 (containerd, its runc shim,
# ctr), runc, the CNI plugins (bridge, host-local, loopback, portmap), etcd, and a static
# pause binary from the Kubernetes module's own pause.c. Also installs the few Debian
# packages the node needs at run time (iptables, conntrack, ...).
#
# Binaries go to $RW_BIN (/var/cache/resourcewatch/k8s-<version>/bin), the CNI plugins to
# $RW_CNI_BIN_DIR; Go's module and build caches to /var/cache/resourcewatch/go. A stamp
# (the hash of every go.mod/go.sum and of this script) decides whether anything is rebuilt:
# a changed pin rebuilds, an unchanged one is a no-op. Safe to re-run after a crash.
#
# Usage: e2e/cluster/build.sh [--force]   (--force rebuilds even when cached)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
source "${HERE}/env.sh"

FORCE=0
for a in "$@"; do
  case "$a" in
    --force) FORCE=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) rw_die "unknown argument: $a" ;;
  esac
done

[[ $(id -u) -eq 0 ]] || rw_die "must run as root"

K8S_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
OTHER_BINS=(containerd containerd-shim-runc-v2 ctr runc etcd pause)
CNI_BINS=(bridge host-local loopback portmap)
# Run time: what kubelet, kube-proxy, the CNI plugins and the harness exec. Build time: a C
# compiler for runc (its nsenter is C; seccomp through libseccomp) and the static pause.
RUNTIME_PKGS=(iptables conntrack socat openssl kmod iproute2 util-linux procps curl libseccomp2)
BUILD_PKGS=(gcc libc6-dev libseccomp-dev pkg-config)
GO_MODS="${HERE}/go"

mkdir -p "${RW_CACHE}" "${RW_BIN}" "${RW_CNI_BIN_DIR}" "${RW_GO_CACHE}"
# One build at a time.
exec 9>"${RW_CACHE}/.build.lock"
flock -n 9 || { rw_log "another build.sh is running; waiting for it"; flock 9; }

APT_UPDATED=0
apt_update() {
  if [[ $APT_UPDATED -eq 0 ]]; then
    rw_log "apt-get update"
    apt-get update -qq || rw_die "apt-get update failed"
    APT_UPDATED=1
  fi
}
missing_pkgs() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
  done
}
install_pkgs() {
  local missing
  missing=$(missing_pkgs "$@")
  [[ -z "$missing" ]] && return 0
  apt_update
  rw_log "apt-get install: $(tr '\n' ' ' <<<"$missing")"
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing \
    >"${RW_CACHE}/apt-install.log" 2>&1 \
    || { tail -n 20 "${RW_CACHE}/apt-install.log" >&2; rw_die "apt-get install failed for: $(tr '\n' ' ' <<<"$missing")(log: ${RW_CACHE}/apt-install.log)"; }
}

stamp() { # what the binaries were built from: the pins and this script
  cat "${GO_MODS}"/*/go.mod "${GO_MODS}"/*/go.sum "$0" | sha256sum | cut -d' ' -f1
}
binaries_cached() {
  local b
  [[ "$(cat "${RW_BIN}/.stamp" 2>/dev/null)" == "$(stamp)" ]] || return 1
  for b in "${K8S_BINS[@]}" "${OTHER_BINS[@]}"; do [[ -x "${RW_BIN}/$b" ]] || return 1; done
  for b in "${CNI_BINS[@]}"; do [[ -x "${RW_CNI_BIN_DIR}/$b" ]] || return 1; done
}

install_pkgs "${RUNTIME_PKGS[@]}"
if [[ $FORCE -eq 0 ]] && binaries_cached; then
  rw_log "Kubernetes ${K8S_VERSION}, containerd ${RW_CONTAINERD_VERSION}, runc ${RW_RUNC_VERSION}, etcd ${RW_ETCD_VERSION} cached in ${RW_BIN}; nothing to build"
  exit 0
fi
install_pkgs "${BUILD_PKGS[@]}"

# ---------------------------------------------------------------- Go
# The go.mod files say `go 1.26.0`; GOTOOLCHAIN=local makes an older go fail here instead
# of fetching a toolchain behind our back.
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly GOMODCACHE="${RW_GO_CACHE}/mod" GOCACHE="${RW_GO_CACHE}/build"
# Go lives in /usr/local/go on the dev and CI machines; a shell that did not read the profile
# setting PATH (sudo, a service) finds it there.
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then export PATH="/usr/local/go/bin:${PATH}"; fi
command -v go >/dev/null || rw_die "go not found on PATH (Go >= 1.26 is needed, e.g. in /usr/local/go/bin)"
GOV=$(go env GOVERSION) || rw_die "go env failed"
[[ "$(printf '%s\n' go1.26 "$GOV" | sort -V | head -n1)" == go1.26 ]] \
  || rw_die "$(command -v go) is ${GOV}; the pinned modules need Go >= 1.26"
rw_log "building with ${GOV} ($(command -v go)); logs in ${RW_CACHE}/build-*.log"
T0=$(date +%s)

# gobuild MODULE OUTDIR LOGNAME [go build args...]: builds with the module's go.sum checked;
# a version the module proxy refuses fails here, loudly, with go's own message.
gobuild() {
  local mod=$1 out=$2 log="${RW_CACHE}/build-$3.log"; shift 3
  local t=$(date +%s)
  mkdir -p "$out.tmp"
  if ! (cd "${GO_MODS}/${mod}" && go build -trimpath -o "$out.tmp/" "$@") >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    rw_die "go build of ${mod} failed (log: $log)"
  fi
  local f
  for f in "$out.tmp"/*; do mv -f "$f" "$out/"; done
  rmdir "$out.tmp"
  rw_log "built ${mod} in $(( $(date +%s) - t ))s"
}

KV="v${K8S_VERSION}"
KMINOR=$(cut -d. -f2 <<<"${K8S_VERSION}")
# Version stamps as Kubernetes' own build sets them: the kubelet reports this version to the
# API server, kubectl's skew check reads it.
CGO_ENABLED=0 gobuild kubernetes "${RW_BIN}" kubernetes -ldflags "-s -w \
  -X k8s.io/component-base/version.gitVersion=${KV} -X k8s.io/component-base/version.gitMajor=1 \
  -X k8s.io/component-base/version.gitMinor=${KMINOR} -X k8s.io/component-base/version.gitTreeState=clean \
  -X k8s.io/client-go/pkg/version.gitVersion=${KV} -X k8s.io/client-go/pkg/version.gitMajor=1 \
  -X k8s.io/client-go/pkg/version.gitMinor=${KMINOR}" \
  $(for b in "${K8S_BINS[@]}"; do echo "k8s.io/kubernetes/cmd/$b"; done)

# containerd without cgo: the btrfs snapshotter (cgo only) drops out, overlayfs stays.
CGO_ENABLED=0 gobuild containerd "${RW_BIN}" containerd -ldflags "-s -w \
  -X github.com/containerd/containerd/v2/version.Version=v${RW_CONTAINERD_VERSION}" \
  github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr

# runc needs cgo (nsenter); with seccomp, as pods asking for RuntimeDefault need it.
CGO_ENABLED=1 gobuild runc "${RW_BIN}" runc -tags seccomp -ldflags "-s -w -X main.version=${RW_RUNC_VERSION}" \
  github.com/opencontainers/runc

CGO_ENABLED=0 gobuild cni "${RW_CNI_BIN_DIR}" cni -ldflags "-s -w" \
  $(for b in main/bridge main/loopback ipam/host-local meta/portmap; do echo "github.com/containernetworking/plugins/plugins/$b"; done)

CGO_ENABLED=0 gobuild etcd "${RW_BIN}" etcd -ldflags "-s -w" go.etcd.io/etcd/server/v3
mv -f "${RW_BIN}/server" "${RW_BIN}/etcd"   # go names it after the path element before /v3

# ---------------------------------------------------------------- pause
KDIR=$(cd "${GO_MODS}/kubernetes" && go list -m -f '{{.Dir}}' k8s.io/kubernetes) \
  || rw_die "the k8s.io/kubernetes module is not in ${GOMODCACHE}"
pause_c="${KDIR}/build/pause/linux/pause.c"
[[ -f "$pause_c" ]] || rw_die "pause.c not found at ${pause_c}"
gcc -Os -static -DVERSION="${K8S_VERSION}-resourcewatch" -o "${RW_BIN}/pause.tmp" "$pause_c" \
  || rw_die "gcc failed on ${pause_c}"
strip "${RW_BIN}/pause.tmp" 2>/dev/null || true
mv -f "${RW_BIN}/pause.tmp" "${RW_BIN}/pause"

# ---------------------------------------------------------------- check
# Each output read whole, then matched: `cmd | grep -q` under pipefail fails when grep
# exits at its match before cmd has written everything (SIGPIPE: seen once, a cold build
# of 21 minutes thrown away).
[[ "$("${RW_BIN}/kubectl" version --client 2>/dev/null)" == *"${KV}"* ]] \
  || rw_die "built kubectl does not report ${KV}"
"${RW_BIN}/runc" --version >/dev/null || rw_die "built runc does not run"
[[ "$("${RW_BIN}/containerd" --version)" == *"${RW_CONTAINERD_VERSION}"* ]] || rw_die "built containerd does not report ${RW_CONTAINERD_VERSION}"
[[ "$("${RW_BIN}/etcd" --version)" == *"${RW_ETCD_VERSION}"* ]] || rw_die "built etcd does not report ${RW_ETCD_VERSION}"
stamp >"${RW_BIN}/.stamp"
rw_log "built Kubernetes ${K8S_VERSION}, containerd ${RW_CONTAINERD_VERSION}, runc ${RW_RUNC_VERSION}, CNI plugins ${RW_CNI_VERSION}, etcd ${RW_ETCD_VERSION} into ${RW_CACHE} in $(( $(date +%s) - T0 ))s"
ls -la "${RW_BIN}" >&2
