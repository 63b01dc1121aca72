//! subPath set-up cost per container against a plain bind mount, on a
//! tmpfs volume in a private mount namespace of its own. For N containers,
//! each with one subPath `c<i>/data/logs` (made on the first round):
//!
//! - `plain bind`: open the directory by path, make the entry, one
//!   `mount(MS_BIND)` (what a runtime's bind of a volume costs);
//! - `volmgr subPath`: `plugins::subpath::set_up_sub_paths` per container
//!   (the safe open below the volume's root, the beneath check, the bind
//!   and its inode check), directories already there;
//! - `volmgr clean-up`: `clean_sub_paths` of all of them (unmount, remove).
//!
//! ```text
//! cargo bench -p volmgr-cli --bench sub_path -- [--containers 500] [--rounds 5]
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "common/mod.rs"]
mod common;

use std::path::Path;
use std::time::Instant;

use volmgr::plugins::subpath::{clean_sub_paths, set_up_sub_paths};
use volmgr::sys::linux::LinuxMounter;
use volmgr::sys::root_dir::RootDir;
use volmgr::volume::{PodUid, SubPath};

fn plain_binds(vol: &Path, targets: &Path, n: usize) {
    for i in 0..n {
        let t = targets.join(i.to_string());
        std::fs::create_dir_all(&t).unwrap();
        let src = vol.join(format!("c{i}/data/logs"));
        nix::mount::mount(
            Some(&src),
            &t,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
    }
}

fn main() {
    if !common::in_private_mount_namespace() {
        return;
    }
    let f = common::flags(&["--containers", "--rounds"]);
    let (n, rounds) = (
        common::flag(&f, "--containers", 500usize),
        common::flag(&f, "--rounds", 5usize),
    );
    let base = tempfile::Builder::new()
        .prefix("volmgr-subpath")
        .tempdir()
        .unwrap();
    let root = RootDir::open(&base.path().join("root")).unwrap();
    let vol = root.path().join("pods/u/volumes/kubernetes.io~empty-dir/v");
    common::mount_tmpfs(&vol);
    let pod = PodUid::new("u").unwrap();
    let subs: Vec<SubPath> = (0..n)
        .map(|i| SubPath {
            container: format!("c{i}"),
            index: 0,
            path: format!("c{i}/data/logs"),
        })
        .collect();
    // First set-up makes the directories; not timed.
    set_up_sub_paths(&root, &LinuxMounter, &pod, "v", &vol, &subs).unwrap();
    clean_sub_paths(&root, &LinuxMounter, &pod, "v").unwrap();
    let targets = base.path().join("plain");
    println!(
        "machine: {}; {n} containers, one subPath each, tmpfs, {rounds} rounds",
        common::machine()
    );
    let mut t = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..rounds {
        let s = Instant::now();
        plain_binds(&vol, &targets, n);
        t[0].push(s.elapsed().as_secs_f64() * 1e6 / n as f64);
        for i in 0..n {
            nix::mount::umount2(&targets.join(i.to_string()), nix::mount::MntFlags::empty())
                .unwrap();
        }
        let s = Instant::now();
        for sub in &subs {
            set_up_sub_paths(
                &root,
                &LinuxMounter,
                &pod,
                "v",
                &vol,
                std::slice::from_ref(sub),
            )
            .unwrap();
        }
        t[1].push(s.elapsed().as_secs_f64() * 1e6 / n as f64);
        let s = Instant::now();
        clean_sub_paths(&root, &LinuxMounter, &pod, "v").unwrap();
        t[2].push(s.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    let plain = common::median(t[0].clone());
    for (name, v) in [
        "plain bind",
        "volmgr subPath set-up",
        "volmgr subPath clean-up",
    ]
    .iter()
    .zip(t)
    {
        let m = common::median(v);
        println!(
            "{name:<26} median {m:>8.1} us per container  ({:.2}x plain bind)",
            m / plain
        );
    }
    nix::mount::umount2(&vol, nix::mount::MntFlags::MNT_DETACH).unwrap();
}
