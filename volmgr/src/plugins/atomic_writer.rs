//! The kubelet's atomic writer (`pkg/volume/util/atomic_writer.go`), with
//! its on-disk layout, so tools that read configMap and secret volumes keep
//! working:
//!
//! ```text
//! <volume>/..2026_11_23_22_31_34.123456789/   the payload (a new one per change)
//! <volume>/..data -> ..2026_11_23_22_31_34.123456789
//! <volume>/key    -> ..data/key               one per top-level name
//! ```
//!
//! An update writes the whole payload into a new `..<timestamp>` directory
//! (files fsynced, then the directory), points a `..data_tmp` symlink at it
//! and renames that over `..data`: one `rename(2)`, so a reader that opens
//! `key` (through `..data`) sees either the old payload or the new one, never
//! a mix, never a missing file. User-visible symlinks are added for new
//! names, those of names gone are removed, then every other `..` entry is
//! deleted: the previous payload right after the swap, as the kubelet does
//! (a rotated-out secret — a revoked credential — must not stay readable
//! in the pod's volume), and whatever older payloads or half-written ones a
//! crash left behind. A reader that resolved `..data` just before the swap
//! can then get `ENOENT` for a file of the previous payload (as with the
//! kubelet); opening the name again finds the new one. Nothing is rewritten
//! when the payload is the same as what `..data` holds (and then leftovers
//! are removed too, so the set-up after a restart cleans up after a crash
//! between the swap and the removal).
//!
//! Every call works relative to the volume directory's descriptor, never
//! follows a symlink (`O_NOFOLLOW`, `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`)
//! and stays on the volume's mount: nothing outside the volume is touched.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstat, mkdirat, Mode};
use nix::unistd::{fchown, fchownat, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};

use crate::sys::beneath::{self, Last};
use crate::sys::dirents::{self, EntryKind};
use crate::sys::root_dir::{PathError, RootDir};
use crate::sys::{SyscallError, Target};
use crate::volume::PayloadFile;

/// The symlink to the current payload directory.
pub const DATA_DIR_NAME: &str = "..data";
/// The symlink renamed over [`DATA_DIR_NAME`].
const NEW_DATA_DIR_NAME: &str = "..data_tmp";
/// The kubelet's limits on a payload path and on one of its components.
const MAX_PATH_LENGTH: usize = 4096;
const MAX_FILE_NAME_LENGTH: usize = 255;
/// Most files in one payload. Above the keys any one ConfigMap or Secret
/// the API server accepts can hold (a request body is at most 3 MiB, and
/// each key takes at least 7 bytes of it, `"k":"",`: about 450,000), so a
/// valid object is never refused; it bounds the memory and work of one
/// volume, the manifests directory's included (no API server bounds its
/// objects).
pub const MAX_PAYLOAD_FILES: usize = 1 << 19;
/// Most bytes (paths and contents) in one payload: 64 MiB, the data of 21
/// objects at the API server's 3 MiB request limit (a ConfigMap's or a
/// Secret's data is at most 1 MiB by the API's validation).
pub const MAX_PAYLOAD_BYTES: usize = 64 << 20;

/// Why a payload could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    /// A path in the payload is not allowed (absolute, `..`, too long).
    #[error("invalid payload path {path:?}: {why}")]
    InvalidPath {
        /// The path.
        path: String,
        /// Why.
        why: &'static str,
    },
    /// The payload is over [`MAX_PAYLOAD_FILES`] or [`MAX_PAYLOAD_BYTES`].
    #[error("the payload has {files} files and {bytes} bytes, more than a volume may hold ({MAX_PAYLOAD_FILES} files, {MAX_PAYLOAD_BYTES} bytes)")]
    TooLarge {
        /// Its files.
        files: usize,
        /// Its bytes (paths and contents).
        bytes: usize,
    },
    /// A file of the volume could not be written or read.
    #[error(transparent)]
    Syscall(#[from] SyscallError),
    /// A directory of the volume could not be used.
    #[error(transparent)]
    Path(#[from] PathError),
}

/// Checks one payload path the kubelet's way (`validatePath`): not
/// absolute, no `..` component, the first component not starting with
/// `..`, within the length limits. Returns its components (empty and `.`
/// components dropped, as `path.Clean` does).
pub fn validate_path(path: &str) -> Result<Vec<&str>, WriterError> {
    let bad = |why| WriterError::InvalidPath {
        path: path.to_string(),
        why,
    };
    if path.len() > MAX_PATH_LENGTH {
        return Err(bad("longer than 4096 bytes"));
    }
    if path.starts_with('/') {
        return Err(bad("must be a relative path"));
    }
    if path.contains('\0') {
        return Err(bad("must not contain NUL"));
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(bad("must not contain '..'"));
    }
    if parts.iter().any(|c| c.len() > MAX_FILE_NAME_LENGTH) {
        return Err(bad("a component is longer than 255 bytes"));
    }
    match parts.first() {
        None => Err(bad("must not be empty")),
        Some(first) if first.starts_with("..") => Err(bad("must not start with '..'")),
        Some(_) => Ok(parts),
    }
}

/// The bytes of a payload: its paths and contents.
pub fn payload_bytes(payload: &BTreeMap<String, PayloadFile>) -> usize {
    payload.iter().map(|(p, f)| p.len() + f.data.len()).sum()
}

/// Whether a payload of `files` files and `bytes` bytes is within
/// [`MAX_PAYLOAD_FILES`] and [`MAX_PAYLOAD_BYTES`].
pub fn check_size(files: usize, bytes: usize) -> Result<(), WriterError> {
    if files > MAX_PAYLOAD_FILES || bytes > MAX_PAYLOAD_BYTES {
        return Err(WriterError::TooLarge { files, bytes });
    }
    Ok(())
}

/// Checks every path of a payload, and that no file is also a directory
/// of another (`a` and `a/b`). Returns the payload keyed by cleaned path.
fn clean_payload(
    payload: &BTreeMap<String, PayloadFile>,
) -> Result<BTreeMap<String, &PayloadFile>, WriterError> {
    check_size(payload.len(), payload_bytes(payload))?;
    let mut out = BTreeMap::new();
    let mut dirs = BTreeSet::new();
    for (p, f) in payload {
        let parts = validate_path(p)?;
        for i in 1..parts.len() {
            dirs.insert(parts[..i].join("/"));
        }
        if out.insert(parts.join("/"), f).is_some() {
            return Err(WriterError::InvalidPath {
                path: p.clone(),
                why: "given twice",
            });
        }
    }
    if let Some(p) = dirs.iter().find(|d| out.contains_key(*d)) {
        return Err(WriterError::InvalidPath {
            path: p.clone(),
            why: "is both a file and a directory",
        });
    }
    Ok(out)
}

/// Ownership applied to what is written: the kubelet's
/// `SetVolumeOwnership` for a read-only volume (group `fsGroup`, files
/// `| 0440`, directories `| 02550`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Ownership {
    /// `fsGroup`, if the pod sets one.
    pub fs_group: Option<u32>,
}

