#!/usr/bin/env bash
# The krew archive (a static kubectl-resourcewatch, its README and the LICENSE krew asks
# every archive to carry) and its
# manifest with the archive's sha256: target/krew/. URI_BASE says where the archive will
# be hosted (default: a file:// URI of target/krew, which `kubectl krew install
# --manifest=target/krew/resourcewatch.yaml` accepts for a local install).
set -euo pipefail
cd "$(dirname "$0")/../.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
out=target/krew
mkdir -p "$out/stage"
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --target x86_64-unknown-linux-gnu \
  -p kubectl-resourcewatch
cp "target/x86_64-unknown-linux-gnu/release/kubectl-resourcewatch" "$out/stage/"
cp kubectl-plugin/README.md LICENSE "$out/stage/"
archive="$out/kubectl-resourcewatch-v$version-linux-amd64.tar.gz"
tar -C "$out/stage" --owner=0 --group=0 --mtime=@0 -czf "$archive" kubectl-resourcewatch README.md LICENSE
sha=$(sha256sum "$archive" | cut -d' ' -f1)
base="${URI_BASE:-file://$(cd "$out" && pwd)}"
sed -e "s|@VERSION@|$version|g" -e "s|@SHA256@|$sha|" -e "s|@URI_BASE@|$base|" \
  kubectl-plugin/krew/resourcewatch.yaml.in >"$out/resourcewatch.yaml"
# The manifest must name this archive and its digest, and nothing may be left unfilled.
! grep -q '@[A-Z0-9_]*@' "$out/resourcewatch.yaml" || { echo "unfilled manifest" >&2; exit 1; }
grep -q "sha256: $sha" "$out/resourcewatch.yaml"
tar -tzf "$archive" | grep -qx kubectl-resourcewatch
tar -tzf "$archive" | grep -qx LICENSE
echo "wrote $archive ($sha) and $out/resourcewatch.yaml"
