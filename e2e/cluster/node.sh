# shellcheck shell=bash
# The node's configuration files, one function each, printed to stdout: the host node
# (up.sh) and the VM node (vm-node-init.sh, inside the VM) write them from here, so the two
# nodes differ only in the arguments. Sourced after env.sh.

# rw_cni_conflist SUBNET IPAM_DIR
rw_cni_conflist() {
  local subnet=$1 ipam=$2
  cat <<EOF
{
  "cniVersion": "0.4.0",
  "name": "resourcewatch-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "${RW_CNI_BRIDGE}",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "${subnet}"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "${ipam}"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

# rw_containerd_toml ROOT STATE SOCKET OPT_DIR RUNC_ROOT CNI_CONF_DIR
rw_containerd_toml() {
  local root=$1 state=$2 sock=$3 opt=$4 runc_root=$5 cni_conf=$6
  cat <<EOF
version = 3
root = "${root}"
state = "${state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = "${sock}"
[ttrpc]
  address = "${sock}.ttrpc"
[debug]
  address = ""
  level = "info"
[metrics]
  address = ""

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = "${opt}"
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "${RW_PAUSE_IMAGE}"
  [plugins.'io.containerd.cri.v1.runtime']
    # No CAP_SYS_RESOURCE here: oom_score_adj values below the runtime's own are clamped.
    restrict_oom_score_adj = true
    disable_apparmor = true
    enable_selinux = false
    max_container_log_line_size = 16384
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = "${runc_root}"
          BinaryName = "${RW_BIN}/runc"
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["${RW_CNI_BIN_DIR}"]
      conf_dir = "${cni_conf}"
      max_conf_num = 1
EOF
}

# rw_kubelet_yaml SERVING_CERT_PREFIX CONTAINERD_SOCKET FAIL_CGROUP_V1
rw_kubelet_yaml() {
  local serving=$1 sock=$2 fail_v1=$3
  cat <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 0.0.0.0
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: ${RW_PKI}/ca.crt
authorization:
  mode: Webhook
tlsCertFile: ${serving}.crt
tlsPrivateKeyFile: ${serving}.key
cgroupDriver: cgroupfs
cgroupsPerQOS: true
failSwapOn: false
oomScoreAdj: 0
protectKernelDefaults: false
makeIPTablesUtilChains: true
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "50Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
evictionPressureTransitionPeriod: 10s
serializeImagePulls: false
maxPods: 110
containerLogMaxSize: 10Mi
containerLogMaxFiles: 2
runtimeRequestTimeout: 5m
containerRuntimeEndpoint: unix://${sock}
imageServiceEndpoint: unix://${sock}
# On a v1 (hybrid) host the kubelet must be told to run: it refuses v1 by default since 1.35.
failCgroupV1: ${fail_v1}
EOF
}

# rw_kube_proxy_yaml KUBECONFIG CLUSTER_CIDR NODE_NAME
rw_kube_proxy_yaml() {
  local kubeconfig=$1 cidr=$2 node=$3
  cat <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: ${kubeconfig}
mode: iptables
clusterCIDR: ${cidr}
hostnameOverride: ${node}
bindAddress: 0.0.0.0
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  # 0: leave the host's conntrack sysctls alone
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
}
