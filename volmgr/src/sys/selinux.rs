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

#[cfg(test)]
mod tests {
    use super::*;

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
