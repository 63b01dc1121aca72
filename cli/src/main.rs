//! The `volmgr` command: the node agent and its client commands.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context};
use clap::{Parser, Subcommand};

use volmgr::ebpf;
use volmgr::operationexecutor::Backoff;
use volmgr::status::Status;
use volmgr::tracer::TracerMode;
use volmgr::util::escape::printable;
use volmgr_cli::agent::{self, AgentOptions};
use volmgr_cli::api::{self, Request};
use volmgr_cli::doctor;
use volmgr_cli::observe::{self, ObserveOptions};
use volmgr_cli::status_text::status_text;

/// volmgr: a node-level Kubernetes volume manager.
#[derive(Parser, Debug)]
#[command(name = "volmgr", version, about, args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The host name, the default `--node-name`.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// `volmgr agent`'s flags.
#[derive(clap::Args, Debug)]
struct AgentArgs {
    /// Root directory (the kubelet's /var/lib/kubelet).
    #[arg(long)]
    root: PathBuf,
    /// Directory of pod manifests (YAML or JSON): the only source of pods
    /// without an API server, static pods next to the API's with one.
    #[arg(long)]
    manifests: Option<PathBuf>,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9110).
    #[arg(long)]
    metrics_addr: Option<SocketAddr>,
    /// Safety-net resync period (re-read the mount table, full pass).
    #[arg(long, default_value = "60s", value_parser = parse_positive_duration)]
    resync_period: Duration,
    /// Safety-net rescan period of the manifests directory.
    #[arg(long, default_value = "20s", value_parser = parse_positive_duration)]
    rescan_period: Duration,
    /// First retry delay after a failed operation.
    #[arg(long, default_value = "500ms", value_parser = parse_positive_duration)]
    backoff_initial: Duration,
    /// Longest retry delay.
    #[arg(long, default_value = "122s", value_parser = parse_positive_duration)]
    backoff_max: Duration,
    /// This node's name (default: the host name); also `nodeName` in CSI
    /// vol_data.json.
    #[arg(long, default_value_t = host_name())]
    node_name: String,
    /// Deadline of each CSI call (the kubelet uses 2 minutes).
    #[arg(long, default_value = "120s", value_parser = parse_positive_duration)]
    csi_timeout: Duration,
    /// Period of the volume stats collection (kubelet_volume_stats_*).
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    volume_stats_period: Duration,
    /// How often volumes of CSI drivers whose CSIDriver has
    /// requiresRepublish are published again (the kubelet's sync period).
    #[arg(long, default_value = "1m", value_parser = parse_positive_duration)]
    csi_republish_period: Duration,
    /// A CSI driver and its socket, NAME=SOCKET (repeatable); drivers can
    /// also register through ROOT/plugins_registry.
    #[arg(long = "csi-driver", value_name = "NAME=SOCKET", value_parser = parse_csi_driver)]
    csi_drivers: Vec<(String, PathBuf)>,
    /// What keeps the actual state current between resyncs: `ebpf` (the
    /// syscall tracer), `mountinfo` (poll /proc/self/mountinfo), `off`
    /// (the resync only), or `auto` (eBPF if it loads, else mountinfo).
    #[arg(long, default_value = "auto", env = "VOLMGR_TRACER")]
    tracer: TracerMode,
    /// Service account tokens for projected serviceAccountToken volumes:
    /// DIR/<namespace>/<service account> holds the token. Without it, such
    /// a volume fails to set up.
    #[arg(long, value_name = "DIR")]
    token_file: Option<PathBuf>,
    /// Use the API server of this kubeconfig (its current context) as the
    /// source of pods: the pods bound to --node-name and the objects they
    /// read (claims, volumes, Secrets, ConfigMaps, ...) come from it,
    /// next to the --manifests pods if given; and for events, CSINode,
    /// the Node's status and service account tokens. Give it the node's
    /// own credentials (as the kubelet's). Without it, the cluster's own
    /// API server when running in a pod.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Own the Node's status.volumesInUse (off next to a kubelet that
    /// reports it); attachable volumes are then set up once reported.
    #[arg(long)]
    report_volumes_in_use: bool,
    /// The container runtime's CRI socket (the kubelet's flag): before a
    /// pod's volumes are torn down (pod deleted, ended or moved), the
    /// runtime must list none of its containers running and none of its
    /// sandboxes ready; while it does, or does not answer, they stay (status
    /// says why). `none`: no runtime on this node (tests, demos): volumes
    /// are torn down as soon as the API server says the pod is gone.
    #[arg(
        long,
        value_name = "unix:///PATH|none",
        default_value = volmgr::cri::RuntimeEndpoint::DEFAULT,
        value_parser = parse_runtime_endpoint
    )]
    container_runtime_endpoint: RuntimeChoice,
    /// A traced mount-family or statfs call blocked this long is reported
    /// as stuck (status, doctor, log, metrics) while it is still blocked.
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration)]
    stuck_syscall_after: Duration,
    /// A file system tool (mkfs, fsck, e2fsck, resize2fs, xfs_growfs,
    /// xfs_repair) running this long is reported as stuck while it runs.
    #[arg(long, default_value = "2m", value_parser = parse_positive_duration)]
    stuck_tool_after: Duration,
    /// The kubelet's feature gates volmgr follows, NAME=BOOL comma
    /// separated: SELinuxMount (on by default, as in Kubernetes 1.37);
    /// SELinuxMountReadWriteOncePod and SELinuxChangePolicy are locked on.
    #[arg(long, default_value = "", value_parser = parse_feature_gates)]
    feature_gates: volmgr::cache::selinux::SeLinuxSettings,
    /// Whether the host has SELinux (volumes mounted with their pods'
    /// SELinux label, conflicting labels refused): `auto` asks the kernel
    /// (selinuxfs at /sys/fs/selinux), as the kubelet does.
    #[arg(long, default_value = "auto", value_parser = parse_selinux_enabled)]
    selinux_enabled: SeLinuxChoice,
    /// Observe mode: read the node next to an unmodified kubelet and
    /// report findings; never mount, unmount or write under ROOT (the
    /// kernel enforces it with Landlock).
    #[arg(long)]
    observe: bool,
    /// Observe mode: the agent's own state (status socket, lock), outside
    /// ROOT. `volmgr status --root DIR` and `volmgr doctor --state-dir DIR`
    /// read it there.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/run/volmgr",
        requires = "observe"
    )]
    state_dir: PathBuf,
    /// Observe mode: how long a pod may need a volume that is not mounted
    /// before it is reported (VolumeStuck).
    #[arg(long, default_value = "2m", value_parser = parse_positive_duration, requires = "observe")]
    stuck_after: Duration,
    /// Observe mode: the longest time between two scans (a scan also runs
    /// on every change of the mount table or of the pods).
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration, requires = "observe")]
    scan_period: Duration,
}

