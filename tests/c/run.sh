#!/usr/bin/env bash
# Builds the C consumers (tests/c/flow.c, tests/c/csi_flow.c,
# tests/c/restart.c) against
# include/volmgr.h and libvolmgr.a with -Wall -Wextra -Werror and
# AddressSanitizer (+ LeakSanitizer, which also sees Rust's allocations: they
# go through malloc), and runs them inside private mount namespaces: the
# flow as is, as on a 4.18 kernel (tests/c/older_kernel.c: the system calls
# added since fail with ENOSYS), and under valgrind (which fails openat2
# with ENOSYS too); the CSI flow with the in-repo test driver. Needs root
# (it mounts); prints why it skips otherwise.
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
# Runs a command in a private mount namespace where the host is read-only
# but /tmp (where everything of the test lives): a bug that binds / or /etc
# into the test's directory cannot cost the host its files.
isolated() {
  unshare --mount --propagation private -- \
    sh -c 'mount --bind /tmp /tmp && mount -o remount,bind,ro / && exec "$@"' isolated "$@"
}
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
for prog in flow csi_flow restart; do
  gcc -std=c11 -Wall -Wextra -Werror -g -O1 -fsanitize=address -fno-omit-frame-pointer \
    -Iinclude -Itests/c "tests/c/$prog.c" target/debug/libvolmgr.a $libs -o "$out/$prog"
done
# The same flow without AddressSanitizer, for valgrind.
gcc -std=c11 -Wall -Wextra -Werror -g -O1 -Iinclude -Itests/c tests/c/flow.c \
  target/debug/libvolmgr.a $libs -o "$out/flow-plain"
gcc -std=c11 -Wall -Wextra -Werror -O1 tests/c/older_kernel.c -o "$out/older_kernel"
mkdir -p "$out/root" "$out/host"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=99 \
  isolated "$out/flow" "$out/root" "$out/host"
# As on a 4.18 kernel (RHEL 8): openat2, listmount and the new mount API
# fail with ENOSYS; volmgr falls back and says so in status.
mkdir -p "$out/old-root" "$out/old-host"
VOLMGR_C_EXPECT_OPENAT_WALK=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=99 \
  isolated "$out/older_kernel" "$out/flow" "$out/old-root" "$out/old-host"
# The restart rule: a first process mounts and dies; the next one, with the
# defaults, tears nothing down before volmgr_sources_ready.
mkdir -p "$out/restart-root"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=99 \
  isolated "$out/restart" "$out/restart-root"
# Under valgrind (memcheck), which does not know openat2 either.
if command -v valgrind >/dev/null; then
  mkdir -p "$out/vg-root" "$out/vg-host"
  VOLMGR_C_EXPECT_OPENAT_WALK=1 isolated \
    valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
    --suppressions=tests/c/valgrind.supp \
    "$out/flow-plain" "$out/vg-root" "$out/vg-host"
else
  echo "SKIP c flow under valgrind: valgrind is not installed"
fi
# CSI through the C ABI: the test driver registers through the plugin
# registry, as node-driver-registrar would.
mkdir -p "$out/csi-root" "$out/csi-state"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=99 \
  isolated "$out/csi_flow" "$out/csi-root" \
  "$PWD/target/debug/volmgr-csi-driver" "$out/csi-state"
