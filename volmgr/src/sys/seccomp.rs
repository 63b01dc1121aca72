//! A seccomp filter that makes `openat2(2)` fail with `ENOSYS`, as it does
//! on kernels before 5.6 and under valgrind: how tests exercise the
//! fallback of [`beneath`](super::beneath) on a kernel that has `openat2`.

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

/// Installs, for the calling thread and every process it starts, a filter
/// under which `openat2` fails with `ENOSYS` (the rest is allowed; a
/// system call of another architecture's ABI is let through untouched).
/// Sets `PR_SET_NO_NEW_PRIVS` first. Only async-signal-safe system calls
/// are made, so this may run in a `Command::pre_exec` hook. Fails with
/// `ENOTSUP` on an architecture it does not know.
pub fn fail_openat2_with_enosys() -> nix::Result<()> {
    let Some(arch) = AUDIT_ARCH else {
        return Err(Errno::ENOTSUP);
    };
    let nr = libc::SYS_openat2 as u32;
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ret = libc::BPF_RET | libc::BPF_K;
    let filter = [
        stmt(load, DATA_ARCH),
        // Another ABI's numbers mean other calls: allow.
        jump_eq(arch, 1, 0),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
        stmt(load, DATA_NR),
        jump_eq(nr, 0, 1),
        stmt(ret, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
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
