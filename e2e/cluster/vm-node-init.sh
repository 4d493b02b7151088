#!/usr/bin/env bash
# Runs inside the VM node (vm-node.sh starts it through vm.sh): the network on the tap
# device, writable tmpfs where a node writes, this project's containerd, runc, CNI, kubelet
# and kube-proxy (the host's own binaries, seen over 9p), the images vm-node.sh lists,
# then requests from the host until it asks the node to stop.
#
# The exchange directory ($RW_VM_NODE_DIR, read-write over 9p) holds: the kubeconfigs
# vm-node.sh wrote, `images` (tarballs to import at start), `requests/import.N` (a tarball
# path; answered by `requests/import.N.rc`), `logs/` (every daemon's log), `ready` once
# the daemons run, and `stop`.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
source "${HERE}/env.sh"
# shellcheck source=node.sh
source "${HERE}/node.sh"
X="${RW_VM_NODE_DIR}"
L="$X/logs"
mkdir -p "$L" "$X/requests"
log() { printf '[%s] vm-node: %s\n' "$(date +%H:%M:%S)" "$*" | tee -a "$L/init.log" >&2; }
export PATH="${RW_BIN}:${PATH}"
MODS="$(ls -d /var/cache/resourcewatch/vm/*/modules | head -n1)"

# ------------------------------------------------------------------ kernel
for m in virtio_net bridge br_netfilter veth overlay; do
  modprobe -d "$MODS" "$m" || { log "modprobe $m failed"; exit 1; }
done
sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
# Debian's kernel defaults kernel.perf_event_paranoid to 3, its own level under which only
# CAP_SYS_ADMIN may open a perf event (CAP_PERFMON is not enough): the agent's CPU profiles
# failed there with EACCES, and said so. 2 is the upstream default (and Amazon Linux's);
# the README's troubleshooting section tells node admins the same.
sysctl -qw kernel.perf_event_paranoid=2

# ------------------------------------------------------------------ network
ip link set lo up
dev=$(ls /sys/class/net | grep -v '^lo$' | head -n1)
[[ -n "$dev" ]] || { log "no network device"; exit 1; }
ip addr add "${RW_VM_NODE_ADDR}/${RW_VM_NET_PREFIX}" dev "$dev"
ip link set "$dev" up
ip route add default via "${RW_VM_HOST_ADDR}"

# ------------------------------------------------------------------ writable places
# The host's root is read-only here; /run and /tmp are tmpfs. The node's state lives under
# /run; /var/log (where kubelet keeps pods' logs) gets a tmpfs of its own.
mount -t tmpfs -o mode=0755 node /var/log
# kubelet keeps some paths under /var/lib/kubelet whatever its --root-dir (device plugins),
# and CNI its cache under /var/lib/cni; the host node's are there, read-only (vm-node.sh
# makes them if missing; down.sh removes what up.sh did not find): this node gets its own.
for d in /var/lib/kubelet /var/lib/cni; do
  [[ -d "$d" ]] || { log "no $d to mount over"; exit 1; }
  mount -t tmpfs -o mode=0750 node "$d"
done
# Pods' volume mounts propagate as on a systemd host.
mount --make-rshared /
V=/run/rw-node
mkdir -p "$V"/{cni,conf,runc,opt,cni-ipam,containerd} /run/containerd

# ------------------------------------------------------------------ containerd
sock=/run/containerd/containerd.sock
rw_cni_conflist "${RW_VM_POD_CIDR}" "$V/cni-ipam" >"$V/cni/10-resourcewatch.conflist"
rw_containerd_toml "$V/containerd" /run/containerd/state "$sock" "$V/opt" "$V/runc" "$V/cni" >"$V/conf/containerd.toml"
setsid containerd --config "$V/conf/containerd.toml" >>"$L/containerd.log" 2>&1 </dev/null &
containerd_pid=$!
ctr_() { ctr --address "$sock" -n k8s.io "$@"; }
for _ in $(seq 600); do
  ctr --address "$sock" version >/dev/null 2>&1 && break
  kill -0 "$containerd_pid" 2>/dev/null || break
  sleep 0.5
done
ctr --address "$sock" version >/dev/null || { log "containerd did not start"; tail -20 "$L/containerd.log" >&2; exit 1; }
log "containerd runs"
import() { # TAR
  ctr_ images import "$1" >>"$L/import.log" 2>&1
}
import "${RW_DATA}/images/pause.tar" || { log "importing the pause image failed"; exit 1; }
ctr_ images label "${RW_PAUSE_IMAGE}" io.cri-containerd.pinned=pinned >/dev/null 2>&1 || true
if [[ -f "$X/images" ]]; then
  while read -r tar; do
    [[ -n "$tar" ]] || continue
    import "$tar" || { log "importing $tar failed"; exit 1; }
  done <"$X/images"
fi
log "images imported"

# ------------------------------------------------------------------ kubelet, kube-proxy
rw_kubelet_yaml "${RW_PKI}/vm-kubelet-serving" "$sock" true >"$V/conf/kubelet.yaml"
setsid kubelet --config="$V/conf/kubelet.yaml" --kubeconfig="$X/kubelet.kubeconfig" \
  --hostname-override="${RW_VM_NODE_NAME}" --node-ip="${RW_VM_NODE_ADDR}" \
  --root-dir=/var/lib/kubelet \
  --node-labels="resourcewatch.io/vm-node=true" --register-with-taints="${RW_VM_TAINT}" \
  --v=1 >>"$L/kubelet.log" 2>&1 </dev/null &
kubelet_pid=$!
rw_kube_proxy_yaml "$X/kube-proxy.kubeconfig" "${RW_VM_POD_CIDR}" "${RW_VM_NODE_NAME}" >"$V/conf/kube-proxy.yaml"
setsid kube-proxy --config="$V/conf/kube-proxy.yaml" --v=1 >>"$L/kube-proxy.log" 2>&1 </dev/null &
proxy_pid=$!
touch "$X/ready"
log "kubelet and kube-proxy started"

# ------------------------------------------------------------------ requests
while [[ ! -e "$X/stop" ]]; do
  # A daemon that exits ends the node (and the VM): vm-node.sh up sees it at once.
  for d in containerd:$containerd_pid kubelet:$kubelet_pid kube-proxy:$proxy_pid; do
    kill -0 "${d#*:}" 2>/dev/null || { log "${d%%:*} exited (its log: $L/${d%%:*}.log)"; exit 1; }
  done
  for r in "$X"/requests/import.*; do
    [[ -f "$r" && "$r" != *.rc && ! -e "$r.rc" ]] || continue
    rc=0; import "$(cat "$r")" || rc=$?
    echo "$rc" >"$r.rc.tmp" && mv "$r.rc.tmp" "$r.rc"
  done
  sleep 1
done
log "stopping"
pkill -TERM kubelet || true; pkill -TERM kube-proxy || true
sleep 2
pkill -TERM containerd || true
sleep 2
exit 0
