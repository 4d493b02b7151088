#!/usr/bin/env bash
# Exit non-zero, listing what is left, if anything the e2e cluster harness started or
# changed is still there: processes (etcd, kube-*, kubelet, containerd, shims, container
# processes), mounts under the harness dirs or /var/lib/kubelet, network interfaces
# (cni0, veth*, the VM node's tap device), the VM node's QEMU and route, iptables rules/chains (KUBE-*, CNI-*), kubepods cgroups, host dirs the
# node created, sysctls that differ from the values recorded by up.sh.
# Things that were there before up.sh (its baseline in the state dir) are not reported.
#
# Usage: e2e/cluster/check-clean.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
source "${HERE}/env.sh"
[[ $(id -u) -eq 0 ]] || rw_die "must run as root"

left=()
add() { left+=("$*"); }

HAVE_BASE=0
[[ -f "${RW_BASELINE}/iptables.txt" ]] && HAVE_BASE=1
[[ -f "${RW_BASELINE}/.active" ]] && add "state: ${RW_BASELINE}/.active exists (cluster is up or down.sh did not finish)"

for p in $(rw_harness_pids); do
  add "process: $p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-160)"
done
for f in "${RW_PIDS}"/*.pid; do
  [[ -e "$f" ]] && add "pid file: $f"
done

while IFS= read -r m; do
  [[ -n "$m" ]] && add "mount: $m"
done < <(rw_harness_mounts)

base_links=""
[[ -f "${RW_BASELINE}/links.txt" ]] && base_links=$(cat "${RW_BASELINE}/links.txt")
for l in $(rw_links); do
  case "$l" in "${RW_CNI_BRIDGE}"|veth*|kube-ipvs0|cni*|flannel*|"${RW_VM_TAP_NAME}") ;; *) continue ;; esac
  grep -qxF "$l" <<<"$base_links" || add "interface: $l"
done

base_ipt=""
[[ $HAVE_BASE -eq 1 ]] && base_ipt=$(cat "${RW_BASELINE}/iptables.txt")
while IFS= read -r line; do
  [[ -n "$line" ]] || continue
  [[ "$line" =~ (KUBE-|CNI-) ]] || continue
  grep -qxF -- "$line" <<<"$base_ipt" && continue
  add "iptables: $line"
done < <(rw_iptables_dump)

for d in $(rw_kubepods_cgroups); do add "cgroup: $d"; done

# The VM node (vm-node.sh): its QEMU and the route to its pods.
for p in $(pgrep -f "qemu-system-x86_64.*${RW_VM_NODE_DIR}" || true); do
  add "process: $p (the VM node's QEMU)"
done
ip route show "${RW_VM_POD_CIDR}" 2>/dev/null | grep -q . && add "route: ${RW_VM_POD_CIDR} (the VM node's pods)"
[[ -e "${RW_PIDS}/vm-node.pid" ]] && add "pid file: ${RW_PIDS}/vm-node.pid"

if [[ -f "${RW_BASELINE}/dirs.txt" ]]; then
  for d in "${RW_HOST_DIRS[@]}"; do
    [[ -e "$d" ]] && ! grep -qxF "$d" "${RW_BASELINE}/dirs.txt" && add "dir: $d (created by the cluster)"
  done
fi
[[ -e "${RW_RUN}" ]] && add "dir: ${RW_RUN}"

if [[ -f "${RW_BASELINE}/sysctl.conf" ]]; then
  while IFS='=' read -r k v; do
    [[ -n "$k" ]] || continue
    cur=$(sysctl -n "$k" 2>/dev/null) || continue
    [[ "$cur" == "$v" ]] || add "sysctl: $k=$cur (was $v before up.sh)"
  done <"${RW_BASELINE}/sysctl.conf"
fi

for port in "${RW_ETCD_CLIENT_PORT}" "${RW_ETCD_PEER_PORT}" "${RW_APISERVER_PORT}" 10250 10248 10256 10257 10259; do
  ss -ltnH "sport = :$port" 2>/dev/null | grep -q . && add "listening port: $port $(ss -ltnpH "sport = :$port" | awk '{print $NF}' | head -n1)"
done

if [[ ${#left[@]} -gt 0 ]]; then
  echo "check-clean: NOT clean, ${#left[@]} item(s) left:" >&2
  printf '  %s\n' "${left[@]}" >&2
  exit 1
fi
echo "check-clean: clean$([[ $HAVE_BASE -eq 0 ]] && echo ' (no baseline recorded; any KUBE-*/CNI-* rule would have counted)')"
