#!/usr/bin/env bash
# The e2e's Python image: CPython 3.12 or newer (pyenv's, where the machine has one)
# at /usr/local/bin/python3, Debian bookworm's own CPython 3.11 at /usr/bin/python3.11
# (whose frames the agent reads from the interpreter, with no flag), and the stack fixtures.
# Usage: e2e/cluster/python-image.sh NAME:TAG OUT.tar
set -euo pipefail
die() { echo "python-image.sh: ERROR: $*" >&2; exit 1; }
[[ $# -eq 2 ]] || die "usage: $0 NAME:TAG OUT.tar"
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
pyenv="${PYENV_ROOT:-${HOME:-/root}/.pyenv}"
py=""
for v in "$pyenv"/versions/3.12.* "$pyenv"/versions/3.13.*; do
  [[ -x "$v/bin/python3.12" ]] && { py="$v/bin/python3.12"; break; }
  [[ -x "$v/bin/python3.13" ]] && { py="$v/bin/python3.13"; break; }
done
[[ -n "$py" ]] || die "no CPython 3.12+ under $pyenv/versions (the e2e's Python leak and profile need one)"
minor=$(basename "$py" | sed 's/^python//')
lib="$(dirname "$(dirname "$py")")/lib/python$minor"
fx="$root/node-agent/tests/fixtures/stacks"
# Debian's 3.11: the binary (libpython linked in), its libraries, and the modules `-S`
# start-up imports, at the paths its prefix (/usr) looks for them.
deb=/usr/bin/python3.11
[[ -x $deb ]] || die "no $deb (make deps installs python3.11)"
debian=(--add "$deb:$deb")
for l in $(ldd "$deb" | grep -oE '/[^ ]+'); do debian+=(--add "$(readlink -f "$l"):$l"); done
for m in os.py encodings/__init__.py encodings/aliases.py encodings/utf_8.py; do
  debian+=(--add "/usr/lib/python3.11/$m:/usr/lib/python3.11/$m")
done
exec "$here/image.sh" --with-libs --path /usr/local/bin/python3 "${debian[@]}" \
  --add "$lib/os.py:/usr/local/lib/python$minor/os.py" \
  --add "$lib/encodings/__init__.py:/usr/local/lib/python$minor/encodings/__init__.py" \
  --add "$lib/encodings/aliases.py:/usr/local/lib/python$minor/encodings/aliases.py" \
  --add "$lib/encodings/utf_8.py:/usr/local/lib/python$minor/encodings/utf_8.py" \
  --add "$fx/leak.py:/leak.py" --add "$fx/burn.py:/burn.py" \
  "$1" "$2" "$py"
