//! The eBPF ring buffer records' decoder on any bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Some(ev) = volmgr::ebpf::decode::decode_record(data) {
        let _ = format!("{ev:?}");
    }
    if data.len() >= 8 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&data[..8]);
        let _ = volmgr::ebpf::decode::errno_name(i64::from_le_bytes(b));
    }
});
