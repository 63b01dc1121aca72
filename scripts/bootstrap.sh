#!/usr/bin/env bash
# Installs everything volmgr needs on a fresh Debian machine, and nothing that
# is already there. Called by the README's commands (scripts/demo.sh,
# scripts/test.sh); safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'bootstrap: %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_updated=0
apt_install() {
  if [ "$apt_updated" -eq 0 ]; then
    log "apt-get update"
    as_root apt-get update -qq
    apt_updated=1
  fi
  log "apt-get install $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# System tools: unshare/mount/umount (util-linux, mount) for private mount
# namespaces and the out-of-band tests; a C compiler for crates with C parts.
need_pkgs=()
command -v unshare >/dev/null 2>&1 || need_pkgs+=(util-linux)
command -v umount >/dev/null 2>&1 || need_pkgs+=(mount)
command -v cc >/dev/null 2>&1 || need_pkgs+=(gcc libc6-dev)
command -v curl >/dev/null 2>&1 || need_pkgs+=(curl ca-certificates)
# Go for the cgo package in ffi/go (Debian's golang-go).
# The machine's own Go (/usr/local/go) is used where it is: Debian's is older
# than what k8s.io/kubernetes needs (scripts/kube-binaries.sh).
{ command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ]; } || need_pkgs+=(golang-go)
# File system tools for the test CSI driver (tests/csi-driver): mkfs.ext4, resize2fs;
# blkid (util-linux) to see whether a loop device is formatted.
have_sbin() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }
{ have_sbin mkfs.ext4 && have_sbin resize2fs; } || need_pkgs+=(e2fsprogs)
# xfsprogs: online growth of xfs needs only CAP_SYS_ADMIN, where ext4's needs
# CAP_SYS_RESOURCE, which some containers drop.
{ have_sbin mkfs.xfs && have_sbin xfs_growfs; } || need_pkgs+=(xfsprogs)
have_sbin blkid || need_pkgs+=(util-linux)
# valgrind: the C consumer also runs under memcheck (tests/c/run.sh).
command -v valgrind >/dev/null 2>&1 || need_pkgs+=(valgrind)
# strace: the system-call yardstick (cli/tests/syscall_yardstick.rs).
command -v strace >/dev/null 2>&1 || need_pkgs+=(strace)
# bpftool and bpftrace: the BPF yardstick (BENCHMARKS.md, "Yardsticks: BPF
# instructions per traced call": the tracer's programs as the kernel runs
# them, against bpftrace one-liners).
have_sbin bpftool || need_pkgs+=(bpftool)
command -v bpftrace >/dev/null 2>&1 || need_pkgs+=(bpftrace)
# podman builds the container image (scripts/image.sh); readelf (binutils)
# checks the binary is static, strip makes the image's copy small.
command -v podman >/dev/null 2>&1 || need_pkgs+=(podman)
{ command -v readelf >/dev/null 2>&1 && command -v strip >/dev/null 2>&1; } || need_pkgs+=(binutils)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  apt_install "${need_pkgs[@]}"
fi

# Rust: the toolchain pinned in rust-toolchain.toml, with rustfmt and clippy.
if ! command -v rustup >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/rustup" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v rustup >/dev/null 2>&1; then
  log "installing rustup"
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain none
  export PATH="$HOME/.cargo/bin:$PATH"
fi
channel=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
if ! rustup run "$channel" cargo --version >/dev/null 2>&1; then
  log "installing Rust $channel"
  rustup toolchain install "$channel" --profile minimal
fi
for c in rustfmt clippy; do
  if ! rustup component list --toolchain "$channel" --installed 2>/dev/null | grep -q "^$c"; then
    log "adding $c to $channel"
    rustup component add "$c" --toolchain "$channel"
  fi
done
log "ready: $(rustup run "$channel" rustc --version)"

# eBPF toolchain (volmgr-ebpf, built by volmgr/build.rs through aya-build):
# nightly with rust-src (build-std=core for bpfel-unknown-none) and bpf-linker
# linked against the nightly toolchain's own libLLVM. Debian has no system LLVM
# of the right version, so LLVM_PREFIX is a lasting directory whose lib/ holds
# two symlinks to that libLLVM: `libLLVM.so` for the build and one under its
# SONAME, which the installed bpf-linker finds through its RUNPATH.
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  log "installing Rust nightly"
  rustup toolchain install nightly --profile minimal
fi
if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
  log "adding rust-src to nightly"
  rustup component add rust-src --toolchain nightly
fi
if ! bpf-linker --version >/dev/null 2>&1; then
  sysroot=$(rustup run nightly rustc --print sysroot)
  libllvm=
  for f in "$sysroot"/lib/libLLVM.so.*; do
    [ -e "$f" ] && libllvm=$f && break
  done
  if [ -z "$libllvm" ]; then
    log "no libLLVM.so.* in $sysroot/lib: cannot build bpf-linker"
    exit 1
  fi
  llvm_ver=$(rustup run nightly rustc -vV | sed -n 's/^LLVM version: *//p')
  llvm_major=${llvm_ver%%.*}
  soname=$(basename "$libllvm")
  if command -v readelf >/dev/null 2>&1; then
    soname=$(readelf -d "$libllvm" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
  fi
  llvm_prefix="${XDG_DATA_HOME:-$HOME/.local/share}/volmgr/llvm-$llvm_ver"
  mkdir -p "$llvm_prefix/lib"
  ln -sfn "$libllvm" "$llvm_prefix/lib/libLLVM.so"
  ln -sfn "$libllvm" "$llvm_prefix/lib/$soname"
  log "building bpf-linker against $libllvm (LLVM $llvm_major)"
  LLVM_PREFIX="$llvm_prefix" rustup run nightly cargo install --locked bpf-linker \
    --no-default-features --features "llvm-$llvm_major"
  bpf-linker --version >/dev/null
fi
log "eBPF toolchain: $(bpf-linker --version)"

# cargo-fuzz for the fuzz targets of fuzz/ (scripts/fuzz.sh builds them with
# nightly). Installed with the pinned stable toolchain: the rustix its lock
# file pins does not build on a current nightly.
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  log "installing cargo-fuzz"
  rustup run "$channel" cargo install --locked cargo-fuzz --version 0.13.1
fi
log "fuzzing: $(cargo-fuzz --version)"
