# shellcheck shell=bash disable=SC2034
# Sourced by the e2e cluster scripts (and by tests): paths, KUBECTL, KUBECONFIG.
# Everything can be overridden from the environment before sourcing.

# The versions are the pins of e2e/cluster/go/*/go.mod (build.sh builds from there).
RW_GO_MODS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/go"
rw_pin() { awk -v m="$2" '$1 == m || ($1 == "require" && $2 == m) { v = ($1 == m) ? $2 : $3; sub(/^v/, "", v); print v; exit }' "${RW_GO_MODS}/$1/go.mod"; }
K8S_VERSION="$(rw_pin kubernetes k8s.io/kubernetes)"
RW_CONTAINERD_VERSION="$(rw_pin containerd github.com/containerd/containerd/v2)"
RW_RUNC_VERSION="$(rw_pin runc github.com/opencontainers/runc)"
RW_CNI_VERSION="$(rw_pin cni github.com/containernetworking/plugins)"
RW_ETCD_VERSION="$(rw_pin etcd go.etcd.io/etcd/server/v3)"
RW_CACHE="${RW_CACHE:-/var/cache/resourcewatch/k8s-${K8S_VERSION}}"
RW_BIN="${RW_BIN:-${RW_CACHE}/bin}"
RW_GO_CACHE="${RW_GO_CACHE:-/var/cache/resourcewatch/go}"
RW_STATE="${RW_STATE:-/var/lib/resourcewatch-e2e}"
RW_RUN="${RW_RUN:-/run/resourcewatch-e2e}"

RW_PKI="${RW_STATE}/pki"
RW_LOGS="${RW_STATE}/logs"
RW_PIDS="${RW_STATE}/pids"
RW_DATA="${RW_STATE}/data"
RW_CONF="${RW_STATE}/conf"

RW_ETCD_DATA="${RW_DATA}/etcd"
RW_CONTAINERD_ROOT="${RW_DATA}/containerd"
RW_CONTAINERD_STATE="${RW_RUN}/containerd"
RW_CONTAINERD_SOCK="${RW_RUN}/containerd.sock"
RW_CNI_CONF_DIR="${RW_CONF}/cni"
RW_CNI_BIN_DIR="${RW_CNI_BIN_DIR:-${RW_CACHE}/cni}"
RW_KUBELET_ROOT="${RW_KUBELET_ROOT:-/var/lib/kubelet}"

RW_ETCD_CLIENT_PORT="${RW_ETCD_CLIENT_PORT:-2379}"
RW_ETCD_PEER_PORT="${RW_ETCD_PEER_PORT:-2380}"
RW_APISERVER_PORT="${RW_APISERVER_PORT:-6443}"
RW_SERVICE_CIDR="10.96.0.0/12"
RW_SERVICE_IP="10.96.0.1"
RW_POD_CIDR="${RW_POD_CIDR:-10.88.0.0/16}"
RW_CNI_BRIDGE="${RW_CNI_BRIDGE:-cni0}"

RW_PAUSE_IMAGE="localhost/resourcewatch/pause:3.2"

KUBECTL="${RW_BIN}/kubectl"
RW_ADMIN_KUBECONFIG="${RW_STATE}/admin.kubeconfig"
export KUBECONFIG="${RW_ADMIN_KUBECONFIG}"

# rw_import_images TAR...: every image into every node's containerd (the VM node's too,
# when it runs: e2e/cluster/vm-node.sh).
rw_import_images() {
  local t
  for t in "$@"; do
    rw_ctr -n k8s.io images import "$t" >/dev/null || rw_die "importing $t failed"
  done
  if "$(dirname "${BASH_SOURCE[0]}")/vm-node.sh" running; then
    "$(dirname "${BASH_SOURCE[0]}")/vm-node.sh" import "$@"
  fi
}

# Logging helpers.
rw_log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
rw_die() { printf '[%s] ERROR: %s\n' "$(date +%H:%M:%S)" "$*" >&2; exit 1; }

