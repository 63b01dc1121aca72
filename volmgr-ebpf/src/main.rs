//! volmgr's eBPF programs: `syscalls:sys_enter_*` / `sys_exit_*` tracepoints
//! on every syscall that changes a mount table (classic and new mount API).
//!
//! At entry the arguments, the caller's mount namespace and the time are kept
//! in the thread's slot of a direct-mapped array (no hash-map helper call on
//! the way in or out; a call whose slot another thread holds is counted and
//! not traced); at exit the latency goes into a per-CPU log-linear
//! histogram and an event with the paths (read with bounded reads) goes to
//! the ring buffer. A failed ring-buffer write is counted, never silent.
//! `statfs` is only kept in its slot while in flight (user space
//! reads the map to report calls stuck on a hung network or FUSE file
//! system): no event, no histogram.
//!
//! File system tools (`mkfs*`, `fsck*`, `e2fsck`, `resize2fs`, `xfs_growfs`,
//! `xfs_repair`, by the command name the exec gives) are followed from
//! `sched:sched_process_exec` (their arguments, read from the new
//! program's argument block) to `sched:sched_process_exit` (exit status and
//! duration); one event per tool run goes to a ring buffer of their own.
#![no_std]
#![no_main]
// `atomic_cxchg`: core's `AtomicU64::compare_exchange` is not offered on the
// BPF target; the backend emits `BPF_CMPXCHG` for the intrinsic (Linux 5.12+).
#![feature(core_intrinsics)]
#![allow(internal_features)]

use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_uid_gid, bpf_ktime_get_ns,
        bpf_probe_read_kernel, bpf_probe_read_user, bpf_probe_read_user_buf,
        bpf_probe_read_user_str_bytes,
        generated::{bpf_get_current_cgroup_id, bpf_get_current_task, bpf_probe_read_user_str},
    },
    macros::{map, tracepoint},
    maps::{Array, LruHashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
    EbpfContext,
};

use core::intrinsics::{atomic_cxchg, atomic_xadd, AtomicOrdering};

#[allow(dead_code)]
mod event;
use event::*;

/// Only this mount namespace (inode); 0 = every namespace. Set at load time.
#[no_mangle]
static FILTER_MNT_NS: u64 = 0;
/// `offsetof(struct task_struct, nsproxy)`, from the kernel's BTF at load time.
#[no_mangle]
static OFF_TASK_NSPROXY: u64 = 0;
/// `offsetof(struct nsproxy, mnt_ns)`.
#[no_mangle]
static OFF_NSPROXY_MNT_NS: u64 = 0;
/// `offsetof(struct mnt_namespace, ns) + offsetof(struct ns_common, inum)`.
#[no_mangle]
static OFF_MNT_NS_INUM: u64 = 0;

/// `offsetof(struct task_struct, mm)`.
#[no_mangle]
static OFF_TASK_MM: u64 = 0;
/// `offsetof(struct mm_struct, arg_start)`.
#[no_mangle]
static OFF_MM_ARG_START: u64 = 0;
/// `offsetof(struct mm_struct, arg_end)`.
#[no_mangle]
static OFF_MM_ARG_END: u64 = 0;
/// `offsetof(struct task_struct, exit_code)`.
#[no_mangle]
static OFF_TASK_EXIT_CODE: u64 = 0;

/// Calls in flight, slot `tid % IN_FLIGHT_SLOTS` (see [`InFlight`]), or for
/// a caller with uid 0 whose slot is held, one of the `RESERVED_SLOTS`
/// after those: every entered call exits, even when a signal interrupts
/// it, and frees its slot.
/// An array: its lookups are inlined by the verifier, where a hash map's
/// update and delete are helper calls. Mappable, so that user space reads
/// it without a syscall per slot.
#[map]
static STARTS: Array<InFlight> = Array::with_max_entries(ALL_SLOTS, BPF_F_MMAPABLE);

/// The path argument of the call in flight in slot `i` of `STARTS`
/// (`IN_FLIGHT_PATH_MAX` bytes, NUL-terminated; empty when the call has
/// none or it could not be read), copied at entry: user space reads it
/// here instead of in the caller's memory (which observe mode's Landlock
/// domain may not open). Mappable, as `STARTS`.
#[map]
static PATHS: Array<[u8; IN_FLIGHT_PATH_MAX]> = Array::with_max_entries(ALL_SLOTS, BPF_F_MMAPABLE);

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(4 << 20, 0);

