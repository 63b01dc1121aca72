//! (k) [`FindingKind::CsiDriverNotReady`]: the CSI registration triage of
//! the kubelet's "driver name X not found in the list of registered CSI
//! drivers". For the driver of each CSI volume a pod waits for (a
//! [`FindingKind::VolumeStuck`] finding: needed for `--stuck-after` and
//! nothing set up; a driver starting up is normal), four read-only checks,
//! in the order the kubelet depends on them:
//!
//! 1. a registration socket of the driver in `ROOT/plugins_registry` (where
//!    the kubelet's plugin watcher looks, subdirectories one level deep;
//!    names starting with `.` and what is not a socket are skipped, as the
//!    watcher does);
//! 2. its `GetInfo` answers (the plugin registration API, the watcher's own
//!    client: [`registration::get_info`]) with the driver's name, and
//!    passes the kubelet's validation (type, version, endpoint);
//!    `NotifyRegistrationStatus` is never called;
//! 3. the endpoint it names answers CSI `Identity.Probe` (ready) and
//!    `GetPluginInfo` with the same name;
//! 4. the node's CSINode lists the driver (a GET of the node's own CSINode,
//!    when the agent has an API server; else "not checked").
//!
//! The first failing step is the finding's summary; the evidence lists
//! every step with its result. Every call is bounded by [`CALL_TIMEOUT`]
//! and runs in one worker thread (one pass at a time for all drivers, so at
//! most one triage of a driver in flight), never in the scan: a scan uses
//! the results of the last pass (kept [`REFRESH`]) and starts a new pass
//! when they are older. A pass's result shows at the next scan. The
//! stuck volume's finding gets the triage's summary as a line of evidence
//! (a healthy driver rules registration out), and a failing triage adds a
//! [`FindingKind::CsiDriverNotReady`] finding on the same pod (its event
//! goes to the pod).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{finding, DesiredPods, Observer, Snapshot};
use crate::pluginmanager::csi_proto::csi;
use crate::pluginmanager::registration::{self, RegistrationError};
use crate::pluginmanager::registry::DriverRegistry;
use crate::status::{Finding, FindingKind};
use crate::sys::dirents;
use crate::sys::root_dir::{RelPath, RootDir};
use crate::util::sync::MutexExt;
use crate::volume::PodUid;

/// The deadline of each call of the triage (connecting, `GetInfo`,
/// `Probe`, `GetPluginInfo`, the CSINode GET).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a driver's triage is used before it is done again.
pub const REFRESH: Duration = Duration::from_secs(10);
/// Registration sockets asked per pass (the rest are counted).
const MAX_SOCKETS: usize = 64;
/// Drivers triaged per pass.
const MAX_DRIVERS: usize = 32;
/// Entries of `ROOT/plugins_registry` and its subdirectories read per
/// pass, at most: a directory of millions of entries costs this many names
/// (and at most as many `lstat`s), and the evidence says it was cut.
pub const MAX_ENTRIES: usize = 4096;
/// Other registration sockets named in a failing step 1's evidence.
const SOCKETS_SHOWN: usize = 8;
/// The kubelet's registration directory under ROOT.
pub const PLUGINS_REGISTRY: &str = "plugins_registry";

/// The node's CSINode, read for step 4.
pub trait CsiNodeLookup: Send + Sync {
    /// The node's name.
    fn node(&self) -> &str;
    /// The driver names the node's CSINode lists (`Ok(None)`: there is no
    /// CSINode object), or why it could not be read; within `timeout`.
    /// Called from the triage's worker thread, never from a runtime's.
    fn drivers(&self, timeout: Duration) -> Result<Option<Vec<String>>, CsiNodeError>;
}

/// Why the node's CSINode could not be read (step 4 is then "not
/// checked"): the lookup's own error, shown as its text.
#[derive(Debug, thiserror::Error)]
pub enum CsiNodeError {
    /// The read failed (the API server's error, no answer in time, ...).
    #[error(transparent)]
    Read(Box<dyn std::error::Error + Send + Sync>),
}

impl CsiNodeError {
    /// The lookup's error `e`.
    pub fn read(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Read(Box::new(e))
    }
}

/// Why a registration socket's answer is not a driver's registration
/// (step 2).
#[derive(Debug, thiserror::Error)]
enum AnswerError {
    /// `GetInfo` failed: connecting, the call or its deadline.
    #[error(transparent)]
    GetInfo(RegistrationError),
    /// Its answer fails the kubelet's validation.
    #[error(
        "its answer (name {name:?}, type {plugin_type:?}) fails the kubelet's validation: {source}"
    )]
    Invalid {
        /// The name it gave.
        name: String,
        /// The type it gave.
        plugin_type: String,
        /// The validation's error.
        source: RegistrationError,
    },
}

