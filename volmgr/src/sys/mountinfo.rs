//! A parser for `/proc/<pid>/mountinfo` (proc(5)): one line per mount,
//!
//! ```text
//! 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//! (1)(2) (3)   (4)   (5)      (6)      (7)   (8) (9)    (10)         (11)
//! ```
//!
//! where (7) is zero or more optional fields ended by the `-` separator, and
//! paths escape space, tab, newline and backslash as octal (`\040`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Why the mount table could not be read or parsed.
#[derive(Debug, thiserror::Error)]
pub enum MountInfoError {
    /// Reading the file failed.
    #[error("read {path}: {source}")]
    Read {
        /// The file that was read.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A line did not have the documented shape.
    #[error("mountinfo line {line}: {reason}: {text:?}")]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        reason: &'static str,
        /// The offending line.
        text: String,
    },
}

/// One mount, as the kernel describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// Unique id of the mount (may be reused after unmount).
    pub mount_id: u32,
    /// Id of the parent mount.
    pub parent_id: u32,
    /// `st_dev` major number of files on this file system.
    pub major: u32,
    /// `st_dev` minor number.
    pub minor: u32,
    /// Path of the directory in the file system that forms the root of this mount.
    pub root: PathBuf,
    /// Mount point, relative to the process's root directory.
    pub mount_point: PathBuf,
    /// Per-mount options (`rw,nosuid,...`).
    pub mount_options: String,
    /// Optional fields (`shared:N`, `master:N`, `propagate_from:N`, `unbindable`).
    pub optional_fields: Vec<String>,
    /// File system type (`tmpfs`, `ext4`, `fuse.sshfs`, ...).
    pub fstype: String,
    /// File-system-specific source (`/dev/loop0`, `tmpfs`, ...).
    pub source: String,
    /// Per-superblock options (`rw,size=65536k`, ...).
    pub super_options: String,
}

impl MountInfo {
    /// Whether the mount is read-only (per-mount flag).
    pub fn read_only(&self) -> bool {
        self.mount_options.split(',').any(|o| o == "ro")
    }

    /// The value of a per-superblock option such as `size`.
    pub fn super_option(&self, key: &str) -> Option<&str> {
        self.super_options.split(',').find_map(|o| {
            let (k, v) = o.split_once('=')?;
            (k == key).then_some(v)
        })
    }
}

/// The mount table of the calling process's mount namespace.
pub const SELF_MOUNTINFO: &str = "/proc/self/mountinfo";

/// Reads and parses `/proc/self/mountinfo`.
pub fn read_self() -> Result<Vec<MountInfo>, MountInfoError> {
    read(Path::new(SELF_MOUNTINFO))
}

/// Size of the last mountinfo read. The next read's buffer starts a little
/// larger, so a table of 10,000 mounts (about 1 MB) is read in place instead
/// of through a buffer doubled (copied, and its new pages faulted in) a
/// dozen times on every resync.
static LAST_READ_BYTES: AtomicUsize = AtomicUsize::new(0);

/// Reads and parses a mountinfo file.
pub fn read(path: &Path) -> Result<Vec<MountInfo>, MountInfoError> {
    use std::io::Read;
    let err = |source| MountInfoError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(err)?;
    let hint = LAST_READ_BYTES.load(Ordering::Relaxed);
    let mut buf = Vec::with_capacity(hint + hint / 8 + 4096);
    file.read_to_end(&mut buf).map_err(err)?;
    LAST_READ_BYTES.store(buf.len(), Ordering::Relaxed);
    parse(&escape_invalid_utf8(buf))
}

/// Parses the text of a mountinfo file.
pub fn parse(text: &str) -> Result<Vec<MountInfo>, MountInfoError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| parse_line(l).map_err(|reason| malformed(i + 1, reason, l)))
        .collect()
}

fn malformed(line: usize, reason: &'static str, text: &str) -> MountInfoError {
    MountInfoError::Malformed {
        line,
        reason,
        text: text.to_string(),
    }
}

