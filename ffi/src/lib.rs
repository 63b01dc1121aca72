//! The C ABI of volmgr: `libvolmgr.a` / `libvolmgr.so` and `include/volmgr.h`
//! (generated from this crate by cbindgen). It mirrors the kubelet's
//! `VolumeManager` interface so a Go kubelet fork can link it through cgo.
//!
//! Boundary rules (after rustls-ffi): every entry point runs inside a panic
//! guard, checks every pointer, rejects invalid UTF-8 and malformed JSON with
//! `VOLMGR_ERR_INVALID_ARGUMENT` and a message for `volmgr_last_error`, and
//! writes out-pointers only on success.
//!
//! Layout (after rustls-ffi, one file per part of the API): `handle.rs`
//! (the handle: `volmgr_new` and its JSON configuration, start, sources
//! ready, stop, free), `events.rs` (the event callback), `pods.rs`,
//! `objects.rs`, `waits.rs`, `queries.rs` (what the kubelet asks, and
//! `volmgr_string_free`), `plugin.rs` (host plugins), `token.rs`,
//! `sub_paths.rs`, `volume_list.rs`; `error.rs` holds the statuses and the
//! one mapping from each library error to its status, `boundary.rs` the
//! panic guard and the argument checks. The manager itself is put together
//! by the library's `VolumeManagerBuilder`, as `volmgr agent` does.

#![allow(non_camel_case_types)]

mod boundary;
mod callback;
pub mod error;
pub mod events;
pub mod handle;
pub mod objects;
pub mod plugin;
pub mod pods;
pub mod queries;
pub mod sub_paths;
pub mod token;
pub mod volume_list;
pub mod waits;

pub use error::*;
pub use events::*;
pub use handle::*;
pub use objects::*;
pub use plugin::*;
pub use pods::*;
pub use queries::*;
pub use sub_paths::*;
pub use token::*;
pub use volume_list::*;
pub use waits::*;

#[cfg(test)]
mod header_tests {
    /// The checked-in header must equal a fresh generation
    /// (`VOLMGR_BLESS=1 cargo test -p volmgr-ffi header` rewrites it).
    #[test]
    fn header_is_up_to_date() {
        let crate_dir = env!("CARGO_MANIFEST_DIR");
        let header = std::path::Path::new(crate_dir).join("../include/volmgr.h");
        let config =
            cbindgen::Config::from_file(std::path::Path::new(crate_dir).join("cbindgen.toml"))
                .unwrap();
        let mut fresh = Vec::new();
        cbindgen::Builder::new()
            .with_crate(crate_dir)
            .with_config(config)
            .generate()
            .unwrap()
            .write(&mut fresh);
        let fresh = String::from_utf8(fresh).unwrap();
        if std::env::var_os("VOLMGR_BLESS").is_some() {
            std::fs::create_dir_all(header.parent().unwrap()).unwrap();
            std::fs::write(&header, &fresh).unwrap();
        }
        let checked_in = std::fs::read_to_string(&header).unwrap_or_default();
        assert!(
            checked_in == fresh,
            "include/volmgr.h is stale: run VOLMGR_BLESS=1 cargo test -p volmgr-ffi header and commit it"
        );
    }
}
