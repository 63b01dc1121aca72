//! Code generated at build time from `proto/` (see `build.rs`).

#![allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used
)]

/// CSI spec v1 (`csi.v1`): messages and the Identity and Node clients.
pub mod csi {
    tonic::include_proto!("csi.v1");
}

/// The kubelet's plugin registration API (`pluginregistration`): messages
/// and the Registration client.
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}
