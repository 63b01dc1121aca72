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
