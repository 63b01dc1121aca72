//! Code generated at build time from volmgr/proto (see build.rs).
#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// CSI spec v1: Identity and Node services.
pub mod csi {
    tonic::include_proto!("csi.v1");
}

/// The kubelet's plugin registration API v1.
pub mod registration {
    tonic::include_proto!("pluginregistration");
}
