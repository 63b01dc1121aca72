//! Test support: run a test body in a private mount namespace (a re-executed
//! child of the test binary, so no thread of the harness ever changes
//! namespace), drive the real `volmgr` binary, and read the real mount table.

#![allow(dead_code)]
// Test-only code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod pod_yaml;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use volmgr::status::Status;
use volmgr::sys::mountinfo::{self, MountInfo};

const CHILD_ENV: &str = "VOLMGR_TEST_IN_PRIVATE_NS";

/// Runs `body` in a fresh private mount namespace, or prints why it skips.
/// `name` must be the test function's name (top level of its file).
pub fn isolated(name: &str, body: impl FnOnce()) {
    isolated_with(name, false, body)
}

/// With this set (scripts/test.sh does, for a second run of the end-to-end
/// suites), every isolated test runs as [`isolated_with`]`(.., true, ..)`.
pub const OLDER_KERNEL_ENV: &str = "VOLMGR_TEST_OLDER_KERNEL";

/// Whether a test asked to run as on an older kernel (`asked`) does, or
/// every test does ([`OLDER_KERNEL_ENV`]).
pub fn runs_as_older_kernel(asked: bool) -> bool {
    asked || std::env::var_os(OLDER_KERNEL_ENV).is_some()
}

/// Like [`isolated`], and with `older_kernel` under a seccomp filter that
/// makes the system calls added since Linux 4.18 (`openat2`, `listmount`,
/// the new mount API, ...) fail with `ENOSYS`, inherited by every process
/// the body starts (the agent included).
pub fn isolated_with(name: &str, older_kernel: bool, body: impl FnOnce()) {
    let older_kernel = runs_as_older_kernel(older_kernel);
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        body();
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP {name}: needs root (CAP_SYS_ADMIN) to create a private mount namespace");
        return;
    }
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    // `--include-ignored`: an `#[ignore]`d test (a benchmark) run with
    // `--ignored` runs its body too.
    cmd.args([
        name,
        "--exact",
        "--nocapture",
        "--test-threads=1",
        "--include-ignored",
    ])
    .env(CHILD_ENV, name);
    // Before fork: nothing is allocated in the child.
    let tmp = std::env::temp_dir();
    // SAFETY: only async-signal-safe syscalls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            volmgr::sys::namespace::enter_private_mount_namespace()?;
            // A bug that binds `/` or `/etc` into the test's directory
            // must not let its clean-up delete the host's files.
            volmgr::sys::namespace::make_host_read_only_but(&tmp)?;
            if older_kernel {
                volmgr::sys::seccomp::emulate_older_kernel()?;
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("spawn the isolated test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        panic!("isolated test {name} failed:\n--- stdout\n{stdout}\n--- stderr\n{stderr}");
    }
    if !stdout.contains("1 passed") {
        panic!("isolated test {name} did not run:\n{stdout}\n{stderr}");
    }
    // A yardstick's figures, seen with `--nocapture`.
    for line in stderr.lines().filter(|l| l.starts_with(YARDSTICK)) {
        eprintln!("{line}");
    }
}

/// The start of a line an isolated test prints for the run's output too
/// (a yardstick's figures).
pub const YARDSTICK: &str = "yardstick: ";

/// The path of the built `volmgr` binary.
pub fn volmgr_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_volmgr"))
}

/// A scratch area: ROOT, manifests, and a directory "outside" ROOT.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub manifests: PathBuf,
    pub outside: PathBuf,
}