/// Per-CPU scratch space where an event is assembled.
#[map]
static SCRATCH: PerCpuArray<[u8; EVENT_MAX]> = PerCpuArray::with_max_entries(1, 0);

/// Per-CPU counts of what was not traced: `LOST_EVENTS` and
/// `LOST_TOOL_RUNS` (no ring-buffer room), `LOST_SLOT_BUSY` (in-flight
/// slot held by another thread).
#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(LOST_KEYS, 0);

/// When an event last woke the reader (see `WAKE_INTERVAL_NS`).
#[map]
static LAST_WAKE: Array<u64> = Array::with_max_entries(1, 0);

/// File system tools running now whose callers can matter (uid 0 of the
/// initial user namespace), by tgid (LRU: an exit that
/// is never seen cannot fill it).
#[map]
static EXECS: LruHashMap<u32, ExecEvent> = LruHashMap::with_max_entries(EXECS_MAX, 0);

/// Those of every other caller: however many an unprivileged user runs,
/// they only evict each other.
#[map]
static EXECS_OTHER: LruHashMap<u32, ExecEvent> = LruHashMap::with_max_entries(EXECS_MAX, 0);

/// Per-CPU space where an [`ExecEvent`] is assembled (too big for the stack).
#[map]
static EXEC_SCRATCH: PerCpuArray<ExecEvent> = PerCpuArray::with_max_entries(1, 0);

/// Finished file system tool runs.
#[map]
static EXEC_EVENTS: RingBuf = RingBuf::with_byte_size(256 << 10, 0);

/// Per-CPU latency histograms, key `syscall * 2 + (ret < 0)`.
#[map]
static HIST: PerCpuArray<Hist> = PerCpuArray::with_max_entries(HIST_KEYS, 0);

/// Ownership, mode and label walks of callers that can matter (uid 0 of
/// the initial user namespace), per process and volume directory.
#[map]
static WALKS: LruHashMap<WalkKey, WalkCount> = LruHashMap::with_max_entries(WALKS_MAX, 0);

/// Those of every other caller (they only evict each other).
#[map]
static WALKS_OTHER: LruHashMap<WalkKey, WalkCount> = LruHashMap::with_max_entries(WALKS_MAX, 0);

/// Per-CPU space where a new [`WalkCount`] is assembled and a path or
/// xattr name read (too big for the stack).
#[map]
static WALK_SCRATCH: PerCpuArray<WalkCount> = PerCpuArray::with_max_entries(1, 0);

/// Offset of the first syscall argument in a `sys_enter_*` record; `ret` of
/// a `sys_exit_*` record is at the same offset.
const ARGS: usize = 16;

/// Argument `i` of the record, read straight from the context (no helper
/// call); each program reads only its own syscall's arguments, so the
/// verifier's bound on the context offset fits every tracepoint's record.
#[inline(always)]
fn arg(ctx: &TracePointContext, i: usize) -> u64 {
    // SAFETY: the record holds the syscall's u64 arguments from offset 16
    // (see /sys/kernel/tracing/events/syscalls/*/format); the verifier
    // checks the offset against the tracepoint's record size.
    unsafe { core::ptr::read((ctx.as_ptr() as *const u8).add(ARGS + 8 * i) as *const u64) }
}

#[inline(always)]
fn global(v: &'static u64) -> u64 {
    // SAFETY: reading our own static; volatile so the loader's value is used.
    unsafe { core::ptr::read_volatile(v) }
}

