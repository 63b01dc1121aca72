//! Reading directory entries straight with `getdents64(2)` on a descriptor
//! the caller keeps: no `fdopendir` (which costs an `fstat`, an `fcntl` and a
//! descriptor of its own), and the entry types come with the names, so a
//! recursive delete needs no `fstatat` per entry.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;

use nix::errno::Errno;

/// What an entry is, as far as the directory tells (`d_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// Anything else that is known not to be a directory.
    Other,
    /// The file system does not say (`DT_UNKNOWN`): ask `fstatat`.
    Unknown,
}

/// One entry (never `.` or `..`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The name.
    pub name: OsString,
    /// Its type.
    pub kind: EntryKind,
}

/// Size of the buffer of one `getdents64` call: holds about 100 typical entries.
const BUF_BYTES: usize = 8192;

/// Space a single record can take at most (19 bytes of header, a 255-byte
/// name and its NUL, rounded up to 8).
const MAX_RECORD: usize = 280;

/// One `getdents64` call's worth of entries.
#[derive(Debug, Default)]
pub struct Batch {
    /// The entries read.
    pub entries: Vec<DirEntry>,
    /// Whether the call reached the end of the directory: it left room for
    /// another record, so the kernel had no more to give at that moment.
    pub at_end: bool,
}

/// Reads the next batch of entries of the open directory `dir` (one
/// `getdents64` call).
pub fn read_batch(dir: BorrowedFd<'_>) -> Result<Batch, Errno> {
    // u64 words keep the records 8-byte aligned, as the kernel writes them.
    // Not zeroed first: the kernel writes what is read (zeroing 8 KiB for
    // each directory was a tenth of a teardown's instructions).
    let mut buf: Vec<u64> = Vec::with_capacity(BUF_BYTES / 8);
    // SAFETY: the buffer's capacity is writable for BUF_BYTES bytes and the
    // descriptor is borrowed for the call.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            dir.as_raw_fd(),
            buf.spare_capacity_mut().as_mut_ptr().cast::<libc::c_void>(),
            BUF_BYTES,
        )
    };
    let n = usize::try_from(n)
        .map_err(|_| Errno::last())?
        .min(BUF_BYTES);
    // SAFETY: the kernel initialized the first `n <= BUF_BYTES` bytes of the
    // buffer's capacity; only those are viewed, as bytes.
    let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
    Ok(Batch {
        at_end: n + MAX_RECORD <= BUF_BYTES,
        entries: parse(bytes),
    })
}

/// Reads every entry of the open directory `dir`, from its current offset to
/// the end.
pub fn read_all(dir: BorrowedFd<'_>) -> Result<Vec<DirEntry>, Errno> {
    let mut out = Vec::new();
    loop {
        let batch = read_batch(dir)?;
        if batch.entries.is_empty() {
            return Ok(out);
        }
        out.extend(batch.entries);
    }
}

/// Decodes `linux_dirent64` records: `d_ino: u64, d_off: i64,
/// d_reclen: u16, d_type: u8, d_name: [u8]` (NUL-terminated, padded).
fn parse(bytes: &[u8]) -> Vec<DirEntry> {
    const NAME_AT: usize = 19;
    let mut out = Vec::new();
    let mut at = 0;
    while at + NAME_AT <= bytes.len() {
        let reclen = usize::from(u16::from_ne_bytes([bytes[at + 16], bytes[at + 17]]));
        if reclen < NAME_AT || at + reclen > bytes.len() {
            break;
        }
        let d_type = bytes[at + 18];
        let raw = &bytes[at + NAME_AT..at + reclen];
        let name = raw.split(|b| *b == 0).next().unwrap_or_default();
        at += reclen;
        if name.is_empty() || name == b"." || name == b".." {
            continue;
        }
        let kind = match d_type {
            libc::DT_DIR => EntryKind::Dir,
            libc::DT_LNK => EntryKind::Symlink,
            libc::DT_UNKNOWN => EntryKind::Unknown,
            _ => EntryKind::Other,
        };
        out.push(DirEntry {
            name: std::ffi::OsStr::from_bytes(name).to_os_string(),
            kind,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn lists_names_and_types() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::fs::write(t.path().join("f"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc", t.path().join("l")).unwrap();
        for i in 0..300 {
            std::fs::write(
                t.path().join(format!("many-{i:03}-{}", "n".repeat(40))),
                b"",
            )
            .unwrap();
        }
        let dir = std::fs::File::open(t.path()).unwrap();
        let mut all = read_all(dir.as_fd()).unwrap();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(all.len(), 303);
        let kind = |n: &str| all.iter().find(|e| e.name == n).unwrap().kind;
        // tmpfs and ext4 both fill d_type.
        assert!(matches!(kind("d"), EntryKind::Dir | EntryKind::Unknown));
        assert!(matches!(kind("f"), EntryKind::Other | EntryKind::Unknown));
        assert!(matches!(kind("l"), EntryKind::Symlink | EntryKind::Unknown));
        assert!(read_batch(dir.as_fd()).unwrap().entries.is_empty());
        let small = tempfile::tempdir().unwrap();
        std::fs::write(small.path().join("one"), b"").unwrap();
        let dir = std::fs::File::open(small.path()).unwrap();
        let b = read_batch(dir.as_fd()).unwrap();
        assert_eq!(b.entries.len(), 1);
        assert!(b.at_end);
    }

    #[test]
    fn parse_stops_at_a_truncated_record() {
        assert!(parse(&[0u8; 10]).is_empty());
        let mut rec = vec![0u8; 24];
        rec[16] = 200; // reclen beyond the buffer
        assert!(parse(&rec).is_empty());
    }
}
