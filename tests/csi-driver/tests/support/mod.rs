//! Test support for the CSI driver: run a test body as root in a private
//! mount namespace (a re-executed child of the test binary), start the real
//! driver binary, talk to it with a tonic client over its Unix socket, and
//! clean up loop devices whatever happens.

#![allow(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

pub mod csi {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("csi.v1");
}
pub mod registration {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("pluginregistration");
}

const CHILD_ENV: &str = "CSI_DRIVER_TEST_IN_PRIVATE_NS";
const DIR_ENV: &str = "CSI_DRIVER_TEST_DIR";

/// Runs `body(dir)` in a fresh private mount namespace with a scratch
/// directory, or prints why it skips. `name` must be the test function's
/// name. After the child exits (its namespace and mounts are gone), loop
/// devices backed by files under the scratch directory are detached.
pub fn isolated(name: &str, body: impl FnOnce(&Path)) {
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        let dir = PathBuf::from(std::env::var(DIR_ENV).expect("scratch dir"));
        body(&dir);
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP {name}: needs root (mount namespaces, loop devices)");
        return;
    }
    if !Path::new("/dev/loop-control").exists() {
        eprintln!("SKIP {name}: no /dev/loop-control (loop driver missing)");
        return;
    }
    let scratch = tempfile::Builder::new()
        .prefix("csi-driver-test-")
        .tempdir()
        .expect("tempdir");
    let dir = scratch.path().canonicalize().expect("canonical tempdir");
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .env(DIR_ENV, &dir);
    // SAFETY: only async-signal-safe syscalls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
            nix::mount::mount(
                None::<&str>,
                "/",
                None::<&str>,
                nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
                None::<&str>,
            )?;
            Ok(())
        });
    }
    let out = cmd.output().expect("spawn the isolated test");
    // The namespace is gone with the child: its mounts are released, so the
    // loop devices it left (if it failed) can be detached now.
    let leaked = detach_loops_under(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        panic!("isolated test {name} failed:\n--- stdout\n{stdout}\n--- stderr\n{stderr}");
    }
    for note in stderr.lines().filter(|l| l.starts_with("NOTE")) {
        eprintln!("{name}: {note}");
    }
    if !stdout.contains("1 passed") {
        panic!("isolated test {name} did not run:\n{stdout}\n{stderr}");
    }
    assert!(leaked.is_empty(), "{name} leaked loop devices: {leaked:?}");
}

/// Loop devices (N, backing file) whose backing file is under `dir`.
pub fn loops_under(dir: &Path) -> Vec<(u32, PathBuf)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/sys/block").unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        let Some(n) = name
            .strip_prefix("loop")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Ok(f) = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")) {
            let f = PathBuf::from(f.trim_end_matches('\n'));
            if f.starts_with(dir) {
                out.push((n, f));
            }
        }
    }
    out
}

/// Detaches every loop device backed by a file under `dir`; returns them.
pub fn detach_loops_under(dir: &Path) -> Vec<(u32, PathBuf)> {
    let found = loops_under(dir);
    for (n, _) in &found {
        let _ = Command::new("losetup")
            .arg("-d")
            .arg(format!("/dev/loop{n}"))
            .status();
    }
    found
}

/// Mount points (from /proc/self/mountinfo) under `dir`.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// Whether `path` is a mount point.
pub fn is_mount(path: &Path) -> bool {
    let p = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    mounts_under(Path::new("/")).contains(&p)
}

/// A running driver; killed (and its mounts and loop devices under the
/// scratch dir cleaned up) on drop.
pub struct Driver {
    pub dir: PathBuf,
    pub state: PathBuf,
    pub socket: PathBuf,
    pub args: Vec<String>,
    pub child: Option<Child>,
}

pub fn driver_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_volmgr-csi-driver"))
}

impl Driver {
    /// Starts the driver with its state in `dir/state`, socket `dir/csi.sock`.
    pub fn start(dir: &Path, extra: &[&str]) -> Self {
        let state = dir.join("state");
        let socket = dir.join("csi.sock");
        let mut d = Self {
            dir: dir.to_path_buf(),
            state,
            socket,
            args: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        d.spawn();
        d
    }

    /// (Re)starts the process.
    pub fn spawn(&mut self) {
        std::fs::create_dir_all(&self.state).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("driver.log"))
            .unwrap();
        let child = Command::new(driver_bin())
            .arg("--endpoint")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--node-id")
            .arg("test-node")
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// Waits for the process to exit by itself; its exit status code.
    pub fn wait_exit(&mut self) -> Option<i32> {
        let mut c = self.child.take().expect("driver running");
        c.wait().unwrap().code()
    }

    /// SIGKILLs the process.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The driver's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("driver.log")).unwrap_or_default()
    }