/// Parses one line of mountinfo.
pub fn parse_line(line: &str) -> Result<MountInfo, &'static str> {
    let mut fields = line.split(' ');
    let mut next = |what: &'static str| fields.next().ok_or(what);
    let mount_id = next("missing mount id")?
        .parse()
        .map_err(|_| "bad mount id")?;
    let parent_id = next("missing parent id")?
        .parse()
        .map_err(|_| "bad parent id")?;
    let (major, minor) = next("missing major:minor")?
        .split_once(':')
        .ok_or("bad major:minor")?;
    let major = major.parse().map_err(|_| "bad major")?;
    let minor = minor.parse().map_err(|_| "bad minor")?;
    let root = unescape(next("missing root")?)?;
    let mount_point = unescape(next("missing mount point")?)?;
    let mount_options = next("missing mount options")?.to_string();
    let mut optional_fields = Vec::new();
    loop {
        match next("missing separator")? {
            "-" => break,
            f => optional_fields.push(f.to_string()),
        }
    }
    let fstype = unescape_string(next("missing fstype")?)?;
    let source = unescape_string(next("missing source")?)?;
    let super_options = next("missing super options")?.to_string();
    Ok(MountInfo {
        mount_id,
        parent_id,
        major,
        minor,
        root: PathBuf::from(root),
        mount_point: PathBuf::from(mount_point),
        mount_options,
        optional_fields,
        fstype,
        source,
        super_options,
    })
}

/// Decodes the kernel's `\ooo` octal escapes. Paths may hold any byte but NUL,
/// so the result is an `OsString`.
fn unescape(field: &str) -> Result<std::ffi::OsString, &'static str> {
    use std::os::unix::ffi::OsStringExt;
    let bytes = field.as_bytes();
    if !bytes.contains(&b'\\') {
        return Ok(field.into());
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            let digits = bytes.get(i + 1..i + 4).ok_or("truncated escape")?;
            if !digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                return Err("bad escape");
            }
            let value = digits
                .iter()
                .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
            out.push(u8::try_from(value).map_err(|_| "escape out of range")?);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Ok(std::ffi::OsString::from_vec(out))
}

fn unescape_string(field: &str) -> Result<String, &'static str> {
    if !field.contains('\\') {
        return Ok(field.to_string());
    }
    Ok(unescape(field)?.to_string_lossy().into_owned())
}

/// Escapes a path the way the kernel does in mountinfo (for tests and
/// tools): space, tab, newline and backslash as `\ooo`. Bytes that are not
/// UTF-8 (the kernel writes them raw) are `\ooo` too, so the text is a
/// `String` that [`parse`] turns back into the same path.
pub fn escape(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for chunk in path.as_os_str().as_bytes().utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                ' ' | '\t' | '\n' | '\\' => push_octal(&mut out, c as u8),
                _ => out.push(c),
            }
        }
        for &b in chunk.invalid() {
            push_octal(&mut out, b);
        }
    }
    out
}

fn push_octal(out: &mut String, b: u8) {
    use std::fmt::Write;
    let _ = write!(out, "\\{b:03o}");
}

