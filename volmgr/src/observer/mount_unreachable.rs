//! (h) `mount_unreachable`: network and FUSE mounts under ROOT (its pod
//! volume paths and the plugins' directories) that no longer answer: an
//! NFS server gone (`stat` hangs, the kubelet with it), a FUSE daemon
//! killed with its CSI node plugin (`Transport endpoint is not
//! connected`).
//!
//! Each such file system (by device, one probe path per device: a mount
//! point where it is the top mount) is probed every [`PROBE_PERIOD`] with
//! a `statx(AT_STATX_FORCE_SYNC)` (the kernel asks the server or daemon
//! again instead of answering from its cache) from a thread of its own
//! that nothing waits on: the scan only reads the probes' results. A
//! probe that has not returned after [`PROBE_TIMEOUT`] makes the mount
//! hung; its thread stays parked in the kernel until the call returns
//! (never a second probe of the same device meanwhile), and at most
//! [`MAX_PARKED_PROBES`] probe threads exist at once: the devices beyond
//! are reported as not probed, not probed by more threads. Local block
//! file systems are never probed.
//!
//! The prober wakes the scan loop when a verdict changes (a probe hangs,
//! fails, or answers again), so a mount that goes bad is reported about
//! `PROBE_PERIOD + PROBE_TIMEOUT` later.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::blocked_tasks::{self, BlockedTask};
use super::{finding, mount_line, DesiredPods, Observer, Snapshot, MAX_FINDINGS_PER_KIND};
use crate::cache::out_of_band::rfc3339;
use crate::status::{Finding, FindingKind, StuckSyscall};
use crate::sys::mountinfo::MountInfo;
use crate::tracer::stuck::StuckView;
use crate::util::sync::MutexExt;
use crate::volume::PodUid;

/// How often each network or FUSE file system under ROOT is probed.
pub const PROBE_PERIOD: Duration = Duration::from_secs(5);
/// How long a probe may take before its mount is reported hung.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// The most probe threads at once (hung ones stay until their call
/// returns); devices beyond are reported "not probed".
pub const MAX_PARKED_PROBES: usize = 32;
/// A probe thread's stack: it makes one system call.
const PROBE_STACK: usize = 64 << 10;
/// How often the prober looks at its probes (woken early when one returns).
const TICK: Duration = Duration::from_millis(250);
/// Blocked tasks named per finding.
const TASKS_LISTED: usize = 16;
/// Other mount points and pods named per finding.
const USERS_LISTED: usize = 32;

/// Network file systems (their server may go away); FUSE is matched by
/// prefix (`fuse`, `fuseblk`, `fuse.<name>`).
const NETWORK_FSTYPES: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "ceph",
    "glusterfs",
    "9p",
    "afs",
    "lustre",
    "gpfs",
    "beegfs",
    "virtiofs",
    "orangefs",
    "pvfs2",
];

/// Whether mounts of `fstype` are probed: network and FUSE file systems,
/// never local block ones.
pub fn probed_fstype(fstype: &str) -> bool {
    fstype == "fuse"
        || fstype == "fuseblk"
        || fstype.starts_with("fuse.")
        || NETWORK_FSTYPES.contains(&fstype)
}

/// A file system's device number, `(major, minor)`.
type Dev = (u32, u32);

/// The prober's settings.
#[derive(Debug, Clone, Copy)]
pub struct ProbeSettings {
    /// Time between two probes of a device.
    pub period: Duration,
    /// A probe not returned after this is a hung mount.
    pub timeout: Duration,
    /// The most probe threads at once.
    pub max_parked: usize,
}

impl Default for ProbeSettings {
    fn default() -> Self {
        Self {
            period: PROBE_PERIOD,
            timeout: PROBE_TIMEOUT,
            max_parked: MAX_PARKED_PROBES,
        }
    }
}

/// What the probes say of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It answered the last probe, or is not probed yet.
    Answering,
    /// A probe has not returned for `for_` (since `since`).
    Hung {
        /// When the probe started.
        since: SystemTime,
        /// How long it has been waiting.
        for_: Duration,
    },
    /// The last probes failed with `errno` (since `since`).
    Failed {
        /// The error number (`ENOTCONN`, `EIO`, `ESTALE`, ...).
        errno: i32,
        /// When it first failed so.
        since: SystemTime,
    },
    /// Not probed: [`ProbeSettings::max_parked`] probe threads are out.
    NotProbed,
}

impl Verdict {
    /// What changes wake the scan: the kind and the errno, not the time.
    fn class(&self) -> (u8, i32) {
        match self {
            Self::Answering => (0, 0),
            Self::Hung { .. } => (1, 0),
            Self::Failed { errno, .. } => (2, *errno),
            Self::NotProbed => (3, 0),
        }
    }
}

