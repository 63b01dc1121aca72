#!/usr/bin/env bash
# Builds the container image volmgr:<version> (Containerfile: FROM scratch,
# the statically linked volmgr from scripts/release.sh) with podman, checks
# it is at most 30 MB, and smoke-tests it from its root file system: the
# image is exported (podman create + export: `podman run` is refused on
# machines that forbid its setrlimit) and run with chroot. The smoke runs
# `volmgr --version`, `volmgr agent --help`, and a short agent run on a
# tiny kubelet-like root inside the image's file system, in a private
# mount namespace (proc, sys and the root are mounted there only; the
# host's mount table is never touched). With observe mode in the binary
# (`agent --help` lists --observe) the run is `agent --observe` and the
# tiny root must come out byte-identical; before it, the manager agent.
# Needs root (chroot, unshare).
set -euo pipefail
cd "$(dirname "$0")/.."
max_bytes=$((30 * 1000 * 1000))

if [ "${VOLMGR_IMAGE_IN_NS:-}" = 1 ]; then
  # The smoke, in its own mount namespace (see the end of this file).
  rootfs=$VOLMGR_IMAGE_ROOTFS
  # A mount point as a container's root is (the tracer makes / private).
  mount --bind "$rootfs" "$rootfs"
  mount -t proc proc "$rootfs/proc"
  mount --rbind /sys "$rootfs/sys"
  # The device nodes a container runtime gives every container (the
  # static binary's getrandom reads /dev/urandom: no dlsym in it).
  mount -t tmpfs -o size=64k,mode=755 tmpfs "$rootfs/dev"
  for d in null zero full random urandom; do
    touch "$rootfs/dev/$d"
    mount --bind "/dev/$d" "$rootfs/dev/$d"
  done
  kubelet=$rootfs/var/lib/kubelet
  mount -t tmpfs -o size=16m tmpfs "$kubelet"
  # A pod directory left behind with a volume directory (an orphan for
  # observe mode), and a plugins directory as the kubelet has.
  mkdir -p "$kubelet/pods/0c0ffee0-0000-4000-8000-000000000001/volumes/kubernetes.io~empty-dir/cache" \
    "$kubelet/plugins/kubernetes.io/csi" "$kubelet/plugins_registry" "$rootfs/run/volmgr" \
    "$rootfs/etc/volmgr/manifests"
  chroot=$(command -v chroot)
  in_image() { env -i RUST_LOG=info "$chroot" "$rootfs" /usr/local/bin/volmgr "$@"; }
  # Everything but access times, and every file's content.
  tree() { (cd "$kubelet" && find . -printf '%M %U:%G %s %T@ %p -> %l\n' | sort && find . -type f -exec sha256sum {} + | sort); }
  if in_image agent --help | grep -q -- --observe; then
    mode=observe
    args=(--observe --root /var/lib/kubelet --state-dir /run/volmgr --stuck-after 2m --manifests /etc/volmgr/manifests)
  else
    mode=manager
    args=(--root /var/lib/kubelet --manifests /etc/volmgr/manifests)
  fi
  # The status socket: in the state directory in observe mode, else ROOT.
  status_args=(--root /var/lib/kubelet)
  [ "$mode" = observe ] && status_args=(--root /run/volmgr)
  before=$(tree)
  # Not through in_image: $! must be the agent (env and chroot exec it).
  env -i RUST_LOG=info "$chroot" "$rootfs" /usr/local/bin/volmgr agent "${args[@]}" \
    --node-name image-smoke 2>"$VOLMGR_IMAGE_WORK/agent.log" &
  agent=$!
  trap 'kill -TERM "$agent" 2>/dev/null || true; wait "$agent" 2>/dev/null || true' EXIT
  status=
  for _ in $(seq 1 120); do
    if ! kill -0 "$agent" 2>/dev/null; then
      cat "$VOLMGR_IMAGE_WORK/agent.log" >&2
      echo "image: the agent ($mode mode) exited early" >&2
      exit 1
    fi
    # Answering, and the tracer (the embedded eBPF object) settled.
    if status=$(in_image status "${status_args[@]}" 2>/dev/null) &&
      ! grep -q 'tracer is loading' <<<"$status"; then
      break
    fi
    status=
    sleep 0.5
  done
  if [ -z "$status" ]; then
    cat "$VOLMGR_IMAGE_WORK/agent.log" >&2
    echo "image: no status from the agent ($mode mode) within 60 s" >&2
    exit 1
  fi
  printf '%s\n' "$status" | sed 's/^/  /'
  if [ "$mode" = observe ] && in_image --help | grep -q '^ *doctor'; then
    # 0: nothing to report, 1: findings (the planted orphan), 2: no agent.
    rc=0
    in_image doctor --state-dir /run/volmgr >"$VOLMGR_IMAGE_WORK/doctor.txt" || rc=$?
    sed 's/^/  /' "$VOLMGR_IMAGE_WORK/doctor.txt"
    [ "$rc" -le 1 ] || { echo "image: volmgr doctor exited $rc" >&2; exit 1; }
  fi
  kill -TERM "$agent"
  rc=0
  wait "$agent" || rc=$?
  trap - EXIT
  if [ "$rc" -ne 0 ]; then
    cat "$VOLMGR_IMAGE_WORK/agent.log" >&2
    echo "image: the agent ($mode mode) exited $rc on SIGTERM" >&2
    exit 1
  fi
  if [ "$mode" = observe ] && [ "$before" != "$(tree)" ]; then
    diff <(printf '%s\n' "$before") <(tree) >&2 || true
    echo "image: observe mode changed the root" >&2
    exit 1
  fi
  echo "image: agent smoke ($mode mode) passed"
  exit 0