impl Ownership {
    fn file_mode(self, mode: u32) -> u32 {
        let mode = mode & 0o7777;
        match self.fs_group {
            Some(_) => mode | 0o440,
            None => mode,
        }
    }

    fn dir_mode(self, mode: u32) -> u32 {
        match self.fs_group {
            Some(_) => mode | 0o2550,
            None => mode,
        }
    }

    /// Owner `user` (a file's `fs_user`) and group `fsGroup`, where given,
    /// then `mode` (after the `fchown`, which clears set-id bits).
    fn apply(
        self,
        fd: BorrowedFd<'_>,
        mode: u32,
        user: Option<u32>,
        what: &Path,
    ) -> Result<(), SyscallError> {
        if user.is_some() || self.fs_group.is_some() {
            let (uid, gid) = (user.map(Uid::from_raw), self.fs_group.map(Gid::from_raw));
            fchown(fd, uid, gid).map_err(|e| SyscallError::new("fchown", what, e))?;
        }
        fchmod(fd, Mode::from_bits_truncate(mode)).map_err(|e| SyscallError::new("fchmod", what, e))
    }
}

/// What [`write`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The payload was already there: nothing was rewritten.
    Unchanged,
    /// A new payload directory was written and swapped in.
    Written {
        /// Its name (`..<timestamp>`).
        dir: String,
    },
}

/// The kubelet's `AtomicWriter.Write`: makes the volume directory `dir`
/// (opened beneath ROOT) hold exactly `payload`.
pub fn write(
    root: &RootDir,
    dir: &Target,
    payload: &BTreeMap<String, PayloadFile>,
    owner: Ownership,
) -> Result<WriteOutcome, WriterError> {
    let clean = clean_payload(payload)?;
    let old = current_payload_dir(dir)?;
    let unchanged = match &old {
        Some(old) => same_payload(dir, old, &clean, owner)?,
        None => false,
    };
    let outcome = if unchanged {
        WriteOutcome::Unchanged
    } else {
        let ts = new_payload_dir(dir)?;
        let swapped =
            fill_payload_dir(dir, &ts, &clean, owner).and_then(|()| swap_data_link(dir, &ts));
        if let Err(e) = swapped {
            discard_failed(root, dir);
            return Err(e);
        }
        WriteOutcome::Written {
            dir: ts.to_string_lossy().into_owned(),
        }
    };
    let visible: BTreeSet<&str> = clean.keys().filter_map(|p| p.split('/').next()).collect();
    update_user_visible(dir, &visible, owner)?;
    // The kubelet's step 11: the previous payload goes right after the
    // swap, with anything older a crash left. Only `..data`'s target stays.
    let keep = match &outcome {
        WriteOutcome::Written { dir } => OsString::from(dir),
        WriteOutcome::Unchanged => old.unwrap_or_default(),
    };
    remove_stale(root, dir, &keep)?;
    Ok(outcome)
}

/// The payload directory `..data` points at, if any (and only if it is a
/// `..` name in the volume directory itself).
fn current_payload_dir(dir: &Target) -> Result<Option<OsString>, WriterError> {
    match nix::fcntl::readlinkat(dir.as_fd(), DATA_DIR_NAME) {
        Ok(t) if t.as_bytes().starts_with(b"..") && !t.as_bytes().contains(&b'/') => Ok(Some(t)),
        Ok(_) => Ok(None),
        Err(Errno::ENOENT) | Err(Errno::EINVAL) => Ok(None),
        Err(e) => Err(sys("readlinkat", dir, DATA_DIR_NAME, e).into()),
    }
}

fn sys(call: &'static str, dir: &Target, name: impl AsRef<OsStr>, e: Errno) -> SyscallError {
    SyscallError::new(call, dir.path().join(name.as_ref()), e)
}

