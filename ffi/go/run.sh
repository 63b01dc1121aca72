#!/usr/bin/env bash
# Runs the Go package's tests against libvolmgr.a (debug build). The tests
# re-execute themselves in a private mount namespace; without root they skip.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build -q -p volmgr-ffi
libs=$(cargo rustc -q -p volmgr-ffi --lib --crate-type staticlib -- --print native-static-libs 2>&1 \
  | sed -n 's/.*native-static-libs: //p' | tail -n 1)
cd ffi/go/volmgr
CGO_LDFLAGS="-L$PWD/../../../target/debug -l:libvolmgr.a $libs" go vet ./...
CGO_LDFLAGS="-L$PWD/../../../target/debug -l:libvolmgr.a $libs" go test -count=1 -v ./...
# The kubelet's VolumeManager over volmgr (ffi/go/kubeletvm, the kubelet
# fork's adapter): its own module, built against k8s.io/kubernetes as
# tests/kube pins it.
cd ../kubeletvm
CGO_LDFLAGS="-L$PWD/../../../target/debug -l:libvolmgr.a $libs" go vet ./...
CGO_LDFLAGS="-L$PWD/../../../target/debug -l:libvolmgr.a $libs" go test -count=1 -v ./...
