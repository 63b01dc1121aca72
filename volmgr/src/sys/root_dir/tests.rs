use super::*;
use nix::sys::stat::mkdirat;

fn root() -> (tempfile::TempDir, RootDir) {
    let t = tempfile::tempdir().unwrap();
    let r = RootDir::open(t.path()).unwrap();
    (t, r)
}

#[test]
fn rejects_bad_components() {
    for bad in ["", ".", "..", "a/b", "a\0b"] {
        assert!(RelPath::new(["pods", bad]).is_err(), "{bad:?}");
    }
    assert!(RelPath::new(["pods", "uid", "..a", "a.."]).is_ok());
}

#[test]
fn mkdir_all_creates_and_reopens() {
    let (_t, r) = root();
    let rel = RelPath::new(["pods", "u1", "volumes", "x"]).unwrap();
    let t = r.mkdir_all(&rel, 0o750).unwrap();
    assert_eq!(t.path(), r.path().join("pods/u1/volumes/x"));
    assert!(r.path().join("pods/u1/volumes/x").is_dir());
    r.mkdir_all(&rel, 0o750).unwrap();
    assert!(r.exists(&rel).unwrap());
}

#[test]
fn refuses_symlinks_anywhere_on_the_path() {
    let (_t, r) = root();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(r.path().join("pods")).unwrap();
    std::os::unix::fs::symlink(outside.path(), r.path().join("pods/evil")).unwrap();
    let rel = RelPath::new(["pods", "evil", "volumes"]).unwrap();
    assert!(matches!(
        r.mkdir_all(&rel, 0o750),
        Err(PathError::Escape { .. })
    ));
    assert!(matches!(
        r.open_dir(&RelPath::new(["pods", "evil"]).unwrap()),
        Err(PathError::Escape { .. })
    ));
    assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    // Removing the symlink removes the link, not the target's contents.
    std::fs::write(outside.path().join("keep"), b"x").unwrap();
    r.remove_all(&RelPath::new(["pods", "evil"]).unwrap())
        .unwrap();
    assert!(outside.path().join("keep").exists());
    assert!(!r.path().join("pods/evil").exists());
}

#[test]
fn remove_all_deletes_deep_trees_without_following_links() {
    let (_t, r) = root();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep"), b"x").unwrap();
    let mut deep = r.path().join("pods/u/volumes");
    for i in 0..300 {
        deep.push(format!("d{i}"));
    }
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("f"), b"data").unwrap();
    std::os::unix::fs::symlink(outside.path(), deep.join("link")).unwrap();
    r.remove_all(&RelPath::new(["pods", "u"]).unwrap()).unwrap();
    assert!(!r.path().join("pods/u").exists());
    assert!(outside.path().join("keep").exists());
    r.remove_all(&RelPath::new(["pods", "u"]).unwrap()).unwrap();
}

/// Makes a chain of `depth` directories `d/d/d/...` under `dir` (longer
/// than PATH_MAX: made relative to descriptors), with a file at the end.
fn deep_chain(dir: &Path, depth: usize) {
    let mut fd: OwnedFd = std::fs::File::open(dir).unwrap().into();
    for _ in 0..depth {
        mkdirat(&fd, "d", Mode::from_bits_truncate(0o755)).unwrap();
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        fd = nix::fcntl::openat(&fd, "d", flags, Mode::empty()).unwrap();
    }
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_CLOEXEC;
    drop(nix::fcntl::openat(&fd, "f", flags, Mode::from_bits_truncate(0o644)).unwrap());
}

