#!/usr/bin/env bash
# Stop the e2e cluster started by up.sh and leave the machine as up.sh found it:
# kubelet first, then every container and sandbox, the shims, containerd, kube-proxy,
# scheduler, controller-manager, apiserver and etcd; unmount what they mounted; remove
# the VM node (vm-node.sh: QEMU, its tap device and route), the CNI bridge, veths, the KUBE-*/CNI-* iptables rules and chains, the kubepods
# cgroups and the host dirs they created; restore the sysctls recorded by up.sh.
# The build cache (/var/cache/resourcewatch) is kept.
#
# Usage: e2e/cluster/down.sh [--purge]   (--purge also deletes the state dir: etcd data, PKI, logs)
# Safe to run any number of times, also when up.sh crashed half-way.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
source "${HERE}/env.sh"

PURGE=0
for a in "$@"; do
  case "$a" in
    --purge) PURGE=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) rw_die "unknown argument: $a" ;;
  esac
done
[[ $(id -u) -eq 0 ]] || rw_die "must run as root"
T0=$(date +%s)

if [[ -d "${RW_STATE}" ]]; then
  exec 8>"${RW_STATE}/.up.lock"
  if ! flock -w 60 8; then
    rw_log "warning: ${RW_STATE}/.up.lock still held after 60s (an up.sh running, or a daemon from an old harness version holding it); going on"
  fi
fi

