//! `volmgr agent`: the volume manager as a standalone node agent, fed by a
//! manifests directory and/or the Kubernetes API server's pods, serving
//! status on a Unix socket and Prometheus metrics over HTTP. SIGTERM/SIGINT
//! stop it cleanly and leave mounts in place, as the kubelet does.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api;
use crate::limits::ClientLimits;
use crate::metrics_server::serve_metrics;
use volmgr::operationexecutor::Backoff;
use volmgr::pluginmanager::registry::DriverRegistry;
use volmgr::plugins::token::FileTokenSource;
use volmgr::populator::convert::PayloadResolution;
use volmgr::populator::manifests::{ManifestsSource, SourceError};
use volmgr::tracer::{TracerError, TracerMode};
use volmgr::volumemanager::{
    self, BuildError, Config, CsiSetup, VolumeManager, VolumeManagerBuilder,
};

/// The kubelet's plugin registration directory under ROOT.
pub use volmgr::volumemanager::csi_wiring::PLUGINS_REGISTRY_DIR;

/// Agent settings (from the command line).
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// ROOT.
    pub root: PathBuf,
    /// The manifests directory (with the API server: static pods next to
    /// the API's).
    pub manifests: Option<PathBuf>,
    /// Where to serve `/metrics`.
    pub metrics_addr: Option<SocketAddr>,
    /// Safety-net resync period.
    pub resync_period: Duration,
    /// Manifests rescan period.
    pub rescan_period: Duration,
    /// Retry backoff.
    pub backoff: Backoff,
    /// Node name.
    pub node_name: String,
    /// Deadline of each CSI call.
    pub csi_timeout: Duration,
    /// Period of the volume stats collection (positive).
    pub volume_stats_period: Duration,
    /// How often `requiresRepublish` CSI drivers' volumes are published
    /// again (positive).
    pub csi_republish_period: Duration,
    /// CSI drivers given on the command line (`--csi-driver NAME=SOCKET`),
    /// registered without the plugin-registration handshake.
    pub csi_drivers: Vec<(String, PathBuf)>,
    /// Which tracer keeps the actual state current between resyncs.
    pub tracer: TracerMode,
    /// `--token-file DIR`: service account tokens by
    /// `<namespace>/<service account>` ([`FileTokenSource`]).
    pub token_dir: Option<PathBuf>,
    /// `--kubeconfig FILE`: talk to that API server (without it, to the
    /// cluster's own when running in a pod).
    pub kubeconfig: Option<PathBuf>,
    /// `--report-volumes-in-use`: this agent owns the Node's
    /// `status.volumesInUse` (and sets attachable volumes up only once
    /// reported there).
    pub report_volumes_in_use: bool,
    /// `--container-runtime-endpoint`: the CRI runtime asked before a
    /// pod's volumes are torn down (`None`: no runtime on this node).
    pub container_runtime: Option<volmgr::cri::RuntimeEndpoint>,
    /// `--stuck-syscall-after`: a traced call blocked this long is reported
    /// as stuck (eBPF tracer).
    pub stuck_syscall_after: Duration,
    /// `--stuck-tool-after`: a file system tool running this long is
    /// reported as stuck (eBPF tracer).
    pub stuck_tool_after: Duration,
    /// `--selinux-enabled`: whether the host has SELinux (`None`: ask).
    pub selinux_enabled: Option<bool>,
    /// `--feature-gates SELinuxMount=...`.
    pub selinux_mount: bool,
}

/// `--stuck-syscall-after` and `--stuck-tool-after`, set before the
/// tracer starts.
pub(crate) fn set_stuck_thresholds(vm: &VolumeManager, opts: &AgentOptions) {
    let ctx = vm.tracer_context();
    let stuck = ctx.status.stuck();
    stuck.set_threshold(opts.stuck_syscall_after);
    stuck.set_tool_threshold(opts.stuck_tool_after);
}