impl Env {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        let manifests = dir.path().join("manifests");
        let outside = dir.path().join("outside");
        for d in [&root, &manifests, &outside] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        let root = root.canonicalize().expect("canonical root");
        Self {
            dir,
            root,
            manifests,
            outside,
        }
    }

    /// Writes a manifest atomically (temporary file + rename).
    pub fn write_manifest(&self, name: &str, text: &str) {
        let tmp = self.manifests.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).expect("write manifest");
        std::fs::rename(&tmp, self.manifests.join(name)).expect("rename manifest");
    }

    pub fn remove_manifest(&self, name: &str) {
        std::fs::remove_file(self.manifests.join(name)).expect("remove manifest");
    }

    /// `ROOT/pods/<uid>/volumes/kubernetes.io~empty-dir/<vol>`.
    pub fn empty_dir(&self, uid: &str, vol: &str) -> PathBuf {
        self.root
            .join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~empty-dir")
            .join(vol)
    }

    pub fn start_agent(&self, extra: &[&str]) -> Agent {
        self.start_agent_env(extra, &[])
    }

    pub fn start_agent_env(&self, extra: &[&str], env: &[(&str, &str)]) -> Agent {
        self.start_agent_with(extra, |cmd| {
            for (k, v) in env {
                cmd.env(k, v);
            }
        })
    }

    /// Starts the agent, `configure` adjusting its command first.
    pub fn start_agent_with(&self, extra: &[&str], configure: impl FnOnce(&mut Command)) -> Agent {
        let manifests = self.manifests.clone();
        self.start_agent_cmd(extra, |cmd| {
            cmd.arg("--manifests").arg(manifests);
            configure(cmd)
        })
    }

    /// Starts the agent with no source of pods but what `extra` gives
    /// (e.g. `--kubeconfig`).
    pub fn start_agent_without_manifests(&self, extra: &[&str]) -> Agent {
        self.start_agent_cmd(extra, |_| {})
    }

    fn start_agent_cmd(&self, extra: &[&str], configure: impl FnOnce(&mut Command)) -> Agent {
        static STARTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = self.dir.path().join(format!("agent-{n}.log"));
        let f = std::fs::File::create(&log).expect("log file");
        let mut cmd = Command::new(volmgr_bin());
        cmd.arg("agent").arg("--root").arg(&self.root).args([
            "--backoff-initial",
            "100ms",
            "--backoff-max",
            "1s",
        ]);
        // No container runtime on the test node unless the test gives one:
        // a deleted pod's volumes go as soon as the API says it is gone.
        if !extra.contains(&"--container-runtime-endpoint") {
            cmd.args(["--container-runtime-endpoint", "none"]);
        }
        cmd.args(extra)
            .env("RUST_LOG", "volmgr=debug")
            .stdout(Stdio::null())
            .stderr(f);
        configure(&mut cmd);
        let child = cmd.spawn().expect("spawn agent");
        Agent { child, log }
    }

    /// A CSI volume's publish target for a pod, as the kubelet lays it out:
    /// `ROOT/pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount`.
    pub fn csi_publish_path(&self, uid: &str, pv: &str) -> PathBuf {
        self.root
            .join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~csi")
            .join(pv)
            .join("mount")
    }

    /// The agent's Prometheus metrics, asked over its status socket.
    pub fn metrics_text(&self) -> String {
        let v = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(volmgr_cli::api::call(
                &self.root,
                &volmgr_cli::api::Request::Metrics,
                Duration::from_secs(30),
            ))
            .unwrap();
        v.as_str().unwrap().to_string()
    }

    /// `volmgr status --json`, once the agent answers.
    pub fn status(&self) -> Status {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = Command::new(volmgr_bin())
                .args(["status", "--json", "--root"])
                .arg(&self.root)
                .output()
                .expect("run volmgr status");
            if out.status.success() {
                return serde_json::from_slice(&out.stdout).expect("status JSON");
            }
            assert!(
                Instant::now() < deadline,
                "agent never answered status: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// State of one volume of one pod in status.
    pub fn volume_state(&self, uid: &str, vol: &str) -> Option<(String, u32, Option<String>)> {
        let s = self.status();
        let p = s.pods.iter().find(|p| p.uid == uid)?;
        let v = p.volumes.iter().find(|v| v.name == vol)?;
        Some((v.state.clone(), v.attempts, v.error.clone()))
    }

    /// Waits (up to a generous limit that only catches hangs) for `cond`.
    pub fn wait_for(&self, what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !cond() {
            assert!(Instant::now() < deadline, "gave up waiting for: {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn wait_synced(&self) {
        self.wait_for("status synced", || self.status().synced);
    }

    /// `volmgr wait` for a pod; returns the exit code.
    pub fn wait_pod(&self, uid: &str, timeout: f64) -> i32 {
        Command::new(volmgr_bin())
            .args([
                "wait",
                "--pod",
                uid,
                "--timeout",
                &timeout.to_string(),
                "--root",
            ])
            .arg(&self.root)
            .status()
            .expect("run volmgr wait")
            .code()
            .unwrap_or(-1)
    }

    /// Mounts below ROOT (not ROOT itself, which the agent binds onto
    /// itself to make it rshared).
    pub fn mounts(&self) -> Vec<MountInfo> {
        mountinfo::read_self()
            .expect("mountinfo")
            .into_iter()
            .filter(|m| m.mount_point.starts_with(&self.root) && m.mount_point != self.root)
            .collect()
    }

    /// How many mounts sit on `path`.
    pub fn mount_count(&self, path: &Path) -> usize {
        self.mounts()
            .iter()
            .filter(|m| m.mount_point == path)
            .count()
    }

    /// Nothing was created outside ROOT (in the "outside" sentinel directory).
    pub fn assert_outside_untouched(&self) {
        let n = std::fs::read_dir(&self.outside).expect("outside").count();
        assert_eq!(n, 0, "something was created outside ROOT");
    }
}

/// A running agent.
pub struct Agent {
    pub child: Child,
    pub log: PathBuf,
}

impl Agent {
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait; returns whether it exited 0.
    pub fn term(mut self) -> bool {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        self.child.wait().map(|s| s.success()).unwrap_or(false)
    }

    /// Waits for an agent that is expected to die (e.g. at a failpoint).
    pub fn wait_exit(mut self) -> std::process::ExitStatus {
        self.child.wait().expect("wait agent")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A pod manifest with the given volumes (YAML flow mappings) all mounted by
/// one container.
pub fn pod_yaml(name: &str, uid: &str, volumes: &[(&str, &str)]) -> String {
    let mounts: Vec<String> = volumes
        .iter()
        .map(|(n, _)| format!("{{name: \"{n}\", mountPath: /m/{n}}}"))
        .collect();
    let vols: Vec<String> = volumes
        .iter()
        .map(|(n, src)| format!("  - {{name: \"{n}\", {src}}}"))
        .collect();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: test, uid: \"{uid}\"}}\nspec:\n  containers: [{{name: c, image: i, volumeMounts: [{}]}}]\n  volumes:\n{}\n",
        mounts.join(", "),
        vols.join("\n")
    )
}

/// `GET /metrics` from the agent's `--metrics-addr` (the body and headers).
pub fn metrics(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// A loopback address with a port that was free a moment ago.
pub fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// Every file under `dir` (not following symlinks, crossing mounts): its
/// path, type and mode, size, owner, mtime and a hash of its contents (or
/// of its link target).
pub fn tree(dir: &Path) -> std::collections::BTreeMap<PathBuf, String> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let md = std::fs::symlink_metadata(&d).unwrap();
        let content = if md.is_file() {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            std::fs::read(&d).unwrap().hash(&mut h);
            format!("{:016x}", h.finish())
        } else if md.file_type().is_symlink() {
            std::fs::read_link(&d).unwrap().display().to_string()
        } else {
            String::new()
        };
        out.insert(
            d.clone(),
            format!(
                "mode={:o} size={} uid={} gid={} mtime={}.{} {}",
                std::os::unix::fs::MetadataExt::mode(&md),
                std::os::unix::fs::MetadataExt::size(&md),
                std::os::unix::fs::MetadataExt::uid(&md),
                std::os::unix::fs::MetadataExt::gid(&md),
                std::os::unix::fs::MetadataExt::mtime(&md),
                std::os::unix::fs::MetadataExt::mtime_nsec(&md),
                content
            ),
        );
        if md.is_dir() {
            for e in std::fs::read_dir(&d).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    out
}

/// `volmgr doctor [--json]` against the agent whose status socket is in
/// `state`: (exit code, stdout).
pub fn doctor(state: &Path, json: bool) -> (i32, String) {
    let mut cmd = Command::new(volmgr_bin());
    cmd.arg("doctor");
    if json {
        cmd.arg("--json");
    }
    let out = cmd.arg("--state-dir").arg(state).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The findings of `kind` in `volmgr doctor --json` against `state` (none
/// while no agent answers).
pub fn doctor_findings(state: &Path, kind: &str) -> Vec<serde_json::Value> {
    let (_, out) = doctor(state, true);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or(serde_json::Value::Null);
    v["findings"]
        .as_array()
        .map(|fs| fs.iter().filter(|f| f["kind"] == kind).cloned().collect())
        .unwrap_or_default()
}