/// One device's probes.
struct DevState {
    /// Where it is probed.
    path: PathBuf,
    /// The probe in flight: when it started.
    in_flight: Option<(Instant, SystemTime)>,
    /// When the last probe returned, and its result (`Err(errno)`).
    last: Option<(Instant, Result<(), i32>)>,
    /// Since when the probes fail with the last errno.
    failing_since: Option<SystemTime>,
    /// No thread was left for its last due probe.
    not_probed: bool,
    /// Still among the scan's targets. A device the scan no longer gives
    /// is kept, unwatched, while its probe is in flight (forgotten when
    /// the probe returns): were it forgotten at once, its return to the
    /// table would start a second probe beside the hung one.
    watched: bool,
}

impl DevState {
    /// A device not probed yet, at `path`.
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            in_flight: None,
            last: None,
            failing_since: None,
            not_probed: false,
            watched: true,
        }
    }
}

/// The prober's state, under [`Shared::state`].
#[derive(Default)]
struct State {
    devs: HashMap<Dev, DevState>,
    /// Probe threads not returned yet (hung ones included).
    outstanding: usize,
    /// The verdicts' classes at the last look (a change wakes the scan).
    classes: BTreeMap<Dev, (u8, i32)>,
    stop: bool,
}

/// What the prober's threads share.
struct Shared {
    settings: ProbeSettings,
    state: Mutex<State>,
    cv: Condvar,
    wake: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
}

/// Probes the network and FUSE mounts the scans give it
/// ([`MountProber::watch`]) from threads of its own.
pub struct MountProber {
    shared: Arc<Shared>,
    stuck: Option<Arc<StuckView>>,
}

impl std::fmt::Debug for MountProber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountProber")
            .field("settings", &self.shared.settings)
            .finish_non_exhaustive()
    }
}

impl MountProber {
    /// Starts the prober's thread (it probes nothing until
    /// [`Self::watch`]); `stuck` gives the tracer's stuck calls, named
    /// as the tasks blocked on a mount.
    pub fn start(
        settings: ProbeSettings,
        stuck: Option<Arc<StuckView>>,
    ) -> std::io::Result<Arc<Self>> {
        let shared = Arc::new(Shared {
            settings,
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            wake: Mutex::new(None),
        });
        let s = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("volmgr-probes".into())
            .spawn(move || drive(&s))?;
        Ok(Arc::new(Self { shared, stuck }))
    }

    /// `wake` is called (from the prober's thread) when a verdict
    /// changes: the scan loop scans again.
    pub fn set_wake(&self, wake: Arc<dyn Fn() + Send + Sync>) {
        *self.shared.wake.locked() = Some(wake);
    }

    /// Probes the devices of `targets` (at their path) from now on, and
    /// forgets the others (those with a probe in flight once it returns:
    /// one probe per device, even when it leaves and comes back); returns
    /// the verdicts of `targets`.
    fn watch(&self, targets: BTreeMap<Dev, PathBuf>) -> BTreeMap<Dev, Verdict> {
        let mut st = self.shared.state.locked();
        st.devs.retain(|dev, d| {
            d.watched = targets.contains_key(dev);
            d.watched || d.in_flight.is_some()
        });
        let mut added = false;
        for (dev, path) in targets {
            let d = st.devs.entry(dev).or_insert_with(|| {
                added = true;
                DevState::new(path.clone())
            });
            d.watched = true;
            d.path = path;
        }
        if added {
            self.shared.cv.notify_all();
        }
        let now = Instant::now();
        let timeout = self.shared.settings.timeout;
        st.devs
            .iter()
            .filter(|(_, d)| d.watched)
            .map(|(dev, d)| (*dev, verdict(d, now, timeout)))
            .collect()
    }

    /// Probe threads out now (hung ones included).
    pub fn outstanding(&self) -> usize {
        self.shared.state.locked().outstanding
    }
}

impl Drop for MountProber {
    fn drop(&mut self) {
        self.shared.state.locked().stop = true;
        self.shared.cv.notify_all();
    }
}

impl Observer {
    /// Reports (h), [`FindingKind::MountUnreachable`], from `prober`'s
    /// probes (without one, none are reported).
    pub fn with_mount_prober(mut self, prober: Arc<MountProber>) -> Self {
        self.mount_probes = Some(prober);
        self
    }

    /// The prober of (h), when set.
    pub fn mount_prober(&self) -> Option<&Arc<MountProber>> {
        self.mount_probes.as_ref()
    }
}