/// Whether payload directory `old` holds exactly `clean` (same paths, bytes
/// and modes as `owner` gives them, and owners where a file names one).
fn same_payload(
    dir: &Target,
    old: &OsStr,
    clean: &BTreeMap<String, &PayloadFile>,
    owner: Ownership,
) -> Result<bool, WriterError> {
    let old_fd = match beneath::open(dir.as_fd(), Path::new(old), dir_flags(), Last::OnSameMount) {
        Ok(fd) => fd,
        // Gone, or replaced by something else than a directory: rewrite.
        Err(Errno::ENOENT | Errno::ELOOP | Errno::ENOTDIR) => return Ok(false),
        Err(e) => return Err(sys("open", dir, old, e).into()),
    };
    let mut listed = BTreeSet::new();
    if !list_files(old_fd.as_fd(), "", &mut listed)? {
        return Ok(false);
    }
    if listed.len() != clean.len() || listed.iter().any(|p| !clean.contains_key(p)) {
        return Ok(false);
    }
    for (p, f) in clean {
        let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let fd = beneath::open(old_fd.as_fd(), Path::new(p), flags, Last::OnSameMount)
            .map_err(|e| sys("open", dir, Path::new(old).join(p), e))?;
        let st = fstat(&fd).map_err(|e| sys("fstat", dir, p, e))?;
        let owner_differs = f.fs_user.is_some_and(|u| st.st_uid != u);
        if st.st_mode & 0o7777 != owner.file_mode(f.mode)
            || st.st_size as usize != f.data.len()
            || owner_differs
        {
            return Ok(false);
        }
        let mut have = Vec::with_capacity(f.data.len());
        std::fs::File::from(fd)
            .take(f.data.len() as u64 + 1)
            .read_to_end(&mut have)
            .map_err(|e| SyscallError::io("read", dir.path().join(p), e))?;
        if have[..] != f.data[..] {
            return Ok(false);
        }
    }
    Ok(true)
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC
}

/// Adds the relative paths of the regular files under `fd` to `out`.
/// Returns `false` (stop: not the same payload) on anything else than
/// regular files and directories, or past [`MAX_PAYLOAD_FILES`].
fn list_files(
    fd: BorrowedFd<'_>,
    prefix: &str,
    out: &mut BTreeSet<String>,
) -> Result<bool, WriterError> {
    let entries =
        dirents::read_all(fd).map_err(|e| SyscallError::new("getdents64", Path::new(prefix), e))?;
    for e in entries {
        let Some(name) = e.name.to_str() else {
            return Ok(false);
        };
        let rel = if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}/{name}")
        };
        if out.len() > MAX_PAYLOAD_FILES {
            return Ok(false);
        }
        match e.kind {
            EntryKind::Dir => {
                let sub = beneath::open(fd, Path::new(name), dir_flags(), Last::OnSameMount)
                    .map_err(|e| SyscallError::new("open", Path::new(&rel), e))?;
                if !list_files(sub.as_fd(), &rel, out)? {
                    return Ok(false);
                }
            }
            EntryKind::Other => {
                out.insert(rel);
            }
            EntryKind::Symlink | EntryKind::Unknown => return Ok(false),
        }
    }
    Ok(true)
}

/// A new `..<UTC timestamp>.<nanoseconds>` directory name (the kubelet's
/// `..2006_01_02_15_04_05.` prefix).
fn timestamp_name(attempt: u32) -> String {
    let now = std::time::SystemTime::now();
    let nanos = now
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    // `2026-11-23T22:31:34.123Z` → `2026_11_23_22_31_34`.
    let stamp: String = crate::cache::out_of_band::rfc3339(now)
        .chars()
        .take(19)
        .map(|c| if c.is_ascii_digit() { c } else { '_' })
        .collect();
    let suffix = match attempt {
        0 => String::new(),
        n => format!("_{n}"),
    };
    format!("..{stamp}.{nanos:09}{suffix}")
}

/// Payloads of up to this many files are synced file by file (`fsync`);
/// larger ones with one `syncfs(2)` once written: 10,000 `fsync`s on a busy
/// ext4 disk take a minute, one `syncfs` a fraction of it.
const FSYNC_EACH_MAX: usize = 64;

/// Creates a new, empty payload directory (`..<timestamp>`) in `dir`.
/// Returns its name.
fn new_payload_dir(dir: &Target) -> Result<OsString, WriterError> {
    let mut attempt = 0;
    loop {
        let name = timestamp_name(attempt);
        match mkdirat(dir.as_fd(), name.as_str(), Mode::from_bits_truncate(0o700)) {
            Ok(()) => return Ok(OsString::from(name)),
            Err(Errno::EEXIST) if attempt < 100 => attempt += 1,
            Err(e) => return Err(sys("mkdirat", dir, &name, e).into()),
        }
    }
}

/// After a write that failed (a full disk, an I/O error): what a
/// successful write ends with, [`remove_stale`], keeping whatever payload
/// `..data` points at (the old one, or the new one if the swap happened and
/// only the sync after it failed); nothing if `..data` cannot be read. The
/// payload directory the write made and a `..data_tmp` go, so a failed
/// write leaves the volume as it was, with nothing half-written to eat
/// what space comes back, and the retries of a volume on a full disk do not
/// pile up payloads. (The kubelet's writer leaves the directory of a
/// payload it could not write: its step 6 returns the error as is.) Best
/// effort: the error returned is the write's.
fn discard_failed(root: &RootDir, dir: &Target) {
    let Ok(current) = current_payload_dir(dir) else {
        return;
    };
    if let Err(e) = remove_stale(root, dir, &current.unwrap_or_default()) {
        tracing::warn!(dir = %dir.path().display(), error = %e, "cannot clean up after a failed write");
    }
}

