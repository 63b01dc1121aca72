//! Whether SELinux is enabled on this host, as go-selinux's `GetEnabled`
//! decides it for the kubelet: `selinuxfs` is mounted at `/sys/fs/selinux`.
//! Without it, the kernel does not know the `context=` mount option, so the
//! kubelet (and volmgr) never pass it to a CSI driver.

use nix::sys::statfs::{statfs, FsType};

/// `SELINUX_MAGIC` of `linux/magic.h`: the file system type of `selinuxfs`.
const SELINUX_MAGIC: i64 = 0xf97c_ff8c;

/// Where `selinuxfs` is mounted when SELinux is on.
const SELINUXFS: &str = "/sys/fs/selinux";

/// Whether SELinux is enabled on this host (`selinuxfs` mounted at
/// `/sys/fs/selinux`).
pub fn enabled() -> bool {
    is_selinuxfs(statfs(SELINUXFS).map(|s| s.filesystem_type()).ok())
}

/// Whether a `statfs` answer (`None`: it failed) is `selinuxfs`'s.
fn is_selinuxfs(fs: Option<FsType>) -> bool {
    #[allow(clippy::useless_conversion)] // the field's type differs between libcs
    fs.is_some_and(|t| i64::from(t.0) == SELINUX_MAGIC)
}

/// The kubelet's `GetSELinuxSupport` (`hostutil.GetSELinux`) for `path`:
/// with SELinux `enabled` on the host, whether the mount holding `path` in
/// `table` (the last listed whose mount point is `path` or above it) has
/// `seclabel` among its super or mount options, i.e. its files carry
/// labels a container runtime can change.
pub fn mount_supports_labels(
    enabled: bool,
    table: &[super::mountinfo::MountInfo],
    path: &std::path::Path,
) -> bool {
    if !enabled {
        return false;
    }
    let has = |opts: &str| opts.split(',').any(|o| o == "seclabel");
    table
        .iter()
        .rev()
        .find(|m| path.starts_with(&m.mount_point))
        .is_some_and(|m| has(&m.super_options) || has(&m.mount_options))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only with SELinux on, and only on a mount whose options say
    /// `seclabel`: the mount holding the path, the top one where mounts
    /// are stacked.
    #[test]
    fn labels_are_supported_where_the_mount_says_seclabel() {
        let table = crate::sys::mountinfo::parse(concat!(
            "1 0 8:1 / / rw,relatime - ext4 /dev/sda1 rw,seclabel\n",
            "2 1 0:5 / /var/lib/kubelet/pods/u/vol rw - tmpfs tmpfs rw,size=1024k\n",
            "3 1 0:6 / /mnt rw - xfs /dev/sdb rw,seclabel\n",
            "4 3 0:7 / /mnt rw - nfs srv:/x rw,vers=4\n",
        ))
        .unwrap();
        let p = |s: &str| std::path::PathBuf::from(s);
        assert!(mount_supports_labels(true, &table, &p("/var/lib/x")));
        assert!(!mount_supports_labels(false, &table, &p("/var/lib/x")));
        assert!(!mount_supports_labels(
            true,
            &table,
            &p("/var/lib/kubelet/pods/u/vol")
        ));
        assert!(!mount_supports_labels(
            true,
            &table,
            &p("/var/lib/kubelet/pods/u/vol/d")
        ));
        assert!(mount_supports_labels(
            true,
            &table,
            &p("/var/lib/kubelet/pods/u/volume")
        ));
        // Stacked on /mnt: the top mount (nfs) counts.
        assert!(!mount_supports_labels(true, &table, &p("/mnt/a")));
    }

    #[test]
    fn only_selinuxfs_counts() {
        #[allow(clippy::useless_conversion)]
        let fs = |m: i64| Some(FsType(m.try_into().unwrap()));
        assert!(is_selinuxfs(fs(SELINUX_MAGIC)));
        assert!(!is_selinuxfs(fs(0x6265_6572))); // sysfs: selinuxfs not mounted there
        assert!(!is_selinuxfs(None));
        // This host: whatever it is, the answer matches /proc/filesystems
        // listing selinuxfs as mounted there.
        let mounted = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .any(|l| l.contains(" /sys/fs/selinux ") && l.contains(" - selinuxfs "));
        assert_eq!(enabled(), mounted);
    }
}