impl AgentArgs {
    /// Observe mode's options, when `--observe`.
    fn observe_options(&self) -> Option<ObserveOptions> {
        self.observe.then(|| ObserveOptions {
            state_dir: self.state_dir.clone(),
            stuck_after: self.stuck_after,
            scan_period: self.scan_period,
        })
    }

    /// The agent's options.
    fn into_options(self) -> AgentOptions {
        AgentOptions {
            root: self.root,
            manifests: self.manifests,
            metrics_addr: self.metrics_addr,
            resync_period: self.resync_period,
            rescan_period: self.rescan_period,
            backoff: Backoff::new(self.backoff_initial, 2, self.backoff_max),
            node_name: self.node_name,
            csi_timeout: self.csi_timeout,
            volume_stats_period: self.volume_stats_period,
            csi_republish_period: self.csi_republish_period,
            csi_drivers: self.csi_drivers,
            tracer: self.tracer,
            token_dir: self.token_file,
            kubeconfig: self.kubeconfig,
            report_volumes_in_use: self.report_volumes_in_use,
            container_runtime: self.container_runtime_endpoint.0,
            stuck_syscall_after: self.stuck_syscall_after,
            stuck_tool_after: self.stuck_tool_after,
            selinux_enabled: self.selinux_enabled.0,
            selinux_mount: self.feature_gates.selinux_mount,
        }
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the node agent on a manifests directory and/or the API server's pods.
    Agent(Box<AgentArgs>),
    /// One report of what needs a person on the node: observe mode's
    /// findings and the syscalls stuck now (exit 0 when nothing, 1 when
    /// something needs a person, 2 when no agent answers); with `--pod`,
    /// that pod's volumes' syscall timelines (eBPF).
    Doctor(doctor::DoctorArgs),
    /// Show the agent's status.
    Status {
        /// Root directory of the agent.
        #[arg(long)]
        root: PathBuf,
        /// Print the status document as JSON.
        #[arg(long)]
        json: bool,
        /// Seconds to wait for the agent's answer.
        #[arg(long, default_value = "30", value_parser = parse_timeout_secs)]
        timeout: f64,
    },
    /// Print a line per mount-table syscall (eBPF; classic and new mount API),
    /// with its arguments, result and latency. Needs root; no agent needed.
    Trace {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        /// Every mount namespace (default: the caller's only).
        #[arg(long)]
        all_namespaces: bool,
        /// Stop after this many syscalls.
        #[arg(long)]
        count: Option<u64>,
    },
    /// Collect mount-table syscall latencies for a while (eBPF) and report
    /// percentiles and histograms per syscall and filesystem type.
    Profile {
        /// Seconds to collect (Ctrl-C stops early).
        #[arg(long, value_parser = parse_duration)]
        duration: Duration,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Also write an SVG plot of the latency distributions to this file.
        #[arg(long)]
        svg: Option<PathBuf>,
        /// Every mount namespace (default: the caller's only).
        #[arg(long)]
        all_namespaces: bool,
        /// Turn on the kernel's BPF run-time statistics meanwhile and report
        /// the tracer programs' own cost per syscall.
        #[arg(long)]
        bpf_stats: bool,
    },
    /// Wait until every volume of a pod is mounted (exit 0), or time out (exit 1).
    Wait {
        /// Root directory of the agent.
        #[arg(long)]
        root: PathBuf,
        /// The pod's UID.
        #[arg(long, required_unless_present = "all", conflicts_with = "all")]
        pod: Option<String>,
        /// Wait for the whole node instead: every desired volume mounted and
        /// nothing else mounted (no pod's volume, no volume's device).
        #[arg(long)]
        all: bool,
        /// With --all: also wait until exactly this many pods are desired.
        #[arg(long, requires = "all")]
        pods: Option<usize>,
        /// Seconds to wait.
        #[arg(long, default_value = "120", value_parser = parse_timeout_secs)]
        timeout: f64,
        /// Wait for the pod's volumes to be unmounted instead.
        #[arg(long)]
        unmounted: bool,
    },
}

/// Parses `500ms`, `30s`, `2m`, `1h` or plain seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mul) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    Duration::try_from_secs_f64(v * mul).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

/// Shortest period or delay accepted: zero would panic (a zero-period
/// interval), stop the reconciler or spin a core.
const MIN_PERIOD: Duration = Duration::from_millis(1);

/// Like [`parse_duration`], refusing zero (and anything under 1 ms).
/// `--container-runtime-endpoint`: an endpoint, or `None` for `none`.
#[derive(Debug, Clone)]
struct RuntimeChoice(Option<volmgr::cri::RuntimeEndpoint>);

/// `--selinux-enabled`: `None` for `auto`.
#[derive(Debug, Clone, Copy)]
struct SeLinuxChoice(Option<bool>);

fn parse_selinux_enabled(s: &str) -> Result<SeLinuxChoice, String> {
    match s {
        "auto" => Ok(SeLinuxChoice(None)),
        "true" => Ok(SeLinuxChoice(Some(true))),
        "false" => Ok(SeLinuxChoice(Some(false))),
        _ => Err(format!("{s:?}: expected auto, true or false")),
    }
}

fn parse_feature_gates(s: &str) -> Result<volmgr::cache::selinux::SeLinuxSettings, String> {
    let mut settings = volmgr::cache::selinux::SeLinuxSettings::default();
    settings.apply_feature_gates(s).map_err(|e| e.to_string())?;
    Ok(settings)
}

fn parse_runtime_endpoint(s: &str) -> Result<RuntimeChoice, String> {
    if s == "none" {
        return Ok(RuntimeChoice(None));
    }
    volmgr::cri::RuntimeEndpoint::parse(s)
        .map(|e| RuntimeChoice(Some(e)))
        .map_err(|e| e.to_string())
}

fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < MIN_PERIOD {
        return Err(format!("{s:?}: must be at least 1ms"));
    }
    Ok(d)
}

