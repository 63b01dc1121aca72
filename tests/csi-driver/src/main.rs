//! `volmgr-csi-driver`: a small CSI node driver that does real work, volmgr's
//! test peer.
//!
//! ```text
//! volmgr-csi-driver --endpoint SOCKET --state-dir DIR [--name NAME]
//!                   [--node-id ID] [--max-volumes-per-node N]
//!                   [--single-node-multi-writer] [--volume-mount-group]
//!                   [--topology KEY=VALUE]... [--registration-dir DIR]
//!                   [--publish-without-stage-check]
//! ```
//!
//! - Identity: GetPluginInfo, GetPluginCapabilities (ONLINE volume
//!   expansion), Probe. Node: NodeGetCapabilities (STAGE_UNSTAGE_VOLUME,
//!   EXPAND_VOLUME, GET_VOLUME_STATS, VOLUME_CONDITION, and with
//!   `--single-node-multi-writer` SINGLE_NODE_MULTI_WRITER: without it, the
//!   SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER access modes are
//!   refused, as by a driver that predates them; with
//!   `--volume-mount-group` VOLUME_MOUNT_GROUP: a stage's group owns the
//!   file system's root, setgid and group-writable; without it a group is
//!   refused), NodeGetInfo, and:
//! - NodeStageVolume: sparse image `DIR/images/<volume id>.img` (size from
//!   volume_context "size", e.g. "64Mi"; default 64Mi; only used when the
//!   image is created), attached to a loop device (ioctls), `mkfs.ext4` when
//!   blkid finds no file system, mounted at staging_target_path with the
//!   capability's mount_flags. Block: attached only.
//! - NodePublishVolume: bind mount of the staging mount (read-only: bind then
//!   remount ro), or for block a bind mount of the loop device node onto a
//!   file the driver creates at target_path. FAILED_PRECONDITION when the
//!   volume is not staged; with `--publish-without-stage-check`, whatever is
//!   at the staging path is bound without a check (block: stage also binds
//!   the device onto `staging_target_path/dev`, and publish binds that).
//! - NodeUnpublishVolume: unmount and remove target_path. NodeUnstageVolume:
//!   unmount, detach the loop device.
//! - NodeExpandVolume: grow the image, LOOP_SET_CAPACITY, resize2fs
//!   (filesystem volumes). NodeGetVolumeStats: statvfs (bytes and inodes)
//!   and a volume condition from `DIR/conditions.json` (see [`conditions`]),
//!   NOT_FOUND when the volume is not staged/published at that path.
//! - Calls for one volume are serialized: a second one while one is in
//!   flight gets ABORTED.
//! - State lives in the system (image files, /sys/block/loop*/loop/
//!   backing_file, /proc/self/mountinfo): a restarted driver finds its
//!   staged and published volumes, and every call is idempotent.
//! - Fault injection: `DIR/faults.json`, see [`faults`]. Call journal:
//!   `DIR/calls.jsonl`, see [`calls`].
//! - `--registration-dir DIR`: also serves the kubelet's plugin registration
//!   API on `DIR/<name>-reg.sock` (what node-driver-registrar does);
//!   NotifyRegistrationStatus is logged and written to
//!   `DIR/registration.json` (in the state dir).
//! - Secrets in requests are never logged (requests are never logged whole).
//!
//! SIGTERM/SIGINT: stop serving (in-flight calls get up to 5 s), remove the
//! sockets, exit 0.

mod calls;
mod conditions;
mod driver;
mod faults;
mod loopdev;
mod mounts;
mod node;
mod proto;
mod service;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Parser;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use crate::driver::Driver;
use crate::proto::{csi, registration};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "volmgr-csi-driver",
    version,
    about = "Small real CSI node driver (loop + ext4) for volmgr's tests"
)]
struct Args {
    /// CSI socket (a path or unix:///path).
    #[arg(long)]
    endpoint: String,
    /// State directory: images/, faults.json, calls.jsonl, registration.json.
    #[arg(long)]
    state_dir: PathBuf,
    /// CSI driver name.
    #[arg(long, default_value = "loop.csi.volmgr.dev")]
    name: String,
    /// Node ID reported by NodeGetInfo (default: the host name).
    #[arg(long)]
    node_id: Option<String>,
    /// NodeGetInfo's max_volumes_per_node (0: no limit).
    #[arg(long, default_value_t = 0)]
    max_volumes_per_node: i64,
    /// Advertise the SINGLE_NODE_MULTI_WRITER node capability (and accept
    /// its access modes, refused otherwise).
    #[arg(long)]
    single_node_multi_writer: bool,
    /// Advertise the VOLUME_MOUNT_GROUP node capability: a capability's
    /// `volume_mount_group` becomes the group of the file system's root
    /// (setgid, group-writable) at stage; refused otherwise.
    #[arg(long)]
    volume_mount_group: bool,
    /// NodeGetInfo's accessible topology segment KEY=VALUE (repeatable).
    #[arg(long = "topology", value_parser = parse_segment)]
    topology: Vec<(String, String)>,
    /// Serve the kubelet plugin registration API on DIR/<name>-reg.sock.
    #[arg(long)]
    registration_dir: Option<PathBuf>,
    /// NodePublishVolume binds what is at the staging path without checking
    /// that the volume is staged (EBS-style; block: the device file stage
    /// binds there, ceph-csi rbd-style).
    #[arg(long)]
    publish_without_stage_check: bool,
    /// Serve CSI inline ephemeral volumes: NodePublishVolume without a
    /// staging path mounts a tmpfs (volume attribute `size`) at the target.
    #[arg(long)]
    ephemeral: bool,
}

