#!/usr/bin/env bash
# Tracer overhead benchmark (volmgr's eBPF tracer vs libbpf-tools mountsnoop
# vs a bpftrace in-kernel histogram), as root. Benchmark-only: installs
# mountsnoop (Debian libbpf-tools) and bpftrace if they are missing. The
# benchmark makes its own private mount namespace; the host is left alone.
# Arguments go to the benchmark, e.g. `--n 20000 --rounds 7`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PATH:/usr/sbin:/sbin"
need=()
command -v mountsnoop >/dev/null 2>&1 || need+=(libbpf-tools)
command -v bpftrace >/dev/null 2>&1 || need+=(bpftrace)
command -v stdbuf >/dev/null 2>&1 || need+=(coreutils)
if [ "${#need[@]}" -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
echo "nproc: $(nproc)  uname -r: $(uname -r)  bpftrace: $(bpftrace --version)"
exec cargo bench -p volmgr-cli --bench tracer_overhead -- "$@"
