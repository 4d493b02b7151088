# shellcheck shell=bash
# Marks between the two lanes of `make test` (.ci/steps --beside): a lane records that it
# reached a point (rw_ci_mark NAME) and the other waits for it (rw_ci_wait NAME), so the
# steps that measure CPU (the cluster's burner pods and profiles, the VM node, the unit
# step's duty cycles) never run beside each other, and the steps beside the cluster fill
# its idle waits instead. Outside `make test` (RW_CI_SYNC unset) both are no-ops.
# A wait also ends when the other lane has finished (it writes `lane-a-done` or
# `lane-b-done` on exit), so a lane that stopped early never holds the other forever.
rw_ci_mark() {
  [[ -n ${RW_CI_SYNC:-} ]] || return 0
  mkdir -p "$RW_CI_SYNC" && touch "$RW_CI_SYNC/$1"
}
rw_ci_wait() {
  [[ -n ${RW_CI_SYNC:-} ]] || return 0
  local other=lane-b-done t=$SECONDS
  [[ ${RW_CI_LANE:-a} == b ]] && other=lane-a-done
  while [[ ! -e $RW_CI_SYNC/$1 && ! -e $RW_CI_SYNC/$other ]]; do sleep 2; done
  (( SECONDS - t < 2 )) || echo "== waited $((SECONDS - t)) s for the other lane's mark '$1'"
}
