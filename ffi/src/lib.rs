//! The C ABI of volmgr: `libvolmgr.a` / `libvolmgr.so` and `include/volmgr.h`
//! (generated from this crate by cbindgen). It mirrors the kubelet's
//! `VolumeManager` interface so a Go kubelet fork can link it through cgo.
//!
//! Boundary rules (after rustls-ffi): every entry point runs inside a panic
//! guard, checks every pointer, rejects invalid UTF-8 and malformed JSON with
//! `VOLMGR_ERR_INVALID_ARGUMENT` and a message for `volmgr_last_error`, and
//! writes out-pointers only on success.

#![allow(non_camel_case_types)]

mod boundary;
pub mod error;
pub mod manager;
pub mod plugin;
pub mod sub_paths;
pub mod token;
pub mod volume_list;

pub use error::*;
pub use manager::*;
pub use plugin::*;
pub use sub_paths::*;
pub use token::*;
pub use volume_list::*;

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
