//! `volmgr agent --observe`: next to an unmodified kubelet, read the node
//! and report what needs a person (see [`volmgr::observer`]); change
//! nothing. The agent confines itself first ([`crate::sandbox`]), keeps its
//! own state (status socket, lock) in `--state-dir` outside ROOT, builds a
//! manager that is never started (no reconstruction that repairs, no
//! reconciler, no stats calls), feeds its desired state from the pod
//! sources, and scans when the mount table or the desired state changes
//! and every `--scan-period`.
//!
//! What it does not do, unlike the managing agent: create ROOT or anything
//! in it, lock ROOT, watch `plugins_registry` (registration answers
//! drivers), request tokens, write CSINode, the Node's status or claims.
//! It records events on pods for findings (rate-limited), and reads back
//! the recent events of pods with a stuck volume (finding (d) shows them;
//! [`volmgr_kube::pod_events`]) and of the node's `Pending` pods (finding
//! (l), `kubelet_disagrees`, compares them with the mount table and, for
//! a volume the kubelet says is unattached, with its VolumeAttachment and
//! the Node's `status.volumesAttached`: [`volmgr_kube::attachments`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{watch, Notify};

use crate::agent::{io, AgentError, AgentOptions};
use crate::api;
use crate::sandbox::{self, Confinement};
use volmgr::observer::{NoSyscallHistory, Observer, SyscallHistory};
use volmgr::populator::convert::PayloadResolution;
use volmgr::status::RecentSyscall;
use volmgr::status::{Finding, FindingKind, ObserveStatus};
use volmgr::tracer::timeline::{self, TimelineStore};
use volmgr::util::sync::MutexExt;
use volmgr::volumemanager::{Built, Config, CsiSetup, VolumeManager, VolumeManagerBuilder};
use volmgr_kube::pod_events::{PodEvents, PodEventsConfig, PodKey};

/// The failpoint that makes the observing agent try a write under ROOT
/// (the test that the kernel refuses it).
pub const WRITE_PROBE_FAILPOINT: &str = "observe-write-probe";
/// The file the write probe tries to create under ROOT.
pub const WRITE_PROBE_FILE: &str = ".volmgr-observe-probe";
/// The failpoint that makes the observing agent try to signal its parent
/// process (signal 0: the permission check only), logging what happened
/// (the test that Landlock's signal scoping refuses it).
pub const SIGNAL_PROBE_FAILPOINT: &str = "observe-signal-probe";

/// Observe mode's settings.
#[derive(Debug, Clone)]
pub struct ObserveOptions {
    /// Where the agent's own state lives (outside ROOT).
    pub state_dir: PathBuf,
    /// How long a needed volume may stay unmounted before it is reported.
    pub stuck_after: Duration,
    /// The safety-net period between scans.
    pub scan_period: Duration,
}

static CONFINEMENT: OnceLock<Confinement> = OnceLock::new();

/// Prepares observe mode before the runtime starts: checks ROOT exists
/// (observe mode creates nothing there), checks the state directory
/// against ROOT and creates it (mode 0700, the agent's own:
/// [`crate::state_dir`]) and confines the process.
pub fn prepare(root: &Path, state_dir: &Path) -> Result<(), AgentError> {
    if !root.is_dir() {
        return Err(AgentError::Io {
            what: format!("observe mode: ROOT {}", root.display()),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory"),
        });
    }
    let canon_root = root.canonicalize().map_err(io("ROOT"))?;
    let state = crate::state_dir::prepare(&canon_root, state_dir)?;
    crate::limits::raise_nofile();
    // Outside the Landlock domain: reading other processes' /proc links
    // (teardown_blocked's holders) is ptrace access Landlock denies.
    if let Err(e) = volmgr::observer::holder_helper::start() {
        tracing::warn!(error = %e, "observe mode: no holder scan helper");
    }
    let c = sandbox::confine(&state);
    tracing::info!(landlock = %c.landlock, capabilities = %c.capabilities, "observe mode: confined");
    let _ = CONFINEMENT.set(c);
    Ok(())
}

