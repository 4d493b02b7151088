# shellcheck shell=bash
# Sourced by run-api-tests.sh and run-cluster-tests.sh: which cluster the e2e tests may touch.
#
# By default, the harness cluster this repository starts (e2e/cluster/up.sh) and nothing
# else: a KUBECONFIG exported in the caller's shell (a workstation's, a stale one) is
# ignored, because these tests install a CRD, create namespaces and pods and, with
# remediation on, evict pods.
#
# Testing another cluster is an explicit opt-in:
#   RW_E2E_KUBECONFIG=/path/to/kubeconfig make e2e
# and a context whose context, cluster, user or server name looks like production
# (prod, production, prd, live as a word) is refused unless
#   RW_E2E_ALLOW_PRODUCTION=yes-really
# is set too.
#
# Sets RW_E2E_EXTERNAL=1 and exports KUBECONFIG for an opted-in cluster; RW_E2E_EXTERNAL=0
# otherwise (the caller starts the harness and sources e2e/cluster/env.sh, which points
# KUBECONFIG at the harness's admin kubeconfig).

rw_target_cluster() {
  if [[ -n "${KUBECONFIG:-}" && -z "${RW_E2E_KUBECONFIG:-}" ]]; then
    echo "note: ignoring KUBECONFIG=$KUBECONFIG: the e2e tests use the harness cluster;" \
      "set RW_E2E_KUBECONFIG to test another cluster" >&2
  fi
  unset KUBECONFIG
  RW_E2E_EXTERNAL=0
  [[ -n "${RW_E2E_KUBECONFIG:-}" ]] || return 0

  [[ -r "$RW_E2E_KUBECONFIG" ]] || { echo "RW_E2E_KUBECONFIG=$RW_E2E_KUBECONFIG: not a readable file" >&2; return 1; }
  local kubectl="${KUBECTL:-kubectl}" ctx names
  command -v "$kubectl" >/dev/null 2>&1 || kubectl=$(source "$(dirname "${BASH_SOURCE[0]}")/cluster/env.sh" && echo "$KUBECTL")
  ctx=$(KUBECONFIG=$RW_E2E_KUBECONFIG "$kubectl" config current-context 2>/dev/null) ||
    { echo "RW_E2E_KUBECONFIG=$RW_E2E_KUBECONFIG: no current context" >&2; return 1; }
  names="$ctx $(KUBECONFIG=$RW_E2E_KUBECONFIG "$kubectl" config view --minify \
    -o 'jsonpath={.contexts[0].context.cluster} {.contexts[0].context.user} {.clusters[0].cluster.server}' 2>/dev/null)"
  if rw_looks_like_production "$names" && [[ "${RW_E2E_ALLOW_PRODUCTION:-}" != yes-really ]]; then
    echo "refusing to run the e2e tests against context '$ctx' ($names): it looks like production;" \
      "they create namespaces and evict pods. RW_E2E_ALLOW_PRODUCTION=yes-really overrides." >&2
    return 1
  fi
  echo "e2e: using the cluster of RW_E2E_KUBECONFIG, context '$ctx'" >&2
  export KUBECONFIG="$RW_E2E_KUBECONFIG"
  RW_E2E_EXTERNAL=1
}

# True when one of the words (context, cluster, user, server URL) has prod, production, prd
# or live as a component: "prod", "eu-prod-1", "gke_acme_prd_x", "https://api.live.example".
rw_looks_like_production() {
  local lower
  lower=$(tr '[:upper:]' '[:lower:]' <<<"$1")
  [[ $lower =~ (^|[^a-z0-9])(prod|production|prd|live)([^a-z0-9]|$) ]]
}
