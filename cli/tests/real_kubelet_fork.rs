//! The kubelet fork whose volume manager is libvolmgr
//! (`ffi/go/kubeletvm`, built by `scripts/kubelet-fork.sh`) against a REAL
//! API server, with the fake container runtime and the in-repo CSI driver
//! (registered through `ROOT/plugins_registry`, seen by both the kubelet's
//! plugin manager and volmgr's plugin watcher), each test in a private
//! mount namespace with its own server and kubelet (`support/kubelet_node.rs`).
//! `volmgr trace --json` (eBPF) runs beside it and says which process and
//! thread made each mount call: libvolmgr's threads are named `volmgr-rt`,
//! the kubelet's Go threads `kubelet`, a mount helper `mount`. (The
//! observer's per-volume timelines cannot be used for this: libvolmgr
//! mounts through `/proc/self/fd/N`, which they do not place by path.)
//!
//! What is checked:
//! 1. a pod with every volume kind (those of `pod_with_every_kind` and a
//!    CSI PersistentVolume whose CSIDriver says `attachRequired: false`)
//!    reaches `Running` with its volumes in the mount table, every mount
//!    call under the pod's directory made by the fork's process on a
//!    libvolmgr thread (`volmgr-rt`) or by the CSI driver, none by a
//!    `kubelet` thread (the kubelet's own volume code);
//! 2. `kill -9` of the fork keeps every mount (same mount ids), and the
//!    restarted fork adopts them: the pod stays Running, the same mount
//!    ids, no mount call on its paths after the restart, while a pod
//!    created after the restart is mounted;
//! 3. a deleted pod's volumes are torn down only after the runtime stopped
//!    its containers (`fake-cri --stop-delay`): no NodeUnpublishVolume and
//!    no unmount while a container runs, then unpublish, then unstage;
//! 4. an attachable CSI volume (a VolumeAttachment and the Node's
//!    `volumesAttached`, set as the cluster admin) is listed in the Node's
//!    `status.volumesInUse` (volmgr through the kubelet's
//!    `GetVolumesInUse`) while its pod runs and dropped once it is gone;
//! 5. a pod whose claim does not exist gets the kubelet's `FailedMount`
//!    text (`unmounted volumes=[...`).
//!
//! The fork is found through `VOLMGR_KUBELET_FORK` (the directory that
//! `scripts/kubelet-fork.sh` prints); without it the tests skip outside CI
//! and fail under `CI`. The eBPF tracer is needed too (root, BPF).

// Test-only helpers: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/csi_driver.rs"]
mod csi_driver;
#[path = "support/kubelet_node.rs"]
mod kubelet_node;
mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_driver::Driver;
use kubelet_node::*;
use support::pod_yaml::PodYaml;
use support::{isolated, volmgr_bin, Env};
use volmgr_kube::testing::RealKubelet;

/// The test CSI driver's name.
const DRIVER: &str = "loop.csi.volmgr.dev";
/// Where the fork's directory is given.
const FORK_ENV: &str = "VOLMGR_KUBELET_FORK";
/// The thread name of libvolmgr's threads (`ffi/src/handle.rs`).
const VOLMGR_THREAD: &str = "volmgr-rt";

/// The fork's `kubelet`: `None` (with the reason) outside CI when it is not
/// given or the eBPF tracer cannot load; a failure under `CI`.
fn fork() -> Option<PathBuf> {
    let reason = match std::env::var_os(FORK_ENV) {
        None => format!("{FORK_ENV} is not set (the directory scripts/kubelet-fork.sh prints)"),
        Some(dir) => {
            let bin = PathBuf::from(dir).join("kubelet");
            match volmgr::ebpf::EbpfTracer::load(volmgr::ebpf::TraceFilter { mnt_ns: None }) {
                _ if !bin.is_file() => format!("{} is not a file", bin.display()),
                Ok(_) => return Some(bin),
                Err(e) => format!("the eBPF tracer cannot load: {e}"),
            }
        }
    };
    if std::env::var_os("CI").is_some() {
        panic!("the kubelet fork tests must run in CI: {reason}");
    }
    eprintln!("SKIP: {reason}");
    None
}

