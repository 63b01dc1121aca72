//! The fsGroup walk (`SetVolumeOwnership`) on a volume of N files (the
//! kubelet's slow recursive chown is kubernetes#69699), side by side in one
//! run, on a tmpfs in a private mount namespace of its own:
//!
//! - `kubelet-style`: what the kubelet's `filepath.Walk` does, `lchown` and
//!   `chmod` by path on every entry (here back to group 0, which also resets
//!   the volume for the next case);
//! - `volmgr, all change`: volmgr's walk when every entry needs the group;
//! - `volmgr, none change`: the same walk again (entries that match are
//!   left alone: one `fstat` each);
//! - `volmgr, OnRootMismatch`: the root matches, so the walk is skipped.
//!
//! ```text
//! cargo bench -p volmgr-cli --bench fs_group -- [--files 100000] [--rounds 5]
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "common/mod.rs"]
mod common;

use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Instant;

use volmgr::plugins::volume_ownership::{set_volume_ownership, FsGroupChangePolicy};

const GID: u32 = 2000;
const PER_DIR: usize = 1000;

fn populate(vol: &Path, files: usize) {
    for d in 0..files.div_ceil(PER_DIR) {
        let dir = vol.join(format!("d{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..PER_DIR.min(files - d * PER_DIR) {
            std::fs::write(dir.join(format!("f{f}")), b"").unwrap();
        }
    }
}

/// The kubelet's walk: lchown + chmod by path on every entry.
fn kubelet_style(dir: &Path, gid: u32) {
    std::os::unix::fs::lchown(dir, None, Some(gid)).unwrap();
    let meta = std::fs::symlink_metadata(dir).unwrap();
    std::fs::set_permissions(
        dir,
        std::fs::Permissions::from_mode(meta.permissions().mode() | 0o660),
    )
    .unwrap();
    if meta.is_dir() {
        for e in std::fs::read_dir(dir).unwrap() {
            kubelet_style(&e.unwrap().path(), gid);
        }
    }
}

fn volmgr_walk(vol: &Path, policy: FsGroupChangePolicy) -> u64 {
    let fd = std::fs::File::open(vol).unwrap();
    let c = set_volume_ownership(fd.as_fd(), vol, GID, false, policy).unwrap();
    c.changed
}

fn main() {
    if !common::in_private_mount_namespace() {
        return;
    }
    let f = common::flags(&["--files", "--rounds"]);
    let (files, rounds) = (
        common::flag(&f, "--files", 100_000usize),
        common::flag(&f, "--rounds", 5usize),
    );
    let base = tempfile::Builder::new()
        .prefix("volmgr-fsgroup")
        .tempdir()
        .unwrap();
    let vol = base.path().join("vol");
    common::mount_tmpfs(&vol);
    populate(&vol, files);
    println!(
        "machine: {}; {files} files in {} directories on tmpfs, {rounds} rounds",
        common::machine(),
        files.div_ceil(PER_DIR)
    );
    let mut t = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..rounds {
        let s = Instant::now();
        kubelet_style(&vol, 0);
        t[0].push(s.elapsed().as_secs_f64() * 1e3);
        let s = Instant::now();
        let changed = volmgr_walk(&vol, FsGroupChangePolicy::Always);
        t[1].push(s.elapsed().as_secs_f64() * 1e3);
        assert!(changed as usize > files, "every entry changed: {changed}");
        let s = Instant::now();
        assert_eq!(volmgr_walk(&vol, FsGroupChangePolicy::Always), 0);
        t[2].push(s.elapsed().as_secs_f64() * 1e3);
        let s = Instant::now();
        assert_eq!(volmgr_walk(&vol, FsGroupChangePolicy::OnRootMismatch), 0);
        t[3].push(s.elapsed().as_secs_f64() * 1e3);
    }
    let names = [
        "kubelet-style (lchown + chmod by path)",
        "volmgr, all change",
        "volmgr, none change",
        "volmgr, OnRootMismatch (root matches)",
    ];
    let kubelet = common::median(t[0].clone());
    for (name, v) in names.iter().zip(t) {
        let m = common::median(v);
        println!(
            "{name:<40} median {m:>9.2} ms  ({:.2}x kubelet-style)",
            m / kubelet
        );
    }
    nix::mount::umount2(&vol, nix::mount::MntFlags::MNT_DETACH).unwrap();
}
