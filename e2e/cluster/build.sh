#!/usr/bin/env bash
# Build Kubernetes 1.20.2 (kube-apiserver, kube-controller-manager, kube-scheduler,
# kubelet, kube-proxy, kubectl) and the pause binary from Debian's sources, and
# install the runtime packages the e2e cluster needs.
#
# The binaries are cached in $RW_BIN (/var/cache/resourcewatch/k8s-1.20.2/bin):
# when all of them are there, the compile is skipped. Safe to re-run after a crash.
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
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) rw_die "unknown argument: $a" ;;
  esac
done

[[ $(id -u) -eq 0 ]] || rw_die "must run as root"

K8S_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
RUNTIME_PKGS=(etcd-server containerd runc containernetworking-plugins iptables conntrack socat openssl kmod iproute2 util-linux procps)
BUILD_PKGS=(golang-go rsync dpkg-dev make gcc libc6-dev)
WORK="${RW_CACHE}/work"

mkdir -p "${RW_CACHE}" "${RW_BIN}"
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

binaries_cached() {
  local b
  for b in "${K8S_BINS[@]}" pause; do
    [[ -x "${RW_BIN}/$b" ]] || return 1
  done
  return 0
}

# ---------------------------------------------------------------- runtime packages
install_pkgs "${RUNTIME_PKGS[@]}"
# The Debian containerd/etcd packages would start services on a systemd machine;
# here there is no systemd, so nothing is started. Make sure no packaged daemon
# runs on our ports anyway.

if [[ $FORCE -eq 0 ]] && binaries_cached; then
  rw_log "Kubernetes ${K8S_VERSION} binaries cached in ${RW_BIN}; nothing to build"
  exit 0
fi

T0=$(date +%s)
# ---------------------------------------------------------------- deb-src
SRC_LIST=/etc/apt/sources.list.d/resourcewatch-src.sources
if ! grep -rqsE '^(deb-src|Types:.*deb-src)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null; then
  rw_log "adding deb-src entries in ${SRC_LIST}"
  tmp=$(mktemp)
  if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    sed -E 's/^Types:.*/Types: deb-src/' /etc/apt/sources.list.d/debian.sources >"$tmp"
    mv "$tmp" "${SRC_LIST}"
  elif grep -qsE '^deb ' /etc/apt/sources.list; then
    SRC_LIST=/etc/apt/sources.list.d/resourcewatch-src.list
    grep -E '^deb ' /etc/apt/sources.list | sed -E 's/^deb /deb-src /' >"$tmp"
    mv "$tmp" "${SRC_LIST}"
  else
    rm -f "$tmp"
    rw_die "no Debian 'deb' entries found in /etc/apt/sources.list or /etc/apt/sources.list.d/debian.sources"
  fi
  chmod 644 "${SRC_LIST}"
  APT_UPDATED=0
fi
apt_update
install_pkgs "${BUILD_PKGS[@]}"
command -v go >/dev/null || rw_die "go not found after installing golang-go"
rw_log "using $(go version)"

# ---------------------------------------------------------------- sources
mkdir -p "${WORK}"
cd "${WORK}"
SRC_DIR=$(find "${WORK}" -maxdepth 1 -type d -name 'kubernetes-1.20*' | head -n1 || true)
if [[ -z "${SRC_DIR}" || ! -f "${SRC_DIR}/.rw-source-complete" ]]; then
  rw_log "fetching Debian source package 'kubernetes' into ${WORK}"
  rm -rf "${WORK:?}"/kubernetes-* "${WORK:?}"/kubernetes_*
  apt-get source -qq kubernetes >"${WORK}/apt-source.log" 2>&1 \
    || { tail -n 30 "${WORK}/apt-source.log" >&2; rw_die "apt-get source kubernetes failed (log: ${WORK}/apt-source.log)"; }
  SRC_DIR=$(find "${WORK}" -maxdepth 1 -type d -name 'kubernetes-1.20*' | head -n1 || true)
  [[ -n "${SRC_DIR}" ]] || rw_die "apt-get source did not produce a kubernetes-1.20* directory in ${WORK}"
  [[ -d "${SRC_DIR}/vendor" ]] || rw_die "${SRC_DIR} has no vendor/ directory"
  touch "${SRC_DIR}/.rw-source-complete"
fi
rw_log "source tree: ${SRC_DIR}"
cd "${SRC_DIR}"