fi

./scripts/bootstrap.sh
export PATH="$HOME/.cargo/bin:$PATH"
if [ "$(id -u)" -ne 0 ]; then
  echo "image: needs root (podman, chroot, a private mount namespace; try: sudo $0)" >&2
  exit 1
fi
start=$(date +%s)
bin=$(./scripts/release.sh)
if readelf -lW "$bin" | grep -q 'program interpreter'; then
  echo "image: $bin is dynamically linked (scripts/release.sh should link it statically)" >&2
  exit 1
fi
version=$("$bin" --version | awk '{print $2}')
image="volmgr:$version"

work=$(mktemp -d /tmp/volmgr-image.XXXXXX)
cid=
cleanup() {
  [ -n "$cid" ] && podman rm -f "$cid" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/ctx/rootfs/tmp" "$work/rootfs"
chmod 1777 "$work/ctx/rootfs/tmp"
# The image's copy without debug line tables (the binary in target/ keeps them).
strip -o "$work/ctx/volmgr" "$bin"
podman build -q -f Containerfile --build-arg "VERSION=$version" -t "$image" "$work/ctx" >/dev/null
size=$(podman image inspect --format '{{.Size}}' "$image")
echo "image: $image, $((size / 1000)) kB (at most $((max_bytes / 1000)) kB)"
if [ "$size" -gt "$max_bytes" ]; then
  echo "image: $image is larger than $((max_bytes / 1000 / 1000)) MB" >&2
  exit 1
fi

# Its root file system, as a container would get it.
cid=$(podman create "$image")
podman export "$cid" | tar -x -C "$work/rootfs"
podman rm "$cid" >/dev/null
cid=
mkdir -p "$work/rootfs/proc" "$work/rootfs/sys" "$work/rootfs/dev" "$work/rootfs/var/lib/kubelet"
chroot=$(command -v chroot)
echo "image: $(env -i "$chroot" "$work/rootfs" /usr/local/bin/volmgr --version)"
env -i "$chroot" "$work/rootfs" /usr/local/bin/volmgr agent --help >/dev/null
VOLMGR_IMAGE_IN_NS=1 VOLMGR_IMAGE_ROOTFS="$work/rootfs" VOLMGR_IMAGE_WORK="$work" \
  unshare --mount --propagation private -- "$0"
echo "image: built and checked in $(($(date +%s) - start)) s"