/// Why step 2 or 3 failed, as the step's evidence and the summary show it.
#[derive(Debug, thiserror::Error)]
enum StepFailure<'a> {
    /// Step 2: the socket answers `GetInfo` as another driver.
    #[error("answers GetInfo as driver {0:?}")]
    OtherDriver(&'a str),
    /// Step 2: no valid answer.
    #[error("{0}")]
    Answer(&'a AnswerError),
    /// Step 3: what the endpoint answered.
    #[error("{0}")]
    Probe(&'a Probed),
    /// Step 3: the endpoint was not asked (the pass asked no more).
    #[error("not asked")]
    NotAsked,
}

/// The step of the triage that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// 1: no registration socket of the driver.
    Registration,
    /// 2: its registration socket does not answer `GetInfo` right.
    GetInfo,
    /// 3: its endpoint does not answer `Probe`/`GetPluginInfo` right.
    Probe,
    /// 4: the node's CSINode does not list it.
    CsiNode,
}

/// One driver's triage.
#[derive(Debug, Clone)]
pub struct Triage {
    /// The first step that failed, `None` when none did.
    pub failed: Option<Step>,
    /// One line: the first failure, or that the driver is registered.
    pub summary: String,
    /// The path the failure concerns (the registration directory, the
    /// registration socket or the endpoint).
    pub path: PathBuf,
    /// Each step with its result.
    pub evidence: Vec<String>,
}

#[derive(Default)]
struct Shared {
    results: HashMap<String, (Instant, Triage)>,
    in_flight: bool,
}

/// The triage's state kept by the [`Observer`]: the last results and
/// whether a pass is running.
#[derive(Default)]
pub(super) struct CsiTriage {
    shared: Arc<Mutex<Shared>>,
    lookup: Option<Arc<dyn CsiNodeLookup>>,
}

impl Observer {
    /// Reads the node's CSINode through `lookup` for the CSI triage's
    /// step 4 (without one, CSINode is not checked).
    pub fn with_csinode(mut self, lookup: Arc<dyn CsiNodeLookup>) -> Self {
        self.csi.lookup = Some(lookup);
        self
    }
}

impl CsiTriage {
    /// Completes the stuck CSI volumes' findings in `out` with their
    /// driver's triage, adds a finding per stuck volume whose driver fails
    /// it, and starts a pass when a result is missing or old.
    pub(super) fn add_findings(
        &mut self,
        snap: &Snapshot,
        pods: &DesiredPods,
        now: Instant,
        out: &mut Vec<Finding>,
    ) {
        let stuck: Vec<(usize, String)> = out
            .iter()
            .enumerate()
            .filter(|(_, f)| f.kind == FindingKind::VolumeStuck)
            .filter_map(|(i, f)| Some((i, driver_of(pods, f)?)))
            .collect();
        // Told apart first, then capped: 32 stuck volumes of one driver
        // leave room for the others.
        let needed: BTreeSet<String> = stuck
            .iter()
            .map(|(_, d)| d.clone())
            .collect::<BTreeSet<String>>()
            .into_iter()
            .take(MAX_DRIVERS)
            .collect();
        let mut shared = self.shared.locked();
        shared.results.retain(|d, _| needed.contains(d));
        let stale = needed.iter().any(|d| {
            shared
                .results
                .get(d)
                .is_none_or(|(at, _)| now.saturating_duration_since(*at) >= REFRESH)
        });
        if stale && !shared.in_flight {
            shared.in_flight = self.start_pass(snap, needed.into_iter().collect());
        }
        let mut added = Vec::new();
        for (i, driver) in stuck {
            let Some((_, t)) = shared.results.get(&driver) else {
                continue;
            };
            let f = &mut out[i];
            f.evidence
                .push(format!("CSI driver {driver:?}: {}", t.summary));
            if t.failed.is_some() {
                added.push(driver_finding(f, &driver, t));
            }
        }
        out.extend(added);
    }

    /// Starts a pass over `drivers` in a thread of its own; whether it
    /// started.
    fn start_pass(&self, snap: &Snapshot, drivers: Vec<String>) -> bool {
        let shared = Arc::clone(&self.shared);
        let lookup = self.lookup.clone();
        let dir = Arc::clone(&snap.dir);
        let spawned = std::thread::Builder::new()
            .name("csi-triage".into())
            .spawn(move || {
                let results = triage_all(&dir, &drivers, lookup.as_deref());
                let mut s = shared.locked();
                let at = Instant::now();
                for (d, t) in drivers.into_iter().zip(results) {
                    s.results.insert(d, (at, t));
                }
                s.in_flight = false;
            });
        if let Err(e) = &spawned {
            tracing::warn!(error = %e, "observe: the CSI triage could not start");
        }
        spawned.is_ok()
    }
}

/// The CSI driver of a stuck volume's finding (its pod's volume, resolved
/// to a CSI source: inline, PersistentVolume or migrated in-tree).
fn driver_of(pods: &DesiredPods, f: &Finding) -> Option<String> {
    let uid = PodUid::new(f.pod_uid.as_deref()?).ok()?;
    pods.csi_driver(&uid, f.volume.as_deref()?)
        .map(str::to_string)
}

/// The [`FindingKind::CsiDriverNotReady`] finding of `stuck`'s pod.
fn driver_finding(stuck: &Finding, driver: &str, t: &Triage) -> Finding {
    let mut f = finding(
        FindingKind::CsiDriverNotReady,
        t.path.display().to_string(),
        t.summary.clone(),
    );
    f.pod_uid = stuck.pod_uid.clone();
    f.pod = stuck.pod.clone();
    f.volume = stuck.volume.clone();
    f.since = stuck.since.clone();
    f.evidence = vec![format!(
        "needed by volume {:?} of pod {}, nothing set up",
        stuck.volume.as_deref().unwrap_or("?"),
        stuck.pod.as_deref().unwrap_or("?")
    )];
    f.evidence.extend(t.evidence.iter().cloned());
    f.evidence.push(match t.failed {
        Some(Step::Probe) => format!(
            "what the kubelet sees: driver {driver}'s calls fail or time out (or, not registered, driver name {driver} not found in the list of registered CSI drivers)"
        ),
        _ => format!(
            "what the kubelet sees: driver name {driver} not found in the list of registered CSI drivers"
        ),
    });
    f
}

/// What a registration socket answered.
struct Registered {
    socket: PathBuf,
    answer: Result<(String, PathBuf, Vec<String>), AnswerError>,
}

/// What a driver's endpoint answered (step 3); shown as the step's
/// evidence by its [`std::fmt::Display`].
#[derive(Debug, Clone, PartialEq)]
enum Probed {
    /// `Probe` answered ready and `GetPluginInfo` named the driver.
    Ready {
        /// The name `GetPluginInfo` gave.
        name: String,
        /// The version `GetPluginInfo` gave.
        vendor_version: String,
    },
    /// The endpoint could not be connected to.
    Unreachable {
        /// The endpoint.
        endpoint: PathBuf,
        /// Why.
        error: String,
    },
    /// `Probe` answered ready=false.
    NotReady,
    /// `Probe` failed or gave no answer.
    ProbeFailed(CallFailure),
    /// `Probe` answered ready; `GetPluginInfo` failed or gave no answer.
    InfoFailed(CallFailure),
    /// `Probe` answered ready; `GetPluginInfo` named another driver.
    OtherDriver {
        /// The name `GetPluginInfo` gave.
        named: String,
        /// The driver asked for.
        driver: String,
    },
}

impl Probed {
    /// Whether step 3 passed.
    fn ok(&self) -> bool {
        matches!(self, Probed::Ready { .. })
    }
}

impl std::fmt::Display for Probed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Probed::Ready {
                name,
                vendor_version,
            } => write!(
                f,
                "Probe ready, GetPluginInfo {name:?} version {vendor_version:?}"
            ),
            Probed::Unreachable { endpoint, error } => {
                write!(f, "{}: {error}", endpoint.display())
            }
            Probed::NotReady => f.write_str("Probe answers ready=false"),
            Probed::ProbeFailed(why) => why.fmt_call(f, "Probe"),
            Probed::InfoFailed(why) => {
                f.write_str("Probe ready, ")?;
                why.fmt_call(f, "GetPluginInfo")
            }
            Probed::OtherDriver { named, driver } => write!(
                f,
                "Probe ready, GetPluginInfo names {named:?}, not {driver:?}"
            ),
        }
    }
}