/// The (never started) volume manager whose desired and actual states the
/// observer reads: the same set-up as manager mode and the C ABI, but ROOT's
/// propagation is left alone and the plugin registry is not followed
/// (registering a driver answers the driver, NotifyRegistrationStatus,
/// which is the kubelet's to do).
fn build_manager(opts: &AgentOptions) -> Result<Built, AgentError> {
    let mut config = Config::new(&opts.root);
    // Observe mode changes nothing under ROOT: not even its propagation.
    config.make_root_shared = false;
    config.node_name = opts.node_name.clone();
    Ok(VolumeManagerBuilder::new(config)
        .tracer(opts.tracer)
        .csi(CsiSetup {
            timeout: opts.csi_timeout,
            drivers: opts.csi_drivers.clone(),
            watch_plugins_registry: false,
        })
        .build()?)
}

/// Runs the observing agent until SIGTERM or SIGINT.
pub async fn run(opts: AgentOptions, obs: ObserveOptions) -> Result<(), AgentError> {
    let signals = crate::agent::StopSignals::install()?;
    crate::agent::check_sources(&opts)?;
    let built = build_manager(&opts)?;
    let vm = Arc::clone(&built.vm);
    let state = obs
        .state_dir
        .canonicalize()
        .map_err(io("the state directory"))?;
    let _lock = crate::agent::lock_root(&state)?;
    let status = Arc::new(Mutex::new(initial_status(&opts.root)));
    vm.set_observe_status(status.locked().clone());
    add_findings_metrics(&vm, &status);
    let (stop_tx, stop_rx) = watch::channel(false);
    // The tracer (eBPF where it loads): per-volume syscall timelines for the
    // findings, stuck calls, latency histograms. It only reads.
    crate::agent::set_stuck_thresholds(&vm, &opts);
    let watchers = built.start_watchers(stop_rx.clone())?;
    let kube = if volmgr_kube::client::api_requested(opts.kubeconfig.as_deref()) {
        Some(volmgr_kube::client::client(opts.kubeconfig.as_deref(), &opts.node_name).await?)
    } else {
        None
    };
    let listener = api::bind(&state).map_err(io("binding the status socket"))?;
    let metrics = crate::agent::bind_metrics(&opts).await?;
    let events = kube
        .clone()
        .map(|c| crate::observe_events::FindingEvents::new(c, &opts.node_name));
    // The stuck pods' events, read in the background (never in a scan).
    // The stuck pods' events and the node's Pending pods' (kubelet_disagrees),
    // read in the background (never in a scan).
    let pod_events = kube.clone().map(|c| {
        let pe = PodEvents::start(c.clone(), PodEventsConfig::default(), stop_rx.clone());
        Arc::new(pe.follow_pending_pods(c, &opts.node_name, stop_rx.clone()))
    });
    let (api_task, metrics_task) = crate::agent::serve_clients(listener, metrics, &vm, &stop_rx);
    let mut scanner = Scanner {
        vm: Arc::clone(&vm),
        observer: with_csinode(
            with_mount_probes(Observer::new(obs.stuck_after, history(&vm)), &vm)
                .with_walk_counters(Arc::clone(&vm.tracer_context().status) as _),
            &kube,
            &opts,
        ),
        status: Arc::clone(&status),
        events,
        pod_events,
        reported: BTreeSet::new(),
    };
    if let Some(pe) = &scanner.pod_events {
        scanner.observer.set_pod_events(Arc::clone(pe) as _);
        scanner.observer.set_kubelet_node(&opts.node_name);
    }
    with_attachments(&mut scanner.observer, &kube, &opts, &stop_rx);
    let scan_task = tokio::spawn(scanner.run(obs.scan_period, stop_rx.clone()));
    // The same pod sources as manager mode, feeding the (never started)
    // manager's desired state; payload volumes by name only, so the agent
    // needs no right to read ConfigMaps, Secrets or the Node.
    let source_task =
        crate::agent::spawn_sources(&opts, kube, &vm, &stop_rx, PayloadResolution::NamesOnly);
    tracing::info!(root = %opts.root.display(), state_dir = %state.display(), "observing (read-only)");
    let result = crate::agent::wait_for_stop(signals, source_task).await;
    let _ = stop_tx.send(true);
    let _ = scan_task.await;
    watchers.join().await;
    crate::agent::clients_stopped(api_task, metrics_task, &state).await;
    result
}

