//! A real kubelet for end-to-end tests: the stock `kubelet` built from the
//! `k8s.io/kubernetes` module (`scripts/kube-binaries.sh`, the same version
//! and cache as [`super::real::RealApiServer`]), with `fake-cri`
//! (`k8s.io/cri-client`'s fake runtime on a unix socket, every container
//! given a log path) as its container runtime, registered as a node of a
//! [`RealApiServer`] with the node's own client certificate.
//!
//! **Sandboxed.** A kubelet deletes host files when it is not: its
//! container-log garbage collection, given containers without a log path,
//! globs its working directory (measured: run from `/` it deleted `/bin`),
//! and it hard-codes `/var/lib/kubelet`, `/var/log/pods` and
//! `/var/log/containers` whatever `--root-dir` says. So
//! [`RealKubelet::start`] refuses to run outside a private mount namespace
//! (one whose `/` does not propagate to the host's), mounts a tmpfs over
//! those three paths first (over `/var/lib` or `/var/log` where they do not
//! exist, so nothing is created on the host), runs the kubelet from an
//! empty working directory with everything else under the test's
//! directory, and kills it and the runtime by pid when dropped (and with
//! `PR_SET_PDEATHSIG` if the test dies first), then detaches every mount
//! under its root so that removing the test's directory never walks into
//! a volume.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::real::{free_port, tail, RealApiServer};

/// A stock kubelet with the fake runtime, stopped (by pid) when dropped.
pub struct RealKubelet {
    kubelet: Option<Child>,
    cri: Child,
    /// The kubelet binary run: the stock one in `bin`, or a fork.
    kubelet_bin: PathBuf,
    /// Environment the kubelet process gets besides the test's.
    env: Vec<(String, String)>,
    dir: PathBuf,
    /// The kubelet's `--root-dir`.
    pub root: PathBuf,
    /// The node's name (`--hostname-override`).
    pub node: String,
    kubeconfig: PathBuf,
    starts: u32,
}

impl RealKubelet {
    /// Starts the fake runtime and the kubelet of node `node` with its root
    /// at `root`, its other files (configuration, certificates, logs, the
    /// runtime's socket, the working directory) under `dir`; both must be
    /// in the test's temporary directory. Panics outside a private mount
    /// namespace.
    pub fn start(server: &RealApiServer, node: &str, root: &Path, dir: &Path) -> Self {
        let stock = server.bin().join("kubelet");
        Self::start_binary(server, node, root, dir, &stock, &[])
    }

    /// As [`Self::start`], running the kubelet binary `kubelet` (a fork,
    /// such as the one `scripts/kubelet-fork.sh` builds) with `env` added
    /// to its environment.
    pub fn start_binary(
        server: &RealApiServer,
        node: &str,
        root: &Path,
        dir: &Path,
        kubelet: &Path,
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_with_runtime(server, node, root, dir, kubelet, env, &[])
    }