/// How a call of step 3 failed.
#[derive(Debug, Clone, PartialEq)]
enum CallFailure {
    /// No answer within [`CALL_TIMEOUT`] (our own deadline).
    Timeout,
    /// The call's status: its code and message. A deadline (the client's
    /// own, from the request's `grpc-timeout`) or a cancel is "no answer".
    Status(tonic::Code, String),
}

impl CallFailure {
    /// A failed call's status.
    fn status(s: &tonic::Status) -> Self {
        CallFailure::Status(s.code(), s.message().to_string())
    }

    /// The failure of `call` as evidence.
    fn fmt_call(&self, f: &mut std::fmt::Formatter<'_>, call: &str) -> std::fmt::Result {
        match self {
            CallFailure::Timeout => write!(f, "{call}: no answer within {CALL_TIMEOUT:?}"),
            CallFailure::Status(
                code @ (tonic::Code::Cancelled | tonic::Code::DeadlineExceeded),
                message,
            ) => write!(
                f,
                "{call}: no answer within {CALL_TIMEOUT:?} ({code:?}: {message})"
            ),
            CallFailure::Status(code, message) => write!(f, "{call} failed: {code:?}: {message}"),
        }
    }
}

/// The node's name and what the read of its CSINode gave (step 4).
type NodeDrivers = (String, Result<Option<Vec<String>>, CsiNodeError>);