/// task->nsproxy->mnt_ns->ns.inum, with the offsets from the kernel's BTF.
#[inline(always)]
fn mount_namespace() -> u64 {
    let off_nsproxy = global(&OFF_TASK_NSPROXY);
    if off_nsproxy == 0 {
        return 0;
    }
    // SAFETY: kernel pointers read through bpf_probe_read_kernel, which
    // checks them.
    unsafe {
        let task = bpf_get_current_task() as *const u8;
        let Ok(nsproxy) =
            bpf_probe_read_kernel(task.wrapping_add(off_nsproxy as usize) as *const u64)
        else {
            return 0;
        };
        if nsproxy == 0 {
            return 0;
        }
        let Ok(mnt_ns) = bpf_probe_read_kernel(
            (nsproxy as *const u8).wrapping_add(global(&OFF_NSPROXY_MNT_NS) as usize) as *const u64,
        ) else {
            return 0;
        };
        if mnt_ns == 0 {
            return 0;
        }
        bpf_probe_read_kernel(
            (mnt_ns as *const u8).wrapping_add(global(&OFF_MNT_NS_INUM) as usize) as *const u32,
        )
        .map_or(0, u64::from)
    }
}

#[inline(always)]
fn enter(ctx: &TracePointContext, syscall: u32) -> u32 {
    let mnt_ns = mount_namespace();
    let filter = global(&FILTER_MNT_NS);
    if filter != 0 && filter != mnt_ns {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let uid = bpf_get_current_uid_gid() as u32;
    let mut s = InFlight {
        owner: pid_tgid,
        ts: 0,
        mnt_ns,
        flags: 0,
        aux: [0; 2],
        strs: [0; 3],
        fds: [0; 2],
        syscall,
        uid,
    };
    match syscall {
        SYS_MOUNT => {
            // mount(dev_name, dir_name, type, flags, data)
            s.strs = [arg(ctx, 2), arg(ctx, 0), arg(ctx, 1)];
            s.flags = arg(ctx, 3);
        }
        SYS_UMOUNT => {
            // umount(name, flags)
            s.strs[2] = arg(ctx, 0);
            s.flags = arg(ctx, 1);
        }
        SYS_FSOPEN => {
            // fsopen(fs_name, flags)
            s.strs[0] = arg(ctx, 0);
            s.flags = arg(ctx, 1);
        }
        SYS_FSCONFIG => {
            // fsconfig(fd, cmd, key, value, aux)
            let cmd = arg(ctx, 1);
            s.fds = [arg(ctx, 0) as i32, arg(ctx, 4) as i32];
            s.aux[0] = cmd;
            s.strs[1] = arg(ctx, 2);
            // FSCONFIG_SET_STRING, FSCONFIG_SET_PATH, FSCONFIG_SET_PATH_EMPTY
            if cmd == 1 || cmd == 3 || cmd == 4 {
                s.strs[2] = arg(ctx, 3);
            }
        }
        SYS_FSMOUNT => {
            // fsmount(fs_fd, flags, attr_flags)
            s.fds[0] = arg(ctx, 0) as i32;
            s.flags = arg(ctx, 1);
            s.aux[0] = arg(ctx, 2);
        }
        SYS_FSPICK | SYS_OPEN_TREE => {
            // fspick(dfd, path, flags), open_tree(dfd, filename, flags)
            s.fds[0] = arg(ctx, 0) as i32;
            s.strs[1] = arg(ctx, 1);
            s.flags = arg(ctx, 2);
        }
        SYS_MOVE_MOUNT => {
            // move_mount(from_dfd, from_pathname, to_dfd, to_pathname, flags)
            s.fds = [arg(ctx, 0) as i32, arg(ctx, 2) as i32];
            s.strs[1] = arg(ctx, 1);
            s.strs[2] = arg(ctx, 3);
            s.flags = arg(ctx, 4);
        }
        SYS_MOUNT_SETATTR => {
            // mount_setattr(dfd, path, flags, uattr, usize)
            s.fds[0] = arg(ctx, 0) as i32;
            s.strs[2] = arg(ctx, 1);
            s.flags = arg(ctx, 2);
            let uattr = arg(ctx, 3);
            if uattr != 0 {
                // struct mount_attr { u64 attr_set, attr_clr, propagation, userns_fd }
                // SAFETY: a user pointer read through the checking helper.
                if let Ok(a) = unsafe { bpf_probe_read_user(uattr as *const [u64; 2]) } {
                    s.aux = a;
                }
            }
        }
        SYS_STATFS => {
            // statfs(pathname, buf)
            s.strs[2] = arg(ctx, 0);
        }
        _ => return 0,
    }
    let own = pid_tgid as u32 & (IN_FLIGHT_SLOTS - 1);
    let slot = match claim_slot(pid_tgid, own) {
        Some(slot) => Some((own, slot)),
        None if uid == 0 => claim_reserved(pid_tgid),
        None => None,
    };
    let Some((index, slot)) = slot else {
        count_lost(LOST_SLOT_BUSY);
        return 0;
    };
    let path = path_argument(syscall, &s.strs);
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: our own array's value, held by this thread (`claim_slot`).
    // Volatile writes, in this order: the record with `ts` 0, then `ts`
    // (see `InFlight` for the reader's side).
    unsafe {
        core::ptr::write_volatile(slot, s);
        copy_path(index, path);
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*slot).ts), now);
    }
    0
}

