#!/bin/busybox sh
# /init of the test VM's initramfs (vm.sh): mounts this machine's root read-only over 9p,
# the kernel's filesystems and tmpfs over it, runs the command vm.sh wrote, records its
# exit status, and powers off. Never drops to a shell: any failure ends the VM.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
fail() { echo "vm-init: $*"; poweroff -f; }
x=$(sed -n 's/.* rw_x=\([^ ]*\).*/\1/p' /proc/cmdline)
for m in $(cat /mods/order); do
  insmod "/mods/$m.ko" || fail "insmod $m"
done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro host /host || fail "mount host"
h=/host
mount -t proc proc $h/proc
mount -t sysfs sys $h/sys
mount -t devtmpfs dev $h/dev
mkdir -p /dev/pts 2>/dev/null; mount -t devpts devpts $h/dev/pts 2>/dev/null
mount -t cgroup2 cgroup2 $h/sys/fs/cgroup || fail "mount cgroup2"
mount -t tracefs tracefs $h/sys/kernel/tracing
mount -t debugfs debugfs $h/sys/kernel/debug
mount -t bpf bpf $h/sys/fs/bpf
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 x "$h$x" || fail "mount x"
# Directories under /tmp or /run that the command needs (its working and target
# directories) are held by a bind mount here, then put back over the tmpfs.
i=0
for d in $(cat "$h$x/keep"); do
  case "$d" in /tmp/*|/run/*) mkdir -p /keep/$i && mount --bind "$h$d" /keep/$i && echo "$i $d" >> /keep/list ;; esac
  i=$((i + 1))
done
mount -t tmpfs tmp $h/tmp
mount -t tmpfs run $h/run
mount -t tmpfs shm $h/dev/shm 2>/dev/null
[ -f /keep/list ] && while read -r i d; do
  mkdir -p "$h$d" && mount --bind /keep/$i "$h$d" || fail "keep $d"
done < /keep/list
for d in $(cat "$h$x/tmpfs"); do
  [ -d "$h$d" ] && mount -t tmpfs tmp "$h$d"
done
# Every controller for the tests' own cgroups (the root's cgroup.subtree_control).
for c in $(cat $h/sys/fs/cgroup/cgroup.controllers); do
  echo "+$c" > $h/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
done
hostname rw-vm
echo "vm-init: Linux $(uname -r), $(nproc) CPUs, cgroup2 controllers: $(cat $h/sys/fs/cgroup/cgroup.controllers)"
# The kernel package's whole module tree (vm.sh fetch), for the kernel's own requests
# (overlay, nf_tables, the xt matches of kube-proxy's rules) and the command's modprobe:
# `modprobe -d` that tree (this machine may have no /lib/modules to mount over).
mods=$(sed -n 's/.* rw_mods=\([^ ]*\).*/\1/p' /proc/cmdline)
if [ -n "$mods" ] && [ -d "$h$mods/lib/modules" ]; then
  printf '#!/bin/sh\nexec /sbin/modprobe -d %s "$@"\n' "$mods" > $h/run/rw-modprobe
  chmod 755 $h/run/rw-modprobe
  echo /run/rw-modprobe > /proc/sys/kernel/modprobe
fi
# This machine's root becomes the root (as switch_root does), and this process, which
# shares its root with the kernel's helpers, is chrooted there: a container's pivot_root
# then leaves a mount namespace whose root is the container's, so `runc exec` (kubectl
# exec) enters the container's file system, and the kernel's modprobe helper finds the
# script above.
cd $h
mount --move . / || fail "move the root"
exec chroot . /bin/sh -c 'sh "$1"; echo $? > "$2"; sync; echo o > /proc/sysrq-trigger; sleep 10' vm-init "$x/cmd.sh" "$x/exit"