/// One pass: the registration sockets' `GetInfo`, the endpoints' `Probe`,
/// the CSINode, then each driver's triage in the order of `drivers`.
fn triage_all(
    dir: &RootDir,
    drivers: &[String],
    lookup: Option<&dyn CsiNodeLookup>,
) -> Vec<Triage> {
    let registry = dir.path().join(PLUGINS_REGISTRY);
    let listing = registration_sockets(dir, drivers);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let (registered, probed) = match rt {
        Ok(rt) => rt.block_on(ask_all(listing.sockets.clone(), drivers)),
        Err(e) => {
            let why = format!("no runtime for the calls: {e}");
            let t = Triage {
                failed: None,
                summary: format!("not triaged: {why}"),
                path: registry,
                evidence: vec![why],
            };
            return drivers.iter().map(|_| t.clone()).collect();
        }
    };
    let csinode = lookup.map(|l| (l.node().to_string(), l.drivers(CALL_TIMEOUT)));
    drivers
        .iter()
        .map(|d| {
            let mut t = judge(d, &registry, &registered, &listing, probed.get(d));
            csinode_step(&mut t, d, csinode.as_ref());
            t
        })
        .collect()
}

/// The registration sockets one pass asks.
#[derive(Debug, Default)]
struct Listing {
    /// The sockets, sorted; at most [`MAX_SOCKETS`].
    sockets: Vec<PathBuf>,
    /// Entries that may be sockets, not looked at: past [`MAX_SOCKETS`].
    not_asked: usize,
    /// The listing stopped at [`MAX_ENTRIES`] entries: the rest was not
    /// read.
    cut: bool,
}

/// The sockets under `ROOT/plugins_registry` (and its subdirectories, one
/// level deep), listed through ROOT's door: first each driver's own
/// `<driver>-reg.sock` (node-driver-registrar's name, looked up directly:
/// found even past a cut), then at most [`MAX_ENTRIES`] entries read, of
/// which only those that may be sockets are `lstat`ed, in the order of
/// their names, until [`MAX_SOCKETS`] sockets are found.
fn registration_sockets(dir: &RootDir, drivers: &[String]) -> Listing {
    let mut out = Listing::default();
    let Ok(top) = RelPath::new([PLUGINS_REGISTRY]) else {
        return out;
    };
    for d in drivers.iter().take(MAX_SOCKETS) {
        let own = top.join(std::ffi::OsStr::new(&format!("{d}-reg.sock")));
        if let Some(abs) = own.ok().map(|rel| dir.abs(&rel)).filter(|a| is_socket(a)) {
            out.sockets.push(abs);
        }
    }
    let mut candidates = Vec::new();
    let mut budget = MAX_ENTRIES;
    let mut dirs = vec![(top, 0)];
    while let Some((rel, depth)) = dirs.pop() {
        let Some((entries, cut)) = read_at_most(dir, &rel, budget) else {
            continue;
        };
        out.cut |= cut;
        budget -= entries.len();
        for e in entries {
            if e.name.as_encoded_bytes().first() == Some(&b'.') {
                continue;
            }
            let Ok(sub) = rel.join(&e.name) else {
                continue;
            };
            let is_dir = match e.kind {
                dirents::EntryKind::Dir => true,
                dirents::EntryKind::Symlink => continue,
                dirents::EntryKind::Other => false,
                dirents::EntryKind::Unknown => {
                    std::fs::symlink_metadata(dir.abs(&sub)).is_ok_and(|m| m.file_type().is_dir())
                }
            };
            match is_dir {
                true if depth == 0 => dirs.push((sub, 1)),
                true => {}
                false => candidates.push(dir.abs(&sub)),
            }
        }
    }
    candidates.sort();
    let mut candidates = candidates.into_iter();
    while out.sockets.len() < MAX_SOCKETS {
        let Some(c) = candidates.next() else {
            break;
        };
        if !out.sockets.contains(&c) && is_socket(&c) {
            out.sockets.push(c);
        }
    }
    out.not_asked = candidates.filter(|c| !out.sockets.contains(c)).count();
    out.sockets.sort();
    out
}

