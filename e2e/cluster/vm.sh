#!/usr/bin/env bash
# A second kernel for the agent's privileged tests: Debian's Linux 6.1 (the LTS kernel of
# Amazon Linux 2023 and Debian 12 nodes) booted with cgroup v2 only, in QEMU's software
# emulation (TCG: KVM does not work on these VMs, see README.md), running a command of
# this machine inside it.
#
#   e2e/cluster/vm.sh fetch                 kernel package and QEMU, cached
#   e2e/cluster/vm.sh run [--timeout S] -- CMD [ARGS...]
#
# Environment: RW_VM_TAP=IFNAME gives the VM a virtio NIC on that (existing) tap device;
# RW_VM_XDIR=DIR is the exchange directory (kept afterwards; default: a fresh one, removed);
# RW_VM_MEMORY (MiB), RW_VM_CPUS; RW_VM_APPEND: more kernel arguments (a debug run: "loglevel=7").
#
# `run` boots the VM with this machine's root shared read-only over 9p, mounts proc, sys,
# devtmpfs, cgroup2, tracefs, debugfs and bpffs over it, tmpfs on /tmp, /run and the
# workspace's target/tmp, and runs CMD chrooted there as root, in the directory `run` was
# called from, with RW_* variables passed on. CMD's output is this script's; its exit
# status is this script's (124 on timeout, 125 when the VM did not run it).
set -euo pipefail
# shellcheck source=e2e/cluster/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# The kernel, pinned here only: a version the archive no longer serves fails `fetch`,
# naming it (move the pin to the newest linux-image-6.1.0-*-amd64 apt-cache lists).
RW_VM_KERNEL_PACKAGE="${RW_VM_KERNEL_PACKAGE:-linux-image-6.1.0-56-amd64}"
RW_VM_KERNEL_VERSION="${RW_VM_KERNEL_VERSION:-6.1.192-2}"
RW_VM_CACHE="${RW_VM_CACHE:-/var/cache/resourcewatch/vm/${RW_VM_KERNEL_PACKAGE}_${RW_VM_KERNEL_VERSION}}"
RW_VM_MEMORY="${RW_VM_MEMORY:-4096}"
RW_VM_CPUS="${RW_VM_CPUS:-2}"
KREL="${RW_VM_KERNEL_PACKAGE#linux-image-}"
# What mounting the host's root over 9p needs, in load order (the package's own modules:
# Debian builds virtio and 9p as modules).
MODULES=(
  drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_pci_modern_dev
  drivers/virtio/virtio_pci_legacy_dev drivers/virtio/virtio_pci fs/netfs/netfs
  fs/fscache/fscache net/9p/9pnet net/9p/9pnet_virtio fs/9p/9p
)

die() { echo "vm.sh: $*" >&2; exit 125; }

