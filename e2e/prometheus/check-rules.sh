#!/usr/bin/env bash
# promtool check + test of the alerting rules (config/prometheus/prometheusrule.yaml, the
# chart's render). Exits non-zero on any failure.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
BIN="$("$HERE/install.sh")"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
python3 -c 'import yaml' 2>/dev/null || python3 -m pip install -q pyyaml==6.0.2
python3 - "$REPO/config/prometheus/prometheusrule.yaml" "$TMP/rules.yaml" \
  "$REPO/charts/resourcewatch/files/prometheus-rules.yaml" <<'PY'
import sys, yaml
with open(sys.argv[1]) as f:
    rule = yaml.safe_load(f)
assert rule["kind"] == "PrometheusRule", rule["kind"]
with open(sys.argv[3]) as f:
    if yaml.safe_load(f) != rule["spec"]:
        sys.exit(f"{sys.argv[3]} differs from the spec of {sys.argv[1]}: run make generate")
with open(sys.argv[2], "w") as f:
    yaml.safe_dump({"groups": rule["spec"]["groups"]}, f, sort_keys=False)
PY
echo "ok: the chart's rules are config/prometheus's"
cp "$HERE/rules-test.yaml" "$TMP/"
"$BIN/promtool" check rules "$TMP/rules.yaml"
"$BIN/promtool" test rules "$TMP/rules-test.yaml"