/// Whether `path` is a socket (not followed when a symlink).
fn is_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path)
        .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
}

/// The first `max` entries of directory `rel` under ROOT (in the
/// directory's order), and whether it has more; read through ROOT's door.
/// `None` when it cannot be read (missing, not a directory).
fn read_at_most(
    dir: &RootDir,
    rel: &RelPath,
    max: usize,
) -> Option<(Vec<dirents::DirEntry>, bool)> {
    use nix::fcntl::OFlag;
    let at = dir.open_dir(rel).ok()?;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::openat(&at, ".", flags, nix::sys::stat::Mode::empty()).ok()?;
    let mut out = Vec::new();
    while out.len() <= max {
        let batch = dirents::read_batch(std::os::fd::AsFd::as_fd(&fd)).ok()?;
        if batch.entries.is_empty() {
            break;
        }
        out.extend(batch.entries);
    }
    let cut = out.len() > max;
    out.truncate(max);
    Some((out, cut))
}

/// Every socket's `GetInfo` (validated as the kubelet does), then the
/// `Probe` and `GetPluginInfo` of each of `drivers` that one names, all at
/// once, each call within [`CALL_TIMEOUT`].
async fn ask_all(
    sockets: Vec<PathBuf>,
    drivers: &[String],
) -> (Vec<Registered>, BTreeMap<String, Probed>) {
    let mut calls = tokio::task::JoinSet::new();
    for (i, socket) in sockets.into_iter().enumerate() {
        calls.spawn(async move {
            let answer = ask_registration(&socket).await;
            (i, Registered { socket, answer })
        });
    }
    let mut registered: Vec<(usize, Registered)> = Vec::new();
    while let Some(r) = calls.join_next().await {
        if let Ok(r) = r {
            registered.push(r);
        }
    }
    registered.sort_by_key(|(i, _)| *i);
    let registered: Vec<Registered> = registered.into_iter().map(|(_, r)| r).collect();
    let mut probes = tokio::task::JoinSet::new();
    for d in drivers {
        let endpoint = registered.iter().find_map(|r| match &r.answer {
            Ok((name, endpoint, _)) if name == d => Some(endpoint.clone()),
            _ => None,
        });
        if let Some(endpoint) = endpoint {
            let d = d.clone();
            probes.spawn(async move {
                let r = probe(&d, &endpoint).await;
                (d, r)
            });
        }
    }
    let mut probed = BTreeMap::new();
    while let Some(r) = probes.join_next().await {
        if let Ok((d, r)) = r {
            probed.insert(d, r);
        }
    }
    (registered, probed)
}

/// A registration socket's `GetInfo`, checked by the kubelet's
/// validation: `(name, endpoint, versions)`, or the error.
async fn ask_registration(socket: &Path) -> Result<(String, PathBuf, Vec<String>), AnswerError> {
    let (info, _client) = registration::get_info(socket, CALL_TIMEOUT)
        .await
        .map_err(AnswerError::GetInfo)?;
    // An empty registry: only this answer is judged, not other
    // registrations of the driver.
    registration::validate(&info, socket, &DriverRegistry::new()).map_err(|source| {
        AnswerError::Invalid {
            name: info.name.clone(),
            plugin_type: info.r#type.clone(),
            source,
        }
    })
}

/// Step 3 at `endpoint`: `Probe` ready, then `GetPluginInfo` naming
/// `driver`; what it answered, or the error.
async fn probe(driver: &str, endpoint: &Path) -> Probed {
    let channel = match registration::connect(endpoint, CALL_TIMEOUT).await {
        Ok(c) => c,
        Err(e) => {
            return Probed::Unreachable {
                endpoint: endpoint.to_path_buf(),
                error: e.to_string(),
            }
        }
    };
    let mut client = csi::identity_client::IdentityClient::new(channel)
        .max_decoding_message_size(crate::pluginmanager::registration::MAX_REGISTRATION_ANSWER);
    let mut req = tonic::Request::new(csi::ProbeRequest {});
    req.set_timeout(CALL_TIMEOUT);
    let ready = match tokio::time::timeout(CALL_TIMEOUT, client.probe(req)).await {
        Ok(Ok(r)) => r.into_inner().ready.unwrap_or(true),
        Ok(Err(s)) => return Probed::ProbeFailed(CallFailure::status(&s)),
        Err(_) => return Probed::ProbeFailed(CallFailure::Timeout),
    };
    if !ready {
        return Probed::NotReady;
    }
    let mut req = tonic::Request::new(csi::GetPluginInfoRequest {});
    req.set_timeout(CALL_TIMEOUT);
    let info = match tokio::time::timeout(CALL_TIMEOUT, client.get_plugin_info(req)).await {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(s)) => return Probed::InfoFailed(CallFailure::status(&s)),
        Err(_) => return Probed::InfoFailed(CallFailure::Timeout),
    };
    if info.name != driver {
        return Probed::OtherDriver {
            named: info.name,
            driver: driver.to_string(),
        };
    }
    Probed::Ready {
        name: info.name,
        vendor_version: info.vendor_version,
    }
}