# ------------------------------------------------------------------ helpers
is_ours() { # PID: its command line names the harness state dir, or it runs one of our binaries
  local pid=$1 exe
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [[ "$exe" == "${RW_BIN}/"* ]] && return 0
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -e "${RW_STATE}" -e "${RW_RUN}"
}
wait_gone() { # TIMEOUT_S PID...
  local deadline=$(( $(date +%s) + $1 )); shift
  local p alive
  while :; do
    alive=()
    for p in "$@"; do [[ -d "/proc/$p" ]] && [[ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ]] && alive+=("$p"); done
    [[ ${#alive[@]} -eq 0 ]] && return 0
    (( $(date +%s) >= deadline )) && return 1
    sleep 0.2
  done
}
stop_daemon() { # NAME [TIMEOUT_S]
  local name=$1 timeout=${2:-15} f="${RW_PIDS}/$1.pid" pid
  [[ -s "$f" ]] || return 0
  pid=$(<"$f")
  if [[ -d "/proc/$pid" ]] && is_ours "$pid"; then
    rw_log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_gone "$timeout" "$pid"; then
      rw_log "$name did not stop in ${timeout}s; SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      wait_gone 10 "$pid" || rw_log "warning: $name (pid $pid) still there"
    fi
  fi
  rm -f "$f"
}
kill_pids() { # SIGNAL PID...
  local sig=$1; shift
  if [[ $# -gt 0 ]]; then kill "-$sig" "$@" 2>/dev/null || true; fi
}
kubepods_pids() {
  local d
  for d in $(rw_kubepods_cgroups); do
    find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -un
}

# ------------------------------------------------------------------ the VM node
# First, while the API server still answers (its Node object is deleted).
"${HERE}/vm-node.sh" down

# ------------------------------------------------------------------ kubelet
stop_daemon kubelet 20

# ------------------------------------------------------------------ containers and sandboxes
CONTAINERD_UP=0
CRI_DIRS_UNUSED=0
if [[ -S "${RW_CONTAINERD_SOCK}" ]] && timeout 10 "${RW_BIN}/ctr" --address "${RW_CONTAINERD_SOCK}" version >/dev/null 2>&1; then
  CONTAINERD_UP=1
fi
if [[ $CONTAINERD_UP -eq 1 ]]; then
  for ns in $(timeout 10 "${RW_BIN}/ctr" --address "${RW_CONTAINERD_SOCK}" namespaces ls -q 2>/dev/null || true); do
    tasks=$(timeout 20 "${RW_BIN}/ctr" --address "${RW_CONTAINERD_SOCK}" -n "$ns" tasks ls -q 2>/dev/null || true)
    if [[ -n "$tasks" ]]; then
      rw_log "killing $(echo "$tasks" | wc -l) task(s) in containerd namespace $ns"
      for t in $tasks; do
        timeout 10 "${RW_BIN}/ctr" --address "${RW_CONTAINERD_SOCK}" -n "$ns" tasks kill -a -s SIGKILL "$t" >/dev/null 2>&1 || true
      done
      for t in $tasks; do
        timeout 15 "${RW_BIN}/ctr" --address "${RW_CONTAINERD_SOCK}" -n "$ns" tasks rm -f "$t" >/dev/null 2>&1 || true
      done
    fi
    ctrs=$(timeout 20 "${RW_BIN}/ctr" --address "${RW_CONTAINERD_SOCK}" -n "$ns" containers ls -q 2>/dev/null || true)
    if [[ -n "$ctrs" ]]; then
      rw_log "deleting $(echo "$ctrs" | wc -l) container(s) in containerd namespace $ns"
      # shellcheck disable=SC2086
      timeout 60 "${RW_BIN}/ctr" --address "${RW_CONTAINERD_SOCK}" -n "$ns" containers rm $ctrs >/dev/null 2>&1 || true
    fi
  done
  if [[ -z "$(timeout 10 "${RW_BIN}/ctr" --address "${RW_CONTAINERD_SOCK}" -n k8s.io containers ls -q 2>/dev/null || echo x)" ]]; then
    CRI_DIRS_UNUSED=1   # no container left: CRI's per-container dirs can go once containerd stops
  fi
fi
# Whatever is still in a kubepods cgroup (containerd dead, or a task that escaped ctr).
pids=$(kubepods_pids)
if [[ -n "$pids" ]]; then
  rw_log "killing $(echo "$pids" | wc -w) leftover container process(es)"
  # shellcheck disable=SC2086
  kill_pids KILL $pids
  # shellcheck disable=SC2086
  wait_gone 10 $pids || rw_log "warning: container processes still alive: $(tr '\n' ' ' <<<"$pids")"
fi

# ------------------------------------------------------------------ kube-proxy, containerd, shims
stop_daemon kube-proxy 10
stop_daemon containerd 20
if [[ $CRI_DIRS_UNUSED -eq 1 ]]; then
  rm -rf --one-file-system "${RW_CONTAINERD_ROOT}/io.containerd.grpc.v1.cri/sandboxes/"* \
    "${RW_CONTAINERD_ROOT}/io.containerd.grpc.v1.cri/containers/"* 2>/dev/null || true
fi
shims=()
for p in /proc/[0-9]*; do
  p=${p#/proc/}
  exe=$(readlink "/proc/$p/exe" 2>/dev/null) || continue
  [[ "$exe" == *containerd-shim* ]] || continue
  tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF "${RW_CONTAINERD_SOCK}" && shims+=("$p")
done
if [[ ${#shims[@]} -gt 0 ]]; then
  rw_log "stopping ${#shims[@]} containerd shim(s)"
  kill_pids TERM "${shims[@]}"
  wait_gone 10 "${shims[@]}" || { kill_pids KILL "${shims[@]}"; wait_gone 5 "${shims[@]}" || true; }
fi
# A last sweep: any harness process left except the control plane (stopped below).
for p in $(rw_harness_pids); do
  exe=$(readlink "/proc/$p/exe" 2>/dev/null) || continue
  case "$exe" in
    */kube-apiserver|*/kube-controller-manager|*/kube-scheduler|*/etcd) ;;
    *) rw_log "killing leftover $(tr '\0' ' ' </proc/"$p"/cmdline | cut -c1-120)"; kill -KILL "$p" 2>/dev/null || true ;;
  esac
done

# ------------------------------------------------------------------ mounts
for attempt in 1 2 3; do
  mounts=$(rw_harness_mounts)
  [[ -z "$mounts" ]] && break
  [[ $attempt -eq 1 ]] && rw_log "unmounting $(echo "$mounts" | wc -l) mount(s)"
  while IFS= read -r m; do
    [[ -n "$m" ]] || continue
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done <<<"$mounts"
done
mounts=$(rw_harness_mounts)
[[ -z "$mounts" ]] || rw_log "warning: could not unmount: $(tr '\n' ' ' <<<"$mounts")"
rm -f /run/netns/cni-* 2>/dev/null || true

# ------------------------------------------------------------------ control plane
stop_daemon kube-scheduler 10
stop_daemon kube-controller-manager 10
stop_daemon kube-apiserver 20
stop_daemon etcd 20

# ------------------------------------------------------------------ network interfaces
base_links=""
[[ -f "${RW_BASELINE}/links.txt" ]] && base_links=$(cat "${RW_BASELINE}/links.txt")
for l in $(rw_links); do
  case "$l" in
    "${RW_CNI_BRIDGE}"|veth*|kube-ipvs0) ;;
    *) continue ;;
  esac
  grep -qxF "$l" <<<"$base_links" && continue
  rw_log "deleting interface $l"
  ip link delete "$l" 2>/dev/null || rw_log "warning: could not delete interface $l"
done

# ------------------------------------------------------------------ iptables
base_ipt=""
[[ -f "${RW_BASELINE}/iptables.txt" ]] && base_ipt=$(cat "${RW_BASELINE}/iptables.txt")
in_base() { grep -qxF -- "$1" <<<"$base_ipt"; }
ipt_removed=0
for bin in $(rw_iptables_bins); do
  for table in filter nat mangle raw; do
    rules=$("$bin" -w 5 -t "$table" -S 2>/dev/null | grep -v '^#') || continue
    # 1. rules that are not the machine's own and mention KUBE-/CNI- chains
    while IFS= read -r line; do
      [[ "$line" == "-A "* ]] || continue
      [[ "$line" =~ (KUBE-|CNI-) ]] || continue
      in_base "$bin $table $line" && continue
      eval "set -- ${line}" || continue
      shift 1
      if "$bin" -w 5 -t "$table" -D "$@" 2>/dev/null; then ipt_removed=$((ipt_removed + 1)); fi
    done <<<"$rules"
    # 2. our chains: flush all, then delete
    chains=$(grep -E '^-N (KUBE-|CNI-)' <<<"$rules" | awk '{print $2}' || true)
    mine=()
    for c in $chains; do in_base "$bin $table -N $c" || mine+=("$c"); done
    for c in "${mine[@]}"; do "$bin" -w 5 -t "$table" -F "$c" 2>/dev/null || true; done
    for c in "${mine[@]}"; do
      if "$bin" -w 5 -t "$table" -X "$c" 2>/dev/null; then ipt_removed=$((ipt_removed + 1)); fi
    done
  done
done
[[ $ipt_removed -gt 0 ]] && rw_log "removed $ipt_removed iptables rule(s)/chain(s)"

# ------------------------------------------------------------------ sysctls
if [[ -f "${RW_BASELINE}/sysctl.conf" ]]; then
  while IFS='=' read -r k v; do
    [[ -n "$k" ]] || continue
    cur=$(sysctl -n "$k" 2>/dev/null) || continue
    if [[ "$cur" != "$v" ]]; then
      rw_log "restoring $k=$v (was $cur)"
      sysctl -qw "$k=$v" || rw_log "warning: could not restore $k"
    fi
  done <"${RW_BASELINE}/sysctl.conf"
fi

# ------------------------------------------------------------------ cgroups
for d in $(rw_kubepods_cgroups); do
  find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  [[ -d "$d" ]] && rw_log "warning: could not remove cgroup $d"
done

# ------------------------------------------------------------------ files
base_dirs=""
[[ -f "${RW_BASELINE}/dirs.txt" ]] && base_dirs=$(cat "${RW_BASELINE}/dirs.txt")
for d in "${RW_HOST_DIRS[@]}"; do
  [[ -e "$d" ]] || continue
  grep -qxF "$d" <<<"$base_dirs" && continue
  [[ -f "${RW_BASELINE}/dirs.txt" ]] || continue   # no record of what was there: leave it
  if findmnt -rn -o TARGET | grep -q "^$d"; then
    rw_log "warning: not removing $d: something is still mounted under it"
    continue
  fi
  rm -rf --one-file-system "$d"
done
# libcni's result cache for our network, when /var/lib/cni was there before (else it is gone).
rm -f /var/lib/cni/results/resourcewatch-e2e-* 2>/dev/null || true
# Pod IPs, container runtime state and sockets: all pods are gone.
rm -rf "${RW_DATA}/cni-ipam" 2>/dev/null || true
if [[ -z "$(findmnt -rn -o TARGET | grep "^${RW_RUN}" || true)" ]]; then rm -rf "${RW_RUN}"; fi
rm -f "${RW_BASELINE}/.active"

if [[ $PURGE -eq 1 ]]; then
  if findmnt -rn -o TARGET | grep -q "^${RW_STATE}"; then
    rw_die "not purging ${RW_STATE}: something is still mounted under it"
  fi
  rw_log "purging ${RW_STATE}"
  rm -rf --one-file-system "${RW_STATE}"
fi
rw_log "cluster down in $(( $(date +%s) - T0 ))s"