/// The user pointer of a call's path argument, 0 when it has none (the
/// same choice as user space's `in_flight`).
#[inline(always)]
fn path_argument(syscall: u32, strs: &[u64; 3]) -> u64 {
    match syscall {
        SYS_MOUNT | SYS_UMOUNT | SYS_MOUNT_SETATTR | SYS_STATFS | SYS_MOVE_MOUNT => strs[2],
        SYS_FSPICK | SYS_OPEN_TREE => strs[1],
        _ => 0,
    }
}

/// Copies the user string at `src` into `PATHS[index]` (at most
/// `IN_FLIGHT_PATH_MAX` bytes with the NUL; empty when `src` is 0 or
/// unreadable: the helper zeroes the buffer on a fault).
#[inline(always)]
fn copy_path(index: u32, src: u64) {
    let Some(dst) = PATHS.get_ptr_mut(index) else {
        return;
    };
    // SAFETY: our own array's value, for the slot this thread holds; a
    // user pointer read through the checking helper, with a constant size.
    unsafe {
        if src == 0 {
            (*dst)[0] = 0;
        } else {
            bpf_probe_read_user_str(
                dst as *mut core::ffi::c_void,
                IN_FLIGHT_PATH_MAX as u32,
                src as *const core::ffi::c_void,
            );
        }
    }
}

/// Reserved slot number `i` of the probes of thread `pid_tgid`.
#[inline(always)]
fn reserved_index(pid_tgid: u64, i: u32) -> u32 {
    IN_FLIGHT_SLOTS + ((pid_tgid as u32).wrapping_add(i) & (RESERVED_SLOTS - 1))
}

/// A reserved slot (its index and value) claimed for thread `pid_tgid` (a caller with uid 0
/// whose own slot is held): the first of its `RESERVED_PROBES` that is
/// free or its own.
#[inline(always)]
fn claim_reserved(pid_tgid: u64) -> Option<(u32, *mut InFlight)> {
    for i in 0..RESERVED_PROBES {
        let index = reserved_index(pid_tgid, i);
        if let Some(slot) = claim_slot(pid_tgid, index) {
            return Some((index, slot));
        }
    }
    None
}

/// The slot a call of thread `pid_tgid` (with `uid`) entered in: its own
/// open slot, or for uid 0 one of its reserved probes; `None` when none
/// is held by it (the call was not traced).
#[inline(always)]
fn own_slot(pid_tgid: u64, uid: u32) -> Option<*mut InFlight> {
    let owned = |i: u32| {
        let slot = STARTS.get_ptr_mut(i)?;
        // SAFETY: `owner` of our own array's value, read volatile.
        let owner = unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*slot).owner)) };
        (owner == pid_tgid).then_some(slot)
    };
    if let Some(slot) = owned(pid_tgid as u32 & (IN_FLIGHT_SLOTS - 1)) {
        return Some(slot);
    }
    if uid != 0 {
        return None;
    }
    for i in 0..RESERVED_PROBES {
        if let Some(slot) = owned(reserved_index(pid_tgid, i)) {
            return Some(slot);
        }
    }
    None
}

/// Slot `index`, claimed for thread `pid_tgid`: free (owner 0) and taken
/// with a compare-and-exchange (two CPUs cannot both take it), or already
/// its own. `None` when another thread holds it.
#[inline(always)]
fn claim_slot(pid_tgid: u64, index: u32) -> Option<*mut InFlight> {
    let slot = STARTS.get_ptr_mut(index)?;
    // SAFETY: `owner` is the first u64 of our own array's value (8-byte
    // aligned), only ever accessed atomically or volatile.
    let claimed = unsafe {
        let owner = core::ptr::addr_of_mut!((*slot).owner);
        let cur = core::ptr::read_volatile(owner);
        cur == pid_tgid
            || (cur == 0
                && atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::Relaxed }>(
                    owner, 0, pid_tgid,
                )
                .1)
    };
    claimed.then_some(slot)
}