/// `observer` probing the network and FUSE mounts under ROOT
/// (`mount_unreachable`), the tracer's stuck calls naming the tasks
/// blocked on them.
fn with_mount_probes(observer: Observer, vm: &Arc<VolumeManager>) -> Observer {
    let stuck = Arc::clone(vm.tracer_context().status.stuck());
    match volmgr::observer::MountProber::start(Default::default(), Some(stuck)) {
        Ok(p) => observer.with_mount_prober(p),
        Err(e) => {
            tracing::warn!(error = %e, "mount probes not started: mount_unreachable is not reported");
            observer
        }
    }
}

/// The attach side of `kubelet_disagrees` reads the VolumeAttachments the
/// scan asks for and the Node, in the background, when there is an API
/// server.
fn with_attachments(
    o: &mut Observer,
    kube: &Option<kube::Client>,
    opts: &AgentOptions,
    stop: &watch::Receiver<bool>,
) {
    if let Some(c) = kube {
        let a =
            volmgr_kube::attachments::Attachments::start(c.clone(), &opts.node_name, stop.clone());
        o.set_attachments(Arc::new(a));
    }
}

/// The CSI triage reads the node's CSINode when there is an API server.
fn with_csinode(o: Observer, kube: &Option<kube::Client>, opts: &AgentOptions) -> Observer {
    match kube {
        Some(c) => o.with_csinode(Arc::new(volmgr_kube::csinode_read::CsiNodeRead::new(
            c.clone(),
            &opts.node_name,
        ))),
        None => o,
    }
}

/// The syscall history findings are completed with: the tracer's
/// per-volume timelines (empty without the eBPF tracer).
fn history(vm: &Arc<VolumeManager>) -> Arc<dyn SyscallHistory> {
    Arc::new(TimelineHistory {
        timelines: Arc::clone(vm.tracer_context().status.timelines()),
        root: vm.root().path().to_path_buf(),
    })
}

/// How many of a volume's last calls a finding shows.
const RECENT_CALLS: usize = 8;

/// [`SyscallHistory`] over the tracer's timelines: the calls of the volume
/// a path belongs to (by the kubelet's layout under ROOT).
struct TimelineHistory {
    timelines: Arc<TimelineStore>,
    root: PathBuf,
}

impl SyscallHistory for TimelineHistory {
    fn recent_for_path(&self, path: &Path) -> Vec<RecentSyscall> {
        let Some(a) = path
            .to_str()
            .and_then(|p| timeline::attribute(p, &self.root))
        else {
            return Vec::new();
        };
        let Some(t) = self.timelines.for_volume(&a.key) else {
            return Vec::new();
        };
        let skip = t.entries.len().saturating_sub(RECENT_CALLS);
        t.entries
            .into_iter()
            .skip(skip)
            .map(|e| RecentSyscall {
                time: e.time,
                process: format!("{}[{}]", e.comm, e.pid),
                call: e.call,
                duration_us: e.duration_ns / 1_000,
                result: e.result,
            })
            .collect()
    }
}

/// Status before the first scan, with the confinement and the write probe.
fn initial_status(root: &Path) -> ObserveStatus {
    let c = CONFINEMENT.get().cloned().unwrap_or_default();
    let write_probe = volmgr::failpoint::armed(WRITE_PROBE_FAILPOINT).then(|| write_probe(root));
    if volmgr::failpoint::armed(SIGNAL_PROBE_FAILPOINT) {
        signal_probe();
    }
    ObserveStatus {
        landlock: c.landlock,
        capabilities: c.capabilities,
        write_probe,
        ..ObserveStatus::default()
    }
}

