//! The wire format shared by the kernel programs and user space: one `no_std`
//! module without dependencies, compiled into both sides (`volmgr` includes
//! this file as `volmgr::ebpf::wire`).
//!
//! An event in the ring buffer is an [`EventHeader`] followed by up to three
//! strings (fstype, source, target), each `len` bytes long including its
//! terminating NUL, with no padding between them: events stay small (about
//! 100 bytes plus the paths) instead of fixed 4 KiB records.

/// `mount(2)`.
pub const SYS_MOUNT: u32 = 0;
/// `umount2(2)`.
pub const SYS_UMOUNT: u32 = 1;
/// `fsopen(2)`.
pub const SYS_FSOPEN: u32 = 2;
/// `fsconfig(2)`.
pub const SYS_FSCONFIG: u32 = 3;
/// `fsmount(2)`.
pub const SYS_FSMOUNT: u32 = 4;
/// `fspick(2)`.
pub const SYS_FSPICK: u32 = 5;
/// `move_mount(2)`.
pub const SYS_MOVE_MOUNT: u32 = 6;
/// `open_tree(2)`.
pub const SYS_OPEN_TREE: u32 = 7;
/// `mount_setattr(2)`.
pub const SYS_MOUNT_SETATTR: u32 = 8;
/// Number of traced syscalls (the ones with events and histograms).
pub const NUM_SYSCALLS: u32 = 9;
/// `statfs(2)`: only kept in flight (for stuck calls on hung network and
/// FUSE file systems); no event, no histogram.
pub const SYS_STATFS: u32 = 9;

/// Slots of the in-flight table `STARTS` open to every caller (a power of
/// two): a call of thread `tid` uses slot `tid % IN_FLIGHT_SLOTS`.
pub const IN_FLIGHT_SLOTS: u32 = 16384;
/// Slots after those, reserved for callers that can matter (uid 0 in the
/// initial user namespace: the kubelet, CSI drivers, mount helpers run by
/// them) whose own slot another thread holds (a power of two): an
/// unprivileged process that parks a thread in every open slot cannot
/// keep their calls out.
pub const RESERVED_SLOTS: u32 = 1024;
/// Reserved slots a privileged call tries, from `tid % RESERVED_SLOTS` on.
pub const RESERVED_PROBES: u32 = 8;
/// Every slot of `STARTS`.
pub const ALL_SLOTS: u32 = IN_FLIGHT_SLOTS + RESERVED_SLOTS;

/// Keys of the per-CPU `LOST` counters: syscall events the ring buffer had
/// no room for.
pub const LOST_EVENTS: u32 = 0;
/// File system tool runs the ring buffer had no room for.
pub const LOST_TOOL_RUNS: u32 = 1;
/// Calls not traced because their in-flight slot was held by a call of
/// another thread (thread ids equal modulo [`IN_FLIGHT_SLOTS`]).
pub const LOST_SLOT_BUSY: u32 = 2;
/// Number of `LOST` counters.
pub const LOST_KEYS: u32 = 3;

/// What `sys_enter` keeps for `sys_exit`: one slot of the direct-mapped
/// `STARTS` array (index `tid % IN_FLIGHT_SLOTS`), held by the thread in
/// `owner` (0 = free). User space maps the array (`BPF_F_MMAPABLE`) and
/// reads it to find calls still in flight. The entry program claims the
/// slot (compare-and-exchange of `owner` from 0), sets `ts` to 0, writes
/// the record and the call's path argument (into `PATHS`, same index),
/// and writes `ts` last; the exit program sets `ts` to 0 before it frees
/// the slot. A reader that finds the same non-zero `owner` and `ts` before
/// and after copying the record and its path has a whole record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct InFlight {
    /// The holder's `bpf_get_current_pid_tgid()`; 0 while the slot is free.
    pub owner: u64,
    /// `bpf_ktime_get_ns()` at entry (0 while the record is written).
    pub ts: u64,
    /// Inode of the caller's mount namespace.
    pub mnt_ns: u64,
    /// The call's flags argument.
    pub flags: u64,
    /// Extra arguments (see [`EventHeader::aux`]).
    pub aux: [u64; 2],
    /// User pointers to fstype, source, target (0 = none).
    pub strs: [u64; 3],
    /// File descriptor arguments.
    pub fds: [i32; 2],
    /// One of the `SYS_*` ids.
    pub syscall: u32,
    /// The caller's real uid in the initial user namespace.
    pub uid: u32,
}