/// Adds one to this CPU's `LOST` counter `key`.
#[inline(always)]
fn count_lost(key: u32) {
    if let Some(lost) = LOST.get_ptr_mut(key) {
        // SAFETY: per-CPU counter of our own map.
        unsafe { *lost += 1 };
    }
}

/// Reads the user string at `src` into `buf[off..off + max]`; its length
/// with the NUL (0 when absent or unreadable) and whether it filled `max`.
#[inline(always)]
fn read_str(buf: &mut [u8; EVENT_MAX], off: usize, src: u64, max: usize) -> (usize, bool) {
    if src == 0 || off > EVENT_MAX - max {
        return (0, false);
    }
    let Some(dst) = buf.get_mut(off..off + max) else {
        return (0, false);
    };
    // SAFETY: a user pointer read through the checking helper, into a
    // bounded slice of our scratch buffer.
    match unsafe { bpf_probe_read_user_str_bytes(src as *const u8, dst) } {
        // The helper returns the bytes without the NUL.
        Ok(s) => {
            let n = s.len() + 1;
            if n > max {
                (max, true)
            } else {
                (n, n == max)
            }
        }
        Err(_) => (0, false),
    }
}

#[inline(always)]
fn exit(ctx: &TracePointContext) -> u32 {
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let pid_tgid = bpf_get_current_pid_tgid();
    let uid = bpf_get_current_uid_gid() as u32;
    // None: not traced at entry (slot held by another thread, filtered
    // out, or the call entered before the tracer was attached).
    let Some(slot) = own_slot(pid_tgid, uid) else {
        return 0;
    };
    // SAFETY: our own array's value. Only the thread in `owner` writes the
    // record (the entry program claims the slot first), so once `owner` is
    // this thread, the copy is whole; then the slot is freed (`ts` first,
    // see `InFlight`).
    let s = unsafe {
        let s = core::ptr::read_volatile(slot);
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*slot).ts), 0);
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*slot).owner), 0);
        s
    };
    if s.syscall >= NUM_SYSCALLS {
        // Kept in flight only (statfs).
        return 0;
    }
    let ret = arg(ctx, 0) as i64;
    let latency = now.wrapping_sub(s.ts);

    let key = s.syscall * 2 + u32::from(ret < 0);
    if let Some(h) = HIST.get_ptr_mut(key) {
        let b = hist_bucket(latency);
        if b < HIST_BUCKETS {
            // SAFETY: per-CPU value of our own map; bounded index.
            unsafe {
                (*h).buckets[b] += 1;
                (*h).sum_ns += latency;
            }
        }
    }

    let Some(buf) = SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: per-CPU scratch value of our own map, used by one program
    // at a time on this CPU.
    let buf = unsafe { &mut *buf };
    let mut off = HEADER_SIZE;
    let (l0, t0) = read_str(buf, off, s.strs[0], FSTYPE_MAX);
    off += l0;
    let (l1, t1) = read_str(buf, off, s.strs[1], PATH_MAX);
    off += l1;
    let (l2, t2) = read_str(buf, off, s.strs[2], PATH_MAX);
    off += l2;

    let pid = (pid_tgid >> 32) as u32;
    let hdr = EventHeader {
        boot_ns: now,
        latency_ns: latency,
        mnt_ns: s.mnt_ns,
        // SAFETY: helper without arguments.
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        flags: s.flags,
        ret,
        aux: s.aux,
        fds: s.fds,
        pid,
        tid: pid_tgid as u32,
        syscall: s.syscall,
        len: [l0 as u16, l1 as u16, l2 as u16],
        truncated: u8::from(t0) * TRUNC_FSTYPE
            | u8::from(t1) * TRUNC_SOURCE
            | u8::from(t2) * TRUNC_TARGET,
        _pad: 0,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
        uid: s.uid,
    };
    // SAFETY: the header is plain data written at the start of the buffer.
    unsafe { core::ptr::write_unaligned(buf.as_mut_ptr() as *mut EventHeader, hdr) };

    // Wake the reader only if no event did recently (races between CPUs
    // only add a wake-up).
    let mut wake = BPF_RB_NO_WAKEUP as u64;
    if let Some(last) = LAST_WAKE.get_ptr_mut(0) {
        // SAFETY: value of our own single-entry array.
        unsafe {
            if now.wrapping_sub(*last) >= WAKE_INTERVAL_NS {
                *last = now;
                wake = BPF_RB_FORCE_WAKEUP as u64;
            }
        }
    }
    let sent = match buf.get(..off) {
        Some(ev) => EVENTS.output::<[u8]>(ev, wake).is_ok(),
        None => false,
    };
    if !sent {
        count_lost(LOST_EVENTS);
    }
    0
}

