#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it: formatting, clippy (warnings are
# errors, no unwrap/expect outside tests), unit tests (including the check that
# include/volmgr.h matches a fresh cbindgen run), the end-to-end tests that
# mount for real in private mount namespaces (root needed; without root they
# print why they skip), the C consumer under AddressSanitizer, the Go (cgo)
# package's tests, the fuzz targets for a bounded time, then a smoke run of
# the demo, then the container image built and smoke-tested. The end-to-end
# tests against a real control plane (kube-apiserver, etcd, kubectl built
# from their Go modules by scripts/kube-binaries.sh, cached under $HOME) run
# within cargo test; the fifteen-minute quiet-watch test runs in the
# background beside the rest of the suite.
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
echo "== cargo test"
log=$(mktemp)
quiet_log=$(mktemp)
quiet_pid=
trap 'if [ -n "$quiet_pid" ]; then kill -- "-$quiet_pid" 2>/dev/null || true; fi; rm -f "$log" "$quiet_log"' EXIT
# Fifteen minutes on a quiet real API server (the watches must outlive the
# old 90 s deadline and the server's own timeouts without a relist): built
# first, then run in the background while the rest of the suite runs.
quiet_test=quiet_watches_live_as_long_as_the_server_lets_them
quiet_bin=$(cargo test -p volmgr-cli --test real_watch --no-run --message-format=json 2>/dev/null \
  | grep -o '"executable":"[^"]*real_watch[^"]*"' | tail -n 1 | cut -d'"' -f4)
[ -x "$quiet_bin" ] || { echo "the real_watch test binary was not built" >&2; exit 1; }
# In a session of its own, so that a failure elsewhere ends it whole (the
# test re-executes itself in a private mount namespace and starts etcd,
# kube-apiserver and the agent).
(cd cli && exec setsid "$quiet_bin" "$quiet_test" --exact --test-threads=1) >"$quiet_log" 2>&1 &
quiet_pid=$!
cargo test --workspace -- --skip "$quiet_test" 2>&1 | tee "$log"
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
echo "== the quiet-watch test (started after the build, in the background)"
quiet_rc=0
wait "$quiet_pid" || quiet_rc=$?
tee -a "$log" <"$quiet_log"
if [ "$quiet_rc" -ne 0 ]; then
  echo "the quiet-watch test failed (exit $quiet_rc)" >&2
  exit 1
fi
# One closing line for the whole run.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i == "passed;") p += $(i-1); if ($i == "failed;") f += $(i-1); if ($i == "ignored;") s += $(i-1) } }
     /^c flow:/ { p += $3; f += $5 }
     /^--- PASS:/ { p++ } /^--- FAIL:/ { f++ } /^--- SKIP:/ { s++ }
     /^fuzz: .* ok$/ { p++ } /^fuzz: .* FAILED/ { f++ }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