/// A pod can build a directory chain far deeper than the open-file
/// limit: tear-down still removes it, with a bounded number of
/// descriptors and memory in proportion to the depth.
#[test]
fn remove_all_deletes_chains_deeper_than_the_descriptor_limit() {
    crate::sys::test_child::run_in_child(
        crate::test_name!("remove_all_deletes_chains_deeper_than_the_descriptor_limit"),
        crate::sys::test_child::Child::PrivateMounts,
        || {
            // Far below the depth, as on a node with a low limit.
            let limit = libc::rlimit {
                rlim_cur: 256,
                rlim_max: 256,
            };
            // SAFETY: a plain struct for setrlimit.
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
            let (_t, r) = root();
            let vol = r.path().join("pods/u/volumes/v");
            std::fs::create_dir_all(&vol).unwrap();
            // The adversarial run's 5,000 levels made every tear-down
            // fail with EMFILE.
            deep_chain(&vol, 5_000);
            r.remove_all(&RelPath::new(["pods", "u"]).unwrap()).unwrap();
            assert!(!r.path().join("pods/u").exists());
        },
    );
}

#[test]
fn remove_all_empties_directories_bigger_than_one_listing() {
    let (_t, r) = root();
    let big = r.path().join("pods/u/volumes/big");
    std::fs::create_dir_all(&big).unwrap();
    for i in 0..2000 {
        std::fs::write(big.join(format!("file-{i:05}-{}", "x".repeat(30))), b"").unwrap();
    }
    for i in 0..50 {
        std::fs::create_dir(big.join(format!("dir-{i}"))).unwrap();
    }
    r.remove_all(&RelPath::new(["pods", "u"]).unwrap()).unwrap();
    assert!(!r.path().join("pods/u").exists());
    // A plain file as the thing to remove.
    std::fs::write(r.path().join("pods/file"), b"x").unwrap();
    r.remove_all(&RelPath::new(["pods", "file"]).unwrap())
        .unwrap();
    assert!(!r.path().join("pods/file").exists());
}

#[test]
fn remove_all_at_deletes_through_a_held_parent_without_following_links() {
    let (_t, r) = root();
    let parent_rel = RelPath::new(["pods", "u", "volumes"]).unwrap();
    let parent = r.mkdir_all(&parent_rel, 0o750).unwrap();
    let dir = r.path().join("pods/u/volumes");
    // An empty directory (removed by the first rmdir).
    std::fs::create_dir(dir.join("empty")).unwrap();
    r.remove_all_at(&parent, OsStr::new("empty")).unwrap();
    assert!(!dir.join("empty").exists());
    // A tree.
    std::fs::create_dir_all(dir.join("tree/a/b")).unwrap();
    std::fs::write(dir.join("tree/a/f"), b"x").unwrap();
    r.remove_all_at(&parent, OsStr::new("tree")).unwrap();
    assert!(!dir.join("tree").exists());
    // A symlink to a directory outside ROOT: the link goes, not the target.
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(outside.path().join("empty")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("empty"), dir.join("link")).unwrap();
    r.remove_all_at(&parent, OsStr::new("link")).unwrap();
    assert!(!dir.join("link").exists());
    assert!(outside.path().join("empty").is_dir());
    // A file, and something already gone.
    std::fs::write(dir.join("file"), b"x").unwrap();
    r.remove_all_at(&parent, OsStr::new("file")).unwrap();
    assert!(!dir.join("file").exists());
    r.remove_all_at(&parent, OsStr::new("file")).unwrap();
}

#[test]
fn cached_pods_dir_survives_deletion_and_recreation() {
    let (_t, r) = root();
    let rel = RelPath::new(["pods", "u1", "volumes", "x"]).unwrap();
    let (_, created) = r.mkdir_mount_target(&rel, 0o750).unwrap();
    assert!(created);
    // Someone deletes ROOT/pods under the manager: the next pod still
    // lands in ROOT/pods, not in the deleted directory.
    std::fs::remove_dir_all(r.path().join("pods")).unwrap();
    let rel2 = RelPath::new(["pods", "u2", "volumes", "x"]).unwrap();
    let (t, created) = r.mkdir_mount_target(&rel2, 0o750).unwrap();
    assert!(created);
    assert_eq!(t.path(), r.path().join("pods/u2/volumes/x"));
    assert!(r.path().join("pods/u2/volumes/x").is_dir());
    // An existing pod directory takes the general path.
    let (_, created) = r.mkdir_mount_target(&rel2, 0o750).unwrap();
    assert!(!created);
    let rel3 = RelPath::new(["pods", "u2", "volumes", "y"]).unwrap();
    let (_, created) = r.mkdir_mount_target(&rel3, 0o750).unwrap();
    assert!(created);
}