/// A node whose kubelet is the fork (`VOLMGR_TRACER=ebpf`), with the test
/// CSI driver registered through `ROOT/plugins_registry` and `fake-cri`
/// given `runtime_args`; `None` where the tests skip.
fn fork_node(runtime_args: &[&str]) -> Option<(Node, Driver)> {
    let kubelet = fork()?;
    let (server, env) = cluster()?;
    let mut driver = Driver::new(&env, DRIVER);
    driver.register_in(env.root.join("plugins_registry"));
    driver.start();
    let k = RealKubelet::start_with_runtime(
        &server,
        NODE,
        &env.root,
        env.dir.path(),
        &kubelet,
        &[("VOLMGR_TRACER", "ebpf"), ("RUST_LOG", "volmgr=debug")],
        runtime_args,
    );
    k.wait_ready(&server);
    let state = env.dir.path().join("state");
    let node = Node {
        observer: None,
        kubelet: k,
        server,
        state,
        env,
    };
    Some((node, driver))
}

/// The CSIDriver `DRIVER`, the CSI PersistentVolume `pv-NAME` (handle
/// `vol-NAME`, ext4 on a loop device) and its claim `NAME`.
fn csi_objects(name: &str, attach_required: bool) -> String {
    format!(
        "apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {{name: {DRIVER}}}
spec: {{attachRequired: {attach_required}, podInfoOnMount: false}}
---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: pv-{name}}}
spec:
  capacity: {{storage: 64Mi}}
  accessModes: [ReadWriteOnce]
  storageClassName: ''
  csi: {{driver: {DRIVER}, volumeHandle: vol-{name}, fsType: ext4, volumeAttributes: {{size: 64Mi}}}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {name}, namespace: default}}
spec:
  accessModes: [ReadWriteOnce]
  volumeName: pv-{name}
  storageClassName: ''
  resources: {{requests: {{storage: 64Mi}}}}
"
    )
}

/// Creates the CSI objects of claim `name` and binds it.
fn create_csi_claim(node: &Node, name: &str, attach_required: bool) {
    node.server.apply(&csi_objects(name, attach_required));
    node.server.bind("default", name, &format!("pv-{name}"));
}

/// Pod `name` mounting claim `claim` at /data.
fn pod_with_claim(name: &str, claim: &str) -> String {
    PodYaml::new(name, NODE).claim("data", claim).build()
}

/// `pod_with_every_kind` with the CSI claim `claim` as volume `data` too.
fn pod_with_every_kind_and_csi(name: &str, env: &Env, claim: &str) -> String {
    every_kind(name, env, "").claim("data", claim).build()
}

/// The pod's mounts (at or below its directory): (mount point, mount id),
/// in the mount table's order (a mount stacked on another comes later).
fn mount_ids(node: &Node, uid: &str) -> Vec<(PathBuf, u32)> {
    let dir = node.pod_dir(uid);
    volmgr::sys::mountinfo::read_self()
        .unwrap()
        .into_iter()
        .filter(|m| m.mount_point.starts_with(&dir))
        .map(|m| (m.mount_point, m.mount_id))
        .collect()
}

/// The fstype of the mount at `path`, if one is there.
fn fstype_at(path: &Path) -> Option<String> {
    volmgr::sys::mountinfo::read_self()
        .unwrap()
        .into_iter()
        .rev()
        .find(|m| m.mount_point == path)
        .map(|m| m.fstype)
}

/// The process id of the CSI driver (the one process named like it).
fn driver_pid(driver: &Driver) -> u32 {
    let sock = driver.socket().display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&sock))
        })
        .expect("the CSI driver's process")
}

/// Messages of the events recorded on pod `name`.
fn event_messages(node: &Node, name: &str) -> Vec<String> {
    node.kubectl(&[
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={name}"),
        "-o",
        "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
    ])
    .lines()
    .map(str::to_string)
    .collect()
}

/// The Node's `status.volumesInUse`.
fn volumes_in_use(node: &Node) -> Vec<String> {
    node.kubectl(&[
        "get",
        "node",
        NODE,
        "-o",
        "jsonpath={range .status.volumesInUse[*]}{@}{\"\\n\"}{end}",
    ])
    .lines()
    .map(str::to_string)
    .collect()
}