/// Writes `clean` into the new payload directory `name` of `dir`, every
/// file and directory synced.
fn fill_payload_dir(
    dir: &Target,
    name: &OsStr,
    clean: &BTreeMap<String, &PayloadFile>,
    owner: Ownership,
) -> Result<(), WriterError> {
    let ts = open_dir_at(dir.as_fd(), Path::new(name)).map_err(|e| sys("open", dir, name, e))?;
    let each = clean.len() <= FSYNC_EACH_MAX;
    let sync = |fd: &OwnedFd| nix::unistd::fsync(fd).map_err(|e| sys("fsync", dir, name, e));
    // The directory of the last file written (one descriptor open at a
    // time, however many directories; files of one directory are mostly
    // next to each other in path order), synced when left.
    let mut current: Option<(&str, OwnedFd)> = None;
    for (p, f) in clean {
        let (parent, file) = match p.rsplit_once('/') {
            Some((parent, file)) => (Some(parent), file),
            None => (None, p.as_str()),
        };
        let pfd = match parent {
            None => ts.as_fd(),
            Some(parent) => {
                if current.as_ref().is_none_or(|(d, _)| *d != parent) {
                    if let (Some((_, fd)), true) = (current.take(), each) {
                        sync(&fd)?;
                    }
                    let fd = make_dirs(ts.as_fd(), parent, owner)
                        .map_err(|e| sys("mkdirat", dir, Path::new(name).join(parent), e))?;
                    current = Some((parent, fd));
                }
                current.as_ref().map_or(ts.as_fd(), |(_, fd)| fd.as_fd())
            }
        };
        write_file(pfd, file, f, owner, each)
            .map_err(|e| sys("write", dir, Path::new(name).join(p), e))?;
    }
    if let (Some((_, fd)), true) = (current.take(), each) {
        sync(&fd)?;
    }
    owner.apply(
        ts.as_fd(),
        owner.dir_mode(0o755),
        None,
        &dir.path().join(name),
    )?;
    match each {
        true => sync(&ts)?,
        false => nix::unistd::syncfs(&ts).map_err(|e| sys("syncfs", dir, name, e))?,
    }
    Ok(())
}

fn open_dir_at(parent: BorrowedFd<'_>, name: &Path) -> Result<OwnedFd, Errno> {
    beneath::open(parent, name, dir_flags(), Last::OnSameMount)
}

/// Creates the directories of `rel` (a checked path) under `ts`, each
/// 0755 (plus ownership), and opens the last.
fn make_dirs(ts: BorrowedFd<'_>, rel: &str, owner: Ownership) -> Result<OwnedFd, Errno> {
    let mut path = std::path::PathBuf::new();
    let mut last = None;
    for c in rel.split('/') {
        path.push(c);
        match mkdirat(ts, &path, Mode::from_bits_truncate(0o700)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(e),
        }
        let fd = open_dir_at(ts, &path)?;
        owner
            .apply(fd.as_fd(), owner.dir_mode(0o755), None, &path)
            .map_err(|e| Errno::from_raw(e.errno().unwrap_or(libc::EIO)))?;
        last = Some(fd);
    }
    last.ok_or(Errno::EINVAL)
}

/// Writes one file (synced when `sync`).
fn write_file(
    parent: BorrowedFd<'_>,
    name: &str,
    f: &PayloadFile,
    owner: Ownership,
    sync: bool,
) -> Result<(), Errno> {
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::openat(parent, name, flags, Mode::from_bits_truncate(0o600))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(&f.data)
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    owner
        .apply(
            file.as_fd(),
            owner.file_mode(f.mode),
            f.fs_user,
            Path::new(name),
        )
        .map_err(|e| Errno::from_raw(e.errno().unwrap_or(libc::EIO)))?;
    if !sync {
        return Ok(());
    }
    file.sync_all()
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
}

/// Points `..data` at `ts` with one rename of a fresh `..data_tmp` symlink,
/// then syncs the volume directory.
fn swap_data_link(dir: &Target, ts: &OsStr) -> Result<(), WriterError> {
    match unlinkat(dir.as_fd(), NEW_DATA_DIR_NAME, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(e) => return Err(sys("unlinkat", dir, NEW_DATA_DIR_NAME, e).into()),
    }
    symlinkat(ts, dir.as_fd(), NEW_DATA_DIR_NAME)
        .map_err(|e| sys("symlinkat", dir, NEW_DATA_DIR_NAME, e))?;
    crate::failpoint::hit("atomic_writer.before_swap");
    nix::fcntl::renameat(dir.as_fd(), NEW_DATA_DIR_NAME, dir.as_fd(), DATA_DIR_NAME)
        .map_err(|e| sys("renameat", dir, DATA_DIR_NAME, e))?;
    sync_dir(dir)
}

/// The volume directory opened for reading (`dir` is an `O_PATH` descriptor).
fn open_self(dir: &Target) -> Result<OwnedFd, WriterError> {
    Ok(
        nix::fcntl::openat(dir.as_fd(), ".", dir_flags(), Mode::empty())
            .map_err(|e| sys("open", dir, ".", e))?,
    )
}

fn sync_dir(dir: &Target) -> Result<(), WriterError> {
    let fd = open_self(dir)?;
    nix::unistd::fsync(&fd).map_err(|e| sys("fsync", dir, ".", e))?;
    Ok(())
}

