//! The manifests directory's parser on any bytes, as YAML and as JSON
//! (`populator::manifests::parse_manifest`): never a panic, and the YAML
//! depth guard bounds the work. The fast YAML reader
//! (`populator::manifests::block_yaml`) either gives up or reads the text
//! exactly as serde_norway does.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = volmgr::populator::manifests::parse_manifest(text, false);
        let _ = volmgr::populator::manifests::parse_manifest(text, true);
        if let Some(fast) = volmgr::populator::manifests::block_yaml::parse(text) {
            let slow = serde_norway::from_str::<serde_json::Value>(text).map_err(|e| e.to_string());
            assert_eq!(Ok(fast), slow, "block_yaml disagrees with serde_norway");
        }
    }
});