/// `*(base + off)` in kernel memory, or 0.
#[inline(always)]
fn kernel_u64(base: u64, off: u64) -> u64 {
    if base == 0 {
        return 0;
    }
    // SAFETY: a kernel pointer read through the checking helper.
    unsafe { bpf_probe_read_kernel((base as *const u8).wrapping_add(off as usize) as *const u64) }
        .unwrap_or(0)
}

/// A file system tool was exec'd: keep its arguments until it exits.
#[tracepoint]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    let Ok(comm) = bpf_get_current_comm() else {
        return 0;
    };
    if !is_fs_tool(&comm) {
        return 0;
    }
    let mnt_ns = mount_namespace();
    let filter = global(&FILTER_MNT_NS);
    if filter != 0 && filter != mnt_ns {
        return 0;
    }
    let Some(e) = EXEC_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: per-CPU scratch value of our own map.
    let e = unsafe { &mut *e };
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: helpers without arguments.
    e.start_ns = unsafe { bpf_ktime_get_ns() };
    e.end_ns = 0;
    e.mnt_ns = mnt_ns;
    // SAFETY: helper without arguments.
    e.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    e.pid = pid;
    e.exit_code = 0;
    e.comm = comm;
    e.flags = 0;
    e.args_len = 0;
    e.uid = bpf_get_current_uid_gid() as u32;
    e._pad = 0;
    // The new program's argument block: current->mm->arg_start..arg_end.
    // SAFETY: helper without arguments.
    let task = unsafe { bpf_get_current_task() };
    let mm = kernel_u64(task, global(&OFF_TASK_MM));
    let start = kernel_u64(mm, global(&OFF_MM_ARG_START));
    let end = kernel_u64(mm, global(&OFF_MM_ARG_END));
    if start != 0 && end > start {
        let mut len = end - start;
        let mut src = start;
        if len > EXEC_ARGS_MAX as u64 {
            src = end - EXEC_ARGS_MAX as u64;
            len = EXEC_ARGS_MAX as u64;
            e.flags = EXEC_ARGS_TRUNCATED;
        }
        if let Some(dst) = e.args.get_mut(..len as usize) {
            // SAFETY: a user pointer of the current process read through
            // the checking helper into a bounded slice of our own value.
            if unsafe { bpf_probe_read_user_buf(src as *const u8, dst) }.is_ok() {
                e.args_len = len as u32;
            }
        }
    }
    if e.uid == 0 {
        let _ = EXECS.insert(&pid, &*e, 0);
    } else {
        let _ = EXECS_OTHER.insert(&pid, &*e, 0);
    }
    0
}

/// A process exited: if it is a file system tool being followed, send its
/// run (arguments, exit status, duration).
#[tracepoint]
pub fn sched_process_exit(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    // Only the thread group leader's exit ends the process we follow.
    if pid != pid_tgid as u32 {
        return 0;
    }
    // A process's uid may change after its exec: look in both tables.
    if let Some(e) = EXECS.get_ptr_mut(&pid) {
        send_tool_run(e);
        let _ = EXECS.remove(&pid);
    }
    if let Some(e) = EXECS_OTHER.get_ptr_mut(&pid) {
        send_tool_run(e);
        let _ = EXECS_OTHER.remove(&pid);
    }
    0
}

