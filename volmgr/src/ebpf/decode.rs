//! Decoding ring-buffer records into [`SyscallEvent`]s, and the syscalls'
//! flags and arguments into names for people.

use std::collections::HashMap;
use std::fmt::Write;

use super::wire::{self, EventHeader};
use super::{MountSyscall, SyscallEvent, ToolExec};

impl MountSyscall {
    /// The syscall with wire id `id`.
    pub fn from_wire(id: u32) -> Option<MountSyscall> {
        MountSyscall::ALL.get(id as usize).copied()
    }
}

/// Turns records into events. Remembers which filesystem type an `fsopen`
/// (and the `fsmount` on it) returned, per process and descriptor, so
/// `fsconfig`, `fsmount` and `move_mount` on that descriptor carry it too.
#[derive(Debug, Default)]
pub struct Decoder {
    fd_fstype: HashMap<(u32, i32), String>,
}

/// Bound on remembered descriptors (descriptors' closes are not traced).
const MAX_FDS: usize = 4096;

impl Decoder {
    /// Decodes one ring-buffer record; `None` if it is malformed.
    pub fn decode(&mut self, rec: &[u8]) -> Option<SyscallEvent> {
        let mut ev = decode_record(rec)?;
        let hdr_fds = fds_of(rec)?;
        let key = |fd: i32| (ev.pid, fd);
        match ev.syscall {
            MountSyscall::Fsopen if ev.ret >= 0 => {
                if self.fd_fstype.len() >= MAX_FDS {
                    self.fd_fstype.clear();
                }
                if let Some(t) = &ev.fstype {
                    self.fd_fstype.insert(key(ev.ret as i32), t.clone());
                }
            }
            MountSyscall::Fsconfig => {
                ev.fstype = self.fd_fstype.get(&key(hdr_fds[0])).cloned();
            }
            MountSyscall::Fsmount => {
                ev.fstype = self.fd_fstype.get(&key(hdr_fds[0])).cloned();
                if let (Some(t), true) = (&ev.fstype, ev.ret >= 0) {
                    self.fd_fstype.insert(key(ev.ret as i32), t.clone());
                }
            }
            MountSyscall::MoveMount => {
                ev.fstype = self.fd_fstype.get(&key(hdr_fds[0])).cloned();
            }
            _ => {}
        }
        Some(ev)
    }
}

fn header(rec: &[u8]) -> Option<EventHeader> {
    if rec.len() < wire::HEADER_SIZE {
        return None;
    }
    // SAFETY: the record holds at least a header; EventHeader is plain
    // data valid for any bytes; read_unaligned copes with the alignment.
    Some(unsafe { std::ptr::read_unaligned(rec.as_ptr().cast::<EventHeader>()) })
}

fn fds_of(rec: &[u8]) -> Option<[i32; 2]> {
    header(rec).map(|h| h.fds)
}

/// The call's raw arguments beyond [`SyscallEvent`]: fds and extra values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExtraArgs {
    /// See [`wire::EventHeader::fds`].
    pub fds: [i32; 2],
    /// See [`wire::EventHeader::aux`].
    pub aux: [u64; 2],
    /// `wire::TRUNC_*` bits.
    pub truncated: u8,
}

/// The extra arguments of a record.
pub fn extra_args(rec: &[u8]) -> Option<ExtraArgs> {
    header(rec).map(|h| ExtraArgs {
        fds: h.fds,
        aux: h.aux,
        truncated: h.truncated,
    })
}

/// Decodes one record without descriptor tracking.
pub fn decode_record(rec: &[u8]) -> Option<SyscallEvent> {
    let h = header(rec)?;
    let syscall = MountSyscall::from_wire(h.syscall)?;
    let mut off = wire::HEADER_SIZE;
    let mut strs: [Option<String>; 3] = [None, None, None];
    for (i, s) in strs.iter_mut().enumerate() {
        let len = usize::from(h.len[i]);
        if len == 0 {
            continue;
        }
        let bytes = rec.get(off..off + len)?;
        off += len;
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        *s = Some(String::from_utf8_lossy(&bytes[..end]).into_owned());
    }
    let [fstype, source, target] = strs;
    let comm_end = h.comm.iter().position(|&b| b == 0).unwrap_or(h.comm.len());
    Some(SyscallEvent {
        boot_ns: h.boot_ns,
        pid: h.pid,
        tid: h.tid,
        comm: String::from_utf8_lossy(&h.comm[..comm_end]).into_owned(),
        mnt_ns: h.mnt_ns,
        cgroup_id: h.cgroup_id,
        syscall,
        flags: h.flags,
        fstype,
        source,
        target,
        ret: h.ret,
        latency_ns: h.latency_ns,
        uid: h.uid,
    })
}

