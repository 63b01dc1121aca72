#!/usr/bin/env bash
# Builds the kubelet fork whose volume manager is libvolmgr and prints the
# directory that holds it (`kubelet`).
#
# The kubelet is k8s.io/kubernetes/cmd/kubelet from the module cache
# (pinned by ffi/go/kubeletvm/go.mod, the version of tests/kube). Its one
# change is made at build time: pkg/kubelet/kubelet.go is copied, its call
# `volumemanager.NewVolumeManager(` becomes `kubeletvm.NewVolumeManager(`
# (same arguments; ffi/go/kubeletvm), one import is added, and
# `go build -overlay` compiles the copy in place of the original. No
# Kubernetes source, modified or not, is kept in this repository.
#
# libvolmgr.a is built by cargo (release; VOLMGR_FFI_PROFILE=debug for the
# debug build) into $CARGO_TARGET_DIR (default: target/). The binary is
# cached under $HOME keyed by its inputs (the Go module, the adapter and
# volmgr Go sources but their tests, volmgr.h, libvolmgr.a, this script,
# the Go version): a second run builds nothing but cargo's no-op check.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
self="$repo/scripts/$(basename "$0")"
export PATH="/usr/local/go/bin:$PATH"
profile="${VOLMGR_FFI_PROFILE:-release}"
target="${CARGO_TARGET_DIR:-$repo/target}"
cd "$repo"
if [ "$profile" = release ]; then
  cargo build -q --release -p volmgr-ffi >&2
else
  cargo build -q -p volmgr-ffi >&2
fi
lib="$target/$profile/libvolmgr.a"
[ -f "$lib" ] || { echo "kubelet-fork: $lib not built" >&2; exit 1; }

mod="$repo/ffi/go/kubeletvm"
cd "$mod"
# The inputs of the binary (tests are not).
srcs=$(ls ./*.go ../volmgr/*.go | grep -v '_test\.go$')
# shellcheck disable=SC2086
key=$( { cat "$self" go.mod go.sum ../volmgr/go.mod $srcs "$repo/include/volmgr.h"; sha256sum <"$lib"; go version; } \
  | sha256sum | cut -c1-16)
out="${XDG_CACHE_HOME:-$HOME/.cache}/volmgr/kubelet-fork-$key"
if [ -x "$out/kubelet" ]; then
  echo "$out"
  exit 0
fi

# The libraries libvolmgr.a needs (what `cargo rustc --print
# native-static-libs` prints for it), cached next to it.
libs_file="$target/$profile/libvolmgr.native-libs"
if [ ! -s "$libs_file" ] || [ "$libs_file" -ot "$lib" ]; then
  rel=(); [ "$profile" = release ] && rel=(--release)
  (cd "$repo" && cargo rustc -q "${rel[@]}" -p volmgr-ffi --lib --crate-type staticlib -- --print native-static-libs 2>&1) \
    | sed -n 's/.*native-static-libs: //p' | tail -n 1 >"$libs_file"
fi
libs=$(cat "$libs_file")

kdir=$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)
kver=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
orig="$kdir/pkg/kubelet/kubelet.go"
# A fixed work directory: the compiled Kubernetes packages are cached by the
# go command under their directory, so the same path keeps later builds
# (another adapter, another libvolmgr.a) to the packages that changed.
work="${XDG_CACHE_HOME:-$HOME/.cache}/volmgr/kubelet-fork-work"
rm -rf "$work"
mkdir -p "$work"
# The one change: the constructor call, and the import of its package.
calls=$(grep -c 'volumemanager\.NewVolumeManager(' "$orig" || true)
if [ "$calls" != 1 ]; then
  echo "kubelet-fork: expected one volumemanager.NewVolumeManager( call in $orig, found $calls" >&2
  exit 1
fi
sed -e 's/volumemanager\.NewVolumeManager(/kubeletvm.NewVolumeManager(/' \
    -e '0,/^import (/s//import (\n\tkubeletvm "volmgr\/ffi\/go\/kubeletvm"/' "$orig" >"$work/kubelet.go"
if ! grep -q '^	kubeletvm "volmgr/ffi/go/kubeletvm"$' "$work/kubelet.go"; then
  echo "kubelet-fork: could not add the import to kubelet.go" >&2
  exit 1
fi
diff -u "$orig" "$work/kubelet.go" >"$work/kubelet.go.diff" || true
# The go command refuses overlays of files in the module cache: the module
# is reached through a symlink outside it (a replace directive in a copy of
# go.mod given with -modfile; the committed go.mod is untouched), and the
# overlay replaces kubelet.go there.
ln -s "$kdir" "$work/kubernetes"
cp go.sum "$work/go.sum"
{ cat go.mod; printf '\nreplace k8s.io/kubernetes => %s\n' "$work/kubernetes"; } >"$work/go.mod"
printf '{"Replace":{"%s":"%s"}}\n' "$work/kubernetes/pkg/kubelet/kubelet.go" "$work/kubelet.go" >"$work/overlay.json"

mkdir -p "$out.tmp"
cp "$work/kubelet.go.diff" "$out.tmp/kubelet.go.diff"
echo "kubelet-fork: building the kubelet $kver with volmgr's volume manager into $out (first run: several minutes)" >&2
# -trimpath and no VCS stamping: the same inputs give the same binary.
CGO_ENABLED=1 CGO_LDFLAGS="-L$(dirname "$lib") -l:libvolmgr.a $libs" \
  go build -trimpath -buildvcs=false -modfile="$work/go.mod" -overlay "$work/overlay.json" \
  -ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kver-volmgr" \
  -o "$out.tmp/kubelet" k8s.io/kubernetes/cmd/kubelet >&2
rm -rf "$out"
mv "$out.tmp" "$out"
# shellcheck source=scripts/cache-prune.sh
. "$repo/scripts/cache-prune.sh"
prune_cache "$(dirname "$out")/kubelet-fork" 3
echo "$out"
