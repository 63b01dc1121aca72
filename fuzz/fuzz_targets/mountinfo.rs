//! `/proc/self/mountinfo` parsing on any text, and the escape of a mount
//! point read back unchanged.
#![no_main]

use std::os::unix::ffi::OsStrExt;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let text = volmgr::sys::mountinfo::escape_invalid_utf8(data.to_vec());
    let _ = volmgr::sys::mountinfo::parse(&text);
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(data));
    if !data.is_empty() && !data.contains(&0) {
        let line = format!(
            "1 0 0:1 / {} rw - tmpfs t rw",
            volmgr::sys::mountinfo::escape(path)
        );
        let m = volmgr::sys::mountinfo::parse_line(&line).expect("an escaped path parses");
        assert_eq!(m.mount_point.as_os_str().as_bytes(), data);
    }
});
