#!/usr/bin/env bash
# Per-call cost of the C ABI from C and from Go (cgo), in one run, next to a
# bare cgo call. Release build; real mounts in a private mount namespace.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" -eq 0 ] || { echo "bench: needs root (it mounts)"; exit 1; }
cargo build -q --release -p volmgr-ffi
libs=$(cargo rustc -q --release -p volmgr-ffi --lib --crate-type staticlib -- --print native-static-libs 2>&1 \
  | sed -n 's/.*native-static-libs: //p' | tail -n 1)
out=$(mktemp -d /tmp/volmgr-bench.XXXXXX)
trap 'rm -rf "$out"' EXIT
gcc -std=c11 -O2 -Iinclude tests/c/bench.c target/release/libvolmgr.a $libs -o "$out/bench"
mkdir -p "$out/root" "$out/host"
echo "machine: nproc=$(nproc) kernel=$(uname -r)"
unshare --mount --propagation private -- "$out/bench" "$out/root" "$out/host"
(cd ffi/go/volmgr && CGO_LDFLAGS="-L$PWD/../../../target/release -l:libvolmgr.a $libs" \
  go test -run '^$' -bench . -benchtime 20000x -count 5 .)
