#!/usr/bin/env bash
# Builds tests/c/flow.c against include/volmgr.h and libvolmgr.a with
# -Wall -Wextra -Werror and AddressSanitizer (+ LeakSanitizer, which also
# sees Rust's allocations: they go through malloc), and runs it inside a
# private mount namespace. Valgrind 3.19 (Debian 12) cannot be used: it
# does not know openat2(2) and fails it with ENOSYS. Needs root (it
# mounts); prints why it skips otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP tests/c: needs root to create a private mount namespace"
  exit 0
fi
cargo build -q -p volmgr-ffi
out=$(mktemp -d /tmp/volmgr-c.XXXXXX)
trap 'rm -rf "$out"' EXIT
# The native libraries Rust's staticlib needs (`--print native-static-libs`).
libs=$(cargo rustc -q -p volmgr-ffi --lib --crate-type staticlib -- --print native-static-libs 2>&1 \
  | sed -n 's/.*native-static-libs: //p' | tail -n 1)
# The link line documented for users (ffi/go/volmgr/volmgr.go) must match.
documented=$(sed -n 's/.*-l:libvolmgr.a \(-l[^"]*\)".*/\1/p' ffi/go/volmgr/volmgr.go | head -n 1)
if [ "$documented" != "$libs" ]; then
  echo "FAIL: documented native libs '$documented' differ from rustc's '$libs' (update ffi/go/volmgr/volmgr.go)"
  echo "c flow: 0 passed, 1 failed"
  exit 1
fi
gcc -std=c11 -Wall -Wextra -Werror -g -O1 -fsanitize=address -fno-omit-frame-pointer \
  -Iinclude tests/c/flow.c target/debug/libvolmgr.a $libs -o "$out/flow"
mkdir -p "$out/root" "$out/host"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=99 \
  unshare --mount --propagation private -- "$out/flow" "$out/root" "$out/host"
