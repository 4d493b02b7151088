#!/usr/bin/env bash
# Can this machine's node be moved from its hybrid cgroup v1 layout to the unified (v2)
# hierarchy at run time? Prints the evidence and the verdict; exit 0 if it can, 1 if not.
#
# A controller can join the v2 hierarchy only once its v1 hierarchy is destroyed, and the
# kernel destroys a v1 hierarchy only when nothing references it any more (no mount, no
# open file in it, no child cgroup). The probe takes the least used v1 hierarchy (one
# cgroup, nothing attached: freezer here), tries to unmount it, then detaches it lazily
# and looks whether the hierarchy is gone and the controller has appeared in
# /sys/fs/cgroup/unified/cgroup.controllers. It remounts the hierarchy where it was
# before it exits, whatever happens (the machine is left as it was).
#
# Usage: e2e/cluster/cgroup-v2-probe.sh [CONTROLLER]   (root; default freezer)
set -euo pipefail
[[ $(id -u) -eq 0 ]] || { echo "cgroup-v2-probe: must run as root" >&2; exit 2; }
C=${1:-freezer}
FS=$(stat -f -c %T /sys/fs/cgroup)
if [[ "$FS" == cgroup2fs ]]; then
  echo "cgroup v2 (unified) already: /sys/fs/cgroup is cgroup2; controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
  exit 0
fi
M="/sys/fs/cgroup/$C"
mountpoint -q "$M" || { echo "cgroup-v2-probe: $M is not a mount point" >&2; exit 2; }
hier() { awk -v c="$C" '$1 == c { print $2 " " $3 }' /proc/cgroups; }
read -r ID N <<<"$(hier)"
echo "layout: /sys/fs/cgroup is $FS; v1 hierarchies: $(awk '$2 > 0 {print $1}' /proc/cgroups | tr '\n' ' ')"
echo "v2 controllers now: $(cat /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null || echo none)"
echo "$C: v1 hierarchy $ID with $N cgroup(s)"
remount() {
  mountpoint -q "$M" || mount -t cgroup -o "$C" cgroup "$M" || echo "cgroup-v2-probe: could not remount $M" >&2
}
trap remount EXIT
if umount "$M" 2>/tmp/cgroup-v2-probe.err; then
  echo "umount $M: done"
else
  echo "umount $M: $(sed 's/^umount: //' /tmp/cgroup-v2-probe.err) (an open file holds it, in a process root cannot inspect: most likely PID 1)"
  umount -l "$M"
  echo "umount -l $M: detached"
fi
# The kernel releases a hierarchy asynchronously (RCU, a work item): wait up to 10 s.
for _ in $(seq 20); do
  read -r ID2 _ <<<"$(hier)"
  [[ "$ID2" == 0 ]] && break
  sleep 0.5
done
V2=$(cat /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null || true)
remount
trap - EXIT
if [[ "$ID2" != 0 ]] || ! grep -qw "$C" <<<"$V2"; then
  echo "after detaching: $C still bound to v1 hierarchy $ID2; v2 controllers: ${V2:-none}"
  echo "verdict: NO. The v1 hierarchy outlives its last mount, so $C (and memory, which also holds"
  echo "cgroups of the VM's own process manager) cannot move to cgroup v2 without a reboot with"
  echo "systemd.unified_cgroup_hierarchy=1 or cgroup_no_v1=all on the kernel command line."
  exit 1
fi
echo "after detaching: $C moved to the v2 hierarchy (remounted on v1 again)"
echo "verdict: yes, hierarchies with no cgroups can be moved"
exit 0