/// The fork's log lines from or about volmgr (its adapter's, libvolmgr's),
/// for a failure's message.
fn volmgr_log_lines(node: &Node) -> String {
    let log = node.kubelet.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("volmgr") || l.contains("mount volumes"))
        .collect();
    lines[lines.len().saturating_sub(80)..].join("\n")
}

/// The kubelet's unique name of CSI volume `vol-NAME`.
fn csi_volume_name(name: &str) -> String {
    format!("kubernetes.io/csi/{DRIVER}^vol-{name}")
}

/// `volmgr trace --json` (every mount-family syscall of the test's mount
/// namespace, with its process, thread name and arguments) in the
/// background, stopped (SIGTERM, by pid) when dropped. libvolmgr mounts on
/// `/proc/self/fd/N` (a descriptor of the target opened safely), which the
/// observer's per-volume timelines cannot place by path: the raw events
/// are read here instead.
struct Trace {
    child: std::process::Child,
    out: PathBuf,
}

impl Trace {
    fn start(env: &Env) -> Self {
        mount_tracefs();
        let out = env.dir.path().join("trace.jsonl");
        let err = env.dir.path().join("trace.log");
        let child = std::process::Command::new(volmgr_bin())
            .args(["trace", "--json"])
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !std::fs::read_to_string(&err)
            .unwrap()
            .contains("tracing mount syscalls")
        {
            assert!(
                Instant::now() < deadline,
                "volmgr trace: {}",
                std::fs::read_to_string(&err).unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, out }
    }

    /// The events so far.
    fn events(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.out)
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

/// A successful `mount(2)` of a tmpfs.
fn is_tmpfs_mount(e: &serde_json::Value) -> bool {
    e["syscall"] == "mount" && e["fstype"] == "tmpfs" && e["ret"] == 0
}

/// Whether traced call `e` names a path under `dir` (target or source).
fn touches(e: &serde_json::Value, dir: &Path) -> bool {
    ["target", "source"]
        .iter()
        .any(|k| e[k].as_str().is_some_and(|p| Path::new(p).starts_with(dir)))
}

/// Checks that volmgr in the fork (pid `fork`, thread [`VOLMGR_THREAD`])
/// or the CSI driver (pid `driver`) made every traced call on the pods'
/// paths or through a descriptor (`/proc/self/fd/N`), none a `kubelet`
/// thread or a mount helper; the successful tmpfs mounts by volmgr.
fn volmgr_tmpfs_mounts(events: &[serde_json::Value], pods: &Path, fork: u32, driver: u32) -> usize {
    let by_volmgr = |e: &serde_json::Value| e["pid"] == fork && e["comm"] == VOLMGR_THREAD;
    for e in events {
        let via_fd = e["target"]
            .as_str()
            .is_some_and(|t| t.starts_with("/proc/self/fd/"));
        if touches(e, pods) || via_fd {
            assert!(
                by_volmgr(e) || e["pid"] == driver,
                "a call on a pod's volume by neither volmgr in the fork (pid {fork}) nor the driver (pid {driver}): {e:#}"
            );
        }
        if e["pid"] == fork && e["comm"] != VOLMGR_THREAD {
            assert!(!touches(e, pods), "the kubelet's own call: {e:#}");
        }
    }
    let tmpfs_by_others = events
        .iter()
        .filter(|e| is_tmpfs_mount(e) && !by_volmgr(e))
        .collect::<Vec<_>>();
    assert_eq!(tmpfs_by_others, Vec::<&serde_json::Value>::new());
    events
        .iter()
        .filter(|e| is_tmpfs_mount(e) && by_volmgr(e))
        .count()
}

/// The tmpfs volumes of `pod_with_every_kind`: Memory emptyDir, secret,
/// projected.
const TMPFS_VOLUMES: [&str; 3] = [
    "kubernetes.io~empty-dir/cache",
    "kubernetes.io~secret/creds",
    "kubernetes.io~projected/token",
];

/// 1. Every volume kind mounted by volmgr, none by the kubelet's own
///    code: the pod Running, its tmpfs volumes and the CSI volume in the
///    mount table; every traced mount call on its paths (or through a
///    descriptor) made by the fork's process on a libvolmgr thread or by
///    the CSI driver (its stage and publish), none by a `kubelet` thread
///    or a `mount` helper; as many tmpfs mounts by volmgr as tmpfs volumes.
///    (Before the adapter made the root shared before volmgr opened it,
///    the tmpfs volumes were mounted under the kubelet's later bind of its
///    root onto itself: in the mount table, yet their paths showed the
///    empty directories.)
#[test]
fn every_volume_kind_is_mounted_by_volmgr_in_the_fork() {
    isolated("every_volume_kind_is_mounted_by_volmgr_in_the_fork", || {
        let Some((node, driver)) = fork_node(&[]) else {
            return;
        };
        let trace = Trace::start(&node.env);
        create_csi_claim(&node, "data", false);
        let pod = pod_with_every_kind_and_csi("app", &node.env, "data");
        let uid = node.run_pod("app", &pod, "Running");
        let kubelet_pid = node.kubelet.pid().unwrap();
        let vols = node.pod_dir(&uid).join("volumes");
        let csi = vols.join("kubernetes.io~csi/pv-data/mount");
        for dir in TMPFS_VOLUMES {
            assert_eq!(
                fstype_at(&vols.join(dir)).as_deref(),
                Some("tmpfs"),
                "{dir}"
            );
            // Through its path too: what a container's runtime binds.
            assert_eq!(
                nix::sys::statfs::statfs(&vols.join(dir))
                    .unwrap()
                    .filesystem_type(),
                nix::sys::statfs::TMPFS_MAGIC,
                "{dir} is no tmpfs through its path"
            );
        }
        assert_eq!(fstype_at(&csi).as_deref(), Some("ext4"));
        assert_eq!(driver.calls_of("NodeStageVolume").len(), 1);
        assert_eq!(driver.calls_of("NodePublishVolume").len(), 1);
        let driver_pid = driver_pid(&driver);
        let csi_target = csi.display().to_string();
        node.wait(60, "the pod's mounts traced", || {
            let events = trace.events();
            events.iter().filter(|e| is_tmpfs_mount(e)).count() >= TMPFS_VOLUMES.len()
                && events
                    .iter()
                    .any(|e| e["target"] == csi_target.as_str() && e["ret"] == 0)
        });
        let events = trace.events();
        let pods = node.env.root.join("pods");
        assert_eq!(
            volmgr_tmpfs_mounts(&events, &pods, kubelet_pid, driver_pid),
            TMPFS_VOLUMES.len(),
            "{events:#?}"
        );
        let publish: Vec<_> = events
            .iter()
            .filter(|e| e["target"] == csi_target.as_str() && e["ret"] == 0)
            .collect();
        assert!(
            !publish.is_empty() && publish.iter().all(|e| e["pid"] == driver_pid),
            "{publish:#?}"
        );
    });
}

/// 2. `kill -9` of the fork keeps every mount; the restarted fork adopts
///    them: the same mount ids, no NodePublishVolume again, and, while it
///    mounts the volumes of a pod created after the restart, no more tmpfs
///    mounts than that pod's. (Before the root was made shared first, the
///    restarted fork mounted a second tmpfs over each of the pod's.)
#[test]
fn killed_fork_keeps_and_adopts_every_mount() {
    isolated("killed_fork_keeps_and_adopts_every_mount", || {
        let Some((mut node, driver)) = fork_node(&[]) else {
            return;
        };
        let trace = Trace::start(&node.env);
        create_csi_claim(&node, "data", false);
        let pod = pod_with_every_kind_and_csi("app", &node.env, "data");
        let uid = node.run_pod("app", &pod, "Running");
        let before = mount_ids(&node, &uid);
        assert!(before.len() >= 4, "{before:#?}");
        node.kubelet.kill();
        assert_eq!(mount_ids(&node, &uid), before, "the mounts after kill -9");
        let seen = trace.events().len();
        node.kubelet.restart();
        let pid = node.kubelet.pid().unwrap();
        // A pod created after the restart is mounted: the restarted fork's
        // volume manager runs, its sources ready.
        let late = node.run_pod(
            "late",
            &pod_with_every_kind("late", &node.env, ""),
            "Running",
        );
        assert_eq!(mount_ids(&node, &late).len(), TMPFS_VOLUMES.len());
        node.wait(60, "app Running", || node.phase("app") == "Running");
        let events = trace.events().split_off(seen);
        let mounts: Vec<_> = events
            .iter()
            .filter(|e| e["syscall"] == "mount" || e["syscall"] == "umount2")
            .map(|e| format!("{} {} {} = {}", e["pid"], e["comm"], e["call"], e["ret"]))
            .collect();
        assert_eq!(
            mount_ids(&node, &uid),
            before,
            "the mounts after the restart; mount calls since: {mounts:#?}\n{}",
            volmgr_log_lines(&node)
        );
        let pods = node.env.root.join("pods");
        assert_eq!(
            volmgr_tmpfs_mounts(&events, &pods, pid, driver_pid(&driver)),
            TMPFS_VOLUMES.len(),
            "tmpfs mounts after the restart: {events:#?}"
        );
        assert_eq!(driver.calls_of("NodePublishVolume").len(), 1);
        assert_eq!(driver.calls_of("NodeStageVolume").len(), 1);
    });
}

/// The `unix_ns` of fake-cri's log lines `fake-cri: stopped WHAT ID pod UID`.
fn runtime_stops(node: &Node, what: &str, uid: &str) -> Vec<u128> {
    let prefix = format!("fake-cri: stopped {what} ");
    let pod = format!(" pod {uid} ");
    node.kubelet
        .runtime_log()
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(&pod))
        .filter_map(|l| l.rsplit_once("unix_ns=")?.1.parse().ok())
        .collect()
}

/// 3. A deleted pod's volumes are torn down only after the runtime stopped
///    its containers: while `fake-cri` takes 5 s to stop the container
///    the CSI volume stays published and mounted; its NodeUnpublishVolume
///    starts after the container stopped, and NodeUnstageVolume after it.
#[test]
fn deleted_pod_is_torn_down_after_its_containers_stopped() {
    isolated(
        "deleted_pod_is_torn_down_after_its_containers_stopped",
        || {
            let Some((node, driver)) = fork_node(&["--stop-delay=5s"]) else {
                return;
            };
            create_csi_claim(&node, "data", false);
            let uid = node.run_pod("app", &pod_with_claim("app", "data"), "Running");
            let target = node
                .pod_dir(&uid)
                .join("volumes/kubernetes.io~csi/pv-data/mount");
            assert_eq!(fstype_at(&target).as_deref(), Some("ext4"));
            node.kubectl(&["delete", "pod", "app", "--wait=false"]);
            let mut polls_while_running = 0;
            let deadline = Instant::now() + Duration::from_secs(120);
            while runtime_stops(&node, "container", &uid).is_empty() {
                assert!(
                    driver.calls_of("NodeUnpublishVolume").is_empty(),
                    "unpublished while the container runs"
                );
                assert_eq!(fstype_at(&target).as_deref(), Some("ext4"));
                polls_while_running += 1;
                assert!(Instant::now() < deadline, "{}", node.kubelet.runtime_log());
                std::thread::sleep(Duration::from_millis(100));
            }
            assert!(polls_while_running > 0);
            node.wait(120, "the volume unstaged", || {
                !driver.calls_of("NodeUnstageVolume").is_empty()
            });
            let stopped = *runtime_stops(&node, "container", &uid)
                .iter()
                .max()
                .unwrap();
            let start = |m: &str| -> u128 {
                let c = driver.calls_of(m);
                assert_eq!(c.len(), 1, "{m}: {c:?}");
                c[0]["start_unix_ns"].as_u64().unwrap().into()
            };
            let (unpublish, unstage) = (start("NodeUnpublishVolume"), start("NodeUnstageVolume"));
            assert!(
                stopped < unpublish && unpublish < unstage,
                "container stopped at {stopped}, unpublish at {unpublish}, unstage at {unstage}"
            );
            node.wait(120, "the pod gone", || node.phase("app").is_empty());
            assert!(node.mounts_below(&node.pod_dir(&uid)).is_empty());
        },
    );
}

/// Marks CSI volume `vol-NAME` attached to the node as the cluster admin
/// (the attach/detach controller and the external attacher do not run):
/// its VolumeAttachment `attached`, and the Node's `volumesAttached`.
fn attach_as_admin(node: &Node, name: &str) {
    let handle = format!("vol-{name}");
    let va = format!(
        "csi-{}",
        volmgr::plugins::csi::handle_hash(&format!("{handle}{DRIVER}{NODE}"))
    );
    node.server.apply(&format!(
        "apiVersion: storage.k8s.io/v1
kind: VolumeAttachment
metadata: {{name: {va}}}
spec: {{attacher: {DRIVER}, nodeName: {NODE}, source: {{persistentVolumeName: pv-{name}}}}}
"
    ));
    node.kubectl(&[
        "patch",
        "volumeattachment",
        &va,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"attached":true}}"#,
    ]);
    node.kubectl(&[
        "patch",
        "node",
        NODE,
        "--subresource=status",
        "--type=merge",
        "-p",
        &format!(
            r#"{{"status":{{"volumesAttached":[{{"name":"{}","devicePath":""}}]}}}}"#,
            csi_volume_name(name)
        ),
    ]);
}

