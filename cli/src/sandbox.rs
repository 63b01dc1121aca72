//! Observe mode's confinement: the agent restricts itself with Landlock
//! (read-only everywhere, ROOT included; writes only under its state
//! directory; no signal to a process outside its Landlock domain) and drops
//! the capabilities it does not need. Both act on the calling thread and
//! what it starts later, so [`confine`] runs before the runtime starts any
//! thread.
//!
//! Landlock (Linux ≥ 5.13) is used through its three system calls. The
//! handled rights are every right that changes the file system (write,
//! truncate, remove, make, rename/link across directories); reads stay
//! unrestricted. A Landlock-restricted process also cannot mount or
//! unmount anything (landlock(7)). Landlock does not cover changes of
//! metadata (chmod, chown, setxattr, utimes): those are left to the
//! capabilities dropped and to file ownership. Where the kernel has
//! Landlock ABI 6 (Linux 6.12), signals are scoped
//! (`LANDLOCK_SCOPE_SIGNAL`): the agent can signal only itself.
//!
//! Capabilities kept (see docs/USAGE.md, "Observe mode"): `CAP_BPF`,
//! `CAP_PERFMON` (loading the eBPF tracer), `CAP_SYS_ADMIN` only on
//! kernels without those two (before 5.8, where it is what loads the
//! tracer), `CAP_SYS_PTRACE` and `CAP_DAC_READ_SEARCH` (reading
//! `/proc/<pid>` of other processes and the kubelet's files whatever their
//! modes), `CAP_SYS_RESOURCE` (the locked-memory limit of BPF maps on older
//! kernels). Every other one is dropped from the bounding, ambient,
//! inheritable, permitted and effective sets.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use volmgr::sys::capabilities;

/// What [`confine`] achieved, for status.
#[derive(Debug, Clone, Default)]
pub struct Confinement {
    /// `enforced (ABI vN)` or `unavailable: <why>`.
    pub landlock: String,
    /// The capabilities kept, or why they were not dropped.
    pub capabilities: String,
}

/// `LANDLOCK_CREATE_RULESET_VERSION`.
const CREATE_RULESET_VERSION: u32 = 1;
/// `LANDLOCK_RULE_PATH_BENEATH`.
const RULE_PATH_BENEATH: libc::c_int = 1;
/// `LANDLOCK_ACCESS_FS_*` of ABI 1 that change the file system: write
/// file, remove dir/file, make char/dir/reg/sock/fifo/block/sym.
const WRITE_ABI1: u64 = (1 << 1) | (1 << 4) | (1 << 5) | (0x7f << 6);
/// `LANDLOCK_ACCESS_FS_REFER` (ABI 2).
const REFER: u64 = 1 << 13;
/// `LANDLOCK_ACCESS_FS_TRUNCATE` (ABI 3).
const TRUNCATE: u64 = 1 << 14;
/// `LANDLOCK_SCOPE_SIGNAL` (ABI 6): no signal to a process outside the
/// domain.
const SCOPE_SIGNAL: u64 = 1 << 1;
/// The first ABI with `scoped`.
const ABI_SCOPE: i64 = 6;

/// `struct landlock_ruleset_attr` (ABI 6); earlier ABIs get its first
/// field only.
#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