/// Decodes one record of the `EXEC_EVENTS` ring; `None` if it is malformed.
pub fn decode_exec(rec: &[u8]) -> Option<ToolExec> {
    if rec.len() < std::mem::size_of::<wire::ExecEvent>() {
        return None;
    }
    // SAFETY: the record holds at least an ExecEvent, plain data valid for
    // any bytes; read_unaligned copes with the alignment.
    let e = unsafe { std::ptr::read_unaligned(rec.as_ptr().cast::<wire::ExecEvent>()) };
    exec_from_wire(&e)
}

/// A tool run as the kernel program keeps it (`EXECS`, `end_ns` 0 while it
/// runs) or sends it (`EXEC_EVENTS`).
pub fn exec_from_wire(e: &wire::ExecEvent) -> Option<ToolExec> {
    let used = (e.args_len as usize).min(wire::EXEC_ARGS_MAX);
    let truncated = e.flags & wire::EXEC_ARGS_TRUNCATED != 0;
    let block = e.args.get(..used)?;
    let block = block.strip_suffix(&[0]).unwrap_or(block);
    let mut args: Vec<String> = if block.is_empty() {
        Vec::new()
    } else {
        block
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect()
    };
    if truncated && !args.is_empty() {
        // Cut at the front: the first piece is a partial argument.
        args.remove(0);
    }
    let comm_end = e.comm.iter().position(|&b| b == 0).unwrap_or(e.comm.len());
    Some(ToolExec {
        start_ns: e.start_ns,
        end_ns: e.end_ns,
        pid: e.pid,
        comm: String::from_utf8_lossy(&e.comm[..comm_end]).into_owned(),
        mnt_ns: e.mnt_ns,
        cgroup_id: e.cgroup_id,
        args,
        args_truncated: truncated,
        exit_code: e.exit_code,
        uid: e.uid,
    })
}

type FlagTable = &'static [(u64, &'static str)];

/// `mount(2)` flags.
pub const MS_FLAGS: FlagTable = &[
    (libc::MS_RDONLY, "MS_RDONLY"),
    (libc::MS_NOSUID, "MS_NOSUID"),
    (libc::MS_NODEV, "MS_NODEV"),
    (libc::MS_NOEXEC, "MS_NOEXEC"),
    (libc::MS_SYNCHRONOUS, "MS_SYNCHRONOUS"),
    (libc::MS_REMOUNT, "MS_REMOUNT"),
    (libc::MS_MANDLOCK, "MS_MANDLOCK"),
    (libc::MS_DIRSYNC, "MS_DIRSYNC"),
    (0x100, "MS_NOSYMFOLLOW"),
    (libc::MS_NOATIME, "MS_NOATIME"),
    (libc::MS_NODIRATIME, "MS_NODIRATIME"),
    (libc::MS_BIND, "MS_BIND"),
    (libc::MS_MOVE, "MS_MOVE"),
    (libc::MS_REC, "MS_REC"),
    (libc::MS_SILENT, "MS_SILENT"),
    (libc::MS_POSIXACL, "MS_POSIXACL"),
    (libc::MS_UNBINDABLE, "MS_UNBINDABLE"),
    (libc::MS_PRIVATE, "MS_PRIVATE"),
    (libc::MS_SLAVE, "MS_SLAVE"),
    (libc::MS_SHARED, "MS_SHARED"),
    (libc::MS_RELATIME, "MS_RELATIME"),
    (libc::MS_KERNMOUNT, "MS_KERNMOUNT"),
    (libc::MS_I_VERSION, "MS_I_VERSION"),
    (libc::MS_STRICTATIME, "MS_STRICTATIME"),
    (libc::MS_LAZYTIME, "MS_LAZYTIME"),
];

/// `umount2(2)` flags.
pub const UMOUNT_FLAGS: FlagTable = &[
    (1, "MNT_FORCE"),
    (2, "MNT_DETACH"),
    (4, "MNT_EXPIRE"),
    (8, "UMOUNT_NOFOLLOW"),
];

