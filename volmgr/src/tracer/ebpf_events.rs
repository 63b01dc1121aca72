//! The eBPF feed: every mount-table syscall of the agent's mount namespace
//! lands in the latency histograms ([`SyscallStats`]); a successful call by
//! another process that may have changed a managed path asks for a targeted
//! check of that path. The event alone never changes the actual state.
//!
//! Which calls may change a managed path: `mount` (a new mount on its target;
//! with `MS_MOVE` its source loses one), `umount2`, and `move_mount` (source
//! and target). `fsopen`, `fsconfig`, `fsmount`, `fspick` and `open_tree`
//! only prepare detached mounts, and `mount_setattr` changes attributes, not
//! what is mounted where, so they are only measured. A target that is
//! relative, empty (a dirfd), or goes through `/proc` (an fd's magic link)
//! cannot be placed without racing the caller, so it means "check
//! everything"; an absolute path is taken as given (util-linux resolves
//! symlinks before calling; a symlinked path outside ROOT that leads into it
//! is left to the resync).
//!
//! The program traces every process in every mount namespace: each call on
//! a volume's path under ROOT, whoever made it (the kubelet, a CSI driver
//! container, a mount helper), goes into that volume's timeline
//! ([`super::timeline`]) and into the latency histograms with the volume's
//! driver. Only calls made in the agent's own mount namespace lead to
//! checks, and calls elsewhere that touch no volume are not counted. A
//! change made in another namespace that reaches the agent's through mount
//! propagation (shared mounts) is left to the resync; the mountinfo poller,
//! which watches the namespace's own table, does see those.
//!
//! Only calls that act on the host's mounts are placed on a volume
//! ([`attributable`]): the calls of uid 0 of the initial user namespace
//! (the kubelet, CSI driver containers, their mount helpers) and the
//! successful calls made in the agent's own mount namespace. Any other
//! process can name a volume's path (and its failing calls are traced),
//! or mount anything at that path in a mount namespace of its own: its
//! calls would only forge a pod's evidence, so they are counted in the
//! histograms without a driver, never in a timeline.
//!
//! File system tool runs (`mkfs`, `fsck`, `resize2fs`, ... from their own
//! ring buffer) go into the timeline of the volume their device belongs
//! to ([`super::devices`]); the mount-family events teach it which device
//! that is.

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};

use crate::ebpf::{MountSyscall, SyscallEvent, SyscallStats, ToolExec};

use super::check::{CheckSender, Origin, Scope};
use super::devices::{own_mounts, DeviceVolumes, Placed};
use super::timeline::TimelineStore;
use super::TracerCounters;
use crate::cache::out_of_band::DetectedBy;
use crate::util::sync::MutexExt;

/// `MS_MOVE` from `linux/mount.h`.
const MS_MOVE: u64 = 0x2000;

/// Who the agent is, for telling its own calls apart.
#[derive(Debug, Clone)]
pub struct Own {
    /// The agent's pid (tgid).
    pub pid: u32,
    /// When the manager is linked into a host process: the name of its
    /// threads; the host's other threads are not the manager.
    pub comm: Option<String>,
    /// Its mount namespace inode.
    pub mnt_ns: u64,
    /// ROOT.
    pub root: PathBuf,
}

/// Where the events go.
pub struct Sinks {
    /// Latency histograms.
    pub stats: Arc<Mutex<SyscallStats>>,
    /// Per-volume timelines.
    pub timelines: Arc<TimelineStore>,
    /// Checks of the mount table.
    pub checks: CheckSender,
    /// Counters for status.
    pub counters: Arc<TracerCounters>,
}

/// Reads events (and file system tool runs, when `execs` is given) until
/// the event channel closes or `shutdown`.
pub async fn run(
    mut events: mpsc::UnboundedReceiver<SyscallEvent>,
    mut execs: Option<mpsc::UnboundedReceiver<ToolExec>>,
    own: Own,
    sinks: Sinks,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut devices = DeviceVolumes::default();
    loop {
        let next_exec = async {
            match execs.as_mut() {
                Some(rx) => rx.recv().await,
                None => std::future::pending().await,
            }
        };
        let next = tokio::select! {
            biased;
            () = crate::util::shutdown::requested(&mut shutdown) => return,
            ev = events.recv() => match ev {
                Some(ev) => Ok(ev),
                None => {
                    tracing::error!("eBPF event stream ended; only the resync remains");
                    return;
                }
            },
            x = next_exec => Err(x),
        };
        match next {
            Ok(ev) => handle(&ev, &own, &sinks, &mut devices),
            Err(Some(x)) => {
                // Others' runs are neither placed nor wait for a mount
                // (they would evict root's runs waiting there).
                let placed = super::stuck::tool_can_matter(&x)
                    .then(|| devices.on_exec(x, &own.root, own_mounts))
                    .flatten();
                if let Some(p) = placed {
                    record_placed(&p, &own, &sinks);
                }
            }
            Err(None) => execs = None,
        }
        while let Ok(ev) = events.try_recv() {
            handle(&ev, &own, &sinks, &mut devices);
        }
    }
}

