//! A seccomp filter that makes the system calls newer kernels added fail
//! with `ENOSYS`, as they do on older kernels (RHEL 8's 4.18), under
//! valgrind and under some container runtimes' seccomp profiles: how tests
//! exercise the fallbacks (the openat walk of [`beneath`](super::beneath),
//! the mount table read without `listmount`) on a kernel that has them all.

use nix::errno::Errno;

/// `AUDIT_ARCH_*` of the architectures the filter knows (linux/audit.h).
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: Option<u32> = Some(0xC000_003E);
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: Option<u32> = Some(0xC000_00B7);
#[cfg(target_arch = "riscv64")]
const AUDIT_ARCH: Option<u32> = Some(0xC000_00F3);
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
)))]
const AUDIT_ARCH: Option<u32> = None;

/// `offsetof(struct seccomp_data, nr)` and `arch`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;

const fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

const fn jump_eq(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    }
}

/// `jge k`: to `jt` when the loaded word is at least `k`, else to `jf`.
const fn jump_ge(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    }
}

/// x86_64's x32 ABI: its calls come with the x86_64 audit arch and their
/// number with this bit set (`__X32_SYSCALL_BIT`), so a filter of plain
/// numbers would let `unlink | X32_BIT` through on kernels with x32 on.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The system calls an older kernel lacks, by the numbers shared by every
/// architecture since their tables were unified (all are 424 or later):
/// `open_tree`, `move_mount`, `fsopen`, `fsconfig`, `fsmount`, `fspick`
/// (5.2), `openat2` (5.6), `mount_setattr` (5.12), `fchmodat2` (6.6),
/// `statmount`, `listmount` (6.8).
pub const NEWER_SYSCALLS: [u32; 11] = [428, 429, 430, 431, 432, 433, 437, 442, 452, 457, 458];

/// Installs, for the calling thread and every process it starts, a filter
/// under which every call of [`NEWER_SYSCALLS`] fails with `ENOSYS`, as on a
/// 4.18 kernel: see [`fail_with_enosys`].
pub fn emulate_older_kernel() -> nix::Result<()> {
    fail_with_enosys(&NEWER_SYSCALLS)
}

/// The most system calls [`fail_with_enosys`] takes.
const MAX_FILTERED: usize = 32;

/// Installs, for the calling thread and every process it starts, a filter
/// under which the system calls numbered `nrs` (of the native ABI) fail with
/// `ENOSYS` (the rest is allowed; a system call of another architecture's
/// ABI is let through untouched). Sets `PR_SET_NO_NEW_PRIVS` first. Only
/// async-signal-safe system calls are made and nothing is allocated, so this
/// may run in a `Command::pre_exec` hook. Fails with `ENOTSUP` on an
/// architecture it does not know, `EINVAL` with more than 32 calls.
pub fn fail_with_enosys(nrs: &[u32]) -> nix::Result<()> {
    let Some(arch) = AUDIT_ARCH else {
        return Err(Errno::ENOTSUP);
    };
    if nrs.len() > MAX_FILTERED {
        return Err(Errno::EINVAL);
    }
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ret = libc::BPF_RET | libc::BPF_K;
    let allow = stmt(ret, libc::SECCOMP_RET_ALLOW);
    let mut filter = [allow; MAX_FILTERED + 7];
    filter[0] = stmt(load, DATA_ARCH);
    // Another ABI's numbers mean other calls: allow.
    filter[1] = jump_eq(arch, 1, 0);
    filter[2] = allow;
    filter[3] = stmt(load, DATA_NR);
    let mut len = 4;
    let n = nrs.len();
    #[cfg(target_arch = "x86_64")]
    {
        // Every x32 call fails: over the tests and the "allow" to ENOSYS.
        let skip = u8::try_from(n + 1).map_err(|_| Errno::EINVAL)?;
        filter[len] = jump_ge(X32_SYSCALL_BIT, skip, 0);
        len += 1;
    }
    for (i, nr) in nrs.iter().enumerate() {
        // Matched: jump over the remaining tests and the "allow" to the
        // ENOSYS return.
        let skip = u8::try_from(n - i).map_err(|_| Errno::EINVAL)?;
        filter[len] = jump_eq(*nr, skip, 0);
        len += 1;
    }
    filter[len] = allow;
    filter[len + 1] = stmt(ret, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32);
    len += 2;
    let prog = libc::sock_fprog {
        len: len as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: PR_SET_NO_NEW_PRIVS takes plain integers.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(Errno::last());
    }
    // SAFETY: `prog` points to `filter`, a valid BPF program of `len`
    // instructions that outlives the call (the kernel copies it).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            std::ptr::from_ref(&prog),
        )
    };
    if rc != 0 {
        return Err(Errno::last());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::sys::test_child::{run_in_child, Child};

    /// Under the filter every newer call fails with ENOSYS, before looking
    /// at its arguments (bad ones would be EFAULT or EINVAL otherwise), and
    /// older calls still work.
    #[test]
    fn the_older_kernel_filter_fails_exactly_the_newer_calls() {
        run_in_child(
            crate::test_name!("the_older_kernel_filter_fails_exactly_the_newer_calls"),
            Child::NoOpenat2,
            || {
                for nr in super::NEWER_SYSCALLS {
                    // SAFETY: the filter answers before the kernel reads
                    // the (null) arguments.
                    let rc = unsafe { libc::syscall(libc::c_long::from(nr), 0, 0, 0, 0, 0) };
                    assert_eq!(rc, -1, "system call {nr}");
                    assert_eq!(nix::errno::Errno::last(), nix::errno::Errno::ENOSYS, "{nr}");
                }
                assert!(std::fs::metadata("/").is_ok(), "statx still works");
                // The child harness checks the openat2 fallback was used.
                let root = std::fs::File::open("/").unwrap();
                let _ = crate::sys::beneath::open(
                    std::os::fd::AsFd::as_fd(&root),
                    std::path::Path::new("tmp"),
                    nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY,
                    crate::sys::beneath::Last::MayBeMountRoot,
                );
            },
        );
    }
}
