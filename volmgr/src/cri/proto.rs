//! Code generated at build time from `proto/cri.proto` (see `build.rs`):
//! the CRI's `runtime.v1` messages and the `RuntimeService` client.

#![allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used
)]

tonic::include_proto!("runtime.v1");