    /// Writes faults.json atomically.
    pub fn set_faults(&self, json: &str) {
        let tmp = self.state.join("faults.json.test-tmp");
        std::fs::write(&tmp, json).unwrap();
        std::fs::rename(&tmp, self.state.join("faults.json")).unwrap();
    }

    /// faults.json as it is now.
    pub fn faults(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.state.join("faults.json")).unwrap()).unwrap()
    }

    /// The call journal.
    pub fn calls(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.state.join("calls.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.kill();
        // Unmount what is left under the scratch dir (deepest first), then
        // detach the loop devices, so a failing test leaks nothing.
        let mut ms = mounts_under(&self.dir);
        ms.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for m in ms {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
        }
        detach_loops_under(&self.dir);
    }
}

/// Connects a channel to a Unix socket.
pub async fn channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
}

/// Clients for the CSI services.
#[derive(Clone)]
pub struct Clients {
    pub identity: csi::identity_client::IdentityClient<Channel>,
    pub node: csi::node_client::NodeClient<Channel>,
}

/// Connects to a (re)starting driver: retries until Probe answers (gives up
/// after a minute with the driver's log).
pub async fn connect(d: &Driver) -> Clients {
    for _ in 0..6000 {
        if let Ok(ch) = channel(&d.socket).await {
            let mut identity = csi::identity_client::IdentityClient::new(ch.clone());
            if identity.probe(csi::ProbeRequest {}).await.is_ok() {
                return Clients {
                    identity,
                    node: csi::node_client::NodeClient::new(ch),
                };
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("driver never answered Probe; log:\n{}", d.log());
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A mount capability with the driver's default file system (ext4).
pub fn mount_cap(flags: &[&str]) -> csi::VolumeCapability {
    mount_cap_fs("", flags)
}

/// A mount capability with a file system type.
pub fn mount_cap_fs(fs_type: &str, flags: &[&str]) -> csi::VolumeCapability {
    use csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.to_string(),
            mount_flags: flags.iter().map(|s| s.to_string()).collect(),
            volume_mount_group: String::new(),
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// A block capability.
pub fn block_cap() -> csi::VolumeCapability {
    use csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, BlockVolume};
    csi::VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

pub fn stage_req(
    id: &str,
    staging: &Path,
    cap: csi::VolumeCapability,
    size: Option<&str>,
) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: id.to_string(),
        staging_target_path: staging.to_string_lossy().into_owned(),
        volume_capability: Some(cap),
        volume_context: size
            .map(|s| [("size".to_string(), s.to_string())].into())
            .unwrap_or_default(),
        ..Default::default()
    }
}

pub fn publish_req(
    id: &str,
    staging: &Path,
    target: &Path,
    cap: csi::VolumeCapability,
    readonly: bool,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: id.to_string(),
        staging_target_path: staging.to_string_lossy().into_owned(),
        target_path: target.to_string_lossy().into_owned(),
        volume_capability: Some(cap),
        readonly,
        ..Default::default()
    }
}

pub fn unpublish_req(id: &str, target: &Path) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: id.to_string(),
        target_path: target.to_string_lossy().into_owned(),
    }
}

pub fn unstage_req(id: &str, staging: &Path) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest {
        volume_id: id.to_string(),
        staging_target_path: staging.to_string_lossy().into_owned(),
    }
}

/// Asserts that nothing is mounted under `dir` and no loop device is backed
/// by a file under it.
pub fn assert_clean(dir: &Path) {
    let m = mounts_under(dir);
    assert!(m.is_empty(), "leaked mounts: {m:?}");
    let l = loops_under(dir);
    assert!(l.is_empty(), "leaked loop devices: {l:?}");
}

/// Whether this process has CAP_SYS_RESOURCE (online ext4 resize needs it;
/// some containers drop it).
pub fn has_cap_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    // CAP_SYS_RESOURCE is capability 24 (linux/capability.h).
    eff & (1 << 24) != 0
}
