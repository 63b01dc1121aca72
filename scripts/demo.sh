#!/usr/bin/env bash
# Runs `volmgr agent` on the manifests in examples/, with ROOT in a temporary
# directory, inside a private mount namespace: every mount the demo makes
# lives and dies with that namespace, the host's mount table is never touched.
# Prints the status once everything is mounted, then keeps running until
# Ctrl-C. With --once it stops after printing (CI uses that).
set -euo pipefail
cd "$(dirname "$0")/.."
once=0
[ "${1:-}" = "--once" ] && once=1

if [ "${VOLMGR_DEMO_IN_NS:-}" != 1 ]; then
  ./scripts/bootstrap.sh
  export PATH="$HOME/.cargo/bin:$PATH"
  # The one release build (static, shared with scripts/image.sh).
  bin=$(./scripts/release.sh)
  if [ "$(id -u)" -ne 0 ]; then
    echo "demo: needs root to create a private mount namespace (try: sudo $0)" >&2
    exit 1
  fi
  root=$(mktemp -d /tmp/volmgr-demo.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  VOLMGR_DEMO_IN_NS=1 VOLMGR_DEMO_ROOT="$root" VOLMGR_DEMO_ONCE="$once" VOLMGR_DEMO_BIN="$bin" \
    unshare --mount --propagation private -- "$0"
  exit $?
fi

bin=$VOLMGR_DEMO_BIN
root="$VOLMGR_DEMO_ROOT/root"
echo "demo: ROOT=$root (private mount namespace), manifests=examples/"
RUST_LOG=${RUST_LOG:-info} "$bin" agent --root "$root" --manifests examples \
  --metrics-addr 127.0.0.1:0 2>"$VOLMGR_DEMO_ROOT/agent.log" &
agent=$!
stop() { kill -TERM "$agent" 2>/dev/null || true; wait "$agent" 2>/dev/null || true; }
trap stop EXIT INT TERM
"$bin" wait --root "$root" --all --timeout 60
"$bin" status --root "$root"
echo
echo "mounts in the demo's namespace:"
grep " $root/" /proc/self/mountinfo | awk '{print "  " $5 "  " $(NF-2) "  " $NF}'
if [ "$VOLMGR_DEMO_ONCE" = 1 ]; then
  exit 0
fi
echo
echo "demo: agent running (log: $VOLMGR_DEMO_ROOT/agent.log). Edit examples/ in another shell"
echo "demo: and watch 'volmgr status'; Ctrl-C stops it (the namespace and its mounts go with it)."
wait "$agent"