# ctr against the harness containerd.
rw_ctr() { "${RW_BIN}/ctr" --address "${RW_CONTAINERD_SOCK}" "$@"; }

# ------------------------------------------------------------------ shared helpers
RW_BASELINE="${RW_STATE}/baseline"       # machine state recorded by up.sh before it changes it
# Sysctls that kubelet, kube-proxy, the CNI bridge plugin or up.sh itself may change.
RW_SYSCTLS=(
  vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes
  net.ipv4.ip_forward net.ipv4.conf.all.route_localnet
  net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
  net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established
  net.netfilter.nf_conntrack_tcp_timeout_close_wait
)
# Directories the node components create when missing; down.sh removes the ones
# that did not exist before up.sh.
RW_HOST_DIRS=(/var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni /run/containerd /run/netns /var/lib/dockershim /etc/kubernetes)

# iptables front ends to look at: the configured ones (what kubelet, kube-proxy and
# the CNI plugins exec) plus the legacy backend when its tables are loaded.
rw_iptables_bins() {
  local b seen=" "
  for b in iptables ip6tables; do
    command -v "$b" >/dev/null 2>&1 && echo "$b" && seen+="$("$b" --version 2>/dev/null | grep -o '(.*)')$b "
  done
  if [[ "$seen" != *"(legacy)iptables"* ]] && command -v iptables-legacy >/dev/null 2>&1 \
     && [[ -n "$(cat /proc/net/ip_tables_names 2>/dev/null)" ]]; then echo iptables-legacy; fi
  if [[ "$seen" != *"(legacy)ip6tables"* ]] && command -v ip6tables-legacy >/dev/null 2>&1 \
     && [[ -n "$(cat /proc/net/ip6_tables_names 2>/dev/null)" ]]; then echo ip6tables-legacy; fi
}
# One line per rule/chain: "<bin> <table> <iptables -S line>".
rw_iptables_dump() {
  local b t
  for b in $(rw_iptables_bins); do
    for t in filter nat mangle raw; do
      "$b" -w 5 -t "$t" -S 2>/dev/null | grep -v '^#' | sed "s|^|$b $t |" || true
    done
  done
}
rw_links() { ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | sort; }

# Mount points under the harness dirs, deepest first.
rw_harness_mounts() {
  local re="^(${RW_STATE}|${RW_RUN}|${RW_KUBELET_ROOT}|/run/containerd|/var/run/containerd|/run/netns/cni-|/var/run/netns/cni-)"
  findmnt -rn -o TARGET 2>/dev/null | grep -E "$re" | awk '{print length, $0}' | sort -rn | cut -d' ' -f2- || true
}

# PIDs of processes started by the harness: our binaries, anything whose command
# line names the harness dirs (etcd, containerd, shims), and anything in a kubepods cgroup.
rw_harness_pids() {
  local p exe cmd
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [[ "$p" == "$$" || "$p" == "$BASHPID" ]] && continue
    exe=$(readlink "/proc/$p/exe" 2>/dev/null) || continue
    if [[ "$exe" == "${RW_BIN}/"* ]]; then echo "$p"; continue; fi
    cmd=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) || continue
    case "$exe" in
      */etcd|*/containerd|*/containerd-shim*|*/runc)
        if [[ "$cmd" == *"${RW_STATE}"* || "$cmd" == *"${RW_RUN}"* ]]; then echo "$p"; continue; fi ;;
    esac
    if grep -qs ':/kubepods' "/proc/$p/cgroup"; then echo "$p"; fi
  done
}

rw_kubepods_cgroups() {
  local d
  for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods.slice; do
    [[ -d "$d" ]] && echo "$d"
  done
  return 0
}

# rw_write_if_changed FILE [MODE] < content: replaces FILE only when the content differs
# (kube-proxy exits when its config file changes; the others need no restart either).
rw_write_if_changed() {
  local f=$1 mode=${2:-644}
  cat >"$f.tmp"
  chmod "$mode" "$f.tmp"
  if [[ -f "$f" ]] && cmp -s "$f.tmp" "$f"; then rm -f "$f.tmp"; else mv -f "$f.tmp" "$f"; fi
}