/// Tries to create a file under ROOT (failpoint [`WRITE_PROBE_FAILPOINT`]):
/// the kernel must refuse it. Returns what happened.
fn write_probe(root: &Path) -> String {
    let path = root.join(WRITE_PROBE_FILE);
    let outcome = match std::fs::File::create(&path) {
        Ok(_) => "write succeeded: observe mode is NOT confined".to_string(),
        Err(e) => format!("write refused: {e}"),
    };
    tracing::warn!(path = %path.display(), %outcome, "observe mode write probe");
    outcome
}

/// Sends signal 0 to the parent process (failpoint
/// [`SIGNAL_PROBE_FAILPOINT`]) and logs whether the kernel refused it.
fn signal_probe() {
    let parent = nix::unistd::getppid();
    let outcome = match nix::sys::signal::kill(parent, None) {
        Ok(()) => "signal allowed: observe mode can signal other processes".to_string(),
        Err(e) => format!("signal refused: {e}"),
    };
    tracing::warn!(pid = parent.as_raw(), %outcome, "observe mode signal probe");
}

/// `volmgr_findings{kind}`: the findings of the last scan, by kind.
fn add_findings_metrics(vm: &Arc<VolumeManager>, status: &Arc<Mutex<ObserveStatus>>) {
    let status = Arc::clone(status);
    vm.add_metrics_source(Arc::new(move || {
        let s = status.locked();
        let mut out = String::from(
            "# HELP volmgr_findings Problems observe mode found on the node, by kind.\n# TYPE volmgr_findings gauge\n",
        );
        for kind in FindingKind::ALL {
            let n = s.findings.iter().filter(|f| f.kind == kind).count()
                + s.findings_not_listed.get(kind.as_str()).copied().unwrap_or(0);
            out.push_str(&format!("volmgr_findings{{kind=\"{}\"}} {n}\n", kind.as_str()));
        }
        out.push_str(&format!(
            "# HELP volmgr_observe_scans_total Scans of observe mode.\n# TYPE volmgr_observe_scans_total counter\nvolmgr_observe_scans_total {}\n",
            s.scans
        ));
        out
    }));
}

/// The scan loop's state.
struct Scanner {
    vm: Arc<VolumeManager>,
    observer: Observer,
    status: Arc<Mutex<ObserveStatus>>,
    events: Option<crate::observe_events::FindingEvents>,
    /// The recent events of pods with a stuck volume (with an API server).
    pod_events: Option<Arc<PodEvents>>,
    /// `(kind, path, pod)` of the last scan's findings (logs and events go
    /// out for new ones; a finding whose pod became known is new).
    reported: BTreeSet<(FindingKind, String, Option<String>)>,
}

/// The shortest time between two scans (changes come in bursts).
const SETTLE: Duration = Duration::from_millis(50);

impl Scanner {
    /// Scans on every change of the mount table or the desired state, and
    /// every `period`, until `stop`.
    async fn run(mut self, period: Duration, mut stop: watch::Receiver<bool>) {
        let mounts = Arc::new(Notify::new());
        if let Some(p) = self.observer.mount_prober() {
            let wake = Arc::clone(&mounts);
            p.set_wake(Arc::new(move || wake.notify_one()));
        }
        let watcher = watch_mount_table(Arc::clone(&mounts), stop.clone());
        let mut desired = self.vm.subscribe();
        let mut pod_events = self.pod_events.as_ref().map(|p| p.changed());
        loop {
            self.scan_once().await;
            tokio::select! {
                () = volmgr::util::shutdown::requested(&mut stop) => break,
                () = mounts.notified() => {}
                () = events_read(&mut pod_events) => {}
                r = desired.changed() => {
                    if r.is_err() {
                        break;
                    }
                }
                () = tokio::time::sleep(period) => {}
            }
            tokio::time::sleep(SETTLE).await;
        }
        let _ = watcher.await;
    }

