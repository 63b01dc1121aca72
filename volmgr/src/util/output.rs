//! Files the command-line tools write where the user says (`volmgr profile
//! --svg FILE`, `volmgr doctor --svg FILE`), often as root and often in a
//! shared directory such as `/tmp`, where another user may have planted a
//! symlink or a hard link at that name.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// How many temporary names are tried before giving up.
const ATTEMPTS: u32 = 64;

/// Writes `contents` to `path` by a new file in the same directory (created
/// with `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0644 less the umask) renamed
/// over `path`. Whatever is at `path` (a symlink or a hard link someone
/// planted there, or the previous run's output) is replaced, never written
/// through: no other file is followed or truncated, and readers see the
/// old file or the whole new one. `O_EXCL` alone would refuse to replace
/// the previous run's output. On failure the temporary file is removed.
pub fn replace_file(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let (tmp, mut file) = create_temporary(path)?;
    let written = file
        .write_all(contents)
        .and_then(|()| file.flush())
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A new file next to `path`, named after it, that did not exist before.
fn create_temporary(path: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"))?;
    let dir = path.parent().unwrap_or(Path::new(""));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mut last = std::io::Error::from(std::io::ErrorKind::AlreadyExists);
    for i in 0..ATTEMPTS {
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}.{nanos:08x}{i}.tmp", std::process::id()));
        let tmp = dir.join(tmp_name);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
        {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_planted_symlink_or_hard_link_is_replaced_not_written_through() {
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let out = t.path().join("out.svg");
        std::os::unix::fs::symlink(&victim, &out).unwrap();
        replace_file(&out, b"<svg/>").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert!(!std::fs::symlink_metadata(&out)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "<svg/>");
        // A hard link, then the previous output: replaced.
        std::fs::remove_file(&out).unwrap();
        std::fs::hard_link(&victim, &out).unwrap();
        replace_file(&out, b"<svg/>").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        replace_file(&out, b"<svg>2</svg>").unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "<svg>2</svg>");
        let left: Vec<_> = std::fs::read_dir(t.path()).unwrap().collect();
        assert_eq!(left.len(), 2, "no temporary file left: {left:?}");
    }
}