/// `pods/u/volumes/kubernetes.io~empty-dir/w`, a disk-backed emptyDir.
const VOL: [&str; 5] = ["pods", "u", "volumes", "kubernetes.io~empty-dir", "w"];

fn rel(c: &[&str]) -> RelPath {
    RelPath::new(c).unwrap()
}

/// The attack of an adversarial run, replayed for a mount on each
/// component of a volume's path: a "host" directory outside ROOT,
/// bind-mounted there, is never modified, and every error names the
/// mount. Returns what went wrong.
fn foreign_mount_on_component(depth: usize) -> Vec<String> {
    use super::super::test_child::{bind, tree, unmount};
    let t = tempfile::tempdir().unwrap();
    let r = RootDir::open(&t.path().join("root")).unwrap();
    let host = t.path().join("host");
    let vol = r.path().join(VOL.join("/"));
    std::fs::create_dir_all(vol.join("e")).unwrap();
    std::fs::write(vol.join("mine"), b"x").unwrap();
    // The host directory holds what the rest of the path names.
    let inner = host.join(VOL[depth..].join("/"));
    std::fs::create_dir_all(inner.join("e")).unwrap();
    for f in ["f1", "f2", "f3"] {
        std::fs::write(inner.join(f), f).unwrap();
    }
    let mount_point = r.path().join(VOL[..depth].join("/"));
    bind(&host, &mount_point);
    let before = tree(&host);
    let mut problems = Vec::new();
    let mut refused = |what: &str, res: Result<(), PathError>| match res {
        Ok(()) => problems.push(format!("depth {depth}: {what} crossed the mount")),
        Err(e) if !e.to_string().contains(&*mount_point.to_string_lossy()) => problems.push(
            format!("depth {depth}: {what}: error without the mount: {e}"),
        ),
        Err(_) => {}
    };
    let parent = rel(&VOL[..4]);
    let strict_parent = depth <= 4;
    match r.open_dir(&parent) {
        Ok(p) if strict_parent => {
            refused("open_dir(parent)", Ok(()));
            refused("remove_all_at", r.remove_all_at(&p, OsStr::new("w")));
        }
        Ok(p) => refused("remove_all_at", r.remove_all_at(&p, OsStr::new("w"))),
        Err(e) => refused("open_dir(parent)", Err(e)),
    }
    refused("remove_all(volume)", r.remove_all(&rel(&VOL)));
    refused("remove_all(pod)", r.remove_all(&rel(&VOL[..2])));
    let sub = rel(&VOL).join("sub").unwrap();
    refused("mkdir_all(sub)", r.mkdir_all(&sub, 0o750).map(drop));
    let new = rel(&VOL).join("new").unwrap();
    refused("write_file", r.write_file(&new, b"x"));
    refused("read_dir", r.read_dir(&rel(&VOL)).map(drop));
    let f1 = rel(&VOL).join("f1").unwrap();
    refused("exists", r.exists(&f1).map(drop));
    let e = rel(&VOL).join("e").unwrap();
    refused("remove_empty_dir", r.remove_empty_dir(&e).map(drop));
    let sibling = parent.join("w2").unwrap();
    if strict_parent {
        refused("mkdir_all(sibling)", r.mkdir_all(&sibling, 0o750).map(drop));
    }
    if tree(&host) != before {
        problems.push(format!(
            "depth {depth}: the host directory changed: {before:?} -> {:?}",
            tree(&host)
        ));
    }
    // (Before the fix, held descriptors of the host directory kept
    // the mount busy.)
    let root_path = r.path().to_path_buf();
    drop(r);
    unmount(&mount_point);
    // What was under the mount is ROOT's own, and still there.
    assert!(vol.join("mine").exists(), "depth {depth}");
    let r = RootDir::open(&root_path).unwrap();
    r.remove_all(&rel(&VOL[..2])).unwrap();
    problems
}

