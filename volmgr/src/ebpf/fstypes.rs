//! The fixed set of file system type labels the latency histograms, status
//! and metrics use: any process can pass any string as a `mount(2)` or
//! `fsopen(2)` type (the call fails, but it is traced), so a type is only
//! ever shown as one of the known names, a FUSE type as its kind (`fuse`,
//! `fuseblk`: the subtype is the daemon's to choose), the rest as `other`.

/// Label of a type that is not in [`KNOWN`].
pub const OTHER: &str = "other";

/// File system types kept by name (sorted: looked up by binary search).
pub const KNOWN: [&str; 60] = [
    "9p",
    "autofs",
    "bcachefs",
    "beegfs",
    "binder",
    "binfmt_misc",
    "bpf",
    "btrfs",
    "ceph",
    "cgroup",
    "cgroup2",
    "cifs",
    "configfs",
    "debugfs",
    "devpts",
    "devtmpfs",
    "efivarfs",
    "erofs",
    "exfat",
    "ext2",
    "ext3",
    "ext4",
    "f2fs",
    "fuse",
    "fuseblk",
    "fusectl",
    "gfs2",
    "glusterfs",
    "gpfs",
    "hugetlbfs",
    "iso9660",
    "jfs",
    "lustre",
    "mqueue",
    "msdos",
    "nfs",
    "nfs4",
    "nfsd",
    "nilfs2",
    "none",
    "ntfs",
    "ntfs3",
    "ocfs2",
    "overlay",
    "proc",
    "pstore",
    "ramfs",
    "rpc_pipefs",
    "securityfs",
    "selinuxfs",
    "smb3",
    "squashfs",
    "sysfs",
    "tmpfs",
    "tracefs",
    "udf",
    "vfat",
    "virtiofs",
    "xfs",
    "zfs",
];

/// The label of file system type `raw`: `""` for none, a name of
/// [`KNOWN`], `fuse`/`fuseblk` for `fuse.<subtype>`/`fuseblk.<subtype>`,
/// else [`OTHER`]. The result is always one of a fixed set of strings.
pub fn label(raw: Option<&str>) -> &'static str {
    let Some(raw) = raw else {
        return "";
    };
    if raw.is_empty() {
        return "";
    }
    let kind = match raw.split_once('.') {
        Some((kind @ ("fuse" | "fuseblk"), _)) => kind,
        _ => raw,
    };
    match KNOWN.binary_search(&kind) {
        Ok(i) => KNOWN[i],
        Err(_) => OTHER,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_is_sorted_and_unique() {
        assert!(KNOWN.windows(2).all(|w| w[0] < w[1]), "{KNOWN:?}");
    }

    #[test]
    fn labels_are_a_fixed_set() {
        assert_eq!(label(None), "");
        assert_eq!(label(Some("")), "");
        assert_eq!(label(Some("ext4")), "ext4");
        assert_eq!(label(Some("fuse.sshfs")), "fuse");
        assert_eq!(label(Some("fuseblk.ntfs")), "fuseblk");
        assert_eq!(label(Some("fuse")), "fuse");
        assert_eq!(label(Some("fuse.\u{1b}]0;x\u{7}")), "fuse");
        assert_eq!(label(Some("\u{1b}]0;pwned\u{7}\u{1b}[2J")), OTHER);
        assert_eq!(label(Some("ext4x")), OTHER);
        assert_eq!(label(Some("fusex.y")), OTHER);
        for i in 0..10_000 {
            let l = label(Some(&format!("fs{i}")));
            assert_eq!(l, OTHER);
        }
    }
}