fn parse_segment(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

fn socket_path(endpoint: &str) -> PathBuf {
    PathBuf::from(endpoint.strip_prefix("unix://").unwrap_or(endpoint))
}

fn bind(path: &Path) -> anyhow::Result<UnixListenerStream> {
    // A stale socket from a previous run.
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => anyhow::bail!("removing the old socket {}: {e}", path.display()),
    }
    let listener =
        UnixListener::bind(path).map_err(|e| anyhow::anyhow!("binding {}: {e}", path.display()))?;
    Ok(UnixListenerStream::new(listener))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.state_dir)?;
    let state_dir = args.state_dir.canonicalize()?;
    let endpoint = socket_path(&args.endpoint);
    if let Some(parent) = endpoint.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let endpoint = std::path::absolute(&endpoint)?;
    let node_id = match args.node_id {
        Some(id) => id,
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")?
            .trim()
            .to_string(),
    };
    let mut driver = Driver::new(args.name.clone(), node_id, endpoint.clone(), state_dir);
    driver.max_volumes_per_node = args.max_volumes_per_node;
    driver.single_node_multi_writer = args.single_node_multi_writer;
    driver.volume_mount_group = args.volume_mount_group;
    driver.topology = args.topology.iter().cloned().collect();
    driver.publish_without_stage_check = args.publish_without_stage_check;
    driver.ephemeral = args.ephemeral;
    let driver = Arc::new(driver);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let csi_incoming = bind(&endpoint)?;
    let csi_server = tonic::transport::Server::builder()
        .add_service(csi::identity_server::IdentityServer::new(service::Csi(
            Arc::clone(&driver),
        )))
        .add_service(csi::node_server::NodeServer::new(service::Csi(Arc::clone(
            &driver,
        ))))
        .serve_with_incoming_shutdown(csi_incoming, stopped(stop_rx.clone()));
    let mut sockets = vec![endpoint.clone()];

    let reg_server = match &args.registration_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            let path = dir.join(format!("{}-reg.sock", args.name));
            let incoming = bind(&path)?;
            tracing::info!(socket = %path.display(), "serving plugin registration");
            sockets.push(path);
            Some(
                tonic::transport::Server::builder()
                    .add_service(registration::registration_server::RegistrationServer::new(
                        service::Registration(Arc::clone(&driver)),
                    ))
                    .serve_with_incoming_shutdown(incoming, stopped(stop_rx.clone())),
            )
        }
        None => None,
    };
    tracing::info!(endpoint = %endpoint.display(), name = %args.name, "serving CSI");

    let servers = async {
        match reg_server {
            Some(reg) => {
                let (a, b) = tokio::join!(csi_server, reg);
                a.and(b)
            }
            None => csi_server.await,
        }
    };
    tokio::pin!(servers);
    let served = tokio::select! {
        r = &mut servers => r,
        () = shutdown_signal() => {
            tracing::info!("shutting down");
            let _ = stop_tx.send(true);
            // In-flight calls get a moment to finish; a hung one does not
            // keep the process alive.
            match tokio::time::timeout(std::time::Duration::from_secs(5), servers).await {
                Ok(r) => r,
                Err(_) => {
                    tracing::warn!("calls still in flight after 5 s; exiting anyway");
                    Ok(())
                }
            }
        }
    };
    for s in &sockets {
        let _ = std::fs::remove_file(s);
    }
    served?;
    Ok(())
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("volmgr-csi-driver: tokio runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
