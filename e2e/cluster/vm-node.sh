#!/usr/bin/env bash
# A second node for the e2e cluster: a QEMU/TCG VM running Debian's Linux 6.1 with cgroup
# v2 only (vm.sh), joined to this machine's API server as its own Node (`rw-vm`, tainted
# resourcewatch.io/vm-node=true:NoSchedule), with its own kubelet credentials, pod range
# and kube-proxy. See README.md, "The VM node".
#
#   e2e/cluster/vm-node.sh up [TAR...]   start it after up.sh (TARs: images to import there)
#   e2e/cluster/vm-node.sh import TAR... import images into its containerd
#   e2e/cluster/vm-node.sh down          stop it; remove its tap device, route and Node
#   e2e/cluster/vm-node.sh running       exit 0 if it runs
#
# Network: a tap device on this machine (${RW_VM_HOST_ADDR}) and the VM (${RW_VM_NODE_ADDR});
# the VM's pod range is routed through it. The API server reaches the VM's kubelet, pods on
# either node reach each other and Services (each node runs kube-proxy).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
source "${HERE}/env.sh"
[[ $(id -u) -eq 0 ]] || rw_die "must run as root"
X="${RW_VM_NODE_DIR}"
PIDF="${RW_PIDS}/vm-node.pid"
K() { "$KUBECTL" --kubeconfig "${RW_ADMIN_KUBECONFIG}" --request-timeout=10s "$@"; }

running() { [[ -s "$PIDF" ]] && kill -0 "$(<"$PIDF")" 2>/dev/null; }

net_up() {
  if ! ip link show "${RW_VM_TAP_NAME}" >/dev/null 2>&1; then
    ip tuntap add dev "${RW_VM_TAP_NAME}" mode tap
    ip addr add "${RW_VM_HOST_ADDR}/${RW_VM_NET_PREFIX}" dev "${RW_VM_TAP_NAME}"
  fi
  ip link set "${RW_VM_TAP_NAME}" up
  # onlink: the tap has no carrier until QEMU opens it.
  ip route replace "${RW_VM_POD_CIDR}" via "${RW_VM_NODE_ADDR}" dev "${RW_VM_TAP_NAME}" onlink
}

net_down() {
  ip route del "${RW_VM_POD_CIDR}" 2>/dev/null || true
  ip link del "${RW_VM_TAP_NAME}" 2>/dev/null || true
}

import() { # TAR...: waits for each answer
  running || rw_die "the VM node does not run"
  local t n rc
  for t in "$@"; do
    t="$(realpath "$t")"
    n="$(date +%s%N)"
    echo "$t" >"$X/requests/import.$n.tmp" && mv "$X/requests/import.$n.tmp" "$X/requests/import.$n"
    for _ in $(seq 1200); do [[ -s "$X/requests/import.$n.rc" ]] && break; running || break; sleep 0.5; done
    rc=$(cat "$X/requests/import.$n.rc" 2>/dev/null || echo timeout)
    rm -f "$X/requests/import.$n" "$X/requests/import.$n.rc"
    [[ "$rc" == 0 ]] || rw_die "importing $t on the VM node failed ($rc; $X/logs/import.log)"
  done
}

up() {
  [[ -s "${RW_ADMIN_KUBECONFIG}" ]] || rw_die "no cluster: run e2e/cluster/up.sh first"
  local t0; t0=$(date +%s)
  if running; then rw_log "the VM node already runs (pid $(<"$PIDF"))"; return 0; fi
  "${HERE}/vm.sh" fetch
  rm -rf "$X"; mkdir -p "$X/requests" "$X/logs"
  # Its own credentials: system:node:rw-vm (the Node authorizer limits it to its Node and
  # pods), a serving certificate the API server verifies (--kubelet-certificate-authority).
  rw_pki_cert vm-kubelet-client "/O=system:nodes/CN=system:node:${RW_VM_NODE_NAME}" client
  rw_pki_cert vm-kubelet-serving "/CN=${RW_VM_NODE_NAME}" server "IP:${RW_VM_NODE_ADDR},DNS:${RW_VM_NODE_NAME}"
  # The API server's certificate names `kubernetes`, not the tap address.
  local server="https://${RW_VM_HOST_ADDR}:${RW_APISERVER_PORT}"
  rw_write_kubeconfig "$X/kubelet.kubeconfig" vm-kubelet-client "$server" kubernetes
  rw_write_kubeconfig "$X/kube-proxy.kubeconfig" kube-proxy "$server" kubernetes
  local t; for t in "$@"; do realpath "$t"; done >"$X/images"
  # Mount points for the VM's own (see vm-node-init.sh); RW_HOST_DIRS, so down.sh removes
  # them unless they were there before up.sh.
  mkdir -p /var/lib/kubelet /var/lib/cni
  net_up
  rw_log "starting the VM node ${RW_VM_NODE_NAME} (Linux ${RW_VM_KERNEL_VERSION:-6.1}, cgroup v2; log ${RW_LOGS}/vm-node.log)"
  RW_VM_TAP="${RW_VM_TAP_NAME}" RW_VM_XDIR="$X" RW_VM_MEMORY="${RW_VM_NODE_MEMORY:-3072}" \
    setsid "${HERE}/vm.sh" run --timeout 86400 -- "${HERE}/vm-node-init.sh" \
    >>"${RW_LOGS}/vm-node.log" 2>&1 </dev/null 8>&- &
  echo $! >"$PIDF"
  local deadline=$(( $(date +%s) + ${RW_VM_NODE_TIMEOUT:-600} ))
  until [[ "$(K get node "${RW_VM_NODE_NAME}" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]; do
    if ! running; then
      tail -n 40 "${RW_LOGS}/vm-node.log" >&2 || true
      rw_die "the VM node exited (logs: ${RW_LOGS}/vm-node.log, $X/logs)"
    fi
    if (( $(date +%s) >= deadline )); then
      tail -n 20 "$X/logs/"*.log >&2 || true
      rw_die "the VM node is not Ready after ${RW_VM_NODE_TIMEOUT:-600}s (logs: $X/logs)"
    fi
    sleep 2
  done
  rw_log "VM node ${RW_VM_NODE_NAME} Ready in $(( $(date +%s) - t0 ))s"
}

down() {
  if running; then
    local pid; pid=$(<"$PIDF")
    touch "$X/stop"
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then
      pkill -KILL -P "$pid" 2>/dev/null || true
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  # QEMU itself, should its parent have gone.
  pkill -KILL -f "qemu-system-x86_64.*${X}" 2>/dev/null || true
  rm -f "$PIDF"
  net_down
  if [[ -s "${RW_ADMIN_KUBECONFIG}" ]]; then
    K delete node "${RW_VM_NODE_NAME}" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  fi
}

case "${1:-}" in
  up) shift; up "$@" ;;
  import) shift; import "$@" ;;
  down) down ;;
  running) running ;;
  *) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
