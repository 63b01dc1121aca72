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

/// The label of a `mount(2)` call with `flags` and type `raw`: a call that
/// makes no new file system (a remount, a bind, a propagation change, a
/// move: the kernel ignores its type argument, often `none`) by what it
/// does, in the kernel's order of precedence (`path_mount`, after it strips
/// the legacy `MS_MGC_VAL` magic); any other by
/// [`label`].
pub fn mount_label(flags: u64, raw: Option<&str>) -> &'static str {
    // The legacy magic in the high half, stripped as the kernel does.
    let flags = match flags & 0xffff_0000 {
        0xc0ed_0000 => flags & 0xffff,
        _ => flags,
    };
    let propagation = libc::MS_SHARED | libc::MS_PRIVATE | libc::MS_SLAVE | libc::MS_UNBINDABLE;
    if flags & libc::MS_REMOUNT != 0 {
        "remount"
    } else if flags & libc::MS_BIND != 0 {
        "bind"
    } else if flags & propagation != 0 {
        "propagation"
    } else if flags & libc::MS_MOVE != 0 {
        "move"
    } else {
        label(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bind mount was labelled `mount none` (the type argument the
    /// kernel ignores).
    #[test]
    fn mounts_that_make_no_file_system_are_labelled_by_what_they_do() {
        assert_eq!(mount_label(libc::MS_BIND, Some("none")), "bind");
        assert_eq!(mount_label(libc::MS_BIND | libc::MS_REC, None), "bind");
        assert_eq!(
            mount_label(libc::MS_REMOUNT | libc::MS_BIND, Some("none")),
            "remount"
        );
        assert_eq!(
            mount_label(libc::MS_SHARED | libc::MS_REC, Some("none")),
            "propagation"
        );
        assert_eq!(mount_label(libc::MS_MOVE, Some("none")), "move");
        assert_eq!(mount_label(0, Some("tmpfs")), "tmpfs");
        assert_eq!(mount_label(0xC0ED_0000, Some("ext4")), "ext4");
    }

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