/// Steps 1 to 3 of `driver` from what the sockets and its endpoint
/// answered.
fn judge(
    driver: &str,
    registry: &Path,
    registered: &[Registered],
    listing: &Listing,
    probed: Option<&Probed>,
) -> Triage {
    let named = |r: &&Registered| matches!(&r.answer, Ok((n, _, _)) if n == driver);
    // node-driver-registrar's name for it: `<driver>-reg.sock`, exactly
    // (driver `foo` is not `foo.bar`'s).
    let file = format!("{driver}-reg.sock");
    let by_file = |r: &&Registered| {
        r.socket
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n == file)
    };
    let Some(reg) = registered
        .iter()
        .find(named)
        .or_else(|| registered.iter().find(by_file))
    else {
        return no_socket(driver, registry, registered, listing);
    };
    let mut ev = vec![format!(
        "1 registration socket: ok: {}",
        reg.socket.display()
    )];
    let endpoint = match &reg.answer {
        Ok((name, endpoint, versions)) if name == driver => {
            ev.push(format!(
                "2 GetInfo: ok: name {name:?}, endpoint {}, versions {versions:?}",
                endpoint.display()
            ));
            endpoint.clone()
        }
        Ok((name, _, _)) => {
            let why = StepFailure::OtherDriver(name);
            return failed(Step::GetInfo, &reg.socket, ev, driver, why);
        }
        Err(e) => {
            let why = StepFailure::Answer(e);
            return failed(Step::GetInfo, &reg.socket, ev, driver, why);
        }
    };
    match probed {
        Some(answer) if answer.ok() => {
            ev.push(format!("3 endpoint {}: ok: {answer}", endpoint.display()));
            Triage {
                failed: None,
                summary: format!(
                    "registered ({}), its endpoint {} answers Probe",
                    reg.socket.display(),
                    endpoint.display()
                ),
                path: endpoint,
                evidence: ev,
            }
        }
        Some(e) => failed(Step::Probe, &endpoint, ev, driver, StepFailure::Probe(e)),
        None => failed(Step::Probe, &endpoint, ev, driver, StepFailure::NotAsked),
    }
}

/// Step 1 failed: no socket is the driver's; the others named.
fn no_socket(
    driver: &str,
    registry: &Path,
    registered: &[Registered],
    listing: &Listing,
) -> Triage {
    let mut ev = vec![format!(
        "1 registration socket: FAILED: none of the {} sockets in {} is driver {driver:?}'s",
        registered.len(),
        registry.display()
    )];
    for r in registered.iter().take(SOCKETS_SHOWN) {
        ev.push(match &r.answer {
            Ok((name, endpoint, _)) => format!(
                "  {}: driver {name:?} at {}",
                r.socket.display(),
                endpoint.display()
            ),
            Err(e) => format!("  {}: {e}", r.socket.display()),
        });
    }
    let hidden = registered.len().saturating_sub(SOCKETS_SHOWN);
    if hidden > 0 {
        ev.push(format!("  ... and {hidden} more sockets"));
    }
    if listing.not_asked > 0 {
        ev.push(format!(
            "  ... and {} more entries not looked at (at most {MAX_SOCKETS} sockets a pass)",
            listing.not_asked
        ));
    }
    if listing.cut {
        ev.push(format!(
            "  the listing of {} was cut at {MAX_ENTRIES} entries: the rest was not read ({driver}-reg.sock was looked up by its name)",
            registry.display()
        ));
    }
    ev.push("2 GetInfo: not asked".into());
    ev.push("3 Probe: not asked".into());
    Triage {
        failed: Some(Step::Registration),
        summary: format!(
            "CSI driver {driver:?} is not registered: no registration socket of it in {}",
            registry.display()
        ),
        path: registry.to_path_buf(),
        evidence: ev,
    }
}