/// A number of seconds, finite and not negative.
fn parse_timeout_secs(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("invalid number of seconds {s:?}"))?;
    Duration::try_from_secs_f64(v).map_err(|e| format!("invalid timeout {s:?}: {e}"))?;
    Ok(v)
}

/// What `volmgr wait` allows the agent beyond its own timeout (the agent
/// answers at its timeout; this covers the exchange itself).
const WAIT_MARGIN: Duration = Duration::from_secs(5);
/// Pause of `volmgr wait` before it tries again an agent with too many clients.
const BUSY_PAUSE: Duration = Duration::from_millis(100);

/// Parses `NAME=SOCKET` (an absolute socket path).
fn parse_csi_driver(s: &str) -> Result<(String, PathBuf), String> {
    let (name, socket) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=SOCKET"))?;
    if name.is_empty() {
        return Err(format!("{s:?}: the driver name is empty"));
    }
    let socket = PathBuf::from(socket);
    if !socket.is_absolute() {
        return Err(format!("{s:?}: the socket must be an absolute path"));
    }
    Ok((name.to_string(), socket))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Agent { .. }) {
        // The client commands print to stdout: `volmgr trace | head` should
        // end quietly when the reader goes, as other command-line tools do
        // (Rust ignores SIGPIPE, which makes `println!` panic instead). The
        // agent keeps ignoring it: a client leaving must not kill it.
        // SAFETY: restoring a default signal disposition before any thread
        // is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    tracing_subscriber::fmt()
        .fmt_fields(printable_fields())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(log_colours())
        .init();
    if let Command::Agent(a) = &cli.command {
        // Before any thread: Landlock and capabilities bind the calling
        // thread and the threads it starts later.
        if let Some(o) = a.observe_options() {
            if let Err(e) = observe::prepare(&a.root, &o.state_dir) {
                eprintln!("volmgr: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(64)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("volmgr: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("volmgr: {}", render_error(&e));
            ExitCode::from(2)
        }
    }
}

/// Colours in the log only for a person at a terminal: a DaemonSet's log
/// (`kubectl logs`), journald or a file gets plain text. `NO_COLOR` (any
/// value, <https://no-color.org>) turns them off at a terminal too.
fn log_colours() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// Log fields written through [`printable`]: names and errors that come
/// from manifests cannot forge log lines (newlines) or reach the terminal
/// (escape sequences).
fn printable_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> {
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let text = format!("{value:?}");
        if field.name() == "message" {
            write!(w, "{}", printable(&text))
        } else {
            write!(w, "{field}={}", printable(&text))
        }
    })
    .delimited(" ")
}