/// The text of a mountinfo file whose bytes may not all be UTF-8 (a mount
/// point is any byte string): invalid bytes become `\ooo` escapes, which
/// the path fields' unescaping turns back into the same bytes. One odd
/// mount point never makes the whole table unreadable.
pub fn escape_invalid_utf8(buf: Vec<u8>) -> String {
    match String::from_utf8(buf) {
        Ok(s) => s,
        Err(e) => {
            let bytes = e.into_bytes();
            let mut out = String::with_capacity(bytes.len() + 64);
            for chunk in bytes.utf8_chunks() {
                out.push_str(chunk.valid());
                for &b in chunk.invalid() {
                    push_octal(&mut out, b);
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mount point that is not UTF-8, or not ASCII, survives the escape
    /// and the parse; a file holding such a line is read whole.
    #[test]
    fn non_utf8_and_non_ascii_mount_points_round_trip() {
        use std::os::unix::ffi::OsStrExt;
        for raw in [&b"/mnt/caf\xc3\xa9 x"[..], &b"/mnt/\xff\xfe\\n"[..]] {
            let path = Path::new(std::ffi::OsStr::from_bytes(raw));
            let line = format!("1 0 0:1 / {} rw - tmpfs t rw", escape(path));
            assert_eq!(parse_line(&line).unwrap().mount_point, path, "{line}");
        }
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("mountinfo");
        let mut text = b"1 0 0:1 / / rw - tmpfs t rw\n2 1 0:2 / /mnt/".to_vec();
        text.extend_from_slice(b"\xff\xfe rw - tmpfs u rw\n");
        std::fs::write(&file, text).unwrap();
        let table = read(&file).unwrap();
        assert_eq!(table.len(), 2);
        assert_eq!(
            table[1].mount_point.as_os_str().as_bytes(),
            b"/mnt/\xff\xfe"
        );
    }

    #[test]
    fn parses_the_man_page_example() {
        let m = parse_line(
            "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue",
        )
        .unwrap();
        assert_eq!(m.mount_id, 36);
        assert_eq!(m.parent_id, 35);
        assert_eq!((m.major, m.minor), (98, 0));
        assert_eq!(m.root, Path::new("/mnt1"));
        assert_eq!(m.mount_point, Path::new("/mnt2"));
        assert_eq!(m.optional_fields, vec!["master:1"]);
        assert_eq!(m.fstype, "ext3");
        assert_eq!(m.source, "/dev/root");
        assert_eq!(m.super_option("errors"), Some("continue"));
        assert!(!m.read_only());
    }

    #[test]
    fn no_and_several_optional_fields() {
        let m = parse_line("1 0 0:1 / / ro - tmpfs none rw").unwrap();
        assert!(m.optional_fields.is_empty());
        assert!(m.read_only());
        let m = parse_line("2 1 0:2 / /x rw shared:3 master:4 unbindable - tmpfs t rw,size=64k")
            .unwrap();
        assert_eq!(
            m.optional_fields,
            vec!["shared:3", "master:4", "unbindable"]
        );
        assert_eq!(m.super_option("size"), Some("64k"));
    }

    #[test]
    fn decodes_octal_escapes() {
        let m = parse_line(r"3 1 0:3 / /a\040b\011c\012d\134e rw - tmpfs my\040src rw").unwrap();
        assert_eq!(m.mount_point, Path::new("/a b\tc\nd\\e"));
        assert_eq!(m.source, "my src");
        assert_eq!(escape(&m.mount_point), r"/a\040b\011c\012d\134e");
    }

    #[test]
    fn non_utf8_bytes_survive() {
        use std::os::unix::ffi::OsStrExt;
        let m = parse_line(r"3 1 0:3 / /x\377y rw - tmpfs t rw").unwrap();
        assert_eq!(m.mount_point.as_os_str().as_bytes(), b"/x\xffy");
    }

    #[test]
    fn rejects_malformed_lines() {
        assert!(parse_line("").is_err());
        assert!(parse_line("1 0 0:1 / / rw tmpfs none rw").is_err());
        assert!(parse_line("x 0 0:1 / / rw - tmpfs none rw").is_err());
        assert!(parse_line(r"1 0 0:1 / /a\09 rw - tmpfs none rw").is_err());
        assert!(parse_line(r"1 0 0:1 / /a\0 rw - tmpfs none rw").is_err());
        let err = parse("1 0 0:1 / / rw - tmpfs none rw\nbroken\n").unwrap_err();
        assert!(matches!(err, MountInfoError::Malformed { line: 2, .. }));
    }

    #[test]
    fn reads_a_table_larger_than_the_last_one_read() {
        // The buffer starts at the last read's size: a table that grew
        // since (or a first, larger one) is still read whole.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("mountinfo");
        let line = |i: usize| format!("{i} 1 0:{i} / /m/d{i} rw - tmpfs tmpfs rw,size=16384k\n");
        std::fs::write(&f, line(1)).unwrap();
        assert_eq!(read(&f).unwrap().len(), 1);
        let big: String = (0..5000).map(line).collect();
        std::fs::write(&f, &big).unwrap();
        let table = read(&f).unwrap();
        assert_eq!(table.len(), 5000);
        assert_eq!(table[4999].mount_point, Path::new("/m/d4999"));
        // Not UTF-8: read, the path's bytes kept (not a read error that
        // would hide every other mount).
        std::fs::write(&f, b"1 0 0:1 / /\xff rw - tmpfs none rw\n").unwrap();
        assert_eq!(read(&f).unwrap().len(), 1);
    }

    #[test]
    fn reads_this_process_table() {
        let table = read_self().unwrap();
        assert!(table.iter().any(|m| m.mount_point == Path::new("/")));
    }
}
