#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ (cargo-fuzz, libFuzzer, AddressSanitizer)
# for a bounded time on its checked-in corpus, fuzz/corpus/<target>/:
# the manifests parser (YAML and JSON), the mountinfo parser, pod → volumes
# resolution, the objects of volmgr_object_upsert with a pod resolved
# against them, the eBPF record decoder, the local API's request parser.
# A crash fails the run; libFuzzer leaves the input in
# fuzz/artifacts/<target>/, which becomes a regression test in the code it
# broke. New inputs a run finds go to a scratch copy, not into the tree.
# VOLMGR_FUZZ_SECONDS (default 20) bounds each target.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
export PATH="$HOME/.cargo/bin:$PATH"
secs="${VOLMGR_FUZZ_SECONDS:-20}"
cargo +nightly fuzz build
for t in $(cargo +nightly fuzz list); do
  work=$(mktemp -d)
  cp -r "corpus/$t/." "$work/"
  echo "== fuzz $t (${secs}s)"
  status=0
  cargo +nightly fuzz run "$t" "$work" -- -max_total_time="$secs" -rss_limit_mb=2048 \
    -max_len=65536 -timeout=10 >"$work.log" 2>&1 || status=$?
  grep -E '^Done|ERROR|SUMMARY|panicked' "$work.log" || true
  if [ "$status" -ne 0 ]; then
    tail -n 60 "$work.log"
    rm -rf "$work" "$work.log"
    echo "fuzz: $t FAILED (input in fuzz/artifacts/$t/)"
    exit 1
  fi
  rm -rf "$work" "$work.log"
  echo "fuzz: $t ok"
done