/// `fsopen(2)` flags.
pub const FSOPEN_FLAGS: FlagTable = &[(1, "FSOPEN_CLOEXEC")];

/// `fsmount(2)` flags.
pub const FSMOUNT_FLAGS: FlagTable = &[(1, "FSMOUNT_CLOEXEC")];

/// `fspick(2)` flags.
pub const FSPICK_FLAGS: FlagTable = &[
    (1, "FSPICK_CLOEXEC"),
    (2, "FSPICK_SYMLINK_NOFOLLOW"),
    (4, "FSPICK_NO_AUTOMOUNT"),
    (8, "FSPICK_EMPTY_PATH"),
];

/// `move_mount(2)` flags.
pub const MOVE_MOUNT_FLAGS: FlagTable = &[
    (0x01, "MOVE_MOUNT_F_SYMLINKS"),
    (0x02, "MOVE_MOUNT_F_AUTOMOUNTS"),
    (0x04, "MOVE_MOUNT_F_EMPTY_PATH"),
    (0x10, "MOVE_MOUNT_T_SYMLINKS"),
    (0x20, "MOVE_MOUNT_T_AUTOMOUNTS"),
    (0x40, "MOVE_MOUNT_T_EMPTY_PATH"),
    (0x100, "MOVE_MOUNT_SET_GROUP"),
    (0x200, "MOVE_MOUNT_BENEATH"),
];

/// `open_tree(2)` flags.
pub const OPEN_TREE_FLAGS: FlagTable = &[
    (1, "OPEN_TREE_CLONE"),
    (libc::O_CLOEXEC as u64, "OPEN_TREE_CLOEXEC"),
    (libc::AT_SYMLINK_NOFOLLOW as u64, "AT_SYMLINK_NOFOLLOW"),
    (libc::AT_NO_AUTOMOUNT as u64, "AT_NO_AUTOMOUNT"),
    (libc::AT_EMPTY_PATH as u64, "AT_EMPTY_PATH"),
    (AT_RECURSIVE, "AT_RECURSIVE"),
];

/// `mount_setattr(2)` flags.
pub const MOUNT_SETATTR_FLAGS: FlagTable = &[
    (libc::AT_SYMLINK_NOFOLLOW as u64, "AT_SYMLINK_NOFOLLOW"),
    (libc::AT_NO_AUTOMOUNT as u64, "AT_NO_AUTOMOUNT"),
    (libc::AT_EMPTY_PATH as u64, "AT_EMPTY_PATH"),
    (AT_RECURSIVE, "AT_RECURSIVE"),
];

const AT_RECURSIVE: u64 = 0x8000;

/// `MOUNT_ATTR_*` (`fsmount` attr_flags, `mount_setattr` attr_set/attr_clr),
/// without the atime field, decoded separately.
pub const MOUNT_ATTR_FLAGS: FlagTable = &[
    (0x1, "MOUNT_ATTR_RDONLY"),
    (0x2, "MOUNT_ATTR_NOSUID"),
    (0x4, "MOUNT_ATTR_NODEV"),
    (0x8, "MOUNT_ATTR_NOEXEC"),
    (0x80, "MOUNT_ATTR_NODIRATIME"),
    (0x100000, "MOUNT_ATTR_IDMAP"),
    (0x200000, "MOUNT_ATTR_NOSYMFOLLOW"),
];

/// `fsconfig(2)` commands.
pub fn fsconfig_cmd_name(cmd: u64) -> Option<&'static str> {
    Some(match cmd {
        0 => "FSCONFIG_SET_FLAG",
        1 => "FSCONFIG_SET_STRING",
        2 => "FSCONFIG_SET_BINARY",
        3 => "FSCONFIG_SET_PATH",
        4 => "FSCONFIG_SET_PATH_EMPTY",
        5 => "FSCONFIG_SET_FD",
        6 => "FSCONFIG_CMD_CREATE",
        7 => "FSCONFIG_CMD_RECONFIGURE",
        8 => "FSCONFIG_CMD_CREATE_EXCL",
        _ => return None,
    })
}

