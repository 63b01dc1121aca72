//! Generates the gRPC clients volmgr needs from the `.proto` files in
//! `proto/`, with no system `protoc`: `protox` parses them into a descriptor
//! set (it knows the well-known types such as `google/protobuf/wrappers.proto`)
//! and `tonic-prost-build` writes the Rust code into `OUT_DIR`.
//!
//! - `csi.proto` (`csi.v1`): the Identity and Node CLIENTS (volmgr calls the
//!   driver, as the kubelet does).
//! - `pluginregistration.proto`: the Registration CLIENT (the kubelet dials
//!   each plugin's registration socket and asks it `GetInfo`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/csi.proto", "proto/pluginregistration.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