    /// One scan: findings into status, events for the new ones.
    async fn scan_once(&mut self) {
        let started = Instant::now();
        let vm = Arc::clone(&self.vm);
        let mut observer = std::mem::replace(
            &mut self.observer,
            Observer::new(Duration::ZERO, Arc::new(NoSyscallHistory)),
        );
        let joined = tokio::task::spawn_blocking(move || {
            // Read before the scan: what it judges is at least that.
            let populated = vm.sources_populated();
            let r = observer.scan(&vm);
            (observer, r, populated)
        })
        .await;
        let Ok((observer, result, populated)) = joined else {
            return;
        };
        let mut s = self.status.locked().clone();
        s.volumes = observer.volumes().to_vec();
        s.findings_not_listed = observer
            .not_listed()
            .iter()
            .map(|(k, n)| (k.as_str().to_string(), *n))
            .collect();
        s.synced = populated && result.is_ok();
        self.observer = observer;
        s.scans += 1;
        s.last_scan = volmgr::cache::out_of_band::rfc3339(SystemTime::now());
        match result {
            Ok(mut findings) => {
                s.scan_error = None;
                self.announce(&findings).await;
                self.add_pod_events(&mut findings);
                s.findings = findings;
            }
            Err(e) => s.scan_error = Some(e.to_string()),
        }
        tracing::debug!(
            findings = s.findings.len(),
            took_ms = started.elapsed().as_millis() as u64,
            "observe scan"
        );
        *self.status.locked() = s.clone();
        self.vm.set_observe_status(s);
    }

    /// Stuck volumes' findings get their pod's recent events as last read;
    /// the pods whose events are read are those of these findings.
    fn add_pod_events(&self, findings: &mut [Finding]) {
        let Some(pe) = &self.pod_events else {
            return;
        };
        let stuck = |f: &&mut Finding| f.kind == FindingKind::VolumeStuck;
        let pods: Vec<PodKey> = findings
            .iter_mut()
            .filter(stuck)
            .filter_map(|f| {
                let (namespace, _) = f.pod.as_deref()?.split_once('/')?;
                Some(PodKey {
                    namespace: namespace.to_string(),
                    uid: f.pod_uid.clone()?,
                })
            })
            .collect();
        pe.want(pods);
        for f in findings.iter_mut().filter(stuck) {
            if let Some(uid) = &f.pod_uid {
                f.events = pe.events_of(uid);
            }
        }
    }

    /// Logs each new finding once, and records an event on its pod.
    async fn announce(&mut self, findings: &[Finding]) {
        let key = |f: &Finding| (f.kind, f.path.clone(), f.pod.clone());
        let now: BTreeSet<_> = findings.iter().map(key).collect();
        for f in findings {
            if self.reported.contains(&key(f)) {
                continue;
            }
            tracing::warn!(kind = f.kind.as_str(), path = %f.path, pod = ?f.pod, "{}", f.summary);
            if let Some(ev) = &mut self.events {
                ev.publish(f).await;
            }
        }
        self.reported = now;
    }
}

/// Returns when pods' events were read (never without a reader).
async fn events_read(rx: &mut Option<watch::Receiver<u64>>) {
    if let Some(r) = rx {
        if r.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending::<()>().await;
}

/// Wakes `notify` whenever the mount table changes (`poll(POLLPRI)` on
/// `/proc/self/mountinfo`, in a blocking thread that looks at `stop` every
/// second).
fn watch_mount_table(
    notify: Arc<Notify>,
    stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::task::spawn_blocking(move || {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let Ok(file) = std::fs::File::open("/proc/self/mountinfo") else {
            return;
        };
        while !*stop.borrow() {
            let mut fds = [PollFd::new(file.as_fd(), PollFlags::POLLPRI)];
            if let Ok(n) = poll(&mut fds, PollTimeout::from(1000u16)) {
                if n > 0 {
                    notify.notify_one();
                }
            }
        }
    })
}
