#!/usr/bin/env bash
# The agent's privileged tests on a second kernel: the test binaries built here (for this
# machine's 6.18 with cgroup v1) run unchanged inside a QEMU/TCG VM on Debian's Linux 6.1
# with cgroup v2 only (e2e/cluster/vm.sh). A skip is a failure there too.
#
#   e2e/run-vm-kernel-tests.sh [--all] [BINARY[:FILTER]...]
#
# Default: the CI subset (make test), one test of each pipeline; --all: every kernel,
# stacks and agent unit test (about an hour under TCG). BINARY is kernel, stacks or lib.
# Each boot ends after RW_VM_TIMEOUT seconds (480 for the subset, 3600 with --all).
set -euo pipefail
cd "$(dirname "$0")/.."
for d in /usr/local/go/bin "$HOME/.cargo/bin"; do
  [[ -d $d && ":$PATH:" != *":$d:"* ]] && export PATH="$d:$PATH"
done

# One test per pipeline (each a few seconds natively; TCG costs ~17x on CPU-bound code):
# the CPU sketch (sched_switch), the memory sketch and its sample stream (rss_stat),
# rss_stat changes made by another task, exact tracking of a v2 cgroup's processes, a
# short process named by its exit record, a path seen from inside a cgroup namespace (the
# agent's own, under containerd), a late target and one targeted mid-interval (its first
# rate), the leak detector on real samples, time-to-OOM against a real memory.max kill
# (and the kill itself, seen through the kprobe 6.1 has; a sudden one; the node's memory
# running out, which only this VM may do), allocation uprobes on libc, growth sites and a
# profile named through unwind tables (C), the CPython walk, and a JVM's perf map (asked
# of the JVM by the agent).
CI_SUBSET=(
  kernel:this_machine_has_what_the_pipelines_need
  kernel:cpu_sketch_ranks_duty_cycles_and_matches_proc
  kernel:memory_sketch_follows_a_growing_process_and_streams_samples
  kernel:rss_changes_made_by_another_task_are_counted
  kernel:exact_targets_cover_every_process_of_a_cgroup
  kernel:a_short_heavy_process_gone_before_its_frame_is_named
  kernel:a_cgroup_path_seen_from_inside_a_cgroup_namespace_resolves_to_the_hierarchys
  kernel:a_running_process_targeted_late_has_its_rss_at_once_and_keeps_its_counters
  kernel:a_process_targeted_mid_interval_reads_its_rate_in_its_first_frame
  kernel:time_to_oom_predicts_the_real_kill
  kernel:a_sudden_allocation_is_killed_and_seen_with_no_prediction
  kernel:a_system_wide_oom_kill_is_seen_as_the_nodes
  kernel:allocation_mode_counts_outstanding_bytes
  stacks:a_c_profile_without_frame_pointers_reaches_main
  stacks:a_c_growth_site_without_frame_pointers_reaches_main
  stacks:growth_sites_beside_a_buffer_given_back_name_the_leak
  stacks:a_python_profile_names_the_python_functions_from_the_interpreter_frames
  stacks:a_java_profile_with_a_perf_map_names_the_java_method
)

selected=()
if [[ ${1:-} == --all ]]; then
  selected=(lib kernel stacks)
elif (($#)); then
  selected=("$@")
else
  selected=("${CI_SUBSET[@]}")
fi

# The test binaries, as cargo built them for `make unit`.
declare -A bins
while IFS=$'\t' read -r kind path; do
  bins[$kind]=$path
done < <(cargo test -p resourcewatch-agent --lib --test kernel --test stacks --no-run \
  --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        kind = m["target"]["kind"][0]
        name = "lib" if kind == "lib" else m["target"]["name"]
        print(name + "\t" + m["executable"])
')
for k in lib kernel stacks; do
  [[ -n ${bins[$k]:-} ]] || { echo "run-vm-kernel-tests: no $k test binary built" >&2; exit 1; }
done

export RW_REQUIRE_PRIVILEGED_TESTS=1
start=$(date +%s)
# Tests that leave the VM's kernel in a state no later test should inherit get a boot of
# their own, after the others: the system-wide OOM kill runs the guest out of memory. And
# the allocation uprobes test, which follows the OOM-kill tests in a boot (libtest runs
# them by name), twice hung a guest CPU in the kernel until the boot's timeout (a soft
# lockup in a task named after that test, 28 and 29 November 2026, both times after the memcg
# OOM kill of a_sudden_allocation...; not reproduced since: the pair passed 21 times, in 6
# boots and 15 times in one boot beside a Kubernetes build): it gets a boot of its own
# too, until the hang is understood.
ALONE=(a_system_wide_oom_kill_is_seen_as_the_nodes allocation_mode_counts_outstanding_bytes)
# A soft lockup ends the boot at once with the kernel's backtrace (loglevel 5 prints it;
# the default 3 printed only its first line) instead of holding it to the timeout; its
# threshold raised to 60 s (watchdog_thresh=30), since emulation runs kernel code ~17x
# slower. The VM exiting without an exit status fails the run (vm.sh).
export RW_VM_APPEND="${RW_VM_APPEND:-loglevel=5 softlockup_panic=1 watchdog_thresh=30}"
alone() { local t; for t in "${ALONE[@]}"; do [[ $1 == "$t" ]] && return 0; done; return 1; }
# Grouped by binary: one boot per binary, its tests named exactly; each ALONE test a
# boot of its own, last.
declare -A filters
order=()
last=()
for s in "${selected[@]}"; do
  b=${s%%:*}
  [[ -n ${bins[$b]:-} ]] || { echo "run-vm-kernel-tests: unknown binary $b" >&2; exit 2; }
  group=$b
  if [[ $s == *:* ]] && alone "${s#*:}"; then
    group="$b/${s#*:}"
    last+=("$group")
    filters[$group]=""
  else
    [[ -v filters[$b] ]] || { order+=("$b"); filters[$b]=""; }
  fi
  [[ $s == *:* ]] && filters[$group]+=" ${s#*:}"
done
order+=("${last[@]}")
# A test that hangs the guest ends with the VM's timeout (CI's whole run has 90 minutes):
# a boot of the subset takes 30-150 s (the slowest seen: 146 s, a CI clone right after its
# cold build), so 480 s is over three times that; a hang cost a cold CI run 900 s before
# (28 November 2026). The OOM-kill tests bound their own wait and say what the child was
# doing (kernel.rs, wait_oom_killed).
timeout_s=${RW_VM_TIMEOUT:-$([[ ${1:-} == --all ]] && echo 3600 || echo 480)}
failed=0
for g in "${order[@]}"; do
  b=${g%%/*}
  # shellcheck disable=SC2086
  args=(--test-threads=1)
  # Named tests run even when ignored on the host (the system-wide OOM fills the
  # machine's memory: it runs only here).
  [[ -n ${filters[$g]} ]] && args+=(--include-ignored --exact ${filters[$g]})
  echo "== $b on Linux 6.1, cgroup v2 (QEMU TCG): ${filters[$g]:-all}"
  t0=$(date +%s)
  if ! e2e/cluster/vm.sh run --timeout "$timeout_s" -- "${bins[$b]}" "${args[@]}"; then
    failed=1
  fi
  echo "== $b: $(( $(date +%s) - t0 )) s"
done
echo "== VM kernel tests: $(( $(date +%s) - start )) s"
exit "$failed"