    /// As [`Self::start_binary`], with `runtime_args` added to `fake-cri`'s
    /// command line (`--stop-delay=5s`: a StopContainer takes 5 s; it logs
    /// every stopped container, see [`Self::runtime_log`]).
    pub fn start_with_runtime(
        server: &RealApiServer,
        node: &str,
        root: &Path,
        dir: &Path,
        kubelet: &Path,
        env: &[(&str, &str)],
        runtime_args: &[&str],
    ) -> Self {
        sandbox();
        for d in [root, dir] {
            assert!(
                d.starts_with(std::env::temp_dir()) && d != std::env::temp_dir(),
                "the kubelet's directories must be in the temporary directory: {}",
                d.display()
            );
        }
        let dir = dir.join("kubelet");
        for sub in ["work", "pod-logs", "volume-plugins", "static-pods", "certs"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        std::fs::create_dir_all(root).unwrap();
        let bin = server.bin().to_path_buf();
        let cri = start_cri(&bin, &dir, runtime_args);
        write_config(&dir, server);
        let mut k = Self {
            kubelet: None,
            cri,
            kubelet_bin: kubelet.to_path_buf(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            dir,
            root: root.to_path_buf(),
            node: node.to_string(),
            kubeconfig: server.node_kubeconfig(node),
            starts: 0,
        };
        k.spawn_kubelet();
        k
    }

    /// Starts the kubelet process (again).
    fn spawn_kubelet(&mut self) {
        let d = &self.dir;
        let mut cmd = Command::new(&self.kubelet_bin);
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd.arg(format!("--config={}", d.join("config.yaml").display()))
            .arg(format!("--root-dir={}", self.root.display()))
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--hostname-override={}", self.node))
            .arg("--node-ip=127.0.0.1")
            .arg(format!("--cert-dir={}", d.join("certs").display()))
            .arg("--v=2")
            // Its garbage collection must find nothing but this empty
            // directory, whatever it globs.
            .current_dir(d.join("work"));
        let log = d.join(format!("kubelet-{}.log", self.starts));
        self.starts += 1;
        self.kubelet = Some(super::real::spawn(&mut cmd, &log));
    }

    /// The kubelet's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.kubelet.as_ref().map(Child::id)
    }

    /// Kills the kubelet (SIGKILL, by pid): its mounts stay, as on a node
    /// whose kubelet crashed. The runtime keeps running.
    pub fn kill(&mut self) {
        if let Some(mut k) = self.kubelet.take() {
            let _ = k.kill();
            let _ = k.wait();
        }
    }

    /// Starts the kubelet again after [`Self::kill`].
    pub fn restart(&mut self) {
        self.kill();
        self.spawn_kubelet();
    }

    /// The kubelet's logs so far, every start's.
    pub fn log(&self) -> String {
        (0..self.starts)
            .map(|n| {
                std::fs::read_to_string(self.dir.join(format!("kubelet-{n}.log")))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The container runtime's (`fake-cri`'s) log so far: the containers
    /// and sandboxes it stopped (`fake-cri: stopped container ID pod UID
    /// unix_ns=N`).
    pub fn runtime_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("fake-cri.log")).unwrap_or_default()
    }

    /// Waits up to `secs` for `cond`, panicking with the kubelet's log tail.
    pub fn wait_for(&self, secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !cond() {
            if Instant::now() > deadline {
                panic!(
                    "gave up waiting for: {what}\n--- kubelet log tail\n{}",
                    tail(&self.log(), 80)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until the Node is `Ready` in the API server.
    pub fn wait_ready(&self, server: &RealApiServer) {
        let node = self.node.clone();
        self.wait_for(120, "the node Ready", || {
            let out = server
                .kubectl()
                .args(["get", "node", &node, "-o"])
                .arg("jsonpath={.status.conditions[?(@.type==\"Ready\")].status}")
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim() == "True"
        });
    }
}

impl Drop for RealKubelet {
    fn drop(&mut self) {
        self.kill();
        let _ = self.cri.kill();
        let _ = self.cri.wait();
        detach_mounts_below(&self.root);
    }
}

/// Detaches every mount at or below `root` (in this namespace), deepest
/// first, so that removing the directory never walks into a volume.
fn detach_mounts_below(root: &Path) {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape(p)))
        .filter(|p| p.starts_with(root))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        // SAFETY: a valid C string; detaching a mount of this namespace.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// A mountinfo path with its octal escapes (`\040`) decoded.
fn unescape(p: &str) -> String {
    let b = p.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            if let Ok(v) = u8::from_str_radix(&p[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The paths the kubelet uses whatever its flags say.
const HARD_CODED: [&str; 3] = ["/var/lib/kubelet", "/var/log/pods", "/var/log/containers"];

/// Checks this process is in a private mount namespace and covers the
/// kubelet's hard-coded paths with tmpfs there (once per process).
fn sandbox() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        // Not the namespace of the process that started this one (the
        // test harness, in the host's) nor, where it can be read, init's.
        let own = std::fs::read_link("/proc/self/ns/mnt").unwrap();
        // SAFETY: getppid cannot fail.
        let parent = format!("/proc/{}/ns/mnt", unsafe { libc::getppid() });
        for other in [parent.as_str(), "/proc/1/ns/mnt"] {
            let theirs = std::fs::read_link(other);
            assert!(
                theirs.as_ref().is_ok_and(|t| *t != own)
                    || (other == "/proc/1/ns/mnt" && theirs.is_err()),
                "refusing to run a kubelet outside a private mount namespace ({other}: {theirs:?})"
            );
        }
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let slash = table
            .lines()
            .find(|l| l.split(' ').nth(4) == Some("/"))
            .unwrap();
        let optional: Vec<&str> = slash.split(' ').skip(6).take_while(|f| *f != "-").collect();
        assert!(
            !optional.iter().any(|f| f.starts_with("shared:")),
            "refusing to run a kubelet: / propagates to its peers ({slash})"
        );
        let mut covered: Vec<PathBuf> = Vec::new();
        for p in HARD_CODED.map(Path::new) {
            if covered.iter().any(|c| p.starts_with(c)) {
                std::fs::create_dir_all(p).unwrap();
            } else if p.exists() {
                mount_tmpfs(p);
                covered.push(p.to_path_buf());
            } else {
                let parent = p.parent().unwrap();
                mount_tmpfs(parent);
                covered.push(parent.to_path_buf());
                std::fs::create_dir_all(p).unwrap();
            }
            assert_eq!(
                fs_type(p),
                libc::TMPFS_MAGIC,
                "{} is not a tmpfs",
                p.display()
            );
        }
    });
}

/// Mounts a tmpfs on `p` (in this namespace).
fn mount_tmpfs(p: &Path) {
    let target = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let fstype = c"tmpfs";
    // SAFETY: valid C strings; a new tmpfs in this private namespace.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    assert_eq!(
        rc,
        0,
        "mount tmpfs on {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

/// `statfs(p).f_type`.
fn fs_type(p: &Path) -> libc::c_long {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a zeroed statfs is a valid out-parameter.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out-pointer.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut s) };
    assert_eq!(rc, 0, "statfs {}", p.display());
    s.f_type as libc::c_long
}

/// Starts `fake-cri` on `dir/cri.sock` with `args` and waits for its socket.
fn start_cri(bin: &Path, dir: &Path, args: &[&str]) -> Child {
    let sock = dir.join("cri.sock");
    let mut cmd = Command::new(bin.join("fake-cri"));
    cmd.arg(format!("--endpoint={}", sock.display()))
        .args(args)
        .current_dir(dir.join("work"));
    let child = super::real::spawn(&mut cmd, &dir.join("fake-cri.log"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "fake-cri never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// Writes `dir/config.yaml`, the KubeletConfiguration: the fake runtime,
/// no cgroups of its own, no eviction or image GC to speak of, x509
/// clients of the cluster CA, loopback ports.
fn write_config(dir: &Path, server: &RealApiServer) {
    let sock = format!("unix://{}", dir.join("cri.sock").display());
    let config = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: {sock}
imageServiceEndpoint: {sock}
podLogsDir: {logs}
volumePluginDir: {plugins}
staticPodPath: {static_pods}
address: 127.0.0.1
port: {port}
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
readOnlyPort: 0
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: AlwaysAllow}}
resolvConf: \"\"
evictionHard: {{memory.available: 1Mi}}
mergeDefaultEvictionSettings: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
",
        logs = dir.join("pod-logs").display(),
        plugins = dir.join("volume-plugins").display(),
        static_pods = dir.join("static-pods").display(),
        port = free_port(),
        healthz = free_port(),
        ca = server.dir().join("ca.crt").display(),
    );
    std::fs::write(dir.join("config.yaml"), config).unwrap();
}

/// Starts `fake-cri` alone (no kubelet) on `dir/cri.sock`, from the empty
/// working directory `dir/work`: a real CRI runtime for tests that drive
/// it themselves (its sandboxes and containers live in its memory).
/// Killed by pid when the returned child is, or when the test dies.
pub fn fake_cri(server: &RealApiServer, dir: &Path) -> Child {
    std::fs::create_dir_all(dir.join("work")).unwrap();
    start_cri(server.bin(), dir, &[])
}
