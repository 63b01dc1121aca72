//! Compiles volmgr's CSI and plugin-registration protos (volmgr/proto) with
//! protox (pure Rust, no system protoc) and generates tonic servers and clients.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = "../../volmgr/proto";
    let files = [
        format!("{proto_dir}/csi.proto"),
        format!("{proto_dir}/pluginregistration.proto"),
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(&files, [proto_dir])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
