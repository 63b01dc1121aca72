#!/usr/bin/env bash
# The stock kubelet and the volmgr kubelet fork side by side (issue 38 §4),
# on the real-kubelet harness (etcd, kube-apiserver with an audit log, the
# kubelet with the fake container runtime, in a private mount namespace):
# pod create → Running of 100 pods with 5 volumes each (p50, p99), API
# requests per pod start from the audit log, the kubelet's idle CPU with
# 110 pods. Prints a table (also left in $VOLMGR_BENCH_OUT, default
# $TMPDIR/bench-kubelet.txt).
#
#   scripts/bench-kubelet.sh            # 1 round: stock then fork
#   VOLMGR_BENCH_ROUNDS=3 VOLMGR_BENCH_PODS=100 VOLMGR_BENCH_IDLE_SECS=60 scripts/bench-kubelet.sh
#
# Needs root. Builds the real Kubernetes binaries (scripts/kube-binaries.sh,
# cached) and the fork with the release libvolmgr (scripts/kubelet-fork.sh,
# cached); the test program itself is cli/tests/bench_kubelet.rs (ignored
# in the normal test run).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
VOLMGR_KUBE_BIN="${VOLMGR_KUBE_BIN:-$(scripts/kube-binaries.sh)}"
# A fork given in VOLMGR_KUBELET_FORK (its binary) is used as it is.
VOLMGR_KUBELET_FORK="${VOLMGR_KUBELET_FORK:-$(VOLMGR_FFI_PROFILE=release scripts/kubelet-fork.sh)/kubelet}"
export VOLMGR_KUBE_BIN VOLMGR_KUBELET_FORK
echo "stock: $VOLMGR_KUBE_BIN/kubelet" >&2
echo "fork:  $VOLMGR_KUBELET_FORK" >&2
cargo test -q -p volmgr-cli --test bench_kubelet -- --ignored --nocapture --test-threads=1