# rw_pki_cert NAME SUBJECT server|client|both [SANS]: a certificate of the harness CA
# (${RW_PKI}/ca.{crt,key}), made again only when its subject, kind or SANs change.
rw_pki_cert() {
  local name=$1 subj=$2 kind=$3 sans=${4:-}
  local crt="${RW_PKI}/$name.crt" key="${RW_PKI}/$name.key" meta="${RW_PKI}/$name.meta"
  local want="$subj|$kind|$sans"
  if [[ -s "$crt" && -s "$key" && -f "$meta" && "$(cat "$meta")" == "$want" ]] \
     && openssl verify -CAfile "${RW_PKI}/ca.crt" "$crt" >/dev/null 2>&1; then
    return 0
  fi
  rw_log "generating certificate $name ($subj)"
  local eku
  case "$kind" in
    server) eku=serverAuth ;; client) eku=clientAuth ;; both) eku=serverAuth,clientAuth ;;
    *) rw_die "bad cert kind $kind" ;;
  esac
  local ext="${RW_PKI}/$name.ext"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    [[ -n "$sans" ]] && echo "subjectAltName=$sans"
  } >"$ext"
  openssl genrsa -out "$key.tmp" 2048 2>/dev/null
  openssl req -new -key "$key.tmp" -subj "$subj" -out "${RW_PKI}/$name.csr" 2>/dev/null
  openssl x509 -req -in "${RW_PKI}/$name.csr" -CA "${RW_PKI}/ca.crt" -CAkey "${RW_PKI}/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 3650 -sha256 -extfile "$ext" -out "$crt.tmp" 2>/dev/null \
    || rw_die "openssl failed to sign $name"
  mv "$key.tmp" "$key"; mv "$crt.tmp" "$crt"
  rm -f "${RW_PKI}/$name.csr" "$ext"
  echo "$want" >"$meta"
}

# rw_write_kubeconfig FILE CERTNAME [SERVER [TLS_SERVER_NAME]]: a kubeconfig for that certificate
# (default server: the API server on this machine's loopback).
rw_write_kubeconfig() {
  local f=$1 n=$2 server=${3:-https://127.0.0.1:${RW_APISERVER_PORT}} sni=${4:-}
  rw_write_if_changed "$f" 600 <<EOF
apiVersion: v1
kind: Config
clusters:
- name: resourcewatch-e2e
  cluster:
    certificate-authority-data: $(base64 -w0 <"${RW_PKI}/ca.crt")
    server: ${server}
${sni:+    tls-server-name: ${sni}}
users:
- name: $n
  user:
    client-certificate-data: $(base64 -w0 <"${RW_PKI}/$n.crt")
    client-key-data: $(base64 -w0 <"${RW_PKI}/$n.key")
contexts:
- name: resourcewatch-e2e
  context:
    cluster: resourcewatch-e2e
    user: $n
current-context: resourcewatch-e2e
EOF
}

# ------------------------------------------------------------------ the VM node (vm-node.sh)
# A second node: Debian's Linux 6.1 with cgroup v2 only, in QEMU's software emulation,
# on a tap device of its own subnet; its pods get their own range, routed through it.
RW_VM_NODE_NAME="${RW_VM_NODE_NAME:-rw-vm}"
RW_VM_NODE_DIR="${RW_STATE}/vm-node"
RW_VM_TAP_NAME="${RW_VM_TAP_NAME:-rwtap0}"
RW_VM_HOST_ADDR="10.89.0.1"
RW_VM_NODE_ADDR="10.89.0.2"
RW_VM_NET_PREFIX=24
RW_VM_POD_CIDR="10.87.0.0/24"
# Pods on the VM node carry this taint (and label): only the agent DaemonSet and tests
# meant for that node go there, nothing of the host node's tests lands on it by chance.
RW_VM_TAINT="resourcewatch.io/vm-node=true:NoSchedule"
