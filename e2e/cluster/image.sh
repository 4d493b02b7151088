#!/usr/bin/env bash
# Build a one-layer image tarball in docker-archive ("docker save") format from one
# static binary, without docker: manifest.json, repositories, <config>.json and
# <layer>/layer.tar. The result imports with `ctr -n k8s.io images import OUT.tar`.
#
# Usage: e2e/cluster/image.sh [--path /IN/IMAGE/PATH] [--with-libs] [--add SRC:DEST]... NAME:TAG OUT.tar BINARY [ENTRYPOINT [ARGS...]]
#   --path      where the binary goes in the image (default: /<basename of BINARY>)
#   --with-libs copy the shared libraries BINARY needs (ldd) to the same paths in the image
#   --add       copy the file SRC to DEST in the image (repeatable; executables stay executable)
#   ENTRYPOINT defaults to the binary's path in the image; any further words are its args.
# Example: e2e/cluster/image.sh localhost/resourcewatch/pause:3.2 /tmp/pause.tar ./pause
set -euo pipefail

die() { echo "image.sh: ERROR: $*" >&2; exit 1; }
usage() { sed -n '2,9p' "$0" >&2; exit 2; }

IN_PATH=""
WITH_LIBS=0
ADDS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --with-libs) WITH_LIBS=1; shift ;;
    --add) [[ $# -ge 2 && "$2" == *:/* ]] || die "--add needs SRC:/DEST"; ADDS+=("$2"); shift 2 ;;
    --path) [[ $# -ge 2 ]] || usage; IN_PATH="$2"; shift 2 ;;
    --path=*) IN_PATH="${1#--path=}"; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) die "unknown option $1" ;;
    *) break ;;
  esac
done
[[ $# -ge 3 ]] || usage
REF="$1"; OUT="$2"; BIN="$3"; shift 3
[[ -f "$BIN" ]] || die "binary not found: $BIN"
[[ "$REF" == *:* && "${REF##*:}" != */* ]] || die "image name must be NAME:TAG, got '$REF'"
[[ -n "$IN_PATH" ]] || IN_PATH="/$(basename "$BIN")"
[[ "$IN_PATH" == /* ]] || die "--path must be absolute, got '$IN_PATH'"
if [[ $# -eq 0 ]]; then set -- "$IN_PATH"; fi

if [[ $WITH_LIBS == 0 ]] && command -v file >/dev/null 2>&1 && file -L "$BIN" | grep -q 'dynamically linked'; then
  echo "image.sh: warning: $BIN is dynamically linked; the image has no libc" >&2
fi

PY=python3
[[ -x /usr/bin/python3 ]] && PY=/usr/bin/python3

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"
mkdir -p "$root$(dirname "$IN_PATH")" "$root"/{dev,proc,sys,etc,tmp,var/run}
chmod 1777 "$root/tmp"
install -m 0755 "$BIN" "$root$IN_PATH"
if [[ $WITH_LIBS == 1 ]]; then
  # "libx.so => /path (addr)" and "/lib64/ld-linux-x86-64.so.2 (addr)": every absolute path.
  libs=$(ldd "$BIN" | grep -oE '/[^ ]+' ) || die "ldd $BIN failed"
  for lib in $libs; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
fi
for a in "${ADDS[@]}"; do
  src="${a%%:/*}"; dest="/${a#*:/}"
  [[ -f "$src" ]] || die "--add: no file $src"
  mkdir -p "$root$(dirname "$dest")"
  # An executable stays one (a second program beside the entrypoint).
  if [[ -x "$src" ]]; then install -m 0755 "$src" "$root$dest"; else install -m 0644 "$src" "$root$dest"; fi
done

# Reproducible layer: sorted, fixed owner and time, names without a leading "./".
layer="$work/layer.tar"
( cd "$root" && tar --sort=name --mtime='@0' --owner=0 --group=0 --numeric-owner \
    --format=posix --pax-option='exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime' \
    -cf "$layer" -- * ) || die "tar failed"
diff_id=$(sha256sum "$layer" | cut -d' ' -f1)

out="$work/out"
mkdir -p "$out/$diff_id"
mv "$layer" "$out/$diff_id/layer.tar"
echo "1.0" >"$out/$diff_id/VERSION"

"$PY" - "$out" "$REF" "$diff_id" "$@" <<'PYEOF'
import hashlib, json, os, sys
out, ref, diff_id, entry = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
created = "1970-01-01T00:00:00Z"
config = {
    "architecture": "amd64",
    "os": "linux",
    "created": created,
    "config": {
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "Entrypoint": entry,
        "WorkingDir": "/",
    },
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff_id]},
    "history": [{"created": created, "created_by": "e2e/cluster/image.sh"}],
}
blob = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
cfg_digest = hashlib.sha256(blob).hexdigest()
with open(os.path.join(out, cfg_digest + ".json"), "wb") as f:
    f.write(blob)
with open(os.path.join(out, diff_id, "json"), "w") as f:
    json.dump({"id": diff_id, "created": created, "os": "linux", "architecture": "amd64",
               "config": config["config"]}, f)
name, tag = ref.rsplit(":", 1)
with open(os.path.join(out, "manifest.json"), "w") as f:
    json.dump([{"Config": cfg_digest + ".json", "RepoTags": [ref],
                "Layers": [diff_id + "/layer.tar"]}], f)
with open(os.path.join(out, "repositories"), "w") as f:
    json.dump({name: {tag: diff_id}}, f)
PYEOF

mkdir -p "$(dirname "$OUT")"
( cd "$out" && tar --sort=name --mtime='@0' --owner=0 --group=0 --numeric-owner \
    -cf "$work/image.tar" -- * ) || die "tar failed"
mv -f "$work/image.tar" "$OUT"
echo "image.sh: wrote $OUT ($REF, entrypoint: $*)" >&2
