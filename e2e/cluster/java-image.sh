#!/usr/bin/env bash
# The e2e's Java image: this machine's OpenJDK 17 runtime (the few files `java` needs to run
# a class: the launcher, libjvm.so with its symbol table, the module image, their
# libraries) and the stack fixtures Burn and Leak, compiled here. No JDK tools: the agent
# asks the JVM for its perf map itself.
# Usage: e2e/cluster/java-image.sh NAME:TAG OUT.tar
set -euo pipefail
die() { echo "java-image.sh: ERROR: $*" >&2; exit 1; }
[[ $# -eq 2 ]] || die "usage: $0 NAME:TAG OUT.tar"
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
javac=$(command -v javac) || die "no javac (make deps installs openjdk-17-jdk-headless)"
jdk=$(dirname "$(dirname "$(readlink -f "$javac")")")
[[ -x $jdk/bin/java && -f $jdk/lib/server/libjvm.so ]] || die "no java runtime under $jdk"
classes=$(mktemp -d)
trap 'rm -rf "$classes"' EXIT
fx="$root/node-agent/tests/fixtures/stacks"
"$javac" -d "$classes" "$fx/Burn.java" "$fx/Leak.java"
adds=()
for f in lib/libjli.so lib/jvm.cfg lib/modules lib/libjava.so lib/libjimage.so lib/libzip.so \
         lib/libnio.so lib/libnet.so lib/tzdb.dat lib/server/libjvm.so lib/server/classes.jsa \
         conf/security/java.security; do
  [[ -e $jdk/$f ]] || continue
  adds+=(--add "$(readlink -f "$jdk/$f"):$jdk/$f")
done
for l in $( (ldd "$jdk/lib/server/libjvm.so"; ldd "$jdk/lib/libjli.so") | grep -oE '/[^ ]+' | sort -u); do
  adds+=(--add "$(readlink -f "$l"):$l")
done
for c in "$classes"/*.class; do adds+=(--add "$c:/$(basename "$c")"); done
exec "$here/image.sh" --with-libs --path "$jdk/bin/java" "${adds[@]}" "$1" "$2" "$jdk/bin/java"