/// Sends a followed tool run that ends now (exit status, duration).
#[inline(always)]
fn send_tool_run(e: *mut ExecEvent) {
    // SAFETY: value of our own map, written by this program only (the
    // leader exits once).
    let e = unsafe { &mut *e };
    // SAFETY: helpers without arguments.
    e.end_ns = unsafe { bpf_ktime_get_ns() };
    // SAFETY: helper without arguments.
    let task = unsafe { bpf_get_current_task() };
    let off = global(&OFF_TASK_EXIT_CODE);
    if off != 0 {
        // SAFETY: a kernel pointer read through the checking helper.
        e.exit_code = unsafe {
            bpf_probe_read_kernel((task as *const u8).wrapping_add(off as usize) as *const i32)
        }
        .unwrap_or(0);
    }
    if EXEC_EVENTS.output::<ExecEvent>(&*e, 0).is_err() {
        count_lost(LOST_TOOL_RUNS);
    }
}

/// `name` (a user pointer) is `security.selinux`.
#[inline(always)]
fn is_selinux_label(name: u64, buf: &mut [u8; WALK_PATH_MAX]) -> bool {
    const LABEL: &[u8; 17] = b"security.selinux\0";
    if name == 0 {
        return false;
    }
    // SAFETY: a user pointer read through the checking helper into the
    // first bytes of our scratch value.
    let n = unsafe {
        bpf_probe_read_user_str(
            buf.as_mut_ptr() as *mut core::ffi::c_void,
            LABEL.len() as u32 + 1,
            name as *const core::ffi::c_void,
        )
    };
    n == LABEL.len() as i64 && LABEL.iter().zip(buf.iter()).all(|(a, b)| a == b)
}

