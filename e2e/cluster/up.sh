#!/usr/bin/env bash
# Start a single-node Kubernetes cluster (the version pinned in go/kubernetes/go.mod) on
# this machine (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd 2
# with runc, kubelet, kube-proxy, the CNI bridge), all built by build.sh, and write
# an admin kubeconfig to /var/lib/resourcewatch-e2e/admin.kubeconfig.
#
# Usage: e2e/cluster/up.sh [--apiserver-only] [--smoke]
#   --apiserver-only  only etcd, kube-apiserver and kube-controller-manager (API tests)
#   --smoke           after start, run a pause pod and wait for it to be Running
# Idempotent: components already running are left alone; safe to re-run after a crash.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
source "${HERE}/env.sh"
# shellcheck source=node.sh
source "${HERE}/node.sh"

APISERVER_ONLY=0
SMOKE=0
for a in "$@"; do
  case "$a" in
    --apiserver-only) APISERVER_ONLY=1 ;;
    --smoke) SMOKE=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) rw_die "unknown argument: $a (see --help)" ;;
  esac
done
[[ $(id -u) -eq 0 ]] || rw_die "must run as root"
[[ $SMOKE -eq 1 && $APISERVER_ONLY -eq 1 ]] && rw_die "--smoke needs the node; drop --apiserver-only"

T_START=$(date +%s)

mkdir -p "${RW_STATE}"
exec 8>"${RW_STATE}/.up.lock"
flock -n 8 || rw_die "another up.sh/down.sh is running (lock ${RW_STATE}/.up.lock)"

"${HERE}/build.sh" >&2
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl pause \
         etcd containerd containerd-shim-runc-v2 ctr runc; do
  [[ -x "${RW_BIN}/$b" ]] || rw_die "${RW_BIN}/$b missing after build.sh"
done
# containerd finds its shim, and the shim runc, on PATH.
export PATH="${RW_BIN}:${PATH}"
for c in openssl curl iptables conntrack findmnt ip; do
  command -v "$c" >/dev/null || rw_die "'$c' not found (build.sh installs the packages)"
done

mkdir -p "${RW_PKI}" "${RW_LOGS}" "${RW_PIDS}" "${RW_DATA}" "${RW_CONF}" "${RW_RUN}" "${RW_BASELINE}"
chmod 700 "${RW_PKI}"

NODE_NAME=$(hostname | tr '[:upper:]' '[:lower:]')
HOST_IP=$(ip -4 route get 1.1.1.1 2>/dev/null | awk '{for (i=1;i<NF;i++) if ($i=="src") {print $(i+1); exit}}')
[[ -n "${HOST_IP}" ]] || HOST_IP=$(hostname -I 2>/dev/null | awk '{print $1}')
[[ -n "${HOST_IP}" ]] || HOST_IP=127.0.0.1
# The cgroup layout decides the kubelet's and runc's mode. This VM boots hybrid (v1
# controllers, an empty v2 tree at /sys/fs/cgroup/unified) and cannot be moved to the
# unified hierarchy at run time: README.md, "cgroup v2 on this VM".
if [[ "$(stat -f -c %T /sys/fs/cgroup)" == cgroup2fs ]]; then
  CGROUP_LAYOUT=v2; FAIL_CGROUP_V1=true
else
  CGROUP_LAYOUT="v1 ($([[ -d /sys/fs/cgroup/unified ]] && echo hybrid || echo legacy))"; FAIL_CGROUP_V1=false
fi
rw_log "node ${NODE_NAME}, host IP ${HOST_IP}, cgroup ${CGROUP_LAYOUT}"

# ------------------------------------------------------------------ baseline
# Recorded once per cluster life (until down.sh), before anything is changed.
if [[ ! -f "${RW_BASELINE}/.active" ]]; then
  rw_log "recording the machine's baseline (sysctls, iptables, links, dirs) in ${RW_BASELINE}"
  tmp="${RW_BASELINE}.tmp"
  rm -rf "$tmp"; mkdir -p "$tmp"
  for k in "${RW_SYSCTLS[@]}"; do
    if v=$(sysctl -n "$k" 2>/dev/null); then printf '%s=%s\n' "$k" "$v"; fi
  done >"$tmp/sysctl.conf"
  rw_iptables_dump >"$tmp/iptables.txt"
  rw_links >"$tmp/links.txt"
  for d in "${RW_HOST_DIRS[@]}"; do if [[ -e "$d" ]]; then echo "$d"; fi; done >"$tmp/dirs.txt"
  date +%s >"$tmp/.active"
  rm -rf "${RW_BASELINE}"; mv "$tmp" "${RW_BASELINE}"
