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
cargo build -q -p volmgr-ffi -p volmgr-csi-driver
out=$(mktemp -d /tmp/volmgr-c.XXXXXX)
# Detach the loop devices the test driver attached to its images, even when
# a check failed, then remove everything.
cleanup() {
  for img in "$out"/csi-state/images/*; do
    [ -e "$img" ] || continue
    losetup -j "$img" | cut -d: -f1 | xargs -r -n1 losetup -d || true
  done
  rm -rf "$out"
}
trap cleanup EXIT
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
for prog in flow csi_flow; do
  gcc -std=c11 -Wall -Wextra -Werror -g -O1 -fsanitize=address -fno-omit-frame-pointer \
    -Iinclude -Itests/c "tests/c/$prog.c" target/debug/libvolmgr.a $libs -o "$out/$prog"
done
mkdir -p "$out/root" "$out/host"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=99 \
  unshare --mount --propagation private -- "$out/flow" "$out/root" "$out/host"
# CSI through the C ABI: the test driver registers through the plugin
# registry, as node-driver-registrar would.
mkdir -p "$out/csi-root" "$out/csi-state"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=99 \
  unshare --mount --propagation private -- "$out/csi_flow" "$out/csi-root" \
  "$PWD/target/debug/volmgr-csi-driver" "$out/csi-state"