/// A triage that failed at `step` (2 or 3) on `path` because of `why`.
fn failed(
    step: Step,
    path: &Path,
    mut ev: Vec<String>,
    driver: &str,
    why: StepFailure<'_>,
) -> Triage {
    let summary = match step {
        Step::GetInfo => {
            ev.push(format!("2 GetInfo: FAILED: {why}"));
            ev.push("3 Probe: not asked".into());
            format!(
                "CSI driver {driver:?}: its registration socket {} does not answer GetInfo: {why}",
                path.display()
            )
        }
        _ => {
            ev.push(format!("3 endpoint {}: FAILED: {why}", path.display()));
            format!(
                "CSI driver {driver:?}: its endpoint {} does not answer Probe: {why}",
                path.display()
            )
        }
    };
    Triage {
        failed: Some(step),
        summary,
        path: path.to_path_buf(),
        evidence: ev,
    }
}

/// Step 4, after steps 1 to 3 passed: whether the node's CSINode lists
/// `driver` (`csinode`: the node and what its read gave; `None`: no API
/// server).
fn csinode_step(t: &mut Triage, driver: &str, csinode: Option<&NodeDrivers>) {
    if t.failed.is_some() {
        t.evidence.push("4 CSINode: not checked".into());
        return;
    }
    let Some((node, read)) = csinode else {
        t.evidence
            .push("4 CSINode: not checked (no API server)".into());
        return;
    };
    let why = match read {
        Ok(Some(drivers)) if drivers.iter().any(|d| d == driver) => {
            t.evidence
                .push(format!("4 CSINode {node}: ok: lists {driver:?}"));
            return;
        }
        Ok(Some(drivers)) => format!("lists {drivers:?}, not {driver:?}"),
        Ok(None) => "there is no CSINode object (the kubelet creates it when it starts)".into(),
        Err(e) => {
            t.evidence
                .push(format!("4 CSINode {node}: not checked: {e}"));
            return;
        }
    };
    t.evidence.push(format!("4 CSINode {node}: FAILED: {why}"));
    t.failed = Some(Step::CsiNode);
    t.summary =
        format!("CSI driver {driver:?} answers, but CSINode {node} does not list it: {why}");
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const D: &str = "d.csi.example";

    fn reg(socket: &str, answer: Result<(&str, &str), &str>) -> Registered {
        Registered {
            socket: PathBuf::from(socket),
            answer: answer
                .map(|(n, e)| (n.to_string(), PathBuf::from(e), vec!["1.0.0".into()]))
                .map_err(|_| AnswerError::GetInfo(RegistrationError::GetInfoTimeout(CALL_TIMEOUT))),
        }
    }

    fn ready() -> Probed {
        Probed::Ready {
            name: D.into(),
            vendor_version: "1.0.0".into(),
        }
    }

    fn triage(
        regs: &[Registered],
        probed: Option<Probed>,
        csinode: Option<Result<Option<Vec<String>>, CsiNodeError>>,
    ) -> Triage {
        let mut t = judge(
            D,
            Path::new("/r/plugins_registry"),
            regs,
            &Listing::default(),
            probed.as_ref(),
        );
        let csinode = csinode.map(|c| ("n1".to_string(), c));
        csinode_step(&mut t, D, csinode.as_ref());
        t
    }

    /// Step 3's evidence reads as it did when it was a `String`.
    #[test]
    fn step_three_reads_as_before() {
        let t = format!("{CALL_TIMEOUT:?}");
        let deadline = CallFailure::Status(tonic::Code::DeadlineExceeded, "late".into());
        let refused = CallFailure::Status(tonic::Code::Unavailable, "refused".into());
        for (p, want) in [
            (
                ready(),
                format!("Probe ready, GetPluginInfo \"{D}\" version \"1.0.0\""),
            ),
            (
                Probed::Unreachable {
                    endpoint: "/d.sock".into(),
                    error: "gone".into(),
                },
                "/d.sock: gone".into(),
            ),
            (Probed::NotReady, "Probe answers ready=false".into()),
            (
                Probed::ProbeFailed(CallFailure::Timeout),
                format!("Probe: no answer within {t}"),
            ),
            (
                Probed::ProbeFailed(deadline.clone()),
                format!("Probe: no answer within {t} (DeadlineExceeded: late)"),
            ),
            (
                Probed::ProbeFailed(refused.clone()),
                "Probe failed: Unavailable: refused".into(),
            ),
            (
                Probed::InfoFailed(CallFailure::Timeout),
                format!("Probe ready, GetPluginInfo: no answer within {t}"),
            ),
            (
                Probed::InfoFailed(deadline),
                format!(
                    "Probe ready, GetPluginInfo: no answer within {t} (DeadlineExceeded: late)"
                ),
            ),
            (
                Probed::InfoFailed(refused),
                "Probe ready, GetPluginInfo failed: Unavailable: refused".into(),
            ),
            (
                Probed::OtherDriver {
                    named: "x".into(),
                    driver: D.into(),
                },
                format!("Probe ready, GetPluginInfo names \"x\", not \"{D}\""),
            ),
        ] {
            assert_eq!(p.to_string(), want);
        }
    }

    /// Before, every entry of `plugins_registry` was read and `lstat`ed
    /// before the sockets were capped: a directory of millions of entries
    /// cost a stat each. Now at most [`MAX_ENTRIES`] are read, the cut is
    /// said, and a driver's own `<driver>-reg.sock` is found by its name.
    #[test]
    fn a_registry_of_more_entries_than_the_cap_is_cut() {
        let t = tempfile::tempdir().unwrap();
        let root = RootDir::open(t.path()).unwrap();
        let reg = root.path().join(PLUGINS_REGISTRY);
        std::fs::create_dir_all(&reg).unwrap();
        for i in 0..MAX_ENTRIES + 50 {
            std::fs::File::create(reg.join(format!("junk-{i:05}"))).unwrap();
        }
        let own = reg.join(format!("{D}-reg.sock"));
        let _l = std::os::unix::net::UnixListener::bind(&own).unwrap();
        let listing = registration_sockets(&root, &[D.to_string()]);
        assert!(listing.cut, "{listing:?}");
        assert_eq!(listing.sockets, vec![own]);
        assert_eq!(listing.not_asked, 0, "{listing:?}");
        let t = no_socket("other.example", &reg, &[], &listing);
        let cut = format!(
            "  the listing of {} was cut at {MAX_ENTRIES} entries",
            reg.display()
        );
        assert!(t.evidence.iter().any(|l| l.starts_with(&cut)), "{t:?}");
        // A listing that is not cut says nothing of it.
        std::fs::remove_file(reg.join("junk-00000")).unwrap();
        for i in 1..51 {
            std::fs::remove_file(reg.join(format!("junk-{i:05}"))).unwrap();
        }
        let listing = registration_sockets(&root, &[]);
        assert!(!listing.cut, "{listing:?}");
        assert_eq!(listing.sockets.len(), 1, "{listing:?}");
    }

    #[test]
    fn the_first_failing_step_is_the_summary() {
        let other = reg("/r/plugins_registry/o-reg.sock", Ok(("o", "/o.sock")));
        let t = triage(&[other], None, None);
        assert_eq!(t.failed, Some(Step::Registration), "{t:?}");
        assert!(t
            .evidence
            .iter()
            .any(|l| l.contains("driver \"o\" at /o.sock")));
        let dead = reg(
            &format!("/r/plugins_registry/{D}-reg.sock"),
            Err("no answer"),
        );
        let t = triage(&[dead], None, None);
        assert_eq!(t.failed, Some(Step::GetInfo), "{t:?}");
        let wrong = reg(
            &format!("/r/plugins_registry/{D}-reg.sock"),
            Ok(("x", "/x")),
        );
        let t = triage(&[wrong], None, None);
        assert_eq!(t.failed, Some(Step::GetInfo), "{t:?}");
        assert!(t.summary.contains("as driver \"x\""), "{t:?}");
        // Another driver whose name only starts with this one's is not
        // taken for its socket (before, `starts_with` took it).
        let longer = reg(
            &format!("/r/plugins_registry/{D}.other-reg.sock"),
            Ok(("y", "/y")),
        );
        let t = triage(&[longer], None, None);
        assert_eq!(t.failed, Some(Step::Registration), "{t:?}");
        let ok = || vec![reg("/r/plugins_registry/any.sock", Ok((D, "/d.sock")))];
        let t = triage(&ok(), Some(Probed::NotReady), None);
        assert_eq!(t.failed, Some(Step::Probe), "{t:?}");
        assert_eq!(t.path, Path::new("/d.sock"));
        assert_eq!(t.evidence.last().unwrap(), "4 CSINode: not checked");
        let t = triage(&ok(), Some(ready()), Some(Ok(Some(vec![]))));
        assert_eq!(t.failed, Some(Step::CsiNode), "{t:?}");
        let t = triage(&ok(), Some(ready()), Some(Ok(None)));
        assert_eq!(t.failed, Some(Step::CsiNode), "{t:?}");
        // A CSINode that cannot be read is not the driver's fault.
        let t = triage(
            &ok(),
            Some(ready()),
            Some(Err(CsiNodeError::Read("403".into()))),
        );
        assert_eq!(t.failed, None, "{t:?}");
        let t = triage(&ok(), Some(ready()), Some(Ok(Some(vec![D.into()]))));
        assert_eq!(t.failed, None, "{t:?}");
        assert_eq!(t.evidence.len(), 4, "{t:?}");
        let t = triage(&ok(), Some(ready()), None);
        assert!(
            t.evidence[3].contains("not checked (no API server)"),
            "{t:?}"
        );
    }
}
