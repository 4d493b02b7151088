#!/usr/bin/env bash
# Helm's own engine for this repository (see charts/helm.py): provides helm-python-sdk
# (Helm v4's Go SDK, hash-pinned from PyPI) in a virtualenv, cached, then runs helm.py.
#
#   charts/helm.sh template|lint|install|upgrade|uninstall ...   (charts/helm.sh -h)
#
# The virtualenv lives in /var/cache/resourcewatch/helm-sdk-venv (or target/helm-sdk-venv
# when that is not writable).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
CACHE=/var/cache/resourcewatch
mkdir -p "$CACHE" 2>/dev/null && [[ -w $CACHE ]] || CACHE="$REPO/target"
VENV="$CACHE/helm-sdk-venv"
PIN='helm-python-sdk==0.2.2 --hash=sha256:28cc13abaf134c3a7e37f070c939be8d9cdc9825c3c8b8b2d35161073bcd4578'
if [[ ! -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c 'import helm_python, yaml' 2>/dev/null; then
  echo "helm.sh: installing helm-python-sdk 0.2.2 (PyPI, hash-pinned) into $VENV" >&2
  req="$(mktemp)"
  trap 'rm -f "$req"' EXIT
  printf '%s\n' "$PIN" >"$req"
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q --require-hashes --only-binary :all: -r "$req" >&2
  "$VENV/bin/pip" install -q pyyaml==6.0.2 >&2
  "$VENV/bin/python" -c 'import helm_python, yaml' ||
    { echo "helm.sh: helm-python-sdk is not importable after installing it" >&2; exit 1; }
fi
exec "$VENV/bin/python" "$HERE/helm.py" "$@"