/// Bytes kept of an in-flight call's path argument, with its NUL: the
/// entry program copies the argument into the `PATHS` array (the slot's
/// index in `STARTS`), so that user space never reads another process's
/// memory for it. Longer paths are cut (still NUL-terminated); a kubelet
/// volume path (`/var/lib/kubelet/pods/<uid>/volumes/<plugin>/<name>`)
/// is about 150 bytes.
pub const IN_FLIGHT_PATH_MAX: usize = 256;

/// Longest filesystem type read, including the NUL.
pub const FSTYPE_MAX: usize = 64;
/// Longest source or target path read, including the NUL.
pub const PATH_MAX: usize = 512;

/// Set in [`EventHeader::truncated`] when a string filled its whole buffer.
pub const TRUNC_FSTYPE: u8 = 1;
/// See [`TRUNC_FSTYPE`].
pub const TRUNC_SOURCE: u8 = 2;
/// See [`TRUNC_FSTYPE`].
pub const TRUNC_TARGET: u8 = 4;

/// Wake-up batching: an event wakes the reader only if no event did in the
/// last `WAKE_INTERVAL_NS`; a reader that got events or a wake-up polls
/// again after this interval (it blocks only after a whole interval with
/// neither), so no event waits longer than about one interval, and a burst
/// of calls costs a few wake-ups instead of one per call.
pub const WAKE_INTERVAL_NS: u64 = 1_000_000;

/// Fixed part of an event.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EventHeader {
    /// `bpf_ktime_get_ns()` at the syscall's exit.
    pub boot_ns: u64,
    /// Exit time minus entry time.
    pub latency_ns: u64,
    /// Inode of the caller's mount namespace (0 if it could not be read).
    pub mnt_ns: u64,
    /// `bpf_get_current_cgroup_id()`.
    pub cgroup_id: u64,
    /// The call's flags argument.
    pub flags: u64,
    /// Return value.
    pub ret: i64,
    /// Extra arguments: `fsconfig` cmd; `fsmount` attr_flags;
    /// `mount_setattr` attr_set and attr_clr.
    pub aux: [u64; 2],
    /// File descriptor arguments: `fsconfig` fd and aux; `fsmount` fs_fd;
    /// `fspick`/`open_tree`/`mount_setattr` dfd; `move_mount` from_dfd and to_dfd.
    pub fds: [i32; 2],
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// One of the `SYS_*` ids.
    pub syscall: u32,
    /// Lengths (with NUL) of fstype, source and target; 0 when absent.
    pub len: [u16; 3],
    /// `TRUNC_*` bits.
    pub truncated: u8,
    /// Padding.
    pub _pad: u8,
    /// The thread's command name, NUL padded.
    pub comm: [u8; 16],
    /// The caller's real uid in the initial user namespace (0: root of the
    /// host; a process root in a user namespace of its own is not 0).
    pub uid: u32,
}

/// Size of [`EventHeader`] in bytes.
pub const HEADER_SIZE: usize = core::mem::size_of::<EventHeader>();
/// Largest event.
pub const EVENT_MAX: usize = HEADER_SIZE + FSTYPE_MAX + 2 * PATH_MAX;

/// Bytes kept of an exec'd file system tool's arguments (the last ones:
/// the device is the last argument).
pub const EXEC_ARGS_MAX: usize = 512;
/// Set in [`ExecEvent::flags`] when the arguments were longer than
/// [`EXEC_ARGS_MAX`] (only their last bytes are kept).
pub const EXEC_ARGS_TRUNCATED: u32 = 1;