fn record_placed(p: &Placed, own: &Own, sinks: &Sinks) {
    sinks
        .timelines
        .record_exec(&p.exec, &p.attribution, &p.device, &own.root);
}

/// Whether `ev` may be placed on a volume (its timeline, its driver's
/// histograms, the device map): a call of uid 0 in the initial user
/// namespace, or a successful call in the agent's own mount namespace
/// (see the module).
pub fn attributable(ev: &SyscallEvent, own: &Own) -> bool {
    ev.uid == 0 || (ev.ret >= 0 && ev.mnt_ns == own.mnt_ns)
}

fn handle(ev: &SyscallEvent, own: &Own, sinks: &Sinks, devices: &mut DeviceVolumes) {
    let driver = if attributable(ev, own) {
        for p in devices.on_syscall(ev, &own.root, own_mounts) {
            record_placed(&p, own, sinks);
        }
        sinks.timelines.record(ev, &own.root)
    } else {
        None
    };
    if driver.is_none() && ev.mnt_ns != own.mnt_ns {
        // Another namespace's call on no volume: not this node's concern.
        return;
    }
    sinks
        .stats
        .locked()
        .record_for_driver(ev, driver.as_deref().unwrap_or(""));
    let (checks, counters) = (&sinks.checks, &sinks.counters);
    counters.events.fetch_add(1, Ordering::Relaxed);
    if counters.observing {
        // Observe mode manages nothing: the kubelet's mounts (and the bind
        // of its root onto itself) are its own, not out of band.
        return;
    }
    let scopes = scopes(ev, own);
    if scopes.is_empty() {
        return;
    }
    counters.out_of_band_events.fetch_add(1, Ordering::Relaxed);
    let origin = Origin {
        by: DetectedBy::Ebpf,
        cause: Some(describe(ev)),
        boot_ns: Some(ev.boot_ns),
    };
    tracing::debug!(
        cause = origin.cause.as_deref().unwrap_or(""),
        "mount-table change by another process; checking"
    );
    for s in scopes {
        checks.check(s, origin.clone());
    }
}

/// `umount2("/x") by umount[42]`.
pub fn describe(ev: &SyscallEvent) -> String {
    let arg = |a: &Option<String>| a.as_deref().map(|s| format!("{s:?}")).unwrap_or_default();
    let args = match ev.syscall {
        MountSyscall::Mount | MountSyscall::MoveMount => {
            format!("{}, {}", arg(&ev.source), arg(&ev.target))
        }
        _ => arg(&ev.target),
    };
    format!("{}({args}) by {}[{}]", ev.syscall.name(), ev.comm, ev.pid)
}

/// The checks an event calls for: none for the agent's own calls, calls in
/// other mount namespaces, failed calls and calls that cannot change what is
/// mounted where.
pub fn scopes(ev: &SyscallEvent, own: &Own) -> Vec<Scope> {
    let ours = ev.pid == own.pid && own.comm.as_ref().is_none_or(|c| *c == ev.comm);
    if ours || ev.mnt_ns != own.mnt_ns || ev.ret != 0 {
        return Vec::new();
    }
    let paths: Vec<&Option<String>> = match ev.syscall {
        MountSyscall::Umount => vec![&ev.target],
        MountSyscall::Mount if ev.flags & MS_MOVE != 0 => vec![&ev.source, &ev.target],
        MountSyscall::Mount => vec![&ev.target],
        MountSyscall::MoveMount => vec![&ev.source, &ev.target],
        MountSyscall::Fsopen
        | MountSyscall::Fsconfig
        | MountSyscall::Fsmount
        | MountSyscall::Fspick
        | MountSyscall::OpenTree
        | MountSyscall::MountSetattr => return Vec::new(),
    };
    let mut out = Vec::new();
    for p in paths {
        match place(p.as_deref(), &own.root) {
            Place::Unknown => return vec![Scope::All],
            Place::Outside => {}
            Place::Below(p) => out.push(Scope::Below(p)),
        }
    }
    out
}

enum Place {
    Unknown,
    Outside,
    Below(PathBuf),
}