# ---------------------------------------------------------------- reflect2 1.0.2
# reflect2 1.0.1 (vendored) crashes with Go >= 1.18 on JSON maps; use Debian's 1.0.2.
if [[ ! -f vendor/github.com/modern-go/reflect2/.rw-1.0.2 ]]; then
  rw_log "replacing vendor/github.com/modern-go/reflect2 with 1.0.2"
  dl=$(mktemp -d)
  chown _apt "$dl" 2>/dev/null || chmod 777 "$dl"   # apt downloads as user _apt
  ( cd "$dl" && apt-get download -qq golang-github-modern-go-reflect2-dev ) \
    || rw_die "apt-get download golang-github-modern-go-reflect2-dev failed"
  dpkg-deb -x "$dl"/golang-github-modern-go-reflect2-dev_*.deb "$dl/x"
  r2="$dl/x/usr/share/gocode/src/github.com/modern-go/reflect2"
  [[ -f "$r2/reflect2.go" ]] || rw_die "reflect2 sources not found in the Debian package"
  rm -rf vendor/github.com/modern-go/reflect2
  mkdir -p vendor/github.com/modern-go/reflect2
  # Only the package's own files (no tests), as 'go mod vendor' would.
  find "$r2" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' -o -name 'LICENSE' \) ! -name '*_test.go' \
    -exec cp {} vendor/github.com/modern-go/reflect2/ \;
  rm -rf "$dl"
  # Keep go.mod and vendor/modules.txt consistent (go checks this in vendor mode).
  sed -i -E 's#(github\.com/modern-go/reflect2) v1\.0\.1#\1 v1.0.2#g' vendor/modules.txt go.mod
  grep -q 'github.com/modern-go/reflect2 v1.0.2' vendor/modules.txt \
    || rw_die "could not update reflect2 in vendor/modules.txt"
  touch vendor/github.com/modern-go/reflect2/.rw-1.0.2
fi

[[ -f vendor/github.com/modern-go/reflect2/go_above_118.go ]] \
  || rw_die "vendor/github.com/modern-go/reflect2 is not 1.0.2 (no go_above_118.go); delete ${SRC_DIR} and re-run"

# ---------------------------------------------------------------- compile
export GOPATH="${SRC_DIR}/.go" CGO_ENABLED=0
mkdir -p .go/src/k8s.io
ln -sfn ../../.. .go/src/k8s.io/kubernetes
rw_log "make WHAT=... (this takes several minutes; log: ${RW_CACHE}/make.log)"
WHAT=""
for b in "${K8S_BINS[@]}"; do WHAT+="cmd/$b "; done
if ! make WHAT="${WHAT% }" KUBE_VERBOSE=1 >"${RW_CACHE}/make.log" 2>&1; then
  tail -n 40 "${RW_CACHE}/make.log" >&2
  rw_die "make failed (full log: ${RW_CACHE}/make.log)"
fi
for b in "${K8S_BINS[@]}"; do
  f=""
  for d in _output/local/bin/linux/amd64 _output/bin; do
    [[ -x "$d/$b" ]] && { f="$d/$b"; break; }
  done
  [[ -n "$f" ]] || rw_die "built binary $b not found under _output"
  install -m 0755 "$f" "${RW_BIN}/$b.tmp"
  mv -f "${RW_BIN}/$b.tmp" "${RW_BIN}/$b"
done

# ---------------------------------------------------------------- pause
pause_c=""
for c in build/pause/linux/pause.c build/pause/pause.c; do
  [[ -f "$c" ]] && { pause_c="$c"; break; }
done
[[ -n "$pause_c" ]] || rw_die "pause.c not found in the source tree"
rw_log "compiling ${pause_c} statically"
gcc -Os -static -DVERSION=3.2-resourcewatch -o "${RW_BIN}/pause.tmp" "$pause_c" \
  || rw_die "gcc failed on ${pause_c}"
strip "${RW_BIN}/pause.tmp" 2>/dev/null || true
mv -f "${RW_BIN}/pause.tmp" "${RW_BIN}/pause"

"${RW_BIN}/kubectl" version --client --short 2>/dev/null | grep -q "v${K8S_VERSION}" \
  || rw_die "built kubectl does not report v${K8S_VERSION}"
# Drop the make output (hundreds of MB); the source tree and Go cache stay for re-builds.
rm -rf "${SRC_DIR}/_output"
rw_log "built Kubernetes ${K8S_VERSION} into ${RW_BIN} in $(( $(date +%s) - T0 ))s"
ls -la "${RW_BIN}" >&2