/// Why the agent could not run.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Building or starting the manager failed.
    #[error(transparent)]
    Manager(#[from] volumemanager::Error),
    /// The API server cannot be used.
    #[error(transparent)]
    Api(#[from] volmgr_kube::client::ClientError),
    /// Another agent holds ROOT.
    #[error("another volmgr agent is running on {0} (lock held on volmgr.lock)")]
    Locked(PathBuf),
    /// An I/O set-up step failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The manifests source failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Observe mode's `--state-dir` is refused.
    #[error(transparent)]
    StateDir(#[from] crate::state_dir::StateDirError),
    /// Neither `--manifests` nor an API server.
    #[error("no source of pods: give --manifests DIR, --kubeconfig FILE, or run in a pod")]
    NoSource,
    /// The tracer asked for could not start.
    #[error("--tracer {mode}: {source}")]
    Tracer {
        /// The `--tracer` value.
        mode: TracerMode,
        /// Why.
        #[source]
        source: TracerError,
    },
}

impl From<BuildError> for AgentError {
    fn from(e: BuildError) -> Self {
        match e {
            BuildError::Manager(e) => Self::Manager(e),
            BuildError::Tracer { mode, source } => Self::Tracer { mode, source },
        }
    }
}

/// Maps an I/O error to [`AgentError::Io`] naming `what` was being done.
pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> AgentError {
    let what = what.into();
    move |source| AgentError::Io { what, source }
}

/// The listener of `/metrics` and `/healthz`, when `--metrics-addr` is set.
pub(crate) async fn bind_metrics(opts: &AgentOptions) -> Result<Option<TcpListener>, AgentError> {
    match opts.metrics_addr {
        Some(addr) => Ok(Some(
            TcpListener::bind(addr)
                .await
                .map_err(io(format!("binding metrics address {addr}")))?,
        )),
        None => Ok(None),
    }
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(opts: AgentOptions) -> Result<(), AgentError> {
    let signals = StopSignals::install()?;
    check_sources(&opts)?;
    crate::limits::raise_nofile();
    create_root(&opts.root)?;
    let mut config = Config::new(&opts.root);
    config.resync_period = opts.resync_period;
    config.backoff = opts.backoff;
    config.node_name = opts.node_name.clone();
    config.volume_stats_period = opts.volume_stats_period;
    config.csi_republish_period = opts.csi_republish_period;
    config.wait_for_reported_in_use = opts.report_volumes_in_use;
    config.selinux_enabled = opts.selinux_enabled;
    config.selinux_mount = opts.selinux_mount;
    let built = VolumeManagerBuilder::new(config)
        .tracer(opts.tracer)
        .csi(CsiSetup {
            timeout: opts.csi_timeout,
            drivers: opts.csi_drivers.clone(),
            watch_plugins_registry: true,
        })
        .build()?;
    let (vm, csi_registry) = (Arc::clone(&built.vm), Arc::clone(&built.csi_registry));
    let (stop_tx, stop_rx) = watch::channel(false);
    let kube = connect_api(&opts, &vm, &stop_rx).await?;
    let root = vm.root().path().to_path_buf();
    let _lock = lock_root(&root)?;
    // Before the manager starts: nothing done to the mount table after
    // reconstruction read it goes unseen.
    set_stuck_thresholds(&vm, &opts);
    let watchers = built.start_watchers(stop_rx.clone())?;
    let listener = api::bind(&root).map_err(io("binding the status socket"))?;
    let metrics = bind_metrics(&opts).await?;
    if let Some(l) = &metrics {
        if let Ok(addr) = l.local_addr() {
            tracing::info!(%addr, "serving Prometheus metrics on /metrics");
        }
    }
    if let Some(client) = &kube {
        spawn_node_components(&opts, client.clone(), &vm, &csi_registry, &stop_rx);
    }
    vm.start().await?;
    tracing::info!(root = %root.display(), manifests = ?opts.manifests, api = kube.is_some(), "agent started");
    let (api_task, metrics_task) = serve_clients(listener, metrics, &vm, &stop_rx);
    let source_task = spawn_sources(&opts, kube, &vm, &stop_rx, PayloadResolution::Full);
    let result = wait_for_stop(signals, source_task).await;
    let _ = stop_tx.send(true);
    let _ = vm.stop().await;
    watchers.join().await;
    clients_stopped(api_task, metrics_task, &root).await;
    result
}

/// SIGTERM and SIGINT, caught from the start of a run: one that comes
/// while the agent starts (its socket already bound, the tracer loading)
/// still stops it cleanly, rather than killing it by the default action
/// (seen under load: exit by signal, the socket left behind).
pub(crate) struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Installs the handlers; signals that come from now on are kept until
    /// [`wait_for_stop`].
    pub(crate) fn install() -> Result<Self, AgentError> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate()).map_err(io("installing the SIGTERM handler"))?,
            int: signal(SignalKind::interrupt()).map_err(io("installing the SIGINT handler"))?,
        })
    }
}

/// Waits for SIGTERM, SIGINT (caught since `signals` were installed), or
/// the end of the pod sources (with their error, if any).
pub(crate) async fn wait_for_stop(
    mut signals: StopSignals,
    mut source_task: tokio::task::JoinHandle<Result<(), AgentError>>,
) -> Result<(), AgentError> {
    tokio::select! {
        _ = signals.term.recv() => { tracing::info!("SIGTERM: stopping, mounts stay in place"); Ok(()) }
        _ = signals.int.recv() => { tracing::info!("SIGINT: stopping, mounts stay in place"); Ok(()) }
        r = &mut source_task => match r {
            Ok(Err(e)) => Err(e),
            _ => Ok(()),
        },
    }
}