/// 4. An attachable CSI volume is in the Node's `status.volumesInUse`
///    (from volmgr through `GetVolumesInUse`) as soon as its pod is on the
///    node, before its VolumeAttachment exists, while the pod runs, and is
///    dropped once the pod is gone; its `WaitForAttachAndMount` waits for
///    the attachment. (Before, the adapter listed only what volmgr had
///    converted: nothing until the VolumeAttachment existed; and the wait
///    ended at once with `failed to process volumes=[data]: waiting for
///    VolumeAttachment`, a FailedMount event.)
#[test]
fn volumes_in_use_follow_the_pod() {
    isolated("volumes_in_use_follow_the_pod", || {
        let Some((node, driver)) = fork_node(&[]) else {
            return;
        };
        create_csi_claim(&node, "att", true);
        let name = csi_volume_name("att");
        node.server.apply(&pod_with_claim("app", "att"));
        // In use before it is attached, as the kubelet reports it (the
        // attach/detach controller must not detach it while it mounts).
        node.wait(120, "the volume in volumesInUse", || {
            volumes_in_use(&node).contains(&name)
        });
        assert!(driver.calls_of("NodeStageVolume").is_empty());
        attach_as_admin(&node, "att");
        node.wait(120, "pod app Running", || node.phase("app") == "Running");
        let uid = node.uid("app");
        let target = node
            .pod_dir(&uid)
            .join("volumes/kubernetes.io~csi/pv-att/mount");
        assert_eq!(fstype_at(&target).as_deref(), Some("ext4"));
        assert_eq!(volumes_in_use(&node), vec![name.clone()]);
        // The wait waited for the attachment, as the kubelet's does: it did
        // not end at once as if the volume were the pod's error.
        let failed: Vec<String> = event_messages(&node, "app")
            .into_iter()
            .filter(|m| m.contains("failed to process volumes=[data]"))
            .collect();
        assert_eq!(failed, Vec::<String>::new());
        node.kubectl(&["delete", "pod", "app", "--wait=false"]);
        node.wait(120, "the pod gone", || node.phase("app").is_empty());
        node.wait(120, "the volume out of volumesInUse", || {
            !volumes_in_use(&node).contains(&name)
        });
        assert_eq!(driver.calls_of("NodeUnstageVolume").len(), 1);
    });
}

/// 5. A pod whose claim does not exist: the fork's `FailedMount` event
///    has the kubelet's text (`unmounted volumes=[data]`).
#[test]
fn missing_claim_fails_with_the_kubelets_text() {
    isolated("missing_claim_fails_with_the_kubelets_text", || {
        let Some((node, _driver)) = fork_node(&[]) else {
            return;
        };
        node.server.apply(&pod_with_missing_claim("control"));
        let kubelets_text = |m: &String| {
            m.starts_with("FailedMount: Unable to attach or mount volumes: ")
                && m.contains("unmounted volumes=[data]")
        };
        let deadline = Instant::now() + Duration::from_secs(100);
        while !event_messages(&node, "control").iter().any(kubelets_text) {
            assert!(
                Instant::now() < deadline,
                "no FailedMount with the kubelet's text: {:#?}\n{}",
                event_messages(&node, "control"),
                volmgr_log_lines(&node)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(node.phase("control"), "Pending");
    });
}
