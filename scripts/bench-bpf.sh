#!/usr/bin/env bash
# BPF yardstick: what the kernel runs per traced mount-family call, for the
# agent's eBPF tracer (volmgr-ebpf, loaded by volmgr/src/ebpf/loader.rs)
# and for two bpftrace one-liners doing comparable work: the programs' size
# as the kernel runs them (instructions translated by the verifier,
# `bpftool prog dump xlated`; bytes of x86 code, `bytes_jited`), and their
# run count and run time (`kernel.bpf_stats_enabled`) over a loop of
# `mount(tmpfs)` + `umount2` pairs. Run time is noisy on a shared VM (read
# the spread of --rounds); the sizes are not. As root; the loop and the
# agent run in a private mount namespace. BENCHMARKS.md, "Yardsticks: BPF
# instructions per traced call".
#   scripts/bench-bpf.sh [PAIRS [ROUNDS]]   (default 20000 3)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "bench-bpf: needs root"; exit 1; }
bash scripts/bootstrap.sh
export PATH="$PATH:/usr/sbin:/sbin"
pairs=${1:-20000}
rounds=${2:-3}
target=${CARGO_TARGET_DIR:-target}
cargo build -q -p volmgr-cli --bin volmgr
out=$(mktemp -d /tmp/volmgr-bench-bpf.XXXXXX)
stats_was=$(sysctl -n kernel.bpf_stats_enabled)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sysctl -q kernel.bpf_stats_enabled="$stats_was"
  rm -rf "$out"
}
trap cleanup EXIT
cat >"$out/loop.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <sys/mount.h>
int main(int argc, char **argv) {
  long n = atol(argv[2]);
  for (long i = 0; i < n; i++) {
    if (mount("none", argv[1], "tmpfs", 0, "size=4k") != 0 || umount2(argv[1], 0) != 0) { perror("mount"); return 1; }
  }
  return 0;
}
C
gcc -O2 "$out/loop.c" -o "$out/loop"
mkdir -p "$out/mnt" "$out/root" "$out/manifests"
echo "machine: nproc=$(nproc) kernel=$(uname -r) build=$(git rev-parse --short HEAD) $(date -u +%F) $(bpftrace --version) bpftool $(bpftool version | sed -n 's/^bpftool v//p;q')"

# The BPF programs process $1 holds (their ids, one a line, from its file
# descriptors): other programs loaded on the machine meanwhile are not its.
prog_ids() { grep -hs '^prog_id:' /proc/"$1"/fdinfo/* | awk '{ print $2 }' | sort -u; }
# Waits until process $1 holds at least $2 programs; prints their ids.
wait_progs() {
  local pid=$1 want=$2
  for _ in $(seq 300); do
    if [ "$(prog_ids "$pid" | wc -l)" -ge "$want" ]; then
      prog_ids "$pid"
      return
    fi
    sleep 0.1
  done
  echo "bench-bpf: programs never loaded" >&2
  cat "$out"/agent.log "$out"/bpftrace.* >&2 2>/dev/null || true
  exit 1
}
# For program ids on stdin: name, xlated instructions, jited bytes, run_cnt,
# run_time_ns, helper and subprogram calls (in the xlated code).
describe() {
  while read -r id; do
    bpftool prog dump xlated id "$id" >"$out/xlated"
    insns=$(grep -c '^ *[0-9]*:' "$out/xlated")
    calls=$(grep -c '^ *[0-9]*: ([0-9a-f]*) call ' "$out/xlated" || true)
    bpftool -j prog show id "$id" | python3 -c 'import json,sys; p=json.load(sys.stdin); print(p["name"], '"$insns"', p["bytes_jited"], p.get("run_cnt",0), p.get("run_time_ns",0), '"$calls"')'
  done
}
# Runs the loop `rounds` times in the mount namespace of process $3 with
# run statistics on; prints per round, for the programs of file $1 whose
# name matches regex $2, the sum of their run time per run (what one mount
# call costs when each runs once for it), and their runs per mount call of
# the loop (over 1 or 2 per program: mount calls of other processes of the
# machine, which bpftrace traces too, and the agent's programs filter out
# at entry).
measure() {
  local ids=$1 names=$2 ns_pid=$3
  for r in $(seq "$rounds"); do
    describe <"$ids" >"$out/before"
    nsenter --mount="/proc/$ns_pid/ns/mnt" -- "$out/loop" "$out/mnt" "$pairs"
    describe <"$ids" >"$out/after"
    paste -d' ' "$out/before" "$out/after" | awk -v names="$names" -v r="$r" -v pairs="$pairs" '
      $1 ~ names && $10 > $4 { runs += $10 - $4; per_run += ($11 - $5) / ($10 - $4) }
      END { printf "  round %d: %.0f ns of BPF per mount call (sum of the programs'"'"' ns per run); %.3f runs per mount call\n", r, per_run, runs / pairs }'
  done
}
# Static size of the programs of file $1 whose name matches regex $2.
sizes() {
  describe <"$1" | awk -v names="$2" '$1 ~ names { printf "  %-28s %5d xlated insns %6d jited bytes %3d calls\n", $1, $2, $3, $6 }'
}
# Stops process $1 (one this script started) and waits for it.
stop() { kill "$1"; wait "$1" 2>/dev/null || true; }
sysctl -q kernel.bpf_stats_enabled=1

echo "== volmgr agent --tracer ebpf (mount pair: sys_enter_mount + sys_exit_mount)"
unshare --mount --propagation private -- "$target/debug/volmgr" agent --root "$out/root" \
  --manifests "$out/manifests" --container-runtime-endpoint none --tracer ebpf >"$out/agent.log" 2>&1 &
agent=$!
pids+=("$agent")
wait_progs "$agent" 20 >"$out/ids.volmgr"
sizes "$out/ids.volmgr" '^sys_(enter|exit)_u?mount$'
measure "$out/ids.volmgr" '^sys_(enter|exit)_mount$' "$agent"

one_liner() {
  local name=$1 want=$2 prog=$3
  echo "== bpftrace $name: $prog"
  # In a private mount namespace with its own tracefs where the host shows
  # none (the agent's loader does the same); the host is left alone.
  unshare --mount --propagation private -- sh -c \
    '[ -e /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing; exec bpftrace -e "$0"' \
    "$prog" >"$out/bpftrace.$name" 2>&1 &
  local bt=$!
  pids+=("$bt")
  wait_progs "$bt" "$want" >"$out/ids.$name"
  sizes "$out/ids.$name" .
  measure "$out/ids.$name" . "$agent"
  stop "$bt"
}
one_liner count 1 'tracepoint:syscalls:sys_enter_mount { @[comm] = count(); }'
one_liner latency 2 'tracepoint:syscalls:sys_enter_mount { @s[tid] = nsecs; } tracepoint:syscalls:sys_exit_mount /@s[tid]/ { @ns = hist(nsecs - @s[tid]); delete(@s[tid]); }'
stop "$agent"