fetch() {
  # One fetch at a time (e2e/prebuild.sh may run one beside the vm-kernel step's).
  mkdir -p "$(dirname "$RW_VM_CACHE")"
  exec 8>"$(dirname "$RW_VM_CACHE")/.fetch.lock"
  flock 8
  local need=()
  command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
  command -v cpio >/dev/null || need+=(cpio)
  # depmod for the kernel package's modules here, modprobe for the guest (it runs this
  # machine's /sbin/modprobe over 9p): Debian's kmod, absent from a minimal install.
  [[ -x /sbin/depmod && -x /sbin/modprobe ]] || need+=(kmod)
  # A static busybox (Debian's busybox-static): the initramfs has no libraries.
  if [[ ! -x /bin/busybox ]] || ldd /bin/busybox >/dev/null 2>&1; then need+=(busybox-static); fi
  if ((${#need[@]})); then
    echo "vm.sh: installing ${need[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }
  fi
  initramfs="$RW_VM_CACHE/initramfs-$(cat "$HERE/vm-init.sh" "$HERE/vm.sh" | sha256sum | cut -c1-12).cpio.gz"
  [[ -f "$initramfs" ]] && return 0
  mkdir -p "$RW_VM_CACHE"
  local tmp m
  tmp="$(mktemp -d)"
  if [[ ! -f "$RW_VM_CACHE/vmlinuz" || ! -d "$RW_VM_CACHE/mods" || ! -d "$RW_VM_CACHE/modules" ]]; then
    if ! (cd "$tmp" && apt-get download -qq "${RW_VM_KERNEL_PACKAGE}=${RW_VM_KERNEL_VERSION}" 2>/dev/null) \
      && ! (apt-get update -qq && cd "$tmp" && apt-get download -qq "${RW_VM_KERNEL_PACKAGE}=${RW_VM_KERNEL_VERSION}"); then
      rm -rf "$tmp"
      echo "vm.sh: the archive does not serve ${RW_VM_KERNEL_PACKAGE}=${RW_VM_KERNEL_VERSION};" \
        "pin one it lists (apt-cache policy 'linux-image-6.1.0-*-amd64') in e2e/cluster/vm.sh" >&2
      exit 1
    fi
    dpkg-deb -x "$tmp"/*.deb "$tmp/x"
    rm -rf "$RW_VM_CACHE/mods"
    mkdir -p "$RW_VM_CACHE/mods.new"
    for m in "${MODULES[@]}"; do
      cp "$tmp/x/lib/modules/$KREL/kernel/$m.ko" "$RW_VM_CACHE/mods.new/" || die "$m.ko is not in $RW_VM_KERNEL_PACKAGE"
    done
    cp "$tmp/x/boot/vmlinuz-$KREL" "$RW_VM_CACHE/vmlinuz"
    # Every module of the package with its modules.dep (the package leaves depmod to its
    # postinst), for what a node loads on demand: virtio_net, bridge, veth, overlay,
    # br_netfilter, nf_tables and the xt matches kube-proxy's rules use.
    rm -rf "$RW_VM_CACHE/modules.new"
    mkdir -p "$RW_VM_CACHE/modules.new/lib/modules"
    mv "$tmp/x/lib/modules/$KREL" "$RW_VM_CACHE/modules.new/lib/modules/"
    /sbin/depmod -b "$RW_VM_CACHE/modules.new" "$KREL" || die "depmod failed on $RW_VM_KERNEL_PACKAGE's modules"
    rm -rf "$RW_VM_CACHE/modules"
    mv "$RW_VM_CACHE/modules.new" "$RW_VM_CACHE/modules"
    mv "$RW_VM_CACHE/mods.new" "$RW_VM_CACHE/mods"
  fi
  # The initramfs (rebuilt when this script or /init changes): busybox, the 9p modules
  # in load order, and /init.
  local root="$tmp/initramfs"
  mkdir -p "$root"/{bin,proc,sys,dev,host,mods}
  cp /bin/busybox "$root/bin/busybox"
  for m in "${MODULES[@]}"; do
    cp "$RW_VM_CACHE/mods/$(basename "$m").ko" "$root/mods/"
    basename "$m" >>"$root/mods/order"
  done
  install -m 0755 "$HERE/vm-init.sh" "$root/init"
  rm -f "$RW_VM_CACHE"/initramfs*.cpio.gz
  (cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$initramfs.new"
  mv "$initramfs.new" "$initramfs"
  rm -rf "$tmp"
}

run() {
  local timeout=1800
  while (($#)); do
    case "$1" in
      --timeout) timeout="$2"; shift 2 ;;
      --) shift; break ;;
      *) die "unknown option $1" ;;
    esac
  done
  (($#)) || die "run: no command"
  fetch
  # The exchange directory (the command, its exit status), shared read-write; everything
  # else of this machine is seen read-only.
  if [[ -n "${RW_VM_XDIR:-}" ]]; then
    xdir="$RW_VM_XDIR"
    mkdir -p "$xdir"
    rm -f "$xdir/exit"
  else
    xdir="$(mktemp -d /var/cache/resourcewatch/vm/run.XXXXXX)"
    trap 'rm -rf "${xdir:-}"' EXIT
  fi
  local net=()
  if [[ -n "${RW_VM_TAP:-}" ]]; then
    net=(-netdev "tap,id=net0,ifname=$RW_VM_TAP,script=no,downscript=no"
         -device "virtio-net-pci,netdev=net0,mac=${RW_VM_MAC:-52:54:00:72:77:01}")
  fi
  {
    echo "cd $(printf '%q' "$PWD")"
    echo "export PATH=$(printf '%q' "$PATH") HOME=/root"
    local v
    for v in $(compgen -e | grep -E '^(RW_|RUST_|CARGO_TARGET_DIR$)' || true); do
      echo "export $v=$(printf '%q' "${!v}")"
    done
    printf '%q ' "$@"
    echo
  } >"$xdir/cmd.sh"
  # Writable places a test may need beyond /tmp: the workspace's target/tmp (cargo's
  # CARGO_TARGET_TMPDIR, compiled into the test binaries).
  local target
  target="$(realpath -m "${CARGO_TARGET_DIR:-target}")"
  echo "$target/tmp" >"$xdir/tmpfs"
  # What must stay visible through the VM's tmpfs on /tmp and /run: this directory and
  # the target directory, when they are under them (a clone in /tmp, as CI may make).
  printf '%s\n' "$PWD" "$target" >"$xdir/keep"
  local rc=0
  timeout --foreground -k 10 "$timeout" qemu-system-x86_64 \
    -machine q35 -cpu max -m "$RW_VM_MEMORY" -smp "$RW_VM_CPUS" \
    -nographic -no-reboot -nodefaults -serial stdio -display none \
    -kernel "$RW_VM_CACHE/vmlinuz" -initrd "$initramfs" \
    -append "console=ttyS0 quiet loglevel=3 cgroup_no_v1=all panic=-1 rw_x=$xdir rw_mods=$RW_VM_CACHE/modules ${RW_VM_APPEND:-}" \
    "${net[@]}" \
    -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap \
    -virtfs "local,path=$xdir,mount_tag=x,security_model=none" \
    </dev/null || rc=$?
  if ((rc == 124)); then
    echo "vm.sh: the VM did not finish within ${timeout}s" >&2
    return 124
  fi
  [[ -f "$xdir/exit" ]] || die "the VM exited ($rc) without running the command"
  return "$(cat "$xdir/exit")"
}

case "${1:-}" in
  fetch) fetch ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 fetch | run [--timeout S] -- CMD [ARGS...]" >&2; exit 2 ;;
esac
