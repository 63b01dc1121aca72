#!/usr/bin/env bash
# Builds the real Kubernetes components the end-to-end harness runs
# (kube-apiserver, kubelet, kubectl from the k8s.io/kubernetes module; etcd
# from go.etcd.io/etcd/server/v3) from the Go modules pinned in tests/kube/,
# and prints the directory that holds them. No Kubernetes source is kept in
# this repository: the Go module proxy brings it. The binaries are cached
# under $HOME keyed by tests/kube/go.sum, so a second run builds nothing.
set -euo pipefail
cd "$(dirname "$0")/../tests/kube"
export PATH="/usr/local/go/bin:$PATH"
key=$(cat go.mod go.sum cmd/*/*.go | sha256sum | cut -c1-16)
out="${XDG_CACHE_HOME:-$HOME/.cache}/volmgr/kube-$key"
if [ -x "$out/kube-apiserver" ] && [ -x "$out/kubelet" ] && [ -x "$out/kubectl" ] && [ -x "$out/etcd" ] \
   && [ -x "$out/fake-cri" ]; then
  echo "$out"
  exit 0
fi
mkdir -p "$out.tmp"
echo "kube-binaries: building kube-apiserver, kubelet, kubectl, etcd, fake-cri into $out (first run: several minutes)" >&2
# -trimpath and no VCS stamping: the same inputs give the same binaries.
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out.tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl \
  ./cmd/etcd ./cmd/fake-cri >&2
rm -rf "$out"
mv "$out.tmp" "$out"
# shellcheck source=scripts/cache-prune.sh
. ../../scripts/cache-prune.sh
prune_cache "$(dirname "$out")/kube" 2
echo "$out"
