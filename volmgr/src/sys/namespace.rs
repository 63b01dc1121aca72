//! Entering a private mount namespace: what every test, demo and benchmark
//! that mounts does first, so the host's mount table is never touched.

/// Moves the calling process (which must be single-threaded, e.g. a child
/// between `fork` and `exec`) into a new mount namespace and makes every
/// mount in it recursively private, so nothing propagates back to the host.
///
/// Only async-signal-safe system calls are made, so this may run in a
/// `Command::pre_exec` hook.
pub fn enter_private_mount_namespace() -> nix::Result<()> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
        None::<&str>,
    )
}

/// For tests, in a private mount namespace (after
/// [`enter_private_mount_namespace`]): makes every path read-only for the
/// calling process and everything it starts, except `tmp` (the temporary
/// directory, bound onto itself first) and the separate mounts such as
/// `/dev` and `/proc`. A test whose code under test wrongly binds `/` or
/// `/etc` into its temporary directory then cannot delete the host's files
/// through that bind when it cleans up (a bind keeps the read-only flag).
///
/// Only async-signal-safe system calls are made (`tmp` must be computed
/// before `fork`), so this may run in a `Command::pre_exec` hook.
pub fn make_host_read_only_but(tmp: &std::path::Path) -> nix::Result<()> {
    use nix::mount::{mount, MsFlags};
    mount(
        Some(tmp),
        tmp,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY,
        None::<&str>,
    )
}

#[cfg(test)]
mod tests {
    use crate::sys::test_child::{bind, run_in_child, Child};

    /// In a test child, the temporary directory is writable, but `/etc`
    /// bound into it is not: a buggy bind cannot cost the host its files.
    #[test]
    fn test_children_cannot_write_the_host_through_a_bind() {
        run_in_child(
            crate::test_name!("test_children_cannot_write_the_host_through_a_bind"),
            Child::PrivateMounts,
            || {
                let t = tempfile::tempdir().unwrap();
                std::fs::write(t.path().join("ok"), b"x").unwrap();
                let etc = t.path().join("etc");
                std::fs::create_dir(&etc).unwrap();
                bind(std::path::Path::new("/etc"), &etc);
                let err = std::fs::write(etc.join("volmgr-probe"), b"x").unwrap_err();
                assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
                assert!(std::fs::remove_file(etc.join("hostname")).is_err());
                crate::sys::test_child::unmount(&etc);
            },
        );
    }
}
