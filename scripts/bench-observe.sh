#!/usr/bin/env bash
# Observe mode on a node with 110 pods and 1,000 volumes (tmpfs emptyDirs
# mounted the way the kubelet mounts them), in a private mount namespace:
# idle CPU of the observing agent, its RSS, and how long a finding takes to
# show after it appears (a pod deleted with its mounts left).
#
#   scripts/bench-observe.sh [path/to/volmgr] [idle seconds]
#
# Needs root (unshare -m). Leaves nothing behind: the mounts go with the
# namespace, the scratch directory is removed.
set -euo pipefail
BIN=${1:-target/debug/volmgr}
IDLE=${2:-30}
BIN=$(realpath "$BIN")
if [[ "${IN_NS:-}" != 1 ]]; then
  exec unshare -m --propagation private env IN_NS=1 "$0" "$BIN" "$IDLE"
fi
DIR=$(mktemp -d /tmp/bench-observe.XXXXXX)
cleanup() {
  kill "${PID:-0}" 2>/dev/null || true
  wait 2>/dev/null || true
  awk -v r="$DIR/root/" 'index($5, r) == 1 {print $5}' /proc/self/mountinfo | sort -r | xargs -r -n 50 umount
  rm -rf "$DIR"
}
trap cleanup EXIT
ROOT=$DIR/root; MAN=$DIR/manifests; STATE=$DIR/state
mkdir -p "$ROOT/pods" "$MAN"
n=0
for p in $(seq -w 0 109); do
  uid="bench-pod-$p"; vols=9; [[ $((10#$p)) -lt 10 ]] && vols=10
  mounts=""; volumes=""
  for v in $(seq 1 $vols); do
    d="$ROOT/pods/$uid/volumes/kubernetes.io~empty-dir/v$v"
    mkdir -p "$d"; mount -t tmpfs -o size=1m tmpfs "$d"; n=$((n+1))
    mounts+="{name: v$v, mountPath: /m/v$v}, "
    volumes+="  - {name: v$v, emptyDir: {medium: Memory}}"$'\n'
  done
  printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: p%s, namespace: bench, uid: "%s"}\nspec:\n  containers: [{name: c, image: i, volumeMounts: [%s]}]\n  volumes:\n%s' \
    "$p" "$uid" "${mounts%, }" "$volumes" > "$MAN/$uid.yaml"
done
echo "pods: 110, volumes: $n"
"$BIN" agent --observe --root "$ROOT" --state-dir "$STATE" --manifests "$MAN" \
  --node-name bench 2>"$DIR/agent.log" &
PID=$!
until "$BIN" doctor --state-dir "$STATE" --json >/dev/null 2>&1 || [[ $? == 1 ]]; do sleep 0.1; done
sleep 3
ticks() { awk '{print $14+$15}' "/proc/$PID/stat"; }
t0=$(ticks); s0=$(date +%s.%N)
sleep "$IDLE"
t1=$(ticks); s1=$(date +%s.%N)
hz=$(getconf CLK_TCK)
echo "idle CPU: $(echo "scale=3; ($t1-$t0)*100/$hz/($s1-$s0)" | bc) % of a core over ${IDLE}s"
echo "RSS: $(awk '/VmRSS/{print $2, $3}' "/proc/$PID/status")"
start=$(date +%s%N)
rm "$MAN/bench-pod-050.yaml"
found() { { "$BIN" doctor --state-dir "$STATE" --json 2>/dev/null || true; } | grep -q '"mounted_for_deleted_pod"'; }
until found; do sleep 0.01; done
end=$(date +%s%N)
echo "finding after a pod deleted with its mounts left: $(( (end-start)/1000000 )) ms"
