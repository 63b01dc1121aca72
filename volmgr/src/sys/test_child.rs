//! For unit tests that mount, or that must see the kernel behave otherwise:
//! the test body runs in a re-executed child of the test binary (so no
//! thread of the harness ever changes namespace), set up between `fork` and
//! `exec`.

// Test-only code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::process::CommandExt;
use std::process::Command;

const CHILD_ENV: &str = "VOLMGR_UNIT_TEST_CHILD";
const NO_OPENAT2_ENV: &str = "VOLMGR_UNIT_TEST_NO_OPENAT2";

/// What the child's world looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Child {
    /// A private mount namespace (`/` recursively private).
    PrivateMounts,
    /// The same, and `openat2` (with every other call of
    /// [`NEWER_SYSCALLS`](crate::sys::seccomp::NEWER_SYSCALLS)) failing with
    /// `ENOSYS` (a seccomp filter), as on a 4.18 kernel: the child checks
    /// that the openat2 fallback was used.
    NoOpenat2,
}

/// The name libtest knows the test `f` of the calling module by.
#[macro_export]
macro_rules! test_name {
    ($f:literal) => {
        concat!(module_path!(), "::", $f)
    };
}

/// For each test body `name` (a function of the enclosing module's parent,
/// with an optional argument), a test that runs it once more in a child
/// where `openat2` fails with `ENOSYS` ([`Child::NoOpenat2`]). Invoke it
/// inside a `mod without_openat2` of the tests module.
#[macro_export]
macro_rules! again_without_openat2 {
    ($($name:ident $(($arg:expr))?),* $(,)?) => {$(
        #[test]
        fn $name() {
            let name = concat!(module_path!(), "::", stringify!($name));
            $crate::sys::test_child::run_in_child(
                name,
                $crate::sys::test_child::Child::NoOpenat2,
                || super::$name($($arg)?),
            );
        }
    )*};
}

/// Runs `body` in a child set up as `how`; `name` is the test's full path as
/// [`test_name!`] gives it. Skips (printing why) when not root.
pub fn run_in_child(name: &str, how: Child, body: impl FnOnce()) {
    let name = name.strip_prefix("volmgr::").unwrap_or(name);
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        body();
        if std::env::var_os(NO_OPENAT2_ENV).is_some() {
            assert_eq!(
                crate::sys::beneath::openat2_in_use(),
                Some(false),
                "the fallback was not used"
            );
        }
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP {name}: needs root for a private mount namespace");
        return;
    }
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name);
    if how == Child::NoOpenat2 {
        cmd.env(NO_OPENAT2_ENV, "1");
    }
    // Before fork: nothing is allocated in the child.
    let tmp = std::env::temp_dir();
    // SAFETY: only async-signal-safe syscalls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            crate::sys::namespace::enter_private_mount_namespace()?;
            // A bug that binds `/` or `/etc` into the test's directory
            // must not let its clean-up delete the host's files.
            crate::sys::namespace::make_host_read_only_but(&tmp)?;
            if how == Child::NoOpenat2 {
                crate::sys::seccomp::emulate_older_kernel()?;
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child test {name} failed:\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(
        stdout.contains("1 passed"),
        "child test {name} did not run:\n{stdout}\n{stderr}"
    );
    // Timings and notes the child printed.
    print!("{stdout}");
}

/// Every file and directory below `dir` (relative paths, sorted), with
/// each file's contents: a snapshot to compare before and after.
pub fn tree(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().to_path_buf();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                todo.push(p);
                out.push((rel, Vec::new()));
            } else if ft.is_symlink() {
                out.push((
                    rel,
                    std::fs::read_link(&p)
                        .unwrap()
                        .into_os_string()
                        .into_encoded_bytes(),
                ));
            } else {
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Bind-mounts `source` on `target` (in the child's private namespace).
pub fn bind(source: &std::path::Path, target: &std::path::Path) {
    nix::mount::mount(
        Some(source),
        target,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap_or_else(|e| panic!("bind {} on {}: {e}", source.display(), target.display()));
}

/// Unmounts `target`.
pub fn unmount(target: &std::path::Path) {
    nix::mount::umount2(target, nix::mount::MntFlags::empty())
        .unwrap_or_else(|e| panic!("umount {}: {e}", target.display()));
}