/// Checks that the agent has a source of pods, and that `--manifests`
/// names a directory.
pub(crate) fn check_sources(opts: &AgentOptions) -> Result<(), AgentError> {
    match &opts.manifests {
        None if !volmgr_kube::client::api_requested(opts.kubeconfig.as_deref()) => {
            Err(AgentError::NoSource)
        }
        Some(dir) if !dir.is_dir() => Err(AgentError::Io {
            what: format!("manifests directory {}", dir.display()),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory"),
        }),
        _ => Ok(()),
    }
}

/// Starts the sources of pods: the manifests directory and the API
/// server's pods, each with its own handle on the desired state (populated
/// once both delivered their pods); the API server's resolves payload
/// volumes as `payloads` says. The task ends when they stop, or early with
/// the manifests source's error.
pub(crate) fn spawn_sources(
    opts: &AgentOptions,
    kube: Option<kube::Client>,
    vm: &Arc<VolumeManager>,
    stop: &watch::Receiver<bool>,
    payloads: PayloadResolution,
) -> tokio::task::JoinHandle<Result<(), AgentError>> {
    let count = usize::from(opts.manifests.is_some()) + usize::from(kube.is_some());
    let mut sinks = volmgr::populator::share_sink(vm.pod_sink(), count).into_iter();
    // One sink per source present (`count` of them).
    let api = kube.and_then(|client| {
        let events = client.clone();
        let mut source =
            volmgr_kube::pods::ApiPodSource::new(client, &opts.node_name, sinks.next()?)
                .with_ca_origin(&volmgr_kube::client::ca_origin(opts.kubeconfig.as_deref()))
                .with_payload_resolution(payloads)
                // An observer keeps ended pods: their directories are the
                // kubelet's until they are deleted.
                .keeping_ended_pods(payloads == PayloadResolution::NamesOnly);
        // Manager mode records why a pod's claims cannot be read, as the
        // kubelet does; an observer leaves that to the node's kubelet.
        if payloads == PayloadResolution::Full {
            let config = volmgr_kube::events::EventConfig::default();
            let events = volmgr_kube::events::SourceEvents::start(
                events,
                &opts.node_name,
                config,
                stop.clone(),
            );
            source = source.with_events(events);
            // What the API says is gone may still run: the runtime says
            // when its volumes may go (an observer tears nothing down).
            if let Some(endpoint) = &opts.container_runtime {
                source = source
                    .with_container_runtime(volmgr::cri::RuntimeClient::new(endpoint.clone()));
            }
        }
        Some(tokio::spawn(source.run(stop.clone())))
    });
    let manifests = opts.manifests.clone().and_then(|dir| {
        let source = ManifestsSource::new(dir, sinks.next()?, opts.rescan_period);
        Some(tokio::spawn(source.run(stop.clone())))
    });
    tokio::spawn(async move {
        let manifests = async {
            match manifests {
                Some(t) => match t.await {
                    Ok(r) => r.map_err(AgentError::from),
                    Err(_) => Ok(()),
                },
                None => Ok(()),
            }
        };
        let api = async {
            if let Some(t) = api {
                let _ = t.await;
            }
            Ok::<(), AgentError>(())
        };
        tokio::try_join!(manifests, api).map(|_| ())
    })
}

/// The API server client, if the agent is to use one (`--kubeconfig`, or
/// in a pod), with what must be in place before the manager starts: the
/// service account token source (TokenRequest, unless `--token-file`
/// supplies tokens), the events on pods and the claims' status after node
/// expansion.
async fn connect_api(
    opts: &AgentOptions,
    vm: &Arc<VolumeManager>,
    stop: &watch::Receiver<bool>,
) -> Result<Option<kube::Client>, AgentError> {
    let client = if volmgr_kube::client::api_requested(opts.kubeconfig.as_deref()) {
        Some(volmgr_kube::client::client(opts.kubeconfig.as_deref(), &opts.node_name).await?)
    } else {
        None
    };
    match (&opts.token_dir, &client) {
        (Some(dir), _) => vm.set_token_source(Arc::new(FileTokenSource::new(dir.clone()))),
        (None, Some(c)) => {
            vm.set_token_source(Arc::new(volmgr_kube::token::ApiTokenSource::new(c.clone())))
        }
        (None, None) => {}
    }
    if let Some(c) = &client {
        let events = volmgr_kube::events::EventConfig::default();
        volmgr_kube::events::start(c.clone(), &opts.node_name, vm, events, stop.clone());
        volmgr_kube::claim_status::start(c.clone(), vm, stop.clone());
        tracing::info!(node = %opts.node_name, "using the API server (pods, objects, events, CSINode, tokens)");
    }
    Ok(client)
}