/// A device's verdict now.
fn verdict(d: &DevState, now: Instant, timeout: Duration) -> Verdict {
    if let Some((started, since)) = d.in_flight {
        let for_ = now.saturating_duration_since(started);
        if for_ >= timeout {
            return Verdict::Hung { since, for_ };
        }
    }
    match (&d.last, d.not_probed) {
        (Some((_, Err(errno))), _) => Verdict::Failed {
            errno: *errno,
            since: d.failing_since.unwrap_or_else(SystemTime::now),
        },
        (_, true) if d.in_flight.is_none() => Verdict::NotProbed,
        _ => Verdict::Answering,
    }
}

/// The prober's thread: starts the probes due, and wakes the scan when a
/// verdict changes, until the prober is dropped.
fn drive(shared: &Arc<Shared>) {
    let mut st = shared.state.locked();
    loop {
        if st.stop {
            return;
        }
        let now = Instant::now();
        start_due(shared, &mut st, now);
        let classes: BTreeMap<Dev, (u8, i32)> = st
            .devs
            .iter()
            .filter(|(_, d)| d.watched)
            .map(|(dev, d)| (*dev, verdict(d, now, shared.settings.timeout).class()))
            .collect();
        if classes != st.classes {
            st.classes = classes;
            drop(st);
            let wake = shared.wake.locked().clone();
            if let Some(w) = wake {
                w();
            }
            st = shared.state.locked();
            continue;
        }
        st = shared
            .cv
            .wait_timeout(st, TICK)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
    }
}

/// Starts a probe of each watched device whose last probe is older than
/// the period and that has none in flight, while threads are left.
fn start_due(shared: &Arc<Shared>, st: &mut State, now: Instant) {
    let period = shared.settings.period;
    let due: Vec<(Dev, PathBuf)> = st
        .devs
        .iter()
        .filter(|(_, d)| d.watched && d.in_flight.is_none())
        .filter(|(_, d)| {
            d.last
                .is_none_or(|(at, _)| now.saturating_duration_since(at) >= period)
        })
        .map(|(dev, d)| (*dev, d.path.clone()))
        .collect();
    for (dev, path) in due {
        let left = st.outstanding < shared.settings.max_parked;
        let Some(d) = st.devs.get_mut(&dev) else {
            continue;
        };
        d.not_probed = !left;
        if !left {
            continue;
        }
        match spawn_probe(shared, dev, path) {
            Ok(()) => {
                d.in_flight = Some((now, SystemTime::now()));
                st.outstanding += 1;
            }
            Err(e) => {
                tracing::debug!(error = %e, "mount probe thread not started");
                d.not_probed = true;
            }
        }
    }
}

/// A thread that probes `path` and records the result for `dev`.
fn spawn_probe(shared: &Arc<Shared>, dev: Dev, path: PathBuf) -> std::io::Result<()> {
    let s = Arc::clone(shared);
    std::thread::Builder::new()
        .name("volmgr-probe".into())
        .stack_size(PROBE_STACK)
        .spawn(move || {
            let result = probe(&path);
            probe_returned(&mut s.state.locked(), dev, result);
            s.cv.notify_all();
        })
        .map(|_| ())
}

/// Records the `result` of `dev`'s probe, just returned; forgets `dev`
/// when the scans no longer watch it.
fn probe_returned(st: &mut State, dev: Dev, result: Result<(), i32>) {
    st.outstanding = st.outstanding.saturating_sub(1);
    let Some(d) = st.devs.get_mut(&dev) else {
        return;
    };
    if !d.watched {
        st.devs.remove(&dev);
        return;
    }
    d.in_flight = None;
    d.failing_since = match (result, d.last.as_ref().map(|l| l.1)) {
        (Ok(()), _) => None,
        (Err(e), Some(Err(prev))) if e == prev => d.failing_since,
        (Err(_), _) => Some(SystemTime::now()),
    };
    d.last = Some((Instant::now(), result));
}

/// One probe: `statx` of `path` with `AT_STATX_FORCE_SYNC` (asks the
/// server or the daemon), `statfs` where `statx` does not exist. Only the
/// errors of [`UNREACHABLE_ERRNOS`] fail it: an error of permission (a
/// FUSE mount without `allow_other` refuses other users before asking
/// its daemon) says nothing of the daemon: answered.
fn probe(path: &Path) -> Result<(), i32> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return Ok(());
    };
    let flags = libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT | libc::AT_STATX_FORCE_SYNC;
    // SAFETY: a NUL-terminated path and a buffer the size of `statx`.
    let r = unsafe {
        let mut buf: libc::statx = std::mem::zeroed();
        libc::syscall(
            libc::SYS_statx,
            libc::AT_FDCWD,
            c.as_ptr(),
            flags,
            libc::STATX_TYPE | libc::STATX_INO,
            &mut buf as *mut libc::statx,
        )
    };
    let mut errno = match r {
        0 => return Ok(()),
        _ => std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
    };
    if errno == libc::ENOSYS {
        // SAFETY: as above, with a `statfs` buffer.
        let r = unsafe {
            let mut buf: libc::statfs = std::mem::zeroed();
            libc::statfs(c.as_ptr(), &mut buf)
        };
        if r == 0 {
            return Ok(());
        }
        errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    }
    match UNREACHABLE_ERRNOS.contains(&errno) {
        true => Err(errno),
        false => Ok(()),
    }
}

