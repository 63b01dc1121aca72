//! Small state files under the root: written whole (a temporary file,
//! synced, renamed) and read bounded.

use std::os::fd::AsFd;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::{PathError, RelPath, RootDir, MAX_STATE_FILE_BYTES};
use crate::sys::beneath::Last;
use crate::sys::SyscallError;

impl RootDir {
    /// Writes `contents` to file `rel` atomically and durably: a temporary
    /// file, its data synced (`fdatasync`), renamed over `rel`, then the
    /// directory synced. After a power loss `rel` holds the old contents or
    /// the new, never an empty or partial file (which ext4 and XFS may leave
    /// for a new file renamed without a sync). A write or sync that fails (a
    /// full disk, an I/O error) removes its temporary file: `rel` is as it
    /// was, and nothing is left behind; a failed sync of the directory is
    /// reported too (the new file is in place, its rename maybe not on disk).
    pub fn write_file(&self, rel: &RelPath, contents: &[u8]) -> Result<(), PathError> {
        use std::io::Write;
        let (dir_rel, name) = rel
            .split_last()
            .ok_or_else(|| PathError::InvalidComponent {
                path: rel.as_path().to_path_buf(),
                component: String::new(),
            })?;
        let dir = self.mkdir_all(&dir_rel, 0o750)?;
        let mut tmp = name.to_os_string();
        tmp.push(".tmp");
        let fd = nix::fcntl::openat(
            dir.as_fd(),
            tmp.as_os_str(),
            OFlag::O_WRONLY
                | OFlag::O_CREAT
                | OFlag::O_TRUNC
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o640),
        )
        .map_err(|e| self.map_err("openat", rel, e))?;
        let mut file = std::fs::File::from(fd);
        let written = file
            .write_all(contents)
            .map_err(|e| SyscallError::io("write", self.abs(rel), e))
            .and_then(|()| {
                file.sync_data()
                    .map_err(|e| SyscallError::io("fdatasync", self.abs(rel), e))
            })
            .map_err(PathError::from);
        drop(file);
        let renamed = written.and_then(|()| {
            nix::fcntl::renameat(dir.as_fd(), tmp.as_os_str(), dir.as_fd(), name)
                .map_err(|e| self.map_err("renameat", rel, e))
        });
        if renamed.is_err() {
            let _ = nix::unistd::unlinkat(
                &dir,
                tmp.as_os_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
        renamed?;
        // `dir` is an `O_PATH` descriptor: the directory opened for reading
        // to sync it.
        let dir_abs = || self.abs(&dir_rel);
        let readable = nix::fcntl::openat(
            dir.as_fd(),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| SyscallError::new("openat", dir_abs(), e))?;
        nix::unistd::fsync(&readable).map_err(|e| SyscallError::new("fsync", dir_abs(), e))?;
        Ok(())
    }

    /// Reads a small state file `rel` (at most [`MAX_STATE_FILE_BYTES`]).
    ///
    /// Opened non-blocking (a FIFO put in its place must not block the
    /// reader; symlinks are refused by the resolution), and refused unless
    /// it is a regular file no larger than the limit (a sparse file of
    /// gigabytes is not read whole).
    pub fn read_file(&self, rel: &RelPath) -> Result<Vec<u8>, PathError> {
        use std::io::Read;
        let fd = self.open_rel(
            rel,
            OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY,
            Last::OnSameMount,
        )?;
        let refuse = |why: String| {
            SyscallError::io(
                "read",
                self.abs(rel),
                std::io::Error::new(std::io::ErrorKind::InvalidData, why),
            )
        };
        let st = nix::sys::stat::fstat(&fd).map_err(|e| self.map_err("fstat", rel, e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(refuse("not a regular file".into()).into());
        }
        if u64::try_from(st.st_size).unwrap_or(u64::MAX) > MAX_STATE_FILE_BYTES {
            return Err(refuse(format!("larger than {MAX_STATE_FILE_BYTES} bytes")).into());
        }
        let mut out = Vec::new();
        std::fs::File::from(fd)
            .take(MAX_STATE_FILE_BYTES + 1)
            .read_to_end(&mut out)
            .map_err(|e| SyscallError::io("read", self.abs(rel), e))?;
        if out.len() as u64 > MAX_STATE_FILE_BYTES {
            return Err(refuse(format!("grew past {MAX_STATE_FILE_BYTES} bytes")).into());
        }
        Ok(out)
    }
}
