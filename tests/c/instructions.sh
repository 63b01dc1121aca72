#!/usr/bin/env bash
# User-space instructions per volume through the C ABI (tests/c/instructions.c)
# under callgrind: start-up, and per pod (one emptyDir{medium: Memory}) from
# volmgr_pod_upsert to its directory gone, as the slope between two storms.
# Debug build by default (`--release` for a release one); real mounts in a
# private mount namespace. Needs root and valgrind (scripts/bootstrap.sh).
# Valgrind 3.19 warns of "unhandled amd64-linux syscall: 437" (openat2) and
# fails it with ENOSYS: libvolmgr then walks paths with openat, as on a
# kernel before 5.6, and the figures are of that path.
# BENCHMARKS.md, "Yardsticks: instructions per volume".
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" -eq 0 ] || { echo "instructions: needs root (it mounts)"; exit 1; }
profile=debug
flag=()
if [ "${1:-}" = "--release" ]; then profile=release; flag=(--release); fi
cargo build -q "${flag[@]}" -p volmgr-ffi
libs=$(cargo rustc -q "${flag[@]}" -p volmgr-ffi --lib --crate-type staticlib -- --print native-static-libs 2>&1 \
  | sed -n 's/.*native-static-libs: //p' | tail -n 1)
target=${CARGO_TARGET_DIR:-target}
out=$(mktemp -d /tmp/volmgr-instructions.XXXXXX)
trap 'rm -rf "$out"' EXIT
gcc -std=c11 -O2 -g -Iinclude tests/c/instructions.c "$target/$profile/libvolmgr.a" $libs -o "$out/instructions"
mkdir -p "$out/root"
echo "machine: nproc=$(nproc) kernel=$(uname -r) build=$(git rev-parse --short HEAD) $profile $(date -u +%F)"
unshare --mount --propagation private -- \
  valgrind --tool=callgrind --quiet --callgrind-out-file="$out/cg.out" "$out/instructions" "$out/root" \
  >"$out/stdout"
ir() { sed -n 's/^summary: //p; s/^totals: //p' "$1" | head -n 1; }
read -r small large < <(sed -n 's/^SMALL=\([0-9]*\) LARGE=\([0-9]*\)$/\1 \2/p' "$out/stdout")
echo "start-up: $(ir "$out/cg.out.1") instructions"
# volmgr's functions by inclusive instructions, name -> count.
incl() {
  callgrind_annotate --inclusive=yes --threshold=100 --auto=no "$1" \
    | sed -nE 's#^ *([0-9,]+) \([^)]*\) +.*\.rs:((volmgr|volmgr_ffi)[a-z_]*::[^ ]*).*#\2 \1#p' \
    | { grep -v '{{closure}}' || true; } | tr -d ,
}
incl "$out/cg.out.2" >"$out/incl.small"
incl "$out/cg.out.3" >"$out/incl.large"
awk -v s="$(ir "$out/cg.out.2")" -v l="$(ir "$out/cg.out.3")" -v ns="$small" -v nl="$large" '
  FNR == NR { if (!($1 in a)) a[$1] = $2; next }
  !($1 in b) { b[$1] = $2 }
  END {
    printf "per volume (slope, storms of %d and %d pods): %.1f thousand instructions\n", ns, nl, (l - s) / (nl - ns) / 1e3
    print "top functions of volmgr by inclusive instructions per volume (thousands):"
    for (f in b) printf "%10.1f  %s\n", (b[f] - a[f]) / (nl - ns) / 1e3, f | "sort -rn | head -n 15"
  }' "$out/incl.small" "$out/incl.large"