/// Adds a `name -> ..data/name` symlink for each visible name that has
/// none, and removes the symlinks into `..data/` of names no longer in the
/// payload. Other entries (not made by the writer) are left alone.
fn update_user_visible(
    dir: &Target,
    visible: &BTreeSet<&str>,
    owner: Ownership,
) -> Result<(), WriterError> {
    let listing = open_self(dir)?;
    let entries = dirents::read_all(listing.as_fd()).map_err(|e| sys("getdents64", dir, ".", e))?;
    let present: BTreeSet<OsString> = entries.iter().map(|e| e.name.clone()).collect();
    for name in visible {
        if present.contains(OsStr::new(name)) {
            continue;
        }
        let target = format!("{DATA_DIR_NAME}/{name}");
        symlinkat(target.as_str(), dir.as_fd(), *name)
            .map_err(|e| sys("symlinkat", dir, name, e))?;
        if let Some(gid) = owner.fs_group {
            fchownat(
                dir.as_fd(),
                *name,
                None,
                Some(Gid::from_raw(gid)),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|e| sys("fchownat", dir, name, e))?;
        }
    }
    for e in entries.iter().filter(|e| e.kind == EntryKind::Symlink) {
        let name = e.name.as_bytes();
        let wanted = std::str::from_utf8(name).is_ok_and(|s| visible.contains(s));
        if name.starts_with(b"..") || wanted {
            continue;
        }
        let ours = nix::fcntl::readlinkat(dir.as_fd(), e.name.as_os_str())
            .is_ok_and(|t| t.as_bytes().starts_with(b"..data/"));
        if ours {
            match unlinkat(dir.as_fd(), e.name.as_os_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(err) => return Err(sys("unlinkat", dir, &e.name, err).into()),
            }
        }
    }
    sync_dir(dir)
}

/// Removes every `..` entry but `..data` and the payload `keep` it points
/// at: the previous payload, and whatever a crash left behind (older
/// payloads, a half-written one, a `..data_tmp`).
fn remove_stale(root: &RootDir, dir: &Target, keep: &OsStr) -> Result<(), WriterError> {
    let listing = open_self(dir)?;
    let entries = dirents::read_all(listing.as_fd()).map_err(|e| sys("getdents64", dir, ".", e))?;
    for e in entries {
        let n = e.name.as_bytes();
        if !n.starts_with(b"..") || n == DATA_DIR_NAME.as_bytes() || e.name == keep {
            continue;
        }
        root.remove_all_at(dir, &e.name)?;
    }
    Ok(())
}

