#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it: formatting, clippy (warnings are
# errors, no unwrap/expect outside tests), unit tests (including the check that
# include/volmgr.h matches a fresh cbindgen run), the end-to-end tests that
# mount for real in private mount namespaces (root needed; without root they
# print why they skip), the C consumer under AddressSanitizer, the Go (cgo)
# package's tests, the fuzz targets for a bounded time, then a smoke run of
# the demo, then the container image built and smoke-tested. The end-to-end
# tests against a real control plane (kube-apiserver, etcd, kubectl built
# from their Go modules by scripts/kube-binaries.sh, cached under $HOME),
# a stock kubelet and the kubelet fork whose volume manager is libvolmgr
# (scripts/kubelet-fork.sh) run within cargo test; the fifteen-minute
# quiet-watch test and the ten-minute healthy node run in the background
# beside the rest of the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
export PATH="$HOME/.cargo/bin:$PATH:/usr/local/go/bin"
# A clean clone builds everything once: incremental caches would only cost
# disk (several GiB) and time. A developer can still ask for them.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# The run builds debug, release, fuzz and eBPF targets: say so early when the
# disk is short, rather than fail in a link half an hour in.
need_gib=16
avail_gib=$(( $(df -Pk . | awk 'NR == 2 { print $4 }') / 1024 / 1024 ))
if [ "$avail_gib" -lt "$need_gib" ]; then
  echo "warning: $avail_gib GiB free under $(pwd); a whole run needs about $need_gib GiB (target/, fuzz/target/)" >&2
fi

echo "== real Kubernetes (kube-apiserver, kubelet, kubectl, etcd from their Go modules; cached under \$HOME)"
VOLMGR_KUBE_BIN=$(./scripts/kube-binaries.sh)
export VOLMGR_KUBE_BIN
echo "$VOLMGR_KUBE_BIN"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== the library, libvolmgr and the API source link no command-line crates"
for crate in volmgr-ffi volmgr-kube; do
  if cargo tree -p "$crate" -e normal,no-proc-macro --prefix none | grep -E '^(clap|anyhow|tracing-subscriber) '; then
    echo "$crate depends on a command-line crate (above): keep them in cli/" >&2
    exit 1
  fi
done
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== the kubelet fork (the stock kubelet, its volume manager libvolmgr: scripts/kubelet-fork.sh; cached under \$HOME)"
# Against the debug libvolmgr.a the tests build anyway; relinked when it
# changes (the Kubernetes packages stay in Go's build cache).
VOLMGR_KUBELET_FORK=$(VOLMGR_FFI_PROFILE=debug ./scripts/kubelet-fork.sh)
export VOLMGR_KUBELET_FORK
echo "$VOLMGR_KUBELET_FORK"
echo "== cargo test"
log=$(mktemp)
# The long tests run in the background while the rest of the suite runs,
# each built first, in a session of its own so that a failure elsewhere
# ends it whole (each re-executes itself in a private mount namespace and
# starts etcd, kube-apiserver, a kubelet or the agent): its pid, log and
# name by index.
bg_pids=() bg_logs=() bg_names=()
trap 'for p in "${bg_pids[@]}"; do kill -- "-$p" 2>/dev/null || true; done; rm -f "$log" "${bg_logs[@]}"' EXIT
# Stopped from outside (a CI time-out): the EXIT trap still ends them.
trap 'exit 143' TERM
trap 'exit 130' INT
# background TEST_FILE TEST_NAME [VAR=VALUE...]: starts one test of
# cli/tests/TEST_FILE.rs in the background.
background() {
  local file=$1 name=$2 bin out
  shift 2
  bin=$(cargo test -p volmgr-cli --test "$file" --no-run --message-format=json 2>/dev/null \
    | grep -o '"executable":"[^"]*'"$file"'[^"]*"' | tail -n 1 | cut -d'"' -f4)
  [ -x "$bin" ] || { echo "the $file test binary was not built" >&2; exit 1; }
  out=$(mktemp)
  (cd cli && exec env "$@" setsid "$bin" "$name" --exact --test-threads=1) >"$out" 2>&1 &
  bg_pids+=($!) bg_logs+=("$out") bg_names+=("$name")
}
# Fifteen minutes on a quiet real API server: the watches must outlive the
# old 90 s deadline and the server's own timeouts without a relist.
quiet_test=quiet_watches_live_as_long_as_the_server_lets_them
background real_watch "$quiet_test"
# Ten minutes of a healthy node with every volume kind next to a real
# kubelet: observe mode's doctor exits 0 throughout.
healthy_test=healthy_node_with_every_volume_kind_stays_clean
background real_kubelet "$healthy_test" VOLMGR_HEALTHY_SECS=600
cargo test --workspace -- --skip "$quiet_test" --skip "$healthy_test" 2>&1 | tee "$log"
echo "== end-to-end suites again as on a 4.18 kernel (openat2, listmount, fchmodat2, new mount API: ENOSYS)"
VOLMGR_TEST_OLDER_KERNEL=1 cargo test -p volmgr-cli --test agent --test hardening --test volume_kinds \
  --test config_volumes --test sub_paths --test csi 2>&1 | tee -a "$log"
echo "== C consumer (include/volmgr.h + libvolmgr.a, AddressSanitizer, real mounts)"
./tests/c/run.sh 2>&1 | tee -a "$log"
echo "== Go package (cgo)"
./ffi/go/run.sh 2>&1 | tee -a "$log"
echo "== fuzzing (each target a bounded time on its corpus)"
./scripts/fuzz.sh 2>&1 | tee -a "$log"
echo "== demo smoke run"
./scripts/demo.sh --once
echo "== container image (the demo's release build; size, --version, agent smoke from its root file system)"
./scripts/image.sh
echo "== the long tests (started after the build, in the background)"
bg_failed=0
for i in "${!bg_pids[@]}"; do
  rc=0
  wait "${bg_pids[$i]}" || rc=$?
  tee -a "$log" <"${bg_logs[$i]}"
  if [ "$rc" -ne 0 ]; then
    echo "the background test ${bg_names[$i]} failed (exit $rc)" >&2
    bg_failed=1
  fi
done
[ "$bg_failed" -eq 0 ] || exit 1
# One closing line for the whole run.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i == "passed;") p += $(i-1); if ($i == "failed;") f += $(i-1); if ($i == "ignored;") s += $(i-1) } }
     /^c flow:/ { p += $3; f += $5 }
     /^--- PASS:/ { p++ } /^--- FAIL:/ { f++ } /^--- SKIP:/ { s++ }
     /^fuzz: .* ok$/ { p++ } /^fuzz: .* FAILED/ { f++ }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
