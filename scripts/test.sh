#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it: formatting, clippy (warnings are
# errors, no unwrap/expect outside tests), unit tests (including the check that
# include/volmgr.h matches a fresh cbindgen run), the end-to-end tests that
# mount for real in private mount namespaces (root needed; without root they
# print why they skip), the C consumer under AddressSanitizer, the Go (cgo)
# package's tests, the fuzz targets for a bounded time, then a smoke run of
# the demo, then the container image built and smoke-tested.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
export PATH="$HOME/.cargo/bin:$PATH"
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
trap 'rm -f "$log"' EXIT
cargo test --workspace 2>&1 | tee "$log"
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
# One closing line for the whole run.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i == "passed;") p += $(i-1); if ($i == "failed;") f += $(i-1); if ($i == "ignored;") s += $(i-1) } }
     /^c flow:/ { p += $3; f += $5 }
     /^--- PASS:/ { p++ } /^--- FAIL:/ { f++ } /^--- SKIP:/ { s++ }
     /^fuzz: .* ok$/ { p++ } /^fuzz: .* FAILED/ { f++ }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