fn foreign_mounts_on_a_volume_path() {
    let problems: Vec<String> = (1..=5).flat_map(foreign_mount_on_component).collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn foreign_mounts_on_a_volume_path_are_never_crossed() {
    use super::super::test_child::{run_in_child, Child};
    let name = crate::test_name!("foreign_mounts_on_a_volume_path_are_never_crossed");
    run_in_child(name, Child::PrivateMounts, foreign_mounts_on_a_volume_path);
}

/// Creates pod directories while another thread swaps a component of
/// each (`pods/<uid>/volumes`) for a symlink to a directory outside ROOT
/// (atomically, `RENAME_EXCHANGE`): nothing is ever created outside.
fn mkdir_races_with_symlink_swaps(iterations: usize) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    let (_t, r) = root();
    let outside = tempfile::tempdir().unwrap();
    let atk = r.path().join("atk");
    std::fs::create_dir(&atk).unwrap();
    // The iteration the attacker is to race (usize::MAX: none yet), and
    // the one it is ready for.
    let target = AtomicUsize::new(usize::MAX);
    let ready = AtomicUsize::new(usize::MAX);
    let (stop, hits) = (AtomicBool::new(false), AtomicUsize::new(0));
    let failed = AtomicUsize::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut done = usize::MAX;
            while !stop.load(SeqCst) {
                let n = target.load(SeqCst);
                if n == usize::MAX || n == done {
                    std::thread::yield_now();
                    continue;
                }
                let link = atk.join(format!("l{n}"));
                std::os::unix::fs::symlink(outside.path(), &link).unwrap();
                let victim = r.path().join(format!("pods/u{n}/volumes"));
                ready.store(n, SeqCst);
                while target.load(SeqCst) == n && !stop.load(SeqCst) {
                    let swapped = nix::fcntl::renameat2(
                        nix::fcntl::AT_FDCWD,
                        &link,
                        nix::fcntl::AT_FDCWD,
                        &victim,
                        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                    );
                    if swapped.is_ok() {
                        hits.fetch_add(1, SeqCst);
                        break;
                    }
                }
                done = n;
            }
        });
        for n in 0..iterations {
            target.store(n, SeqCst);
            while ready.load(SeqCst) != n {
                std::thread::yield_now();
            }
            let rel = RelPath::new([
                "pods",
                &format!("u{n}"),
                "volumes",
                "kubernetes.io~empty-dir",
                "w",
            ])
            .unwrap();
            if r.mkdir_mount_target(&rel, 0o750).is_err() {
                failed.fetch_add(1, SeqCst);
            }
            let _ = r.mkdir_all(&rel.join("x").unwrap(), 0o750);
        }
        stop.store(true, SeqCst);
    });
    println!(
        "symlink swaps: {} of {iterations} pod directories swapped, {} creations refused",
        hits.load(SeqCst),
        failed.load(SeqCst)
    );
    assert!(
        super::super::test_child::tree(outside.path()).is_empty(),
        "created outside ROOT: {:?}",
        super::super::test_child::tree(outside.path())
    );
}

#[test]
fn mkdir_races_with_symlink_swaps_never_create_outside() {
    mkdir_races_with_symlink_swaps(5000);
}

/// The real-filesystem tests and the attacks once more, where `openat2`
/// fails with `ENOSYS` (kernels before 5.6, valgrind): the fallback walk
/// keeps the same rules.
mod without_openat2 {
    crate::again_without_openat2!(
        mkdir_all_creates_and_reopens,
        refuses_symlinks_anywhere_on_the_path,
        remove_all_deletes_deep_trees_without_following_links,
        remove_all_empties_directories_bigger_than_one_listing,
        remove_all_at_deletes_through_a_held_parent_without_following_links,
        cached_pods_dir_survives_deletion_and_recreation,
        write_and_read_files,
        mkdir_races_with_symlink_swaps(2000),
        foreign_mounts_on_a_volume_path,
    );
}