/// The errors of a probe that say the server or daemon does not answer;
/// any other (`EACCES`, `ENOENT` of a path renamed meanwhile, ...) says
/// nothing of it.
const UNREACHABLE_ERRNOS: &[i32] = &[
    libc::ENOTCONN,
    libc::EIO,
    libc::ESTALE,
    libc::ETIMEDOUT,
    libc::EHOSTDOWN,
    libc::EHOSTUNREACH,
    libc::ENETUNREACH,
    libc::ECONNREFUSED,
    libc::ECONNRESET,
    libc::ECONNABORTED,
    libc::ENODEV,
    libc::ENXIO,
    libc::EREMOTEIO,
];

/// The probed mounts under ROOT, and for each device the path it is
/// probed at (a mount point where it is the top mount).
fn targets(snap: &Snapshot) -> (Vec<&MountInfo>, BTreeMap<Dev, PathBuf>) {
    let mounts: Vec<&MountInfo> = snap
        .table
        .below(&snap.root)
        .filter(|m| probed_fstype(&m.fstype))
        .collect();
    let mut at = BTreeMap::new();
    for m in &mounts {
        let on_top = snap
            .table
            .top(&m.mount_point)
            .is_some_and(|t| t.mount_id == m.mount_id);
        if on_top {
            at.entry((m.major, m.minor))
                .or_insert_with(|| m.mount_point.clone());
        }
    }
    (mounts, at)
}

/// (h): the network and FUSE mounts under ROOT that do not answer, each
/// with its source, how it fails, the tasks blocked on it and the pods
/// using it; one more finding for the mounts not probed (threads out).
/// Past [`MAX_FINDINGS_PER_KIND`] (in the order of the paths, the finding
/// of the mounts not probed first) mounts are only counted in
/// `not_listed`, without their evidence; the evidence of a device is
/// built once for all its mounts (a volume's subPath bind mounts).
pub(super) fn evaluate(
    prober: Option<&MountProber>,
    snap: &Snapshot,
    pods: &DesiredPods,
    out: &mut Vec<Finding>,
    not_listed: &mut BTreeMap<FindingKind, usize>,
) {
    let Some(prober) = prober else {
        return;
    };
    let (mounts, at) = targets(snap);
    let verdicts = prober.watch(at);
    let mut by_dev: BTreeMap<Dev, Vec<&MountInfo>> = BTreeMap::new();
    let mut not_probed: Vec<&MountInfo> = Vec::new();
    for m in mounts.iter().copied() {
        match verdicts.get(&(m.major, m.minor)) {
            Some(Verdict::Hung { .. } | Verdict::Failed { .. }) => {
                by_dev.entry((m.major, m.minor)).or_default().push(m);
            }
            Some(Verdict::NotProbed) => not_probed.push(m),
            _ => {}
        }
    }
    let tasks = match by_dev.is_empty() {
        true => blocked_tasks::Scan::default(),
        false => blocked_tasks::scan(Path::new("/proc"), std::process::id()),
    };
    let stuck = match (&prober.stuck, by_dev.is_empty()) {
        (Some(s), false) => s.stuck(),
        _ => Vec::new(),
    };
    let ctx = Ctx {
        snap,
        pods,
        by_dev: &by_dev,
        tasks: &tasks,
        stuck: &stuck,
    };
    let room = MAX_FINDINGS_PER_KIND - usize::from(!not_probed.is_empty());
    let mut listed: Vec<(String, &MountInfo)> = by_dev
        .values()
        .flatten()
        .map(|m| (m.mount_point.display().to_string(), *m))
        .collect();
    // As `Observer::evaluate` sorts them (stable: the table's order).
    listed.sort_by_key(|(path, m)| (path.clone(), m.mount_id));
    if listed.len() > room {
        *not_listed.entry(FindingKind::MountUnreachable).or_default() += listed.len() - room;
        listed.truncate(room);
    }
    let timeout = prober.shared.settings.timeout;
    let mut evidence: HashMap<Dev, DevEvidence> = HashMap::new();
    for (path, m) in listed {
        let dev = (m.major, m.minor);
        if let Some(v) = verdicts.get(&dev) {
            let ev = evidence.entry(dev).or_insert_with(|| ctx.dev_evidence(m));
            out.push(ctx.finding(path, m, v, timeout, ev));
        }
    }
    if !not_probed.is_empty() {
        out.push(not_probed_finding(snap, &not_probed, prober.outstanding()));
    }
}