/// `NAME|NAME|0x..` for the bits of `flags` (`0` when none is set).
pub fn flag_names(flags: u64, table: FlagTable) -> String {
    let mut out = String::new();
    let mut rest = flags;
    for &(bit, name) in table {
        if bit != 0 && flags & bit == bit {
            if !out.is_empty() {
                out.push('|');
            }
            out.push_str(name);
            rest &= !bit;
        }
    }
    if rest != 0 {
        if !out.is_empty() {
            out.push('|');
        }
        let _ = write!(out, "{rest:#x}");
    }
    if out.is_empty() {
        out.push('0');
    }
    out
}

/// `mount(2)` flags by name, handling the legacy `MS_MGC_VAL` magic.
pub fn mount_flag_names(flags: u64) -> String {
    const MS_MGC_MSK: u64 = 0xffff_0000;
    const MS_MGC_VAL: u64 = 0xc0ed_0000;
    if flags & MS_MGC_MSK == MS_MGC_VAL {
        let rest = flag_names(flags & !MS_MGC_MSK, MS_FLAGS);
        return if rest == "0" {
            "MS_MGC_VAL".into()
        } else {
            format!("MS_MGC_VAL|{rest}")
        };
    }
    flag_names(flags, MS_FLAGS)
}

/// `MOUNT_ATTR_*` by name, including the atime field.
pub fn mount_attr_names(attr: u64) -> String {
    const ATIME: u64 = 0x70;
    let atime = match attr & ATIME {
        0x10 => Some("MOUNT_ATTR_NOATIME"),
        0x20 => Some("MOUNT_ATTR_STRICTATIME"),
        _ => None, // 0 is MOUNT_ATTR_RELATIME, the default
    };
    let known_atime = if atime.is_some() { attr & ATIME } else { 0 };
    let rest = flag_names(attr & !known_atime, MOUNT_ATTR_FLAGS);
    match (atime, rest.as_str()) {
        (Some(a), "0") => a.into(),
        (Some(a), r) => format!("{r}|{a}"),
        (None, _) => rest,
    }
}

/// The decoded flags of an event.
pub fn flags_of(ev: &SyscallEvent) -> String {
    match ev.syscall {
        MountSyscall::Mount => mount_flag_names(ev.flags),
        MountSyscall::Umount => flag_names(ev.flags, UMOUNT_FLAGS),
        MountSyscall::Fsopen => flag_names(ev.flags, FSOPEN_FLAGS),
        MountSyscall::Fsconfig => "0".into(),
        MountSyscall::Fsmount => flag_names(ev.flags, FSMOUNT_FLAGS),
        MountSyscall::Fspick => flag_names(ev.flags, FSPICK_FLAGS),
        MountSyscall::MoveMount => flag_names(ev.flags, MOVE_MOUNT_FLAGS),
        MountSyscall::OpenTree => flag_names(ev.flags, OPEN_TREE_FLAGS),
        MountSyscall::MountSetattr => flag_names(ev.flags, MOUNT_SETATTR_FLAGS),
    }
}

/// `errno` name of a negative return value, e.g. `ENOENT`.
pub fn errno_name(ret: i64) -> Option<String> {
    if ret >= 0 {
        return None;
    }
    // `checked_neg`: -i64::MIN does not exist (a corrupt record must not
    // panic the decoder).
    let e = i32::try_from(ret.checked_neg()?).ok()?;
    Some(format!("{:?}", nix::errno::Errno::from_raw(e)))
}

/// A directory descriptor argument: `AT_FDCWD` or the number.
pub fn dirfd_name(fd: i32) -> String {
    if fd == libc::AT_FDCWD {
        "AT_FDCWD".into()
    } else {
        fd.to_string()
    }
}

fn quoted(s: &Option<String>, truncated: bool) -> String {
    match s {
        None => "NULL".into(),
        Some(s) if truncated => format!("{s:?}..."),
        Some(s) => format!("{s:?}"),
    }
}

