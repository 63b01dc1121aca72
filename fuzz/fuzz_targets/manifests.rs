//! The manifests directory's parser on any bytes, as YAML and as JSON
//! (`populator::manifests::parse_manifest`): never a panic, and the YAML
//! depth guard bounds the work.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = volmgr::populator::manifests::parse_manifest(text, false);
        let _ = volmgr::populator::manifests::parse_manifest(text, true);
    }
});