/// The error and its causes, skipping causes whose text is already shown.
fn render_error(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !out.contains(&c) {
            out.push_str(": ");
            out.push_str(&c);
        }
    }
    out
}

/// Runs the command: the agent until it stops, or one client command.
async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Agent(args) => match args.observe_options() {
            Some(o) => observe::run(args.into_options(), o).await?,
            None => agent::run(args.into_options()).await?,
        },
        Command::Trace {
            json,
            all_namespaces,
            count,
        } => {
            ebpf::report::trace(ebpf::report::TraceOptions {
                json,
                all_namespaces,
                count,
            })
            .await?;
        }
        Command::Profile {
            duration,
            json,
            svg,
            all_namespaces,
            bpf_stats,
        } => {
            ebpf::report::profile(ebpf::report::ProfileOptions {
                duration,
                json,
                svg,
                all_namespaces,
                bpf_stats,
            })
            .await?;
        }
        Command::Status {
            root,
            json,
            timeout: t,
        } => status(&root, json, t).await?,
        Command::Doctor(args) => return doctor::run(args).await,
        Command::Wait {
            root,
            pod,
            all,
            pods,
            timeout,
            unmounted,
        } => {
            let req = wait_request(pod, all, pods, timeout, unmounted)?;
            return Ok(wait(&root, req, timeout_arg(timeout)?).await);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `volmgr status`: the agent's status document, as JSON or as text.
async fn status(root: &Path, json: bool, timeout_secs: f64) -> anyhow::Result<()> {
    let v = match api::call(root, &Request::Status, timeout_arg(timeout_secs)?).await {
        Ok(v) => v,
        Err(e @ api::ApiError::Busy { .. }) => return Err(e.into()),
        Err(e) => return Err(e).context("is the agent running on this root?"),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let s: Status = serde_json::from_value(v)?;
        print!("{}", status_text(&s));
    }
    Ok(())
}

/// The request of `volmgr wait`: for the whole node (`--all`), or for one
/// pod's volumes to be mounted or (`--unmounted`) unmounted.
fn wait_request(
    pod: Option<String>,
    all: bool,
    pods: Option<usize>,
    timeout_secs: f64,
    unmounted: bool,
) -> anyhow::Result<Request> {
    let timeout_ms = millis(timeout_arg(timeout_secs)?);
    match pod {
        _ if all => Ok(Request::WaitAll { pods, timeout_ms }),
        Some(pod) if unmounted => Ok(Request::WaitUnmount { pod, timeout_ms }),
        Some(pod) => Ok(Request::Wait { pod, timeout_ms }),
        None => Err(anyhow!("--pod or --all is required")),
    }
}

/// `volmgr wait`: sends `req` to the agent, which answers when the volumes
/// are there (success) or its own wait timed out (failure). The agent may
/// be starting or restarting: it keeps trying to reach it until `timeout`,
/// each new try asking for the time left.
async fn wait(root: &Path, mut req: Request, timeout: Duration) -> ExitCode {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match api::call(root, &req, left + WAIT_MARGIN).await {
            Ok(_) => return ExitCode::SUCCESS,
            Err(api::ApiError::Remote(e)) => {
                eprintln!("volmgr: {e}");
                return ExitCode::FAILURE;
            }
            Err(e) if tokio::time::Instant::now() >= deadline => {
                eprintln!("volmgr: cannot reach the agent before the timeout: {e}");
                return ExitCode::FAILURE;
            }
            Err(api::ApiError::Busy { .. }) => tokio::time::sleep(BUSY_PAUSE).await,
            Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
        }
        let left_ms = millis(deadline.saturating_duration_since(tokio::time::Instant::now()));
        match &mut req {
            Request::Wait { timeout_ms, .. } | Request::WaitUnmount { timeout_ms, .. } => {
                *timeout_ms = left_ms
            }
            _ => {}
        }
    }
}

/// The `--timeout` seconds as a duration.
fn timeout_arg(secs: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(secs).map_err(|e| anyhow!("--timeout: {e}"))
}

/// `d` in whole milliseconds (saturating).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
