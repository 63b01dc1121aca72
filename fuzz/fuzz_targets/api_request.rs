//! The local API's request lines (`volmgr status`, `wait`) on any bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = volmgr_cli::api::parse_request(data);
});