/// The call as C-like text, e.g. `mount("tmpfs", "/mnt", "tmpfs", MS_NOSUID, ...)`.
pub fn call_text(ev: &SyscallEvent, x: &ExtraArgs) -> String {
    let t = |bit| x.truncated & bit != 0;
    let fstype = quoted(&ev.fstype, t(wire::TRUNC_FSTYPE));
    let source = quoted(&ev.source, t(wire::TRUNC_SOURCE));
    let target = quoted(&ev.target, t(wire::TRUNC_TARGET));
    let flags = flags_of(ev);
    match ev.syscall {
        MountSyscall::Mount => format!("mount({source}, {target}, {fstype}, {flags}, ...)"),
        MountSyscall::Umount => format!("umount2({target}, {flags})"),
        MountSyscall::Fsopen => format!("fsopen({fstype}, {flags})"),
        MountSyscall::Fsconfig => {
            let cmd =
                fsconfig_cmd_name(x.aux[0]).map_or_else(|| x.aux[0].to_string(), str::to_string);
            let value = match x.aux[0] {
                1 | 3 | 4 => target,
                _ => "...".into(),
            };
            format!(
                "fsconfig({}, {cmd}, {source}, {value}, {})",
                x.fds[0], x.fds[1]
            )
        }
        MountSyscall::Fsmount => format!(
            "fsmount({}, {flags}, {})",
            x.fds[0],
            mount_attr_names(x.aux[0])
        ),
        MountSyscall::Fspick => format!("fspick({}, {source}, {flags})", dirfd_name(x.fds[0])),
        MountSyscall::MoveMount => format!(
            "move_mount({}, {source}, {}, {target}, {flags})",
            dirfd_name(x.fds[0]),
            dirfd_name(x.fds[1])
        ),
        MountSyscall::OpenTree => {
            format!("open_tree({}, {source}, {flags})", dirfd_name(x.fds[0]))
        }
        MountSyscall::MountSetattr => format!(
            "mount_setattr({}, {target}, {flags}, {{attr_set={}, attr_clr={}}})",
            dirfd_name(x.fds[0]),
            mount_attr_names(x.aux[0]),
            mount_attr_names(x.aux[1])
        ),
    }
}