/// Counts one ownership (`WALK_CHOWN`), mode (`WALK_CHMOD`) or label
/// (`WALK_RELABEL`) change of the calling process at its entry: argument
/// `path_arg` is the path (`None`: a descriptor), `name_arg` the xattr
/// name (only `security.selinux` counts). A call after a pause of
/// `WALK_GAP_NS` starts the key's counts again.
#[inline(always)]
fn walk(
    ctx: &TracePointContext,
    kind: usize,
    path_arg: Option<usize>,
    name_arg: Option<usize>,
) -> u32 {
    let mnt_ns = mount_namespace();
    let filter = global(&FILTER_MNT_NS);
    if filter != 0 && filter != mnt_ns {
        return 0;
    }
    let Some(w) = WALK_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: per-CPU scratch value of our own map, used by one program
    // at a time on this CPU.
    let w = unsafe { &mut *w };
    if let Some(i) = name_arg {
        if !is_selinux_label(arg(ctx, i), &mut w.dir) {
            return 0;
        }
    }
    w.dir[0] = 0;
    if let Some(i) = path_arg {
        // SAFETY: a user pointer read through the checking helper, with a
        // constant size, into our scratch value (zeroed on a fault).
        unsafe {
            bpf_probe_read_user_str(
                w.dir.as_mut_ptr() as *mut core::ffi::c_void,
                WALK_PATH_MAX as u32,
                arg(ctx, i) as *const core::ffi::c_void,
            )
        };
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let mut key = WalkKey {
        pid,
        _pad: 0,
        dir_hash: 0,
    };
    let (end, hash) = volume_dir(&w.dir).map_or((0, 0), |(e, h)| (e as u64, h));
    // Through our map's memory: the verifier then knows nothing of `end`
    // and checks what follows once, not once per exit of the loop.
    // SAFETY: per-CPU scratch value of our own map.
    let end = unsafe {
        core::ptr::write_volatile(core::ptr::addr_of_mut!(w.first_ns), end);
        core::ptr::read_volatile(core::ptr::addr_of!(w.first_ns))
    };
    key.dir_hash = hash;
    if let Some(b) = w.dir.get_mut(end as usize) {
        *b = 0;
    }
    let uid = bpf_get_current_uid_gid() as u32;
    let map = if uid == 0 { &WALKS } else { &WALKS_OTHER };
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(c) = map.get_ptr_mut(&key) {
        // SAFETY: value of our own map; the count is added atomically
        // (threads of one process on several CPUs).
        unsafe {
            let last = core::ptr::read_volatile(core::ptr::addr_of!((*c).last_ns));
            // (A thread on another CPU may have written a later `last`.)
            if now > last && now - last > WALK_GAP_NS {
                // A new walk of the same key (see `WALK_GAP_NS`).
                core::ptr::write_volatile(core::ptr::addr_of_mut!((*c).first_ns), now);
                (*c).calls = [0; WALK_KINDS];
            }
            if let Some(n) = (*c).calls.get_mut(kind) {
                atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(n, 1);
            }
            core::ptr::write_volatile(core::ptr::addr_of_mut!((*c).last_ns), now);
        }
        return 0;
    }
    new_walk(w, kind, now, mnt_ns, pid, uid);
    let _ = map.insert(&key, &*w, 0);
    0
}

/// Fills the scratch `w` (its `dir` already set) as a new walk's first call.
#[inline(always)]
fn new_walk(w: &mut WalkCount, kind: usize, now: u64, mnt_ns: u64, pid: u32, uid: u32) {
    w.first_ns = now;
    w.last_ns = now;
    w.calls = [0; WALK_KINDS];
    if let Some(n) = w.calls.get_mut(kind) {
        *n = 1;
    }
    w.mnt_ns = mnt_ns;
    w.pid = pid;
    w.uid = uid;
    w.comm = bpf_get_current_comm().unwrap_or([0; 16]);
}

macro_rules! walks {
    ($($prog:ident, $kind:expr, $path:expr, $name:expr;)*) => {$(
        #[tracepoint]
        pub fn $prog(ctx: TracePointContext) -> u32 {
            walk(&ctx, $kind, $path, $name)
        }
    )*};
}

walks! {
    // chown(filename, user, group), lchown(filename, ...), fchown(fd, ...),
    // fchownat(dfd, filename, user, group, flag)
    sys_enter_chown, WALK_CHOWN, Some(0), None;
    sys_enter_lchown, WALK_CHOWN, Some(0), None;
    sys_enter_fchown, WALK_CHOWN, None, None;
    sys_enter_fchownat, WALK_CHOWN, Some(1), None;
    // chmod(filename, mode), fchmod(fd, mode), fchmodat(dfd, filename, mode),
    // fchmodat2(dfd, filename, mode, flags)
    sys_enter_chmod, WALK_CHMOD, Some(0), None;
    sys_enter_fchmod, WALK_CHMOD, None, None;
    sys_enter_fchmodat, WALK_CHMOD, Some(1), None;
    sys_enter_fchmodat2, WALK_CHMOD, Some(1), None;
    // setxattr(pathname, name, value, size, flags), lsetxattr(...),
    // fsetxattr(fd, name, ...)
    sys_enter_setxattr, WALK_RELABEL, Some(0), Some(1);
    sys_enter_lsetxattr, WALK_RELABEL, Some(0), Some(1);
    sys_enter_fsetxattr, WALK_RELABEL, None, Some(1);
}

macro_rules! programs {
    ($($enter:ident, $exit:ident, $id:expr;)*) => {$(
        #[tracepoint]
        pub fn $enter(ctx: TracePointContext) -> u32 {
            enter(&ctx, $id)
        }
        #[tracepoint]
        pub fn $exit(ctx: TracePointContext) -> u32 {
            exit(&ctx)
        }
    )*};
}

programs! {
    sys_enter_mount, sys_exit_mount, SYS_MOUNT;
    sys_enter_umount, sys_exit_umount, SYS_UMOUNT;
    sys_enter_fsopen, sys_exit_fsopen, SYS_FSOPEN;
    sys_enter_fsconfig, sys_exit_fsconfig, SYS_FSCONFIG;
    sys_enter_fsmount, sys_exit_fsmount, SYS_FSMOUNT;
    sys_enter_fspick, sys_exit_fspick, SYS_FSPICK;
    sys_enter_move_mount, sys_exit_move_mount, SYS_MOVE_MOUNT;
    sys_enter_open_tree, sys_exit_open_tree, SYS_OPEN_TREE;
    sys_enter_mount_setattr, sys_exit_mount_setattr, SYS_MOUNT_SETATTR;
    sys_enter_statfs, sys_exit_statfs, SYS_STATFS;
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 4] = *b"GPL\0";
