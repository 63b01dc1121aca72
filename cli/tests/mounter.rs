//! The real `LinuxMounter`'s mount ids (`statx` `STATX_MNT_ID_UNIQUE`,
//! `listmount(2)`), in a private mount namespace.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::os::fd::OwnedFd;
use std::path::Path;

use nix::fcntl::{open, OFlag};
use nix::mount::{mount, umount, MsFlags};
use nix::sys::stat::Mode;
use support::isolated;
use volmgr::sys::linux::LinuxMounter;
use volmgr::sys::{Mounter, Target};

fn tmpfs(path: &Path) {
    mount(
        Some("tmpfs"),
        path,
        Some("tmpfs"),
        MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
}

fn target(path: &Path) -> Target {
    let fd: OwnedFd = open(path, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
    Target::new(fd, path.to_path_buf())
}

/// More mounts than one `listmount` buffer holds (4,096 ids), so the
/// listing must continue after its first call.
#[test]
fn listmount_lists_every_mount_id() {
    isolated("listmount_lists_every_mount_id", || {
        let m = LinuxMounter;
        let Some(before) = m.mount_ids().unwrap() else {
            eprintln!("SKIP listmount_lists_every_mount_id: the kernel has no listmount(2) (6.8+)");
            return;
        };
        let base = tempfile::tempdir().unwrap();
        tmpfs(base.path());
        let paths: Vec<_> = (0..5000)
            .map(|i| base.path().join(format!("m{i}")))
            .collect();
        let mut ids = Vec::new();
        for p in &paths {
            std::fs::create_dir(p).unwrap();
            assert_eq!(
                m.mount_id(&target(p)).unwrap(),
                None,
                "not a mount root yet"
            );
            tmpfs(p);
            ids.push(m.mount_id(&target(p)).unwrap().expect("a unique mount id"));
        }
        let listed = m.mount_ids().unwrap().unwrap();
        assert_eq!(listed.len(), before.len() + 1 + paths.len());
        assert!(ids.iter().all(|id| listed.contains(id)));
        // Unmounted: no longer listed, and a new mount gets a new id.
        umount(&paths[7]).unwrap();
        let listed = m.mount_ids().unwrap().unwrap();
        assert!(!listed.contains(&ids[7]));
        tmpfs(&paths[7]);
        let again = m.mount_id(&target(&paths[7])).unwrap().unwrap();
        assert!(!ids.contains(&again));
        nix::mount::umount2(base.path(), nix::mount::MntFlags::MNT_DETACH).unwrap();
    });
}