/// What one scan's findings of (h) are built from.
struct Ctx<'a> {
    snap: &'a Snapshot,
    pods: &'a DesiredPods,
    /// The mounts that do not answer, by device (in the table's order).
    by_dev: &'a BTreeMap<Dev, Vec<&'a MountInfo>>,
    tasks: &'a blocked_tasks::Scan,
    stuck: &'a [StuckSyscall],
}

/// The evidence of a device, the same for each of its mounts.
struct DevEvidence {
    /// The tasks blocked on it.
    blocked: Vec<String>,
    /// Its first [`USERS_LISTED`]` + 1` mounts, by mount ID, each as a
    /// line "also mounted at".
    users: Vec<(u32, String)>,
    /// How many mounts it has under ROOT.
    mounts: usize,
}

impl Ctx<'_> {
    /// The evidence of `m`'s device.
    fn dev_evidence(&self, m: &MountInfo) -> DevEvidence {
        let on_dev: &[&MountInfo] = self
            .by_dev
            .get(&(m.major, m.minor))
            .map_or(&[], Vec::as_slice);
        let users = on_dev
            .iter()
            .take(USERS_LISTED + 1)
            .map(|o| (o.mount_id, self.user_line(o)))
            .collect();
        DevEvidence {
            blocked: self.blocked_lines(m, on_dev),
            users,
            mounts: on_dev.len(),
        }
    }

    /// The finding of mount `m` (at `path`), whose device's verdict is
    /// `v` and evidence `dev`.
    fn finding(
        &self,
        path: String,
        m: &MountInfo,
        v: &Verdict,
        timeout: Duration,
        dev: &DevEvidence,
    ) -> Finding {
        let (summary, probe, since) = match v {
            Verdict::Hung { since, for_ } => (
                format!(
                    "{} mount does not answer: a statx has not returned for {}s",
                    m.fstype,
                    for_.as_secs()
                ),
                format!(
                    "probe: statx(AT_STATX_FORCE_SYNC) did not return within {}s (waiting for {}s)",
                    timeout.as_secs_f64(),
                    for_.as_secs()
                ),
                *since,
            ),
            Verdict::Failed { errno, since } => {
                let e = nix::errno::Errno::from_raw(*errno);
                (
                    format!("{} mount fails: {e:?} ({})", m.fstype, e.desc()),
                    format!(
                        "probe: statx(AT_STATX_FORCE_SYNC) failed: {e:?} ({})",
                        e.desc()
                    ),
                    *since,
                )
            }
            _ => (String::new(), String::new(), SystemTime::now()),
        };
        let mut f = finding(FindingKind::MountUnreachable, path, summary);
        f.since = Some(rfc3339(since));
        f.evidence.push(mount_line(m));
        f.evidence.push(source_line(m));
        f.evidence.push(probe);
        f.evidence.extend(dev.blocked.iter().cloned());
        if let Some(uid) = pod_of(&self.snap.root, &m.mount_point) {
            f.pod_uid = Some(uid.as_str().to_string());
            f.pod = self
                .pods
                .pod(&uid)
                .map(|p| format!("{}/{}", p.namespace, p.name));
            f.volume = super::volume_at(&self.snap.asw, &uid, &m.mount_point);
        }
        users_lines(m, dev, &mut f.evidence);
        f
    }

    /// The tasks blocked on `m`, whose device's mounts under ROOT are
    /// `on_dev`: the tracer's stuck calls on their paths, then the tasks
    /// of the /proc scan whose working directory is on it, or that wait
    /// in its file system's code (when several mounts of that file
    /// system do not answer, any of them).
    fn blocked_lines(&self, m: &MountInfo, on_dev: &[&MountInfo]) -> Vec<String> {
        let on_dev: Vec<&Path> = on_dev.iter().map(|u| u.mount_point.as_path()).collect();
        let on_it = |s: &&StuckSyscall| on_dev.iter().any(|p| Path::new(&s.path).starts_with(p));
        let mut lines: Vec<String> = self.stuck.iter().filter(on_it).map(stuck_line).collect();
        let family = blocked_tasks::family(&m.fstype);
        let same_family = self
            .by_dev
            .values()
            .filter_map(|v| v.first())
            .filter(|u| blocked_tasks::family(&u.fstype) == family)
            .count();
        let traced: std::collections::HashSet<u32> =
            self.stuck.iter().filter(on_it).map(|s| s.tid).collect();
        let mut opaque = Vec::new();
        for t in self.tasks.tasks.iter().filter(|t| !traced.contains(&t.tid)) {
            if t.opaque() && t.state == 'D' {
                opaque.push(format!("{:?}[{}/{}]", t.comm, t.pid, t.tid));
            } else if let Some(line) = task_line(t, &on_dev, family, same_family) {
                lines.push(line);
            }
        }
        let mut ev = Vec::new();
        let n = lines.len();
        ev.extend(lines.into_iter().take(TASKS_LISTED));
        if n > TASKS_LISTED {
            ev.push(format!("... and {} more blocked tasks", n - TASKS_LISTED));
        }
        if !opaque.is_empty() {
            let more = opaque.len().saturating_sub(TASKS_LISTED);
            opaque.truncate(TASKS_LISTED);
            ev.push(format!(
                "in D state, what they wait on not readable from the sandbox (this mount or another): {}{}",
                opaque.join(", "),
                match more {
                    0 => String::new(),
                    n => format!(" and {n} more"),
                }
            ));
        }
        if self.tasks.truncated {
            ev.push(format!(
                "blocked tasks: only the first {} tasks of /proc were looked at",
                blocked_tasks::MAX_TASKS
            ));
        }
        ev
    }

    /// `o`, a mount of a device that does not answer, with its pod.
    fn user_line(&self, o: &MountInfo) -> String {
        let pod = pod_of(&self.snap.root, &o.mount_point).map(|uid| match self.pods.pod(&uid) {
            Some(p) => format!(" (pod {}/{}, {uid})", p.namespace, p.name),
            None => format!(" (pod {uid}, no longer on the node)"),
        });
        format!(
            "also mounted at {:?}{}",
            o.mount_point,
            pod.unwrap_or_default()
        )
    }
}