/// A file system tool (`mkfs*`, `fsck*`, `e2fsck`, `resize2fs`,
/// `xfs_growfs`, `xfs_repair`) that ran: kept per process (key: tgid) in
/// the `EXECS` map from `sched_process_exec` on, and sent to the
/// `EXEC_EVENTS` ring buffer as it is when the process exits.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExecEvent {
    /// `bpf_ktime_get_ns()` when the exec completed.
    pub start_ns: u64,
    /// `bpf_ktime_get_ns()` when the process exited.
    pub end_ns: u64,
    /// Inode of the process's mount namespace (0 if it could not be read).
    pub mnt_ns: u64,
    /// `bpf_get_current_cgroup_id()`.
    pub cgroup_id: u64,
    /// Process id (tgid).
    pub pid: u32,
    /// The kernel's `task->exit_code`: a wait status (`exit(n)` is
    /// `n << 8`; killed by signal `s` is `s`).
    pub exit_code: i32,
    /// Bytes of `args` used.
    pub args_len: u32,
    /// `EXEC_ARGS_*` bits.
    pub flags: u32,
    /// The command name (the basename of the executed file, 15 bytes).
    pub comm: [u8; 16],
    /// The arguments (argv, NUL separated), or their last
    /// [`EXEC_ARGS_MAX`] bytes.
    pub args: [u8; EXEC_ARGS_MAX],
    /// The process's real uid in the initial user namespace.
    pub uid: u32,
    /// Padding (0).
    pub _pad: u32,
}

/// Tool runs followed at most per table: `EXECS` (callers that can
/// matter: uid 0 of the initial user namespace) and `EXECS_OTHER`
/// (everyone else), each an LRU table of its own, so that no number of
/// unprivileged tools evicts a root one.
pub const EXECS_MAX: u32 = 1024;

/// Whether `comm` names a file system tool that is traced: `mkfs*`,
/// `fsck*`, `e2fsck`, `resize2fs`, `xfs_growfs`, `xfs_repair`.
#[inline(always)]
pub fn is_fs_tool(comm: &[u8; 16]) -> bool {
    // Zipped, not indexed: no bounds checks (and no panic paths) in BPF.
    let starts = |p: &[u8]| p.iter().zip(comm.iter()).all(|(a, b)| a == b);
    // Whole names end with the NUL.
    starts(b"mkfs")
        || starts(b"fsck")
        || starts(b"e2fsck\0")
        || starts(b"resize2fs\0")
        || starts(b"xfs_growfs\0")
        || starts(b"xfs_repair\0")
}

/// Kinds of metadata changes counted per walk ([`WalkCount::calls`]):
/// `chown`, `lchown`, `fchown`, `fchownat`.
pub const WALK_CHOWN: usize = 0;
/// `chmod`, `fchmod`, `fchmodat`, `fchmodat2`.
pub const WALK_CHMOD: usize = 1;
/// `setxattr`, `lsetxattr`, `fsetxattr` of `security.selinux` (a relabel).
pub const WALK_RELABEL: usize = 2;
/// Number of kinds.
pub const WALK_KINDS: usize = 3;
/// Bytes of a walk's path read (with the NUL).
pub const WALK_PATH_MAX: usize = 256;
/// Walks followed at most per table: `WALKS` (callers with uid 0 of the
/// initial user namespace) and `WALKS_OTHER` (everyone else), LRU tables
/// of their own, so that no number of unprivileged walkers evicts the
/// kubelet's.
pub const WALKS_MAX: u32 = 1024;
/// A pause between two calls of one walk key longer than this (ns) starts
/// a new walk: the entry's counts and `first_ns` start again, so that a
/// volume re-walked now and then (a ConfigMap's at every sync) is never
/// summed into one long walk. User space clears a walk after the same
/// pause without a call.
pub const WALK_GAP_NS: u64 = 5_000_000_000;