/// The node's API objects kept by the agent: CSINode and the CSI node
/// annotations for registered drivers, and with `--report-volumes-in-use`
/// the Node's `status.volumesInUse`.
fn spawn_node_components(
    opts: &AgentOptions,
    client: kube::Client,
    vm: &Arc<VolumeManager>,
    registry: &Arc<DriverRegistry>,
    stop: &watch::Receiver<bool>,
) {
    let node = opts.node_name.clone();
    tokio::spawn(volmgr_kube::csinode::run(
        client.clone(),
        node.clone(),
        Arc::clone(registry),
        stop.clone(),
    ));
    if opts.report_volumes_in_use {
        tokio::spawn(volmgr_kube::node_status::run(
            client,
            node,
            Arc::clone(vm),
            volmgr_kube::node_status::NodeStatusConfig::default(),
            stop.clone(),
        ));
    }
}

/// Serves the local API and (if bound) the metrics endpoint, under one
/// set of [`ClientLimits`].
pub(crate) fn serve_clients(
    listener: tokio::net::UnixListener,
    metrics: Option<TcpListener>,
    vm: &Arc<VolumeManager>,
    stop: &watch::Receiver<bool>,
) -> (
    tokio::task::JoinHandle<()>,
    Option<tokio::task::JoinHandle<()>>,
) {
    let limits = ClientLimits::from_rlimit();
    let api = tokio::spawn(api::serve(
        listener,
        Arc::clone(vm),
        limits.clone(),
        stop.clone(),
    ));
    let metrics =
        metrics.map(|l| tokio::spawn(serve_metrics(l, Arc::clone(vm), limits, stop.clone())));
    (api, metrics)
}

/// After the stop signal: waits for the tasks [`serve_clients`] started to
/// end, then removes the status socket from `dir`.
pub(crate) async fn clients_stopped(
    api_task: tokio::task::JoinHandle<()>,
    metrics_task: Option<tokio::task::JoinHandle<()>>,
    dir: &std::path::Path,
) {
    let _ = api_task.await;
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    let _ = std::fs::remove_file(api::socket_path(dir));
}

/// Creates ROOT if missing, mode 0750 whatever the umask (the kubelet's
/// root directory mode); an existing ROOT is left as it is.
fn create_root(root: &std::path::Path) -> Result<(), AgentError> {
    use std::os::unix::fs::DirBuilderExt;
    if root.exists() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(root)
        .map_err(io(format!("creating {}", root.display())))
}

/// The lock file's name under ROOT.
pub const LOCK_NAME: &str = "volmgr.lock";

/// Holds an exclusive `flock` on `ROOT/volmgr.lock` for the agent's life.
///
/// Only the agent's user may open the lock (mode 0600, owner checked,
/// never through a symlink): a `flock` needs only a descriptor, even a
/// read-only one, so a lock file others can open is a lock anyone can take
/// to keep the agent from starting. A lock file that is not a private
/// regular file of this user (e.g. 0644 from an older version, which
/// someone may hold open) is replaced by a fresh one; after locking, the
/// path must still name the locked file (else a concurrent replacement
/// won, and the lock is taken again on the new file).
pub(crate) fn lock_root(root: &std::path::Path) -> Result<std::fs::File, AgentError> {
    let path = root.join(LOCK_NAME);
    for _ in 0..8 {
        let f = match open_lock(&path) {
            // A symlink in its place (O_NOFOLLOW): replaced, never followed.
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                replace_lock(root, &path)?;
                continue;
            }
            r => r.map_err(io(format!("opening {}", path.display())))?,
        };
        if !is_private_file(&f) {
            replace_lock(root, &path)?;
            continue;
        }
        // SAFETY: flock on a descriptor we own; no memory is involved.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            return Err(AgentError::Locked(root.to_path_buf()));
        }
        if same_file(&f, &path) {
            return Ok(f);
        }
    }
    Err(AgentError::Io {
        what: format!("locking {}", path.display()),
        source: std::io::Error::other("the lock file keeps being replaced"),
    })
}

fn open_lock(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
}

/// Whether `f` is a regular file of this user that nobody else may open.
fn is_private_file(f: &std::fs::File) -> bool {
    use std::os::unix::fs::MetadataExt;
    f.metadata().is_ok_and(|m| {
        m.is_file() && m.uid() == nix::unistd::geteuid().as_raw() && m.mode() & 0o077 == 0
    })
}

/// Whether `path` (not followed) still names the file `f` is open on.
fn same_file(f: &std::fs::File, path: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (f.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Puts a fresh private lock file at `path` (atomically, by rename).
fn replace_lock(root: &std::path::Path, path: &std::path::Path) -> Result<(), AgentError> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::fs::PermissionsExt;
    tracing::warn!(path = %path.display(), "replacing a lock file others could open");
    let tmp = root.join(format!(".{LOCK_NAME}.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(io(format!("creating {}", tmp.display())))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(io(format!("chmod {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(io(format!("replacing {}", path.display())))
}
