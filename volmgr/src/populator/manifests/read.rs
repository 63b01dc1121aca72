//! Reading one manifest file: only regular files, at most
//! [`MAX_FILE_BYTES`], stat'ed first when already read so a rescan opens
//! nothing that did not change.

use std::ffi::OsStr;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode};

use super::parse::{parse_manifest, ParsedFile};

/// Files larger than this are refused.
pub(super) const MAX_FILE_BYTES: u64 = 8 << 20;

/// Change detector for one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileKey {
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileKey {
    fn of(st: &FileStat) -> Self {
        Self {
            ino: st.st_ino,
            size: u64::try_from(st.st_size).unwrap_or(0),
            mtime_ns: i128::from(st.st_mtime) * 1_000_000_000 + i128::from(st.st_mtime_nsec),
            ctime_ns: i128::from(st.st_ctime) * 1_000_000_000 + i128::from(st.st_ctime_nsec),
        }
    }
}

/// Whether `st` is a regular file.
fn is_regular(st: &FileStat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

/// What reading a file found.
pub(super) enum FileRead {
    Unchanged,
    Gone,
    Failed(Option<FileKey>, String),
    Parsed(FileKey, ParsedFile),
}

pub(super) fn read_file(
    dir: &std::fs::File,
    name: &OsStr,
    json: bool,
    known: Option<FileKey>,
) -> FileRead {
    let gone_or = |what: &str, e: Errno| {
        if e == Errno::ENOENT {
            FileRead::Gone
        } else {
            FileRead::Failed(None, format!("{what}: {}", std::io::Error::from(e)))
        }
    };
    // A file already read is only stat'ed (a rescan opens nothing that did
    // not change); a new one is opened at once and stat'ed through its
    // descriptor.
    if let Some(known) = known {
        match nix::sys::stat::fstatat(dir, name, AtFlags::empty()) {
            Ok(st) if is_regular(&st) && FileKey::of(&st) == known => return FileRead::Unchanged,
            Ok(st) if !is_regular(&st) => return FileRead::Gone,
            Ok(_) => {}
            Err(e) => return gone_or("stat", e),
        }
    }
    // O_NONBLOCK: a FIFO named like a manifest must not block the reader
    // (it is then found not to be a regular file); regular files ignore it.
    let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK;
    let mut file = match nix::fcntl::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => std::fs::File::from(fd),
        Err(e) => return gone_or("open", e),
    };
    let meta = match nix::sys::stat::fstat(&file) {
        Ok(m) => m,
        Err(e) => return gone_or("stat", e),
    };
    if !is_regular(&meta) {
        return FileRead::Gone;
    }
    let key = FileKey::of(&meta);
    if known == Some(key) {
        return FileRead::Unchanged;
    }
    let len = u64::try_from(meta.st_size).unwrap_or(0);
    if len > MAX_FILE_BYTES {
        return FileRead::Failed(
            Some(key),
            format!("file is larger than {MAX_FILE_BYTES} bytes"),
        );
    }
    let bytes = match read_sized(&mut file, len) {
        Ok(b) => b,
        Err(e) => return FileRead::Failed(Some(key), format!("read: {e}")),
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return FileRead::Failed(Some(key), "file is not valid UTF-8".into());
    };
    FileRead::Parsed(key, parse_manifest(&text, json))
}

/// Reads a regular file whose size `fstat` gave: one `read` of one byte more
/// than that size normally returns everything (a short read of a regular
/// file means end of file); a file that grew meanwhile is read on, up to
/// [`MAX_FILE_BYTES`] (its change is seen again through inotify).
fn read_sized(file: &mut std::fs::File, len: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let want = usize::try_from(len).unwrap_or(usize::MAX).saturating_add(1);
    let mut buf = vec![0u8; want];
    let mut filled = 0;
    loop {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => {
                filled += n;
                if filled < buf.len() {
                    break;
                }
                if buf.len() as u64 > MAX_FILE_BYTES {
                    return Err(std::io::Error::other(format!(
                        "file grew past {MAX_FILE_BYTES} bytes"
                    )));
                }
                buf.resize(buf.len() * 2, 0);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

/// Whether `name` is a manifest file: `Some(true)` for JSON, `Some(false)`
/// for YAML, `None` for other names (hidden files included).
pub(super) fn is_manifest_name(name: &std::ffi::OsStr) -> Option<bool> {
    let s = name.to_str()?;
    if s.starts_with('.') {
        return None;
    }
    if s.ends_with(".json") {
        Some(true)
    } else if s.ends_with(".yaml") || s.ends_with(".yml") {
        Some(false)
    } else {
        None
    }
}