/// Key of a walk: the calling process and its volume directory (FNV-1a
/// hash of its path argument cut after `/volumes/<plugin>/<name>`, as
/// the kubelet lays volumes out; 0 for every other path, relative paths
/// and calls on a descriptor).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WalkKey {
    /// Process id (tgid).
    pub pid: u32,
    /// Padding (0).
    pub _pad: u32,
    /// The volume directory's hash (0: other paths).
    pub dir_hash: u64,
}

/// Ownership, mode and SELinux label changes of one process in one
/// volume directory ([`WalkKey`]), counted at the calls' entry: what a
/// kubelet applying a pod's `fsGroup` (or a runtime relabelling a volume)
/// does to every file of the volume.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WalkCount {
    /// `bpf_ktime_get_ns()` of the first call.
    pub first_ns: u64,
    /// `bpf_ktime_get_ns()` of the last call.
    pub last_ns: u64,
    /// Calls per kind (`WALK_*`).
    pub calls: [u64; WALK_KINDS],
    /// Inode of the caller's mount namespace.
    pub mnt_ns: u64,
    /// Process id (tgid).
    pub pid: u32,
    /// The caller's real uid in the initial user namespace.
    pub uid: u32,
    /// The command name of the first call's thread.
    pub comm: [u8; 16],
    /// The volume directory (NUL-terminated; empty for other paths).
    pub dir: [u8; WALK_PATH_MAX],
}

/// FNV-1a's offset basis (64 bits).
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a's prime (64 bits).
pub const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
/// `b"volumes/"` as the last eight bytes read, first byte highest.
pub const VOLUMES_WINDOW: u64 = u64::from_be_bytes(*b"volumes/");

/// The end of the volume directory in `path` (a NUL-terminated path
/// argument): the index of the `/` (or NUL) after
/// `/volumes/<plugin>/<name>`, and the FNV-1a hash of the bytes before
/// it; `None` when the path has no such part. The same code runs in the
/// kernel program and in user space (its tests).
#[inline(always)]
pub fn volume_dir(path: &[u8; WALK_PATH_MAX]) -> Option<(usize, u64)> {
    let mut window = 0u64;
    let mut hash = FNV_OFFSET;
    // Slashes still to pass after `/volumes/`: 0 = not found yet.
    let mut left = 0u32;
    let mut i = 0;
    while i < WALK_PATH_MAX {
        let b = path[i];
        if b == 0 {
            return (left == 1).then_some((i, hash));
        }
        // The same byte loaded again for the window and the hash: what
        // the tests on `b` teach the BPF verifier does not reach them
        // (their states stay alike, and the verifier's pruning works).
        // SAFETY: `i` is within `path`.
        let v = u64::from(unsafe { core::ptr::read_volatile(path.as_ptr().add(i)) });
        if left > 0 {
            if b == b'/' {
                left -= 1;
                if left == 0 {
                    return Some((i, hash));
                }
            }
        } else {
            let out = window >> 56;
            window = (window << 8) | v;
            if window == VOLUMES_WINDOW && out == u64::from(b'/') {
                left = 2;
                window = 0;
            }
        }
        hash = (hash ^ v).wrapping_mul(FNV_PRIME);
        i += 1;
    }
    None
}

/// Powers of two covered by the in-kernel histograms: 1 µs .. 2^25 µs (33 s).
pub const HIST_POWERS: usize = 25;
/// Linear sub-buckets per power of two.
pub const HIST_SUB: usize = 4;
/// Buckets: one below 1 µs, `HIST_POWERS * HIST_SUB`, one overflow.
pub const HIST_BUCKETS: usize = 2 + HIST_POWERS * HIST_SUB;