/// The other mount points of `m`'s file system under ROOT (of `dev`),
/// with their pods (the pods using it).
fn users_lines(m: &MountInfo, dev: &DevEvidence, ev: &mut Vec<String>) {
    let others = dev
        .users
        .iter()
        .filter(|(id, _)| *id != m.mount_id)
        .take(USERS_LISTED);
    ev.extend(others.map(|(_, line)| line.clone()));
    let n = dev.mounts.saturating_sub(1);
    if n > USERS_LISTED {
        ev.push(format!("... and {} more mounts of it", n - USERS_LISTED));
    }
}

/// A stuck call the tracer saw, as evidence.
fn stuck_line(s: &StuckSyscall) -> String {
    let stack = s.kernel_stack.iter().take(6).cloned().collect::<Vec<_>>();
    format!(
        "blocked: {:?}[{}] (thread {}) in {}({:?}) for {:.0}s (traced); stack: {}",
        s.comm,
        s.pid,
        s.tid,
        s.call,
        s.path,
        s.elapsed_seconds,
        stack.join(" < ")
    )
}

/// A blocked task as evidence for a mount whose mount points (on its
/// device) are `on_dev`: when its working directory is on it, or it
/// waits in `family`'s code (`same_family`: how many devices of that
/// family do not answer).
fn task_line(
    t: &BlockedTask,
    on_dev: &[&Path],
    family: Option<&str>,
    same_family: usize,
) -> Option<String> {
    let cwd_on = t
        .cwd
        .as_deref()
        .is_some_and(|c| on_dev.iter().any(|p| c.starts_with(p)));
    let waits_in = family.is_some_and(|f| t.waits_in(f));
    if !cwd_on && !waits_in {
        return None;
    }
    let why = match (cwd_on, same_family) {
        (true, _) => "its working directory is on it".to_string(),
        (false, 1) => format!("waits in {}", family.unwrap_or("?")),
        (false, n) => format!(
            "waits in {} (one of the {n} {} mounts that do not answer)",
            family.unwrap_or("?"),
            family.unwrap_or("?")
        ),
    };
    Some(format!(
        "blocked: {:?}[{}] (thread {}) state {} wchan {} syscall {}: {why}{}",
        t.comm,
        t.pid,
        t.tid,
        t.state,
        t.wchan,
        t.syscall,
        match t.stack.is_empty() {
            true => String::new(),
            false => format!("; stack: {}", t.stack.join(" < ")),
        }
    ))
}

/// Where `m` comes from: its FUSE connection (`/sys/fs/fuse/connections/<id>`,
/// with its waiting requests when that file system is mounted), or its
/// server.
fn source_line(m: &MountInfo) -> String {
    if m.fstype == "fuse" || m.fstype == "fuseblk" || m.fstype.starts_with("fuse.") {
        // The connection's name is the superblock's device number (its
        // minor, for the anonymous devices FUSE mounts get).
        let id = (u64::from(m.major) << 20) | u64::from(m.minor);
        let dir = Path::new("/sys/fs/fuse/connections").join(id.to_string());
        let waiting = std::fs::read_to_string(dir.join("waiting"))
            .map(|w| format!(", {} requests waiting", w.trim()))
            .unwrap_or_default();
        return format!(
            "source: fuse {:?} connection {id} ({}{waiting})",
            m.source,
            dir.display()
        );
    }
    let addr = m
        .super_option("addr")
        .map(|a| format!(" (addr={a})"))
        .unwrap_or_default();
    format!("source: server {:?}{addr}", m.source)
}

