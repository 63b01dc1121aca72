#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it: formatting, clippy (warnings are
# errors, no unwrap/expect outside tests), unit tests, and the end-to-end
# tests that mount for real in private mount namespaces (root needed; without
# root they print why they skip), then a smoke run of the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
export PATH="$HOME/.cargo/bin:$PATH"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace
echo "== demo smoke run"
./scripts/demo.sh --once
