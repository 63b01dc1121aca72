#!/usr/bin/env bash
# The one release build of the `volmgr` command: statically linked
# (`-C target-feature=+crt-static` on the host's gnu target), so the same
# binary serves the demo, the container image (scripts/image.sh) and a copy
# onto any node. `--target` keeps the flag off build scripts and proc
# macros (they cannot be static) and puts the binary in
# target/<host triple>/release/volmgr, whose path is printed on stdout.
# Every caller goes through here so CI compiles the release profile once.
set -euo pipefail
cd "$(dirname "$0")/.."
# PATH without repeats: volmgr's build script runs again whenever PATH
# differs, and each caller (demo.sh, image.sh) may have prepended cargo's
# directory once more; the same PATH keeps it one release build.
PATH=$(printf '%s' "$HOME/.cargo/bin:$PATH" | awk -v RS=: -v ORS=: '$0 != "" && !seen[$0]++' | sed 's/:$//')
export PATH
host=$(rustc -vV | sed -n 's/^host: //p')
case "$host" in
  *-linux-gnu) ;;
  *) echo "release: static linking is set up for *-linux-gnu hosts, not $host" >&2; exit 1 ;;
esac
var="CARGO_TARGET_$(echo "$host" | tr 'a-z-' 'A-Z_')_RUSTFLAGS"
export "$var=-C target-feature=+crt-static"
cargo build --release -q -p volmgr-cli --target "$host" >&2
echo "target/$host/release/volmgr"