fi

# ------------------------------------------------------------------ PKI
CA_CRT="${RW_PKI}/ca.crt"; CA_KEY="${RW_PKI}/ca.key"
pki_ca() {
  if [[ -s "$CA_CRT" && -s "$CA_KEY" ]]; then return 0; fi
  rw_log "generating CA"
  openssl genrsa -out "$CA_KEY.tmp" 2048 2>/dev/null
  openssl req -x509 -new -nodes -key "$CA_KEY.tmp" -sha256 -days 3650 \
    -subj "/CN=resourcewatch-e2e-ca" -out "$CA_CRT.tmp" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
  mv "$CA_KEY.tmp" "$CA_KEY"; mv "$CA_CRT.tmp" "$CA_CRT"
}
pki_ca
APISERVER_SANS="IP:127.0.0.1,IP:${RW_SERVICE_IP},IP:${HOST_IP},DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:${NODE_NAME}"
rw_pki_cert apiserver "/CN=kube-apiserver" server "${APISERVER_SANS}"
rw_pki_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" client
rw_pki_cert admin "/O=system:masters/CN=kubernetes-admin" client
rw_pki_cert controller-manager "/CN=system:kube-controller-manager" client
rw_pki_cert scheduler "/CN=system:kube-scheduler" client
rw_pki_cert kube-proxy "/CN=system:kube-proxy" client
rw_pki_cert kubelet-client "/O=system:nodes/CN=system:node:${NODE_NAME}" client
rw_pki_cert kubelet-serving "/CN=${NODE_NAME}" server "IP:127.0.0.1,IP:${HOST_IP},DNS:localhost,DNS:${NODE_NAME}"
if [[ ! -s "${RW_PKI}/sa.key" || ! -s "${RW_PKI}/sa.pub" ]]; then
  rw_log "generating service-account key pair"
  openssl genrsa -out "${RW_PKI}/sa.key.tmp" 2048 2>/dev/null
  openssl rsa -in "${RW_PKI}/sa.key.tmp" -pubout -out "${RW_PKI}/sa.pub" 2>/dev/null
  mv "${RW_PKI}/sa.key.tmp" "${RW_PKI}/sa.key"