/// A per-CPU latency histogram for one (syscall, ok/error) pair, keyed by
/// `syscall * 2 + (ret < 0)`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Hist {
    /// Counts per bucket (see [`hist_bucket`]).
    pub buckets: [u64; HIST_BUCKETS],
    /// Sum of the latencies, ns.
    pub sum_ns: u64,
}

/// Number of histogram slots.
pub const HIST_KEYS: u32 = NUM_SYSCALLS * 2;

/// The log-linear bucket of a latency: 0 below 1 µs; then for a latency of
/// `v` µs with `2^e <= v < 2^(e+1)`, bucket `1 + HIST_SUB * e + sub`, where
/// `sub` is the next two bits below the top one; the last bucket is overflow.
/// Written without loops or count-leading-zeros so the BPF verifier and the
/// BPF backend take it as it is.
#[inline(always)]
pub fn hist_bucket(ns: u64) -> usize {
    let v = ns / 1000;
    if v == 0 {
        return 0;
    }
    if v >= 1 << HIST_POWERS {
        return HIST_BUCKETS - 1;
    }
    // e = floor(log2(v)), by binary search.
    let mut e = 0u64;
    let mut x = v;
    if x >= 1 << 16 {
        x >>= 16;
        e += 16;
    }
    if x >= 1 << 8 {
        x >>= 8;
        e += 8;
    }
    if x >= 1 << 4 {
        x >>= 4;
        e += 4;
    }
    if x >= 1 << 2 {
        x >>= 2;
        e += 2;
    }
    if x >= 1 << 1 {
        e += 1;
    }
    let sub = if e >= 2 {
        (v >> (e - 2)) & 3
    } else {
        (v << (2 - e)) & 3
    };
    1 + HIST_SUB * (e as usize) + sub as usize
}

/// Lower and upper bound of bucket `i` in nanoseconds (`[lo, hi)`); the
/// overflow bucket's upper bound is `u64::MAX`.
pub fn hist_bucket_bounds_ns(i: usize) -> (u64, u64) {
    if i == 0 {
        return (0, 1000);
    }
    if i >= HIST_BUCKETS - 1 {
        return (1000 << HIST_POWERS, u64::MAX);
    }
    let e = ((i - 1) / HIST_SUB) as u32;
    let sub = ((i - 1) % HIST_SUB) as u64;
    // [(4 + sub) * 2^e / 4, (5 + sub) * 2^e / 4) µs
    let lo = (4 + sub) * (1000u64 << e) / 4;
    // Below 4 µs the buckets are whole microseconds (v is in µs).
    let hi = if e < 2 {
        lo + 1000
    } else {
        (5 + sub) * (1000u64 << e) / 4
    };
    (lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(s: &str) -> [u8; WALK_PATH_MAX] {
        let mut p = [0u8; WALK_PATH_MAX];
        p[..s.len()].copy_from_slice(s.as_bytes());
        p
    }

    fn fnv(s: &str) -> u64 {
        s.bytes().fold(FNV_OFFSET, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(FNV_PRIME)
        })
    }

    #[test]
    fn the_volume_directory_of_a_walked_path() {
        let dir = "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pvc-1";
        for p in [
            dir.to_string(),
            format!("{dir}/mount"),
            format!("{dir}/mount/a/b/c"),
        ] {
            assert_eq!(volume_dir(&path(&p)), Some((dir.len(), fnv(dir))), "{p}");
        }
        // Not (yet) a volume directory, or none at all.
        for p in [
            "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi",
            "/var/lib/kubelet/pods/u1/volumes",
            "/home/x/file",
            "relative/name",
            "",
        ] {
            assert_eq!(volume_dir(&path(p)), None, "{p}");
        }
        // A path that fills the buffer without its end: not placed.
        let long = format!("/r/pods/u/volumes/p/{}", "n".repeat(300));
        let mut p = [b'x'; WALK_PATH_MAX];
        p.copy_from_slice(&long.as_bytes()[..WALK_PATH_MAX]);
        assert_eq!(volume_dir(&p), None);
    }
}
