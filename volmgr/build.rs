//! Two generated inputs of volmgr:
//!
//! 1. The gRPC clients from the `.proto` files in `proto/`, with no system
//!    `protoc`: `protox` parses them into a descriptor set (it knows the
//!    well-known types such as `google/protobuf/wrappers.proto`) and
//!    `tonic-prost-build` writes the Rust code into `OUT_DIR`. `csi.proto`
//!    (`csi.v1`) gives the Identity and Node clients (volmgr calls the driver,
//!    as the kubelet does); `pluginregistration.proto` the Registration
//!    client (the kubelet dials each plugin's registration socket);
//!    `cri.proto` (`runtime.v1`, a part of the CRI) the RuntimeService
//!    client (is a deleted pod's runtime gone?).
//! 2. The eBPF programs in `../volmgr-ebpf`, built with aya-build (nightly,
//!    `build-std=core`, `bpfel-unknown-none`) into `$OUT_DIR/volmgr-ebpf`, which
//!    `src/ebpf/loader.rs` embeds. Without nightly or bpf-linker the build still
//!    succeeds with a warning and an empty object: the tracer then reports that
//!    it was built without it and the agent falls back to mountinfo. With the
//!    toolchain present, a failing eBPF build fails the build (set
//!    `VOLMGR_NO_EBPF=1` to build without the tracer on purpose).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    // First: the eBPF build below changes the current directory.
    grpc_clients(&manifest_dir)?;
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    let ebpf_dir = manifest_dir.join("../volmgr-ebpf");
    let object = out_dir.join("volmgr-ebpf");
    println!("cargo:rerun-if-changed={}", ebpf_dir.join("src").display());
    println!(
        "cargo:rerun-if-changed={}",
        ebpf_dir.join("Cargo.toml").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        ebpf_dir.join("Cargo.lock").display()
    );
    println!("cargo:rerun-if-env-changed=VOLMGR_NO_EBPF");
    println!("cargo:rerun-if-env-changed=PATH");

    let why_not = if std::env::var_os("VOLMGR_NO_EBPF").is_some_and(|v| v == "1") {
        Some("VOLMGR_NO_EBPF=1".to_string())
    } else if !runs("bpf-linker", &["--version"]) {
        Some("bpf-linker not found (run scripts/bootstrap.sh)".to_string())
    } else if !runs("rustup", &["run", "nightly", "rustc", "--version"]) {
        Some("no nightly Rust toolchain (run scripts/bootstrap.sh)".to_string())
    } else if let Err(e) = build(&ebpf_dir) {
        // The toolchain is there, so this is a bug in volmgr-ebpf: fail
        // loudly rather than ship (and test) a binary without the tracer.
        // VOLMGR_NO_EBPF=1 builds without it on purpose.
        eprintln!("building the eBPF programs failed: {e}");
        std::process::exit(1);
    } else {
        None
    };
    if let Some(why) = why_not {
        println!("cargo:warning=building volmgr without the eBPF tracer: {why}");
        // An empty object: EbpfTracer::load reports EbpfError::NotBuilt.
        if let Err(e) = std::fs::write(&object, b"") {
            println!("cargo:warning=cannot write {}: {e}", object.display());
        }
    }
    Ok(())
}

fn grpc_clients(manifest_dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let include = manifest_dir.join("proto");
    let protos = [
        include.join("csi.proto"),
        include.join("pluginregistration.proto"),
        include.join("cri.proto"),
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let fds = protox::compile(&protos, [&include])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}

fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn build(ebpf_dir: &Path) -> Result<(), String> {
    // volmgr-ebpf is its own workspace (kept out of the normal build): run
    // aya-build's `cargo build --package volmgr-ebpf` from there.
    std::env::set_current_dir(ebpf_dir)
        .map_err(|e| format!("cannot enter {}: {e}", ebpf_dir.display()))?;
    let root_dir = ebpf_dir.to_string_lossy().into_owned();
    // aya-build turns every line the inner cargo prints into a warning.
    std::env::set_var("CARGO_TERM_QUIET", "true");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "volmgr-ebpf",
            root_dir: &root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    )
    .map_err(|e| format!("{e:#}"))
}
