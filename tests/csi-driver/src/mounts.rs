//! The mount table (`/proc/self/mountinfo`) and the mount syscalls the driver
//! uses: mount a device, bind-mount, remount read-only, unmount.

use std::io;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone)]
pub struct MountEntry {
    /// Device number of the mounted file system (major, minor).
    pub dev: (u64, u64),
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Per-mount options (e.g. "rw,relatime").
    pub options: String,
    /// File system type.
    pub fs_type: String,
}

impl MountEntry {
    /// Mounted read-only.
    pub fn read_only(&self) -> bool {
        self.options.split(',').any(|o| o == "ro")
    }
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
            && b[i + 1] <= b'3'
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    use std::os::unix::ffi::OsStringExt;
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Parses the calling process's mount table.
pub fn read() -> io::Result<Vec<MountEntry>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() < 6 || fields.len() < sep + 2 {
            continue;
        }
        let Some((maj, min)) = fields[2].split_once(':') else {
            continue;
        };
        let (Ok(maj), Ok(min)) = (maj.parse(), min.parse()) else {
            continue;
        };
        out.push(MountEntry {
            dev: (maj, min),
            mount_point: unescape(fields[4]),
            options: fields[5].to_string(),
            fs_type: fields[sep + 1].to_string(),
        });
    }
    Ok(out)
}

/// The topmost mount at `path` (compared after resolving symlinks), if any.
pub fn mount_at(path: &Path) -> io::Result<Option<MountEntry>> {
    let path = match path.canonicalize() {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(read()?.into_iter().rev().find(|m| m.mount_point == path))
}

/// (major, minor) of a device number.
pub fn split_dev(rdev: u64) -> (u64, u64) {
    (u64::from(libc::major(rdev)), u64::from(libc::minor(rdev)))
}

/// The SELinux context options, which libmount (`mount(8)`, what real
/// drivers call) drops on a host without SELinux: the kernel refuses them
/// there (EINVAL).
const SELINUX_OPTIONS: [&str; 5] = [
    "context",
    "fscontext",
    "defcontext",
    "rootcontext",
    "seclabel",
];

/// Whether the host has SELinux (selinuxfs mounted), as libselinux's
/// `is_selinux_enabled` decides it for libmount.
fn selinux_enabled() -> bool {
    Path::new("/sys/fs/selinux/enforce").exists()
}

/// Splits mount options at the commas outside double quotes (the kubelet
/// quotes `context="system_u:object_r:container_file_t:s0:c1,c2"`).
fn split_options(s: &str) -> Vec<&str> {
    let (mut out, mut start, mut quoted) = (Vec::new(), 0, false);
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// Mount flags and file-system data from CSI `mount_flags`.
pub fn parse_mount_flags(flags: &[String]) -> (MsFlags, String) {
    let mut ms = MsFlags::empty();
    let mut data = Vec::new();
    let selinux = selinux_enabled();
    for f in flags.iter().flat_map(|f| split_options(f)) {
        let name = f.trim().split('=').next().unwrap_or("");
        if !selinux && SELINUX_OPTIONS.contains(&name) {
            continue;
        }
        match f.trim() {
            "" | "defaults" | "rw" => {}
            "ro" => ms |= MsFlags::MS_RDONLY,
            "noatime" => ms |= MsFlags::MS_NOATIME,
            "nodiratime" => ms |= MsFlags::MS_NODIRATIME,
            "relatime" => ms |= MsFlags::MS_RELATIME,
            "strictatime" => ms |= MsFlags::MS_STRICTATIME,
            "nosuid" => ms |= MsFlags::MS_NOSUID,
            "nodev" => ms |= MsFlags::MS_NODEV,
            "noexec" => ms |= MsFlags::MS_NOEXEC,
            "sync" => ms |= MsFlags::MS_SYNCHRONOUS,
            "dirsync" => ms |= MsFlags::MS_DIRSYNC,
            other => data.push(other.to_string()),
        }
    }
    (ms, data.join(","))
}

/// Mounts the file system on `device` at `target`.
pub fn mount_device(
    device: &Path,
    target: &Path,
    fs_type: &str,
    flags: MsFlags,
    data: &str,
) -> nix::Result<()> {
    let data = (!data.is_empty()).then_some(data);
    nix::mount::mount(Some(device), target, Some(fs_type), flags, data)
}

/// Bind-mounts `source` onto `target`; read-only (and with `extra` flags
/// such as nosuid) through a second, remounting step, as the kernel requires.
pub fn bind(source: &Path, target: &Path, read_only: bool, extra: MsFlags) -> nix::Result<()> {
    nix::mount::mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )?;
    let mut flags = extra - MsFlags::MS_RDONLY;
    if read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    if !flags.is_empty() {
        let res = nix::mount::mount(
            None::<&str>,
            target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | flags,
            None::<&str>,
        );
        if let Err(e) = res {
            let _ = unmount(target);
            return Err(e);
        }
    }
    Ok(())
}

/// Unmounts `target` (not following a symlink). Not mounted is an error.
pub fn unmount(target: &Path) -> nix::Result<()> {
    nix::mount::umount2(target, MntFlags::UMOUNT_NOFOLLOW)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_mountinfo_paths() {
        assert_eq!(unescape(r"/a\040b\011c"), PathBuf::from("/a b\tc"));
        assert_eq!(unescape(r"/x\134y"), PathBuf::from("/x\\y"));
        // Not an escape: kept as is.
        assert_eq!(unescape(r"/a\9zz\777"), PathBuf::from(r"/a\9zz\777"));
        assert_eq!(unescape("/tail\\04"), PathBuf::from("/tail\\04"));
    }

    #[test]
    fn mount_flags_split_into_flags_and_data() {
        let (ms, data) = parse_mount_flags(&[
            "ro,noatime".to_string(),
            "errors=remount-ro".to_string(),
            "defaults".to_string(),
        ]);
        assert_eq!(ms, MsFlags::MS_RDONLY | MsFlags::MS_NOATIME);
        assert_eq!(data, "errors=remount-ro");
    }

    /// A quoted SELinux context is one option; kept with SELinux, dropped
    /// without, as libmount does.
    #[test]
    fn a_quoted_context_is_one_option() {
        let context = "context=\"system_u:object_r:container_file_t:s0:c1,c2\"";
        assert_eq!(
            split_options(&format!("ro,{context},noatime")),
            ["ro", context, "noatime"]
        );
        let (_, data) = parse_mount_flags(&[context.to_string(), "size=1m".to_string()]);
        if selinux_enabled() {
            assert_eq!(data, format!("{context},size=1m"));
        } else {
            assert_eq!(data, "size=1m");
        }
    }
}