/// The pod whose directory (`ROOT/pods/<uid>/...`) holds `path`.
fn pod_of(root: &Path, path: &Path) -> Option<PodUid> {
    let rel = path.strip_prefix(root.join("pods")).ok()?;
    PodUid::new(rel.iter().next()?.to_str()?).ok()
}

/// The mounts not probed because every probe thread is out (hung).
fn not_probed_finding(snap: &Snapshot, mounts: &[&MountInfo], outstanding: usize) -> Finding {
    let mut f = finding(
        FindingKind::MountUnreachable,
        snap.root.display().to_string(),
        format!(
            "{} network or FUSE mounts not probed: {outstanding} probes still hung",
            mounts.len()
        ),
    );
    for m in mounts.iter().take(USERS_LISTED) {
        f.evidence.push(format!("not probed: {}", mount_line(m)));
    }
    if mounts.len() > USERS_LISTED {
        f.evidence.push(format!(
            "... and {} more not probed",
            mounts.len() - USERS_LISTED
        ));
    }
    f
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_network_and_fuse_file_systems_are_probed() {
        for t in [
            "nfs",
            "nfs4",
            "cifs",
            "fuse",
            "fuse.sshfs",
            "fuseblk",
            "ceph",
            "9p",
        ] {
            assert!(probed_fstype(t), "{t}");
        }
        for t in [
            "ext4", "xfs", "tmpfs", "btrfs", "overlay", "fusectl", "proc",
        ] {
            assert!(!probed_fstype(t), "{t}");
        }
    }

    #[test]
    fn a_probe_that_does_not_return_is_hung_and_one_per_device() {
        let mut d = DevState {
            in_flight: Some((Instant::now(), SystemTime::now())),
            ..DevState::new(PathBuf::from("/x"))
        };
        let later = Instant::now() + Duration::from_secs(4);
        let v = verdict(&d, later, Duration::from_secs(3));
        assert!(matches!(v, Verdict::Hung { .. }), "{v:?}");
        assert_eq!(
            verdict(&d, Instant::now(), Duration::from_secs(3)),
            Verdict::Answering
        );
        d.in_flight = None;
        d.last = Some((Instant::now(), Err(libc::ENOTCONN)));
        let v = verdict(&d, later, Duration::from_secs(3));
        assert!(
            matches!(
                v,
                Verdict::Failed {
                    errno: libc::ENOTCONN,
                    ..
                }
            ),
            "{v:?}"
        );
    }

    #[test]
    fn the_probes_cap_leaves_the_rest_not_probed() {
        let shared = Arc::new(Shared {
            settings: ProbeSettings {
                max_parked: 0,
                ..ProbeSettings::default()
            },
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            wake: Mutex::new(None),
        });
        let mut st = State::default();
        st.devs.insert((0, 1), DevState::new(PathBuf::from("/")));
        start_due(&shared, &mut st, Instant::now());
        let d = &st.devs[&(0, 1)];
        assert!(d.in_flight.is_none());
        assert_eq!(
            verdict(d, Instant::now(), PROBE_TIMEOUT),
            Verdict::NotProbed
        );
        assert_eq!(st.outstanding, 0);
    }

    /// A prober with no thread of its own (the test drives it).
    fn idle_prober() -> MountProber {
        MountProber {
            shared: Arc::new(Shared {
                settings: ProbeSettings::default(),
                state: Mutex::new(State::default()),
                cv: Condvar::new(),
                wake: Mutex::new(None),
            }),
            stuck: None,
        }
    }

    /// Before, `watch` forgot a device gone from the table even while its
    /// probe hung: when it came back a new state started a second probe
    /// (`outstanding` 2 here), one more parked thread per flap.
    #[test]
    fn a_device_that_leaves_and_returns_while_its_probe_hangs_is_not_probed_twice() {
        let p = idle_prober();
        let dev = (0, 77);
        let path = PathBuf::from("/");
        let hung = Instant::now() - Duration::from_secs(60);
        {
            let mut st = p.shared.state.locked();
            let d = DevState {
                in_flight: Some((hung, SystemTime::now())),
                ..DevState::new(path.clone())
            };
            st.devs.insert(dev, d);
            st.outstanding = 1;
        }
        assert!(p.watch(BTreeMap::new()).is_empty());
        let v = p.watch(BTreeMap::from([(dev, path)]));
        assert!(matches!(v.get(&dev), Some(Verdict::Hung { .. })), "{v:?}");
        {
            let mut st = p.shared.state.locked();
            start_due(&p.shared, &mut st, Instant::now());
            assert_eq!(st.outstanding, 1, "a second probe of the same device");
        }
        // Gone again; its probe returns: forgotten, its thread counted back.
        assert!(p.watch(BTreeMap::new()).is_empty());
        let mut st = p.shared.state.locked();
        assert!(st.devs.contains_key(&dev));
        probe_returned(&mut st, dev, Ok(()));
        assert!(st.devs.is_empty());
        assert_eq!(st.outstanding, 0);
    }

    /// `n` bind mounts (subPaths of pods `p0`..) of one NFS export, on
    /// device `dev`, under `root`.
    fn bind_mounts(root: &Path, dev: Dev, n: u32) -> Vec<MountInfo> {
        (0..n)
            .map(|i| MountInfo {
                mount_id: 100 + i,
                parent_id: 1,
                major: dev.0,
                minor: dev.1,
                root: PathBuf::from(format!("/export/sub{i}")),
                mount_point: root.join(format!(
                    "pods/00000000-0000-0000-0000-{i:012}/volume-subpaths/nfs/app/0"
                )),
                mount_options: "rw".into(),
                optional_fields: Vec::new(),
                fstype: "nfs4".into(),
                source: "server:/export".into(),
                super_options: "rw,addr=10.0.0.9".into(),
            })
            .collect()
    }

    /// Before, each of the M mounts of one device that does not answer
    /// got a finding (300 here, cut to 256 only after) with its evidence
    /// built anew: the table rescanned and the tasks matched against all
    /// M mount points, once per mount.
    #[test]
    fn the_mounts_of_one_hung_device_stop_at_the_cap_and_share_its_evidence() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().to_path_buf();
        let dev = (0, 99);
        let snap = Snapshot {
            root: root.clone(),
            dir: Arc::new(crate::sys::root_dir::RootDir::open(&root).unwrap()),
            table: crate::sys::mount_table::MountTable::new(bind_mounts(&root, dev, 300)),
            asw: Default::default(),
            pod_dirs: Vec::new(),
            loops: Vec::new(),
        };
        let p = idle_prober();
        let hung = Instant::now() - Duration::from_secs(60);
        let d = DevState {
            in_flight: Some((hung, SystemTime::now())),
            ..DevState::new(root.clone())
        };
        p.shared.state.locked().devs.insert(dev, d);
        let mut out = Vec::new();
        let mut not_listed = BTreeMap::new();
        let pods = DesiredPods::default();
        evaluate(Some(&p), &snap, &pods, &mut out, &mut not_listed);
        assert_eq!(out.len(), MAX_FINDINGS_PER_KIND);
        assert_eq!(not_listed.get(&FindingKind::MountUnreachable), Some(&44));
        let first = &out[0];
        assert!(first
            .path
            .ends_with("-000000000000/volume-subpaths/nfs/app/0"));
        let also: Vec<&String> = first
            .evidence
            .iter()
            .filter(|l| l.starts_with("also mounted at "))
            .collect();
        assert_eq!(also.len(), USERS_LISTED);
        assert!(
            also[0].contains("-000000000001/volume-subpaths"),
            "{also:?}"
        );
        assert!(also[0].starts_with("also mounted at \""), "{also:?}");
        let more = format!("... and {} more mounts of it", 299 - USERS_LISTED);
        assert!(first.evidence.contains(&more), "{:#?}", first.evidence);
        assert!(out[1].evidence.iter().any(|l| l.contains("-000000000000/")));
    }

    /// Before, a process name went into the evidence as it is: a name
    /// like `x[1] (thread 2) state D` forged fields of the line.
    #[test]
    fn process_names_are_quoted_in_the_evidence() {
        let t = BlockedTask {
            pid: 7,
            tid: 8,
            comm: "x[1] (thread 2) state D".into(),
            state: 'D',
            wchan: "nfs_wait".into(),
            cwd: Some(PathBuf::from("/m/a")),
            ..BlockedTask::default()
        };
        let line = task_line(&t, &[Path::new("/m")], Some("nfs"), 1).unwrap();
        assert!(
            line.starts_with("blocked: \"x[1] (thread 2) state D\"[7] (thread 8) state D"),
            "{line}"
        );
    }

    #[test]
    fn a_local_path_answers() {
        assert_eq!(probe(Path::new("/")), Ok(()));
        assert_eq!(probe(Path::new("/nonexistent-volmgr")), Ok(()));
    }
}