fn place(path: Option<&str>, root: &Path) -> Place {
    let Some(p) = path.filter(|p| !p.is_empty()) else {
        return Place::Unknown;
    };
    let p = Path::new(p);
    if !p.is_absolute()
        || p.starts_with("/proc")
        || p.components().any(|c| matches!(c, Component::ParentDir))
    {
        return Place::Unknown;
    }
    // Lexical clean-up only (`//`, `/./`); never touches the file system.
    let p: PathBuf = p.components().collect();
    if p.starts_with(root) && p != root {
        Place::Below(p)
    } else if root.starts_with(&p) {
        Place::Unknown
    } else {
        Place::Outside
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own() -> Own {
        Own {
            pid: 100,
            comm: None,
            mnt_ns: 7,
            root: PathBuf::from("/r"),
        }
    }

    fn ev(syscall: MountSyscall, source: Option<&str>, target: Option<&str>) -> SyscallEvent {
        SyscallEvent {
            boot_ns: 1,
            pid: 200,
            tid: 200,
            comm: "umount".into(),
            mnt_ns: 7,
            cgroup_id: 1,
            syscall,
            flags: 0,
            fstype: None,
            source: source.map(Into::into),
            target: target.map(Into::into),
            ret: 0,
            latency_ns: 1000,
            uid: 0,
        }
    }

    #[test]
    fn umount_under_root_checks_that_path() {
        let e = ev(MountSyscall::Umount, None, Some("/r/pods/u/v"));
        assert_eq!(scopes(&e, &own()), vec![Scope::Below("/r/pods/u/v".into())]);
        assert_eq!(describe(&e), "umount2(\"/r/pods/u/v\") by umount[200]");
        let e = ev(MountSyscall::Umount, None, Some("/r//pods/./u"));
        assert_eq!(scopes(&e, &own()), vec![Scope::Below("/r/pods/u".into())]);
    }

    #[test]
    fn own_failed_foreign_namespace_and_unrelated_calls_are_ignored() {
        let mut e = ev(MountSyscall::Umount, None, Some("/r/pods/u/v"));
        e.pid = 100;
        assert!(scopes(&e, &own()).is_empty(), "the agent's own call");
        let host = Own {
            comm: Some("volmgr-rt".into()),
            ..own()
        };
        assert!(
            !scopes(&e, &host).is_empty(),
            "a host process's own thread is not the manager"
        );
        e.comm = "volmgr-rt".into();
        assert!(
            scopes(&e, &host).is_empty(),
            "the manager's thread in a host"
        );
        let mut e = ev(MountSyscall::Umount, None, Some("/r/pods/u/v"));
        e.ret = -16;
        assert!(scopes(&e, &own()).is_empty(), "EBUSY changed nothing");
        let mut e = ev(MountSyscall::Umount, None, Some("/r/pods/u/v"));
        e.mnt_ns = 8;
        assert!(scopes(&e, &own()).is_empty(), "another namespace");
        let e = ev(MountSyscall::Umount, None, Some("/mnt"));
        assert!(scopes(&e, &own()).is_empty(), "outside ROOT");
        let e = ev(MountSyscall::Umount, None, Some("/r2/x"));
        assert!(scopes(&e, &own()).is_empty(), "a sibling of ROOT");
        let e = ev(MountSyscall::Fsmount, None, None);
        assert!(scopes(&e, &own()).is_empty(), "a detached mount");
    }

    /// The host's root is placed on volumes wherever it calls from; anyone
    /// else only with a successful call in the agent's mount namespace.
    #[test]
    fn only_calls_on_the_hosts_mounts_are_attributable() {
        let victim = Some("/r/pods/victim/volumes/kubernetes.io~empty-dir/d");
        let mut e = ev(MountSyscall::Mount, None, victim);
        assert!(attributable(&e, &own()), "root, here");
        e.mnt_ns = 8;
        assert!(attributable(&e, &own()), "root, a CSI driver's namespace");
        e.uid = 65534;
        assert!(!attributable(&e, &own()), "nobody, a namespace of its own");
        e.mnt_ns = 7;
        assert!(attributable(&e, &own()), "nobody's mount here succeeded");
        e.ret = -1;
        e.comm = "kubelet".into();
        assert!(!attributable(&e, &own()), "nobody's failed call");
        e.uid = 0;
        assert!(attributable(&e, &own()), "root's failed call");
    }

    #[test]
    fn unplaceable_targets_check_everything() {
        for t in [
            None,
            Some(""),
            Some("rel/path"),
            Some("/proc/self/fd/3/x"),
            Some("/r/a/../b"),
            Some("/"),
            Some("/r"),
        ] {
            let e = ev(MountSyscall::Umount, None, t);
            assert_eq!(scopes(&e, &own()), vec![Scope::All], "{t:?}");
        }
    }

    #[test]
    fn moves_check_source_and_target() {
        let mut e = ev(MountSyscall::Mount, Some("/r/pods/u/v"), Some("/mnt"));
        assert!(
            scopes(&e, &own()).is_empty(),
            "a plain mount's source is no path"
        );
        e.flags = MS_MOVE;
        assert_eq!(scopes(&e, &own()), vec![Scope::Below("/r/pods/u/v".into())]);
        let e = ev(MountSyscall::MoveMount, Some("/mnt"), Some("/r/pods/u/v"));
        assert_eq!(scopes(&e, &own()), vec![Scope::Below("/r/pods/u/v".into())]);
        let e = ev(MountSyscall::MoveMount, Some(""), Some("/r/pods/u/v"));
        assert_eq!(scopes(&e, &own()), vec![Scope::All], "from a dirfd");
    }
}