fi
chmod 600 "${RW_PKI}"/*.key

rw_write_kubeconfig "${RW_ADMIN_KUBECONFIG}" admin
rw_write_kubeconfig "${RW_CONF}/controller-manager.kubeconfig" controller-manager
rw_write_kubeconfig "${RW_CONF}/scheduler.kubeconfig" scheduler
rw_write_kubeconfig "${RW_CONF}/kube-proxy.kubeconfig" kube-proxy
rw_write_kubeconfig "${RW_CONF}/kubelet.kubeconfig" kubelet-client

# ------------------------------------------------------------------ daemon helpers
# daemon_pid NAME BINARY: prints the PID if the daemon from our PID file runs that binary.
daemon_pid() {
  local f="${RW_PIDS}/$1.pid" pid exe
  [[ -s "$f" ]] || return 1
  pid=$(<"$f")
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [[ "$exe" == "$2" || "$exe" == "$2 (deleted)" ]] || return 1
  echo "$pid"
}
port_free_or_ours() { # PORT NAME BINARY
  local port=$1
  if ss -ltnH "sport = :$port" 2>/dev/null | grep -q .; then
    daemon_pid "$2" "$3" >/dev/null && return 0
    rw_die "port $port (needed by $2) is in use by another process: $(ss -ltnpH "sport = :$port" | head -n1)"
  fi
}
# start_daemon NAME BINARY ARGS...: runs it under setsid, PID file and log in the state dir.
start_daemon() {
  local name=$1 bin=$2; shift 2
  local pidf="${RW_PIDS}/$name.pid" log="${RW_LOGS}/$name.log" pid
  if pid=$(daemon_pid "$name" "$bin"); then
    rw_log "$name already running (pid $pid)"
    return 0
  fi
  rm -f "$pidf"
  printf '\n===== %s starting %s %s\n' "$(date -Is)" "$bin" "$*" >>"$log"
  # 8>&-: the daemon must not inherit (and so hold) the up.sh lock.
  # shellcheck disable=SC2016  # $$ and $@ expand in the child shell
  setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidf" "$bin" "$@" >>"$log" 2>&1 </dev/null 8>&- &
  for _ in $(seq 50); do [[ -s "$pidf" ]] && break; sleep 0.1; done
  [[ -s "$pidf" ]] || rw_die "$name did not start (log: $log)"
  rw_log "started $name (pid $(<"$pidf"), log $log)"
}
# wait_for NAME TIMEOUT_S COMMAND...: polls COMMAND; dies with the daemon's log tail on timeout
# or when the daemon exits.
wait_for() {
  local name=$1 timeout=$2; shift 2
  local deadline=$(( $(date +%s) + timeout ))
  while ! "$@" >/dev/null 2>&1; do
    if [[ -f "${RW_PIDS}/$name.pid" ]] && ! kill -0 "$(<"${RW_PIDS}/$name.pid")" 2>/dev/null; then
      tail -n 30 "${RW_LOGS}/$name.log" >&2 || true
      rw_die "$name exited (log: ${RW_LOGS}/$name.log)"
    fi
    if (( $(date +%s) >= deadline )); then
      tail -n 30 "${RW_LOGS}/$name.log" >&2 || true
      rw_die "timed out after ${timeout}s waiting for $name: $* (log: ${RW_LOGS}/$name.log)"
    fi
    sleep 0.5
  done
}
CURL_ADMIN=(curl -fsS --max-time 5 --cacert "$CA_CRT" --cert "${RW_PKI}/admin.crt" --key "${RW_PKI}/admin.key")
http_ok() { curl -fsS --max-time 3 -o /dev/null "$1"; }
https_ok() { curl -ksfS --max-time 3 -o /dev/null "$1"; }
K() { "$KUBECTL" --kubeconfig "${RW_ADMIN_KUBECONFIG}" --request-timeout=10s "$@"; }

ETCD_BIN="${RW_BIN}/etcd"
CONTAINERD_BIN="${RW_BIN}/containerd"

# ------------------------------------------------------------------ etcd
port_free_or_ours "${RW_ETCD_CLIENT_PORT}" etcd "$ETCD_BIN"
port_free_or_ours "${RW_ETCD_PEER_PORT}" etcd "$ETCD_BIN"
mkdir -p "${RW_ETCD_DATA}"; chmod 700 "${RW_ETCD_DATA}"
start_daemon etcd "$ETCD_BIN" \
  --name=resourcewatch-e2e --data-dir="${RW_ETCD_DATA}" \
  --listen-client-urls="http://127.0.0.1:${RW_ETCD_CLIENT_PORT}" \
  --advertise-client-urls="http://127.0.0.1:${RW_ETCD_CLIENT_PORT}" \
  --listen-peer-urls="http://127.0.0.1:${RW_ETCD_PEER_PORT}" \
  --initial-advertise-peer-urls="http://127.0.0.1:${RW_ETCD_PEER_PORT}" \
  --initial-cluster="resourcewatch-e2e=http://127.0.0.1:${RW_ETCD_PEER_PORT}" \
  --snapshot-count=10000 --quota-backend-bytes=2147483648 --log-level=warn
etcd_healthy() { curl -fsS --max-time 3 "http://127.0.0.1:${RW_ETCD_CLIENT_PORT}/health" | grep -q '"health":"true"'; }
wait_for etcd 60 etcd_healthy

# ------------------------------------------------------------------ kube-apiserver
port_free_or_ours "${RW_APISERVER_PORT}" kube-apiserver "${RW_BIN}/kube-apiserver"
start_daemon kube-apiserver "${RW_BIN}/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:${RW_ETCD_CLIENT_PORT}" \
  --bind-address=0.0.0.0 --secure-port="${RW_APISERVER_PORT}" \
  --advertise-address="${HOST_IP}" \
  --tls-cert-file="${RW_PKI}/apiserver.crt" --tls-private-key-file="${RW_PKI}/apiserver.key" \
  --client-ca-file="$CA_CRT" \
  --kubelet-client-certificate="${RW_PKI}/apiserver-kubelet-client.crt" \
  --kubelet-client-key="${RW_PKI}/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority="$CA_CRT" \
  --kubelet-preferred-address-types=InternalIP,Hostname \
  --service-account-key-file="${RW_PKI}/sa.pub" \
  --service-account-signing-key-file="${RW_PKI}/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --authorization-mode=Node,RBAC \
  --allow-privileged=true \
  --service-cluster-ip-range="${RW_SERVICE_CIDR}" \
  --service-node-port-range=30000-32767 \
  --enable-bootstrap-token-auth=false \
  --profiling=false --v=1
wait_for kube-apiserver 120 "${CURL_ADMIN[@]}" -o /dev/null "https://127.0.0.1:${RW_APISERVER_PORT}/readyz"
rw_log "kube-apiserver ready"

# ------------------------------------------------------------------ kube-controller-manager
start_daemon kube-controller-manager "${RW_BIN}/kube-controller-manager" \
  --kubeconfig="${RW_CONF}/controller-manager.kubeconfig" \
  --authentication-kubeconfig="${RW_CONF}/controller-manager.kubeconfig" \
  --authorization-kubeconfig="${RW_CONF}/controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=10257 \
  --cluster-signing-cert-file="$CA_CRT" --cluster-signing-key-file="$CA_KEY" \
  --root-ca-file="$CA_CRT" \
  --service-account-private-key-file="${RW_PKI}/sa.key" \
  --use-service-account-credentials=true \
  --controllers='*,-nodeipam' --allocate-node-cidrs=false \
  --service-cluster-ip-range="${RW_SERVICE_CIDR}" \
  --leader-elect=false --profiling=false --v=1
wait_for kube-controller-manager 60 https_ok https://127.0.0.1:10257/healthz

if [[ $APISERVER_ONLY -eq 0 ]]; then
  # ---------------------------------------------------------------- kube-scheduler
  start_daemon kube-scheduler "${RW_BIN}/kube-scheduler" \
    --kubeconfig="${RW_CONF}/scheduler.kubeconfig" \
    --authentication-kubeconfig="${RW_CONF}/scheduler.kubeconfig" \
    --authorization-kubeconfig="${RW_CONF}/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10259 \
    --leader-elect=false --profiling=false --v=1
  wait_for kube-scheduler 60 https_ok https://127.0.0.1:10259/healthz

  # ---------------------------------------------------------------- host settings
  # The originals are in ${RW_BASELINE}/sysctl.conf; down.sh restores them.
  sysctl -qw net.ipv4.ip_forward=1
  if [[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]]; then
    sysctl -qw net.bridge.bridge-nf-call-iptables=1
  else
    modprobe br_netfilter 2>/dev/null || true
    if [[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]]; then
      sysctl -qw net.bridge.bridge-nf-call-iptables=1
    else
      rw_log "warning: br_netfilter not available; Service traffic between pods on the bridge may not work"
    fi
  fi

  # ---------------------------------------------------------------- CNI config
  mkdir -p "${RW_CNI_CONF_DIR}" "${RW_DATA}/cni-ipam"
  [[ -x "${RW_CNI_BIN_DIR}/bridge" && -x "${RW_CNI_BIN_DIR}/host-local" && -x "${RW_CNI_BIN_DIR}/portmap" \
     && -x "${RW_CNI_BIN_DIR}/loopback" ]] || rw_die "CNI plugins missing in ${RW_CNI_BIN_DIR}"
  # containerd's CRI sets up lo itself with the loopback plugin from bin_dir.
  rw_cni_conflist "${RW_POD_CIDR}" "${RW_DATA}/cni-ipam" | rw_write_if_changed "${RW_CNI_CONF_DIR}/10-resourcewatch.conflist"

  # ---------------------------------------------------------------- containerd
  mkdir -p "${RW_CONTAINERD_ROOT}" "${RW_CONTAINERD_STATE}" "${RW_DATA}/containerd-opt"
  # containerd 2's config schema (version 3): the CRI plugin is split into its images and
  # runtime parts.
  rw_containerd_toml "${RW_CONTAINERD_ROOT}" "${RW_CONTAINERD_STATE}" "${RW_CONTAINERD_SOCK}" \
    "${RW_DATA}/containerd-opt" "${RW_RUN}/runc" "${RW_CNI_CONF_DIR}" | rw_write_if_changed "${RW_CONF}/containerd.toml"
  start_daemon containerd "$CONTAINERD_BIN" --config "${RW_CONF}/containerd.toml"
  wait_for containerd 60 rw_ctr version

  # ---------------------------------------------------------------- pause image
  if ! rw_ctr -n k8s.io images ls -q 2>/dev/null | grep -qxF "${RW_PAUSE_IMAGE}"; then
    mkdir -p "${RW_DATA}/images"
    "${HERE}/image.sh" "${RW_PAUSE_IMAGE}" "${RW_DATA}/images/pause.tar" "${RW_BIN}/pause"
    rw_ctr -n k8s.io images import "${RW_DATA}/images/pause.tar" >/dev/null \
      || rw_die "ctr images import of the pause image failed"
    rw_ctr -n k8s.io images label "${RW_PAUSE_IMAGE}" io.cri-containerd.pinned=pinned >/dev/null 2>&1 || true
    rw_log "imported ${RW_PAUSE_IMAGE}"
  fi

  # ---------------------------------------------------------------- kubelet
  for p in 10250 10248; do port_free_or_ours $p kubelet "${RW_BIN}/kubelet"; done
  rw_kubelet_yaml "${RW_PKI}/kubelet-serving" "${RW_CONTAINERD_SOCK}" "${FAIL_CGROUP_V1}" | rw_write_if_changed "${RW_CONF}/kubelet.yaml"
  # The kubelet's CRI socket must exist before it starts.
  start_daemon kubelet "${RW_BIN}/kubelet" \
    --config="${RW_CONF}/kubelet.yaml" \
    --kubeconfig="${RW_CONF}/kubelet.kubeconfig" \
    --hostname-override="${NODE_NAME}" --node-ip="${HOST_IP}" \
    --root-dir="${RW_KUBELET_ROOT}" \
    --v=1
  wait_for kubelet 120 http_ok http://127.0.0.1:10248/healthz

  # ---------------------------------------------------------------- kube-proxy
  for p in 10256 10249; do port_free_or_ours $p kube-proxy "${RW_BIN}/kube-proxy"; done
  rw_kube_proxy_yaml "${RW_CONF}/kube-proxy.kubeconfig" "${RW_POD_CIDR}" "${NODE_NAME}" | rw_write_if_changed "${RW_CONF}/kube-proxy.yaml"
  start_daemon kube-proxy "${RW_BIN}/kube-proxy" --config="${RW_CONF}/kube-proxy.yaml" --v=1
  wait_for kube-proxy 60 http_ok http://127.0.0.1:10256/healthz

  # ---------------------------------------------------------------- node + lease
  lease_fresh() {
    local t
    t=$(K -n kube-node-lease get lease "${NODE_NAME}" -o 'jsonpath={.spec.renewTime}' 2>/dev/null) || return 1
    [[ -n "$t" ]] || return 1
    (( $(date -d "$t" +%s) >= KUBELET_STARTED ))
  }
  node_ready() {
    [[ "$(K get node "${NODE_NAME}" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
  }
  # The lease must be renewed by the kubelet now running: after a restart the old Node
  # object still says Ready. Its PID file was written when it started.
  KUBELET_STARTED=$(stat -c %Y "${RW_PIDS}/kubelet.pid")
  wait_for kubelet 120 lease_fresh
  wait_for kubelet 120 node_ready
  rw_log "node ${NODE_NAME} registered, Ready, lease renewed"
fi

# ------------------------------------------------------------------ default ServiceAccount
sa_ready() { K -n default get serviceaccount default >/dev/null 2>&1; }
wait_for kube-controller-manager 120 sa_ready

# ------------------------------------------------------------------ smoke
if [[ $SMOKE -eq 1 ]]; then
  rw_log "smoke: running a pause pod"
  K -n default delete pod rw-smoke --ignore-not-found --wait=true >/dev/null
  K -n default apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: rw-smoke
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: pause
    image: ${RW_PAUSE_IMAGE}
    imagePullPolicy: Never
EOF
  deadline=$(( $(date +%s) + 120 ))
  until [[ "$(K -n default get pod rw-smoke -o 'jsonpath={.status.phase}' 2>/dev/null)" == Running ]]; do
    if (( $(date +%s) >= deadline )); then
      K -n default describe pod rw-smoke >&2 || true
      rw_die "smoke: pod rw-smoke not Running after 120s (logs: ${RW_LOGS})"
    fi
    sleep 0.5
  done
  K -n default get pod rw-smoke -o wide >&2
  K -n default delete pod rw-smoke --wait=true >/dev/null
  rw_log "smoke: pod ran and was deleted"
fi

rw_log "cluster up in $(( $(date +%s) - T_START ))s$([[ $APISERVER_ONLY -eq 1 ]] && echo ' (apiserver only)')"
# stdout carries only these lines, so `eval "$(e2e/cluster/up.sh)"` works.
echo "export PATH=${RW_BIN}:\$PATH"
echo "export KUBECONFIG=${RW_ADMIN_KUBECONFIG}"