#[test]
fn write_and_read_files() {
    let (_t, r) = root();
    let rel = RelPath::new(["pods", "u", "plugins", "p", "ready"]).unwrap();
    r.write_file(&rel, b"hello").unwrap();
    assert_eq!(r.read_file(&rel).unwrap(), b"hello");
    let names = r
        .read_dir(&RelPath::new(["pods", "u", "plugins", "p"]).unwrap())
        .unwrap();
    assert_eq!(names, vec![OsString::from("ready")]);
    assert!(r
        .read_dir(&RelPath::new(["nope"]).unwrap())
        .unwrap()
        .is_empty());
}

/// A write syncs the file and then its directory: with `fsync` failing
/// (a seccomp filter), the directory's sync after the rename is the
/// error; with `fdatasync` failing, the file's own sync before the
/// rename is, and the file keeps its old contents with nothing left.
#[test]
fn a_write_is_synced_and_a_failed_sync_is_reported() {
    use super::super::test_child::{run_in_child, Child};
    let name = crate::test_name!("a_write_is_synced_and_a_failed_sync_is_reported");
    run_in_child(name, Child::PrivateMounts, || {
        let (_t, r) = root();
        let rel = RelPath::new(["pods", "u", "vol_data.json"]).unwrap();
        let dir = RelPath::new(["pods", "u"]).unwrap();
        r.write_file(&rel, b"old").unwrap();
        // From here on `fsync` fails on this thread (a seccomp filter):
        // the directory's sync, after the rename, is reported.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let nr = |n: libc::c_long| n as u32;
        crate::sys::seccomp::fail_with_enosys(&[nr(libc::SYS_fsync)]).unwrap();
        let err = r.write_file(&rel, b"new").unwrap_err();
        assert!(err.to_string().contains("fsync"), "{err}");
        assert_eq!(r.read_file(&rel).unwrap(), b"new");
        // And `fdatasync` too: the file's own sync fails before the
        // rename, which leaves the file as it was and nothing else.
        crate::sys::seccomp::fail_with_enosys(&[nr(libc::SYS_fdatasync)]).unwrap();
        let err = r.write_file(&rel, b"newer").unwrap_err();
        assert!(err.to_string().contains("fdatasync"), "{err}");
        assert_eq!(r.read_file(&rel).unwrap(), b"new");
        assert_eq!(
            r.read_dir(&dir).unwrap(),
            vec![OsString::from("vol_data.json")]
        );
    });
}

/// On a full file system (a 1 MiB tmpfs, filled), a write fails with
/// `ENOSPC`, the file keeps its old contents and no temporary file is
/// left; with space back, the same write succeeds.
#[test]
fn a_write_on_a_full_disk_keeps_the_old_file_and_leaves_nothing() {
    use super::super::test_child::{run_in_child, Child};
    let name = crate::test_name!("a_write_on_a_full_disk_keeps_the_old_file_and_leaves_nothing");
    run_in_child(name, Child::PrivateMounts, || {
        use std::io::Write;
        let t = tempfile::tempdir().unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            t.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=1m"),
        )
        .unwrap();
        let r = RootDir::open(t.path()).unwrap();
        let rel = RelPath::new(["pods", "u", "vol_data.json"]).unwrap();
        r.write_file(&rel, b"old").unwrap();
        let filler = t.path().join("filler");
        let mut f = std::fs::File::create(&filler).unwrap();
        while f.write_all(&[7u8; 4096]).is_ok() {}
        drop(f);
        let err = r.write_file(&rel, &[b'n'; 64 * 1024]).unwrap_err();
        assert!(err.to_string().contains("No space left on device"), "{err}");
        assert_eq!(r.read_file(&rel).unwrap(), b"old");
        let dir = RelPath::new(["pods", "u"]).unwrap();
        assert_eq!(
            r.read_dir(&dir).unwrap(),
            vec![OsString::from("vol_data.json")]
        );
        std::fs::remove_file(&filler).unwrap();
        r.write_file(&rel, &[b'n'; 64 * 1024]).unwrap();
        assert_eq!(r.read_file(&rel).unwrap().len(), 64 * 1024);
        drop(r);
        nix::mount::umount(t.path()).unwrap();
    });
}