/// The return value as text: the value, or `-1 ENOENT`-style errno.
pub fn ret_text(ret: i64) -> String {
    match errno_name(ret) {
        Some(name) => format!("-{} {name}", -ret),
        None => ret.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec_record(args: &[u8], flags: u32, exit_code: i32) -> Vec<u8> {
        let mut e = wire::ExecEvent {
            start_ns: 1_000,
            end_ns: 51_000,
            mnt_ns: 7,
            cgroup_id: 9,
            pid: 42,
            exit_code,
            args_len: args.len() as u32,
            flags,
            comm: [0; 16],
            args: [0; wire::EXEC_ARGS_MAX],
            uid: 0,
            _pad: 0,
        };
        e.comm[..9].copy_from_slice(b"mkfs.ext4");
        e.args[..args.len()].copy_from_slice(args);
        // SAFETY: test: viewing plain data as bytes.
        unsafe {
            std::slice::from_raw_parts(
                (&e as *const wire::ExecEvent).cast::<u8>(),
                std::mem::size_of::<wire::ExecEvent>(),
            )
        }
        .to_vec()
    }

    #[test]
    fn tool_runs_decode_with_device_result_and_duration() {
        let rec = exec_record(b"mkfs.ext4\0-q\0-E\0nodiscard\0/dev/loop0\0", 0, 0);
        let x = decode_exec(&rec).unwrap();
        assert_eq!(x.comm, "mkfs.ext4");
        assert_eq!(x.pid, 42);
        assert_eq!(
            x.args,
            vec!["mkfs.ext4", "-q", "-E", "nodiscard", "/dev/loop0"]
        );
        assert_eq!(x.device(), Some("/dev/loop0"));
        assert_eq!(x.duration_ns(), 50_000);
        assert_eq!(x.result(), "ok");
        assert_eq!(x.command_line(), "mkfs.ext4 -q -E nodiscard /dev/loop0");
        // A device given before a size; exit 8; killed by SIGKILL.
        let x = decode_exec(&exec_record(b"resize2fs\0/dev/sdb\0+10G\0", 0, 8 << 8)).unwrap();
        assert_eq!(x.device(), Some("/dev/sdb"));
        assert_eq!(x.result(), "exit 8");
        let x = decode_exec(&exec_record(b"fsck\0-a\0vol\0", 0, 9)).unwrap();
        assert_eq!(x.device(), Some("vol"), "no path: the last non-option");
        assert_eq!(x.result(), "signal 9");
        let x = decode_exec(&exec_record(b"fsck\0-a\0", 0, 0)).unwrap();
        assert_eq!(x.device(), None, "argv[0] is not the device");
        // Truncated: the first, partial argument is dropped.
        let x = decode_exec(&exec_record(
            b"ng-option\0/dev/sdc\0",
            wire::EXEC_ARGS_TRUNCATED,
            0,
        ))
        .unwrap();
        assert_eq!(x.args, vec!["/dev/sdc"]);
        assert_eq!(x.device(), Some("/dev/sdc"));
        assert_eq!(x.command_line(), "... /dev/sdc");
        assert!(decode_exec(&rec[..rec.len() - 1]).is_none(), "cut short");
    }

    #[test]
    fn errno_of_any_return_value() {
        assert_eq!(errno_name(-2).as_deref(), Some("ENOENT"));
        assert_eq!(errno_name(0), None);
        assert_eq!(
            errno_name(i64::MIN),
            None,
            "no overflow on a corrupt record"
        );
        assert_eq!(errno_name(-(1 << 40)), None);
    }

    #[test]
    fn bind_and_move_are_not_confused() {
        assert_eq!(mount_flag_names(0x1000), "MS_BIND");
        assert_eq!(mount_flag_names(0x2000), "MS_MOVE");
        assert_eq!(mount_flag_names(0x1000 | 0x4000), "MS_BIND|MS_REC");
        assert_eq!(mount_flag_names(0xc0ed_0000 | 0x1000), "MS_MGC_VAL|MS_BIND");
        assert_eq!(mount_flag_names(0), "0");
        assert_eq!(mount_flag_names(1 << 40), "0x10000000000");
    }

    #[test]
    fn new_api_flags() {
        assert_eq!(
            flag_names(0x4 | 0x40, MOVE_MOUNT_FLAGS),
            "MOVE_MOUNT_F_EMPTY_PATH|MOVE_MOUNT_T_EMPTY_PATH"
        );
        assert_eq!(
            flag_names(1 | libc::O_CLOEXEC as u64, OPEN_TREE_FLAGS),
            "OPEN_TREE_CLONE|OPEN_TREE_CLOEXEC"
        );
        assert_eq!(
            mount_attr_names(0x1 | 0x10),
            "MOUNT_ATTR_RDONLY|MOUNT_ATTR_NOATIME"
        );
        assert_eq!(mount_attr_names(0), "0");
        assert_eq!(fsconfig_cmd_name(6), Some("FSCONFIG_CMD_CREATE"));
        assert_eq!(ret_text(-2), "-2 ENOENT");
        assert_eq!(ret_text(3), "3");
    }

    #[test]
    fn records_decode() {
        let mut h = EventHeader {
            pid: 7,
            tid: 8,
            syscall: wire::SYS_MOUNT,
            ret: -16,
            latency_ns: 1234,
            flags: 0x1000,
            len: [6, 3, 0],
            ..Default::default()
        };
        h.comm[..5].copy_from_slice(b"mount");
        let mut rec = vec![0u8; wire::HEADER_SIZE];
        // SAFETY: the buffer holds a header.
        unsafe { std::ptr::write_unaligned(rec.as_mut_ptr().cast::<EventHeader>(), h) };
        rec.extend_from_slice(b"tmpfs\0/a\0");
        let ev = decode_record(&rec).unwrap();
        assert_eq!(ev.comm, "mount");
        assert_eq!(ev.fstype.as_deref(), Some("tmpfs"));
        assert_eq!(ev.source.as_deref(), Some("/a"));
        assert_eq!(ev.target, None);
        assert_eq!(ev.syscall, MountSyscall::Mount);
        assert_eq!(ev.ret, -16);
        // A record cut short is rejected, not misread.
        assert_eq!(decode_record(&rec[..rec.len() - 1]), None);
        assert_eq!(decode_record(&rec[..10]), None);
    }

    #[test]
    fn histogram_buckets_are_ordered_and_contain_their_values() {
        let mut last = 0;
        for ns in [
            0u64,
            999,
            1000,
            1999,
            2000,
            3500,
            4000,
            5000,
            7999,
            8000,
            1_000_000,
            1u64 << 40,
        ] {
            let b = wire::hist_bucket(ns);
            assert!(b >= last, "{ns}");
            last = b;
            let (lo, hi) = wire::hist_bucket_bounds_ns(b);
            assert!(lo <= ns && ns < hi, "{ns} in bucket {b} [{lo}, {hi})");
        }
    }
}