/// `struct landlock_path_beneath_attr` (packed).
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// The capabilities kept (numbers of linux/capability.h), but
/// [`CAP_SYS_ADMIN`] only where [`CAP_PERFMON`] and [`CAP_BPF`] do not exist.
const KEPT: &[(u32, &str)] = &[
    (2, "CAP_DAC_READ_SEARCH"),
    (19, "CAP_SYS_PTRACE"),
    (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
    (24, "CAP_SYS_RESOURCE"),
    (CAP_PERFMON, "CAP_PERFMON"),
    (CAP_BPF, "CAP_BPF"),
];

/// `CAP_SYS_ADMIN`.
const CAP_SYS_ADMIN: u32 = 21;
/// `CAP_PERFMON` (Linux 5.8).
const CAP_PERFMON: u32 = 38;
/// `CAP_BPF` (Linux 5.8).
const CAP_BPF: u32 = 39;

/// The capabilities to keep on a kernel whose last capability is
/// `last_cap`: those of [`KEPT`] it knows, `CAP_SYS_ADMIN` only when it has
/// no `CAP_BPF` (it would let the agent remount, set the host name, ...).
fn kept(last_cap: u32) -> Vec<(u32, &'static str)> {
    KEPT.iter()
        .copied()
        .filter(|(c, _)| *c <= last_cap)
        .filter(|(c, _)| *c != CAP_SYS_ADMIN || last_cap < CAP_BPF)
        .collect()
}

/// The kernel's last capability (`/proc/sys/kernel/cap_last_cap`).
fn last_cap() -> u32 {
    capabilities::last_cap(CAP_BPF)
}

/// Confines this process: writes only under `state_dir` and signals only
/// to itself (Landlock), the capabilities of [`kept`] only. Call before
/// any thread is started.
pub fn confine(state_dir: &Path) -> Confinement {
    let last = last_cap();
    let keep = kept(last);
    let capabilities = match drop_capabilities(last, &keep) {
        Ok(()) => {
            let names: Vec<&str> = keep.iter().map(|(_, n)| *n).collect();
            format!("kept {}", names.join(","))
        }
        Err(e) => format!("not dropped: {e}"),
    };
    let landlock = match landlock(state_dir) {
        Ok(abi) if abi >= ABI_SCOPE => format!("enforced (ABI v{abi}, signals scoped)"),
        Ok(abi) => format!("enforced (ABI v{abi})"),
        Err(e) => format!("unavailable: {e}"),
    };
    Confinement {
        landlock,
        capabilities,
    }
}

/// Restricts this thread (and its future threads) with Landlock; returns
/// the ABI version.
fn landlock(state_dir: &Path) -> std::io::Result<i64> {
    // SAFETY: the version query takes no attribute (NULL, 0).
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if abi < 1 {
        return Err(std::io::Error::last_os_error());
    }
    let mut handled = WRITE_ABI1;
    if abi >= 2 {
        handled |= REFER;
    }
    if abi >= 3 {
        handled |= TRUNCATE;
    }
    let attr = RulesetAttr {
        handled_access_fs: handled,
        handled_access_net: 0,
        scoped: if abi >= ABI_SCOPE { SCOPE_SIGNAL } else { 0 },
    };
    // What this ABI knows: `handled_access_fs` alone before ABI 6.
    let size = if abi >= ABI_SCOPE {
        std::mem::size_of::<RulesetAttr>()
    } else {
        std::mem::size_of::<u64>()
    };
    // SAFETY: `attr` is a valid ruleset attribute at least `size` long.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            size,
            0u32,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let ruleset = fd as libc::c_int;
    let result = allow_beneath(ruleset, state_dir, handled).and_then(|()| restrict(ruleset));
    // SAFETY: closing the ruleset descriptor we created.
    unsafe { libc::close(ruleset) };
    result.map(|()| abi)
}

/// Allows `access` beneath `dir` in `ruleset`.
fn allow_beneath(ruleset: libc::c_int, dir: &Path, access: u64) -> std::io::Result<()> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated path; O_PATH opens nothing for I/O.
    let dir_fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if dir_fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let rule = PathBeneathAttr {
        allowed_access: access,
        parent_fd: dir_fd,
    };
    // SAFETY: `rule` is a valid path-beneath attribute; the fds are ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            RULE_PATH_BENEATH,
            &rule as *const PathBeneathAttr,
            0u32,
        )
    };
    let err = std::io::Error::last_os_error();
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(dir_fd) };
    if rc != 0 {
        return Err(err);
    }
    Ok(())
}

/// `no_new_privs`, then `landlock_restrict_self`.
fn restrict(ruleset: libc::c_int) -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: restricting the calling thread with a ruleset fd we own.
    if unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Drops every capability up to `last` but those of `keep` from all sets
/// of this thread ([`capabilities`]).
fn drop_capabilities(last: u32, keep: &[(u32, &str)]) -> std::io::Result<()> {
    let ids: Vec<u32> = keep.iter().map(|(c, _)| *c).collect();
    capabilities::drop_bounding_except(last, &ids);
    capabilities::keep_only(&ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sys_admin_is_kept_only_where_bpf_and_perfmon_do_not_exist() {
        let names = |last| -> Vec<&str> { kept(last).into_iter().map(|(_, n)| n).collect() };
        assert_eq!(
            names(40),
            [
                "CAP_DAC_READ_SEARCH",
                "CAP_SYS_PTRACE",
                "CAP_SYS_RESOURCE",
                "CAP_PERFMON",
                "CAP_BPF"
            ]
        );
        assert_eq!(
            names(37),
            [
                "CAP_DAC_READ_SEARCH",
                "CAP_SYS_PTRACE",
                "CAP_SYS_ADMIN",
                "CAP_SYS_RESOURCE"
            ]
        );
    }
}
