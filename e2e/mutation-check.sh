#!/usr/bin/env bash
# Shows that a trust test can fail: applies one mutation to the operator's source (a fix
# reverted), rebuilds the operator, runs one test of e2e/tests/trust/ against the
# running apiserver-only harness (e2e/cluster/up.sh --apiserver-only), restores the file
# and prints the test's exit code and first failure. Expect rc=101 for every mutation.
#
#   e2e/mutation-check.sh NAME FILE OLD_TEXT NEW_TEXT TEST_FILTER
#
# The mutations that show the RemediationPolicy authority and the /metrics review are tested:
#   ledger      operator/shell/src/ledger.rs     'let problem = last.filter(|t| known.now - t < known.counts_for).map(|t| {'
#                                          'let problem = last.filter(|_| false).map(|t| {'           a_lost_or_unreadable
#   podselector operator/shell/src/controller/gather.rs 'granted_by: grants.covering(pod.labels()),'
#                                          'granted_by: grants.policies.first().map(|p| p.0.clone()),'  restarts_are_granted
#   evictright  operator/shell/src/controller/gather.rs '        operator_may_evict(ctx, ns).await\n' '        Ok(())\n' restarts_are_granted
#   metrics     operator/shell/src/main.rs       'Some(auth)' -> 'None'  metrics_are_served
set -uo pipefail
cd "$(dirname "$0")/.."
name=$1 file=$2 old=$3 new=$4 test=$5
python3 - "$file" "$old" "$new" <<'PY'
import sys
p,old,new=sys.argv[1:]
s=open(p).read()
assert s.count(old)==1, f"{old!r} found {s.count(old)} times"
open(p,'w').write(s.replace(old,new))
PY
[[ $? -eq 0 ]] || { echo "$name: the mutation did not apply; nothing run" >&2; exit 2; }
cargo build -q -p resourcewatch-operator || { git checkout -q -- "$file"; exit 2; }
source e2e/cluster/env.sh; export KUBECONFIG KUBECTL
timeout 300 cargo test -q -p resourcewatch-e2e --test trust -- --ignored --test-threads=1 "$test" > /tmp/mut-$name.log 2>&1
rc=$?
git checkout -q -- "$file"
echo "$name: test $test rc=$rc: $(grep -m1 -A1 panicked /tmp/mut-$name.log | tail -1 | cut -c1-200)"