#[cfg(test)]
mod kubelet_scenarios;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::sync::Arc;

    use crate::sys::root_dir::RelPath;

    fn file(data: &str, mode: u32) -> PayloadFile {
        PayloadFile {
            data: Arc::from(data.as_bytes()),
            mode,
            fs_user: None,
        }
    }

    fn payload(items: &[(&str, &str)]) -> BTreeMap<String, PayloadFile> {
        items
            .iter()
            .map(|(p, d)| (p.to_string(), file(d, 0o644)))
            .collect()
    }

    fn setup() -> (tempfile::TempDir, RootDir, Target) {
        let d = tempfile::tempdir().unwrap();
        let root = RootDir::open(d.path()).unwrap();
        let dir = root
            .mkdir_all(&RelPath::new(["vol"]).unwrap(), 0o755)
            .unwrap();
        (d, root, dir)
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn read(dir: &Path, p: &str) -> String {
        std::fs::read_to_string(dir.join(p)).unwrap()
    }

    #[test]
    fn writes_the_kubelet_layout_and_rewrites_nothing_unchanged() {
        let (_d, root, dir) = setup();
        let p = payload(&[("a", "1"), ("sub/dir/b", "2")]);
        let WriteOutcome::Written { dir: ts } =
            write(&root, &dir, &p, Ownership::default()).unwrap()
        else {
            panic!("not written");
        };
        let v = dir.path();
        assert!(ts.starts_with("..20"), "{ts}");
        assert_eq!(
            names(v),
            vec![ts.clone(), "..data".into(), "a".into(), "sub".into()]
        );
        assert_eq!(
            std::fs::read_link(v.join("..data")).unwrap(),
            Path::new(&ts)
        );
        assert_eq!(
            std::fs::read_link(v.join("a")).unwrap(),
            Path::new("..data/a")
        );
        assert_eq!(
            std::fs::read_link(v.join("sub")).unwrap(),
            Path::new("..data/sub")
        );
        assert_eq!(read(v, "a"), "1");
        assert_eq!(read(v, "sub/dir/b"), "2");
        let mode = std::fs::metadata(v.join("a")).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o644);
        // The same payload again: nothing rewritten.
        assert_eq!(
            write(&root, &dir, &p, Ownership::default()).unwrap(),
            WriteOutcome::Unchanged
        );
        assert_eq!(
            std::fs::read_link(v.join("..data")).unwrap(),
            Path::new(&ts)
        );
        // A mode change is a change.
        let mut p2 = p.clone();
        p2.insert("a".into(), file("1", 0o400));
        assert!(matches!(
            write(&root, &dir, &p2, Ownership::default()).unwrap(),
            WriteOutcome::Written { .. }
        ));
        let mode = std::fs::metadata(v.join("a")).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o400);
    }

    #[test]
    fn an_update_swaps_payloads_and_removes_what_is_gone() {
        let (_d, root, dir) = setup();
        let v = dir.path().to_path_buf();
        let first = write(
            &root,
            &dir,
            &payload(&[("a", "1"), ("b", "2")]),
            Ownership::default(),
        )
        .unwrap();
        let WriteOutcome::Written { dir: ts1 } = first else {
            panic!()
        };
        // Something not made by the writer is left alone.
        std::fs::write(v.join("mine"), "x").unwrap();
        let out = write(
            &root,
            &dir,
            &payload(&[("b", "3"), ("c", "4")]),
            Ownership::default(),
        )
        .unwrap();
        let WriteOutcome::Written { dir: ts } = out else {
            panic!()
        };
        // The previous payload is removed right after the swap.
        assert!(!v.join(&ts1).exists());
        let want = [&ts, "..data", "b", "c", "mine"];
        assert_eq!(names(&v), want.map(String::from).to_vec());
        assert_eq!(read(&v, "b"), "3");
        assert_eq!(read(&v, "c"), "4");
        // An empty payload (an optional source gone): `..data` and its
        // (empty) directory; the names of the payload go.
        let out = write(&root, &dir, &BTreeMap::new(), Ownership::default()).unwrap();
        let WriteOutcome::Written { dir: empty } = out else {
            panic!()
        };
        let want = [&empty, "..data", "mine"];
        assert_eq!(names(&v), want.map(String::from).to_vec());
        // Nothing changed: nothing written.
        let out = write(&root, &dir, &BTreeMap::new(), Ownership::default()).unwrap();
        assert_eq!(out, WriteOutcome::Unchanged);
        assert_eq!(names(&v), want.map(String::from).to_vec());
    }

    /// Every regular file under `dir` (not following symlinks) holding
    /// `needle`.
    fn files_holding(dir: &Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                out.extend(files_holding(&e.path(), needle));
            } else if t.is_file() {
                let data = std::fs::read(e.path()).unwrap();
                if data.windows(needle.len()).any(|w| w == needle) {
                    out.push(e.path());
                }
            }
        }
        out
    }

    fn payload_dirs(v: &Path) -> Vec<String> {
        names(v)
            .into_iter()
            .filter(|n| n.starts_with("..") && n != "..data")
            .collect()
    }

    /// A write that failed before its swap (a full disk) takes its payload
    /// directory and `..data_tmp` with it; one that failed after the swap
    /// (syncing the volume directory) keeps the payload `..data` points at
    /// and ends as a successful write does.
    /// The end-to-end test on a full tmpfs is
    /// `a_full_disk_fails_the_update_and_keeps_the_old_payload`.
    #[test]
    fn a_failed_write_takes_its_payload_but_never_the_current_one() {
        let (_d, root, dir) = setup();
        let v = dir.path().to_path_buf();
        write(&root, &dir, &payload(&[("x", "old")]), Ownership::default()).unwrap();
        let current = payload_dirs(&v);
        assert_eq!(current.len(), 1);

        let ts = new_payload_dir(&dir).unwrap();
        std::fs::create_dir(v.join(&ts).join("sub")).unwrap();
        std::fs::write(v.join(&ts).join("sub/x"), "half").unwrap();
        symlinkat(ts.as_os_str(), dir.as_fd(), NEW_DATA_DIR_NAME).unwrap();
        assert_eq!(payload_dirs(&v).len(), 3, "{:?}", names(&v));
        discard_failed(&root, &dir);
        assert_eq!(payload_dirs(&v), current, "{:?}", names(&v));
        assert_eq!(read(&v, "x"), "old");

        // The swap done, only the sync after it failed: the new payload
        // stays, and the previous one goes as after a successful write.
        let ts = new_payload_dir(&dir).unwrap();
        std::fs::write(v.join(&ts).join("x"), "new").unwrap();
        symlinkat(ts.as_os_str(), dir.as_fd(), NEW_DATA_DIR_NAME).unwrap();
        std::fs::rename(v.join(NEW_DATA_DIR_NAME), v.join(DATA_DIR_NAME)).unwrap();
        discard_failed(&root, &dir);
        assert_eq!(payload_dirs(&v), vec![ts.to_string_lossy().into_owned()]);
        assert_eq!(read(&v, "x"), "new");
    }

    /// Issue 25 item 4: a rotated-out secret does not stay on the pod's
    /// disk. Two updates in quick succession leave exactly one payload
    /// directory, and the old values are nowhere under the volume.
    #[test]
    fn a_rotated_out_secret_is_removed_right_after_the_swap() {
        let (_d, root, dir) = setup();
        let v = dir.path().to_path_buf();
        for value in ["revoked-1", "revoked-2", "current"] {
            let p = payload(&[("password", value), ("sub/key", value)]);
            write(&root, &dir, &p, Ownership::default()).unwrap();
        }
        assert_eq!(payload_dirs(&v).len(), 1, "{:?}", names(&v));
        assert_eq!(read(&v, "password"), "current");
        assert_eq!(read(&v, "sub/key"), "current");
        for old in ["revoked-1", "revoked-2"] {
            let left = files_holding(&v, old.as_bytes());
            assert!(left.is_empty(), "{old} left in {left:?}");
        }
    }

    /// A payload past the file-by-file sync (one `syncfs`), in many
    /// directories visited out of order (`d1/x`, `d1.x`, `d1/y`...): every
    /// file written, then recognised as unchanged.
    #[test]
    fn a_large_payload_in_many_directories() {
        let (_d, root, dir) = setup();
        let mut p = BTreeMap::new();
        for i in 0..3000 {
            p.insert(
                format!("d{}/sub/f{i}", i % 100),
                file(&format!("v{i}"), 0o644),
            );
            p.insert(format!("d{}.x", i % 100), file("dot", 0o644));
            p.insert(format!("top{i}"), file(&format!("t{i}"), 0o600));
        }
        assert!(p.len() > FSYNC_EACH_MAX);
        write(&root, &dir, &p, Ownership::default()).unwrap();
        let v = dir.path();
        for i in 0..3000 {
            assert_eq!(read(v, &format!("d{}/sub/f{i}", i % 100)), format!("v{i}"));
            assert_eq!(read(v, &format!("top{i}")), format!("t{i}"));
        }
        assert_eq!(read(v, "d7.x"), "dot");
        let again = write(&root, &dir, &p, Ownership::default()).unwrap();
        assert_eq!(again, WriteOutcome::Unchanged);
    }

    /// What a crash between the swap and the removal (or an older agent)
    /// left: removed by the next write, even one that rewrites nothing (the
    /// set-up every payload volume gets after a restart).
    #[test]
    fn payloads_left_behind_go_at_the_next_write() {
        let (_d, root, dir) = setup();
        let v = dir.path().to_path_buf();
        let p = payload(&[("password", "current")]);
        write(&root, &dir, &p, Ownership::default()).unwrap();
        for old in ["..2020_01_01_00_00_00.1", "..2020_01_01_00_00_00.2"] {
            std::fs::create_dir_all(v.join(old).join("sub")).unwrap();
            std::fs::write(v.join(old).join("sub/password"), "revoked").unwrap();
        }
        let out = write(&root, &dir, &p, Ownership::default()).unwrap();
        assert_eq!(out, WriteOutcome::Unchanged);
        assert_eq!(payload_dirs(&v).len(), 1, "{:?}", names(&v));
        assert!(files_holding(&v, b"revoked").is_empty());
        assert_eq!(read(&v, "password"), "current");
    }

    #[test]
    fn paths_are_checked() {
        for bad in ["../x", "/abs", "..x", "a/../b", "", "..data/x"] {
            assert!(validate_path(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(validate_path("a/./b//c").unwrap(), vec!["a", "b", "c"]);
        assert!(validate_path("a..b/..c").is_ok());
        let (_d, root, dir) = setup();
        let e = write(
            &root,
            &dir,
            &payload(&[("a", "1"), ("a/b", "2")]),
            Ownership::default(),
        );
        assert!(matches!(e, Err(WriterError::InvalidPath { .. })), "{e:?}");
        let e = write(
            &root,
            &dir,
            &payload(&[("x/../../../etc/passwd", "1")]),
            Ownership::default(),
        );
        assert!(matches!(e, Err(WriterError::InvalidPath { .. })), "{e:?}");
        assert!(
            names(dir.path()).is_empty(),
            "nothing written: {:?}",
            names(dir.path())
        );
    }

    #[test]
    fn symlinks_planted_in_the_volume_are_never_followed() {
        let (d, root, dir) = setup();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("victim"), "keep").unwrap();
        let v = dir.path().to_path_buf();
        // `..data` pointing outside, and a stale payload dir that is a symlink.
        std::os::unix::fs::symlink(outside.path(), v.join("..data")).unwrap();
        std::os::unix::fs::symlink(outside.path(), v.join("..2020_01_01_00_00_00.1")).unwrap();
        write(
            &root,
            &dir,
            &payload(&[("victim", "new")]),
            Ownership::default(),
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(outside.path().join("victim")).unwrap(),
            "keep"
        );
        assert_eq!(read(&v, "victim"), "new");
        assert!(!v.join("..2020_01_01_00_00_00.1").exists());
        // A payload directory swapped for a symlink to the outside.
        let ts = std::fs::read_link(v.join("..data")).unwrap();
        std::fs::remove_dir_all(v.join(&ts)).unwrap();
        std::os::unix::fs::symlink(outside.path(), v.join(&ts)).unwrap();
        write(
            &root,
            &dir,
            &payload(&[("victim", "newer")]),
            Ownership::default(),
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(outside.path().join("victim")).unwrap(),
            "keep"
        );
        assert_eq!(read(&v, "victim"), "newer");
        assert_eq!(names(outside.path()), vec!["victim".to_string()]);
        drop(d);
    }

    #[test]
    fn fs_group_owns_and_group_reads() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIP: needs root to chown");
            return;
        }
        let (_d, root, dir) = setup();
        let p: BTreeMap<_, _> = [
            ("k".to_string(), file("v", 0o600)),
            ("d/k".to_string(), file("v", 0o400)),
        ]
        .into();
        write(
            &root,
            &dir,
            &p,
            Ownership {
                fs_group: Some(4321),
            },
        )
        .unwrap();
        let v = dir.path();
        for (f, want) in [("k", 0o640), ("d/k", 0o440)] {
            let m = std::fs::metadata(v.join(f)).unwrap();
            assert_eq!(m.gid(), 4321, "{f}");
            assert_eq!(m.mode() & 0o7777, want, "{f}");
        }
        let d = std::fs::metadata(v.join("d")).unwrap();
        assert_eq!((d.gid(), d.mode() & 0o7777), (4321, 0o2755));
        assert_eq!(std::fs::symlink_metadata(v.join("k")).unwrap().gid(), 4321);
    }

    /// A file with an `fs_user` (a token of a pod that runs as one user) is
    /// owned by it, with and without `fsGroup`; the others by the writer.
    /// A change of owner alone is a change.
    #[test]
    fn fs_user_owns_its_file() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIP: needs root to chown");
            return;
        }
        let token = |user| PayloadFile {
            fs_user: Some(user),
            ..file("jwt", 0o600)
        };
        for (fs_group, user, want) in [
            (None, 1000, (1000, 0, 0o600)),
            (Some(2000), 1000, (1000, 2000, 0o640)),
            (Some(2000), 1001, (1001, 2000, 0o640)),
        ] {
            let (_d, root, dir) = setup();
            let p: BTreeMap<_, _> = [
                ("token".to_string(), token(user)),
                ("ca.crt".to_string(), file("CA", 0o644)),
            ]
            .into();
            write(&root, &dir, &p, Ownership { fs_group }).unwrap();
            let m = std::fs::metadata(dir.path().join("token")).unwrap();
            assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), want);
            let ca = std::fs::metadata(dir.path().join("ca.crt")).unwrap();
            assert_eq!(
                (ca.uid(), ca.gid(), ca.mode() & 0o7777),
                (0, fs_group.unwrap_or(0), 0o644)
            );
            let again = write(&root, &dir, &p, Ownership { fs_group }).unwrap();
            assert_eq!(again, WriteOutcome::Unchanged);
        }
        let (_d, root, dir) = setup();
        let p: BTreeMap<_, _> = [("token".to_string(), token(1000))].into();
        write(&root, &dir, &p, Ownership::default()).unwrap();
        let p: BTreeMap<_, _> = [("token".to_string(), token(1001))].into();
        let out = write(&root, &dir, &p, Ownership::default()).unwrap();
        assert!(matches!(out, WriteOutcome::Written { .. }), "{out:?}");
        let m = std::fs::metadata(dir.path().join("token")).unwrap();
        assert_eq!(m.uid(), 1001);
    }

    /// A reader (another thread) reading two keys always changed together
    /// never sees them disagree while 1,000 updates swap in. Updates are
    /// paced by the reader (each waits until a read that began after the
    /// previous update finished), as real updates are seconds apart. The
    /// previous payload is removed right after the swap (as the kubelet
    /// does), so a read that resolved `..data` just before it may find its
    /// files gone (`ENOENT`): such a read starts again, and the one after it
    /// (the new payload) succeeds.
    #[test]
    fn readers_never_see_a_mix() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
        let (_d, root, dir) = setup();
        let v = dir.path().to_path_buf();
        let write_xy = |s: &str| {
            let p = payload(&[("x", s), ("y", s)]);
            write(&root, &dir, &p, Ownership::default()).unwrap();
        };
        write_xy("0");
        let (stop, reads) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let reader = {
            let (stop, reads, v) = (Arc::clone(&stop), Arc::clone(&reads), v.clone());
            std::thread::spawn(move || {
                let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
                let mut retries_in_a_row = 0;
                while !stop.load(SeqCst) {
                    // Resolve `..data` once, as a reader that opens the
                    // directory does: both keys from one payload.
                    let data = v.join(std::fs::read_link(v.join("..data")).unwrap());
                    let both = std::fs::read_to_string(data.join("x"))
                        .and_then(|x| std::fs::read_to_string(data.join("y")).map(|y| (x, y)));
                    // Through the user-visible name.
                    let visible =
                        both.and_then(|xy| std::fs::read_to_string(v.join("x")).map(|_| xy));
                    match visible {
                        Ok((x, y)) => assert_eq!(x, y, "mixed payload"),
                        Err(e) if gone(&e) && retries_in_a_row < 2 => {
                            retries_in_a_row += 1;
                            continue;
                        }
                        Err(e) => panic!("read failed again: {e}"),
                    }
                    retries_in_a_row = 0;
                    reads.fetch_add(1, SeqCst);
                }
            })
        };
        for i in 1..=1000 {
            let seen = reads.load(SeqCst);
            while reads.load(SeqCst) < seen + 2 && !reader.is_finished() {
                std::thread::yield_now();
            }
            write_xy(&i.to_string());
        }
        stop.store(true, SeqCst);
        reader.join().unwrap();
        assert!(reads.load(SeqCst) >= 2000);
        assert_eq!(read(&v, "x"), "1000");
    }

    const CRASH_ENV: &str = "VOLMGR_WRITER_CRASH_DIR";

    /// Killed (abort, as `kill -9`) after the new payload is written and
    /// before the swap: the volume holds the old payload, and the next write
    /// removes the half-done one.
    #[test]
    fn a_crash_before_the_swap_leaves_the_old_payload() {
        if let Some(d) = std::env::var_os(CRASH_ENV) {
            let root = RootDir::open(Path::new(&d)).unwrap();
            let dir = root.open_dir(&RelPath::new(["vol"]).unwrap()).unwrap();
            write(
                &root,
                &dir,
                &payload(&[("x", "new"), ("y", "new")]),
                Ownership::default(),
            )
            .unwrap();
            panic!("the failpoint did not fire");
        }
        let (d, root, dir) = setup();
        let v = dir.path().to_path_buf();
        write(
            &root,
            &dir,
            &payload(&[("x", "old"), ("y", "old")]),
            Ownership::default(),
        )
        .unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "plugins::atomic_writer::tests::a_crash_before_the_swap_leaves_the_old_payload",
                "--exact",
                "--nocapture",
            ])
            .env(CRASH_ENV, d.path())
            .env("VOLMGR_FAILPOINTS", "atomic_writer.before_swap")
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("failpoint atomic_writer.before_swap")
        );
        assert_eq!((read(&v, "x"), read(&v, "y")), ("old".into(), "old".into()));
        assert_eq!(
            names(&v).len(),
            6,
            "half-written payload and ..data_tmp left: {:?}",
            names(&v)
        );
        write(
            &root,
            &dir,
            &payload(&[("x", "old"), ("y", "old")]),
            Ownership::default(),
        )
        .unwrap();
        assert_eq!(names(&v).len(), 4, "{:?}", names(&v));
        assert_eq!(payload_dirs(&v).len(), 1, "{:?}", names(&v));
    }
}
