//! The test CSI driver (`volmgr-csi-driver`, built next to `volmgr`) as a
//! child process, for the CSI test crates (`#[path]`-included by each).
//!
//! The driver journals every call in `STATE/calls.jsonl`, takes injected
//! faults from `STATE/faults.json`, and with `--registration-dir` serves the
//! kubelet plugin registration API and records what the agent told it in
//! `STATE/registration.json`.

// Each test crate uses part of this module.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::{volmgr_bin, Env};

/// The test driver binary.
pub fn driver_bin() -> PathBuf {
    let bin = volmgr_bin()
        .parent()
        .expect("target dir")
        .join("volmgr-csi-driver");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p volmgr-csi-driver` (cargo test --workspace builds it)",
        bin.display()
    );
    bin
}

/// Polls `cond` every 20 ms for up to 90 s.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "gave up waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A test driver, its state directory, socket and log (all under the test's
/// directory). Dropping it kills the driver and detaches the loop devices
/// backed by its images, even when a test failed.
pub struct Driver {
    name: &'static str,
    child: Option<Child>,
    /// Serve the kubelet plugin registration API in this directory.
    registration: Option<PathBuf>,
    state: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    /// More command-line arguments.
    args: Vec<String>,
}

impl Driver {
    /// A driver called `name` for `env`; not started yet.
    pub fn new(env: &Env, name: &'static str) -> Self {
        let state = env.dir.path().join("driver");
        std::fs::create_dir_all(&state).unwrap();
        Self {
            name,
            child: None,
            registration: None,
            state,
            socket: env.dir.path().join("csi.sock"),
            log: env.dir.path().join("driver.log"),
            args: Vec::new(),
        }
    }

    /// Passes `args` to the driver from the next start on (e.g.
    /// `--max-volumes-per-node 2`).
    pub fn with_args(&mut self, args: &[&str]) {
        self.args = args.iter().map(|a| a.to_string()).collect();
    }

    /// Its CSI endpoint.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// Moves its endpoint to `socket` from the next start on.
    pub fn move_socket(&mut self, socket: PathBuf) {
        self.socket = socket;
    }

    /// Its state directory (images, journal, faults).
    pub fn state(&self) -> &std::path::Path {
        &self.state
    }

    /// Where it serves plugin registration, if it does.
    pub fn registration_dir(&self) -> Option<&std::path::Path> {
        self.registration.as_deref()
    }

    /// Serves plugin registration in `dir` from the next start on.
    pub fn register_in(&mut self, dir: PathBuf) {
        self.registration = Some(dir);
    }

    /// The registration socket it serves (`<dir>/<name>-reg.sock`).
    pub fn registration_socket(&self) -> PathBuf {
        self.registration
            .as_ref()
            .expect("a driver serving registration")
            .join(format!("{}-reg.sock", self.name))
    }

    /// Starts the driver without waiting for anything.
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(driver_bin())
            .arg("--endpoint")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(&self.state)
            .args(["--name", self.name, "--node-id", "node-1"])
            .args(
                self.registration
                    .iter()
                    .flat_map(|r| [std::ffi::OsStr::new("--registration-dir"), r.as_os_str()]),
            )
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn the CSI driver");
        self.child = Some(child);
    }

    /// Starts (again) and waits for its socket.
    pub fn start(&mut self) {
        self.spawn();
        wait_for("driver socket", || {
            std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
        });
    }

    /// Stops it with SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops it with SIGTERM: the driver removes its sockets and exits.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(c.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let _ = c.wait();
        }
    }

    /// Waits for it to exit (an injected crash).
    pub fn wait_exit(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// Its `--csi-driver NAME=SOCKET` flag for the agent.
    pub fn flag(&self) -> String {
        format!("{}={}", self.name, self.socket.display())
    }

    /// Replaces faults.json atomically.
    pub fn faults(&self, rules: serde_json::Value) {
        let tmp = self.state.join(".faults.tmp");
        std::fs::write(&tmp, rules.to_string()).unwrap();
        std::fs::rename(&tmp, self.state.join("faults.json")).unwrap();
    }

    /// Every journalled call.
    pub fn calls(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.state.join("calls.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The journalled calls of `method`.
    pub fn calls_of(&self, method: &str) -> Vec<serde_json::Value> {
        self.calls()
            .into_iter()
            .filter(|c| c["method"] == method)
            .collect()
    }

    /// Calls of `method` for `volume` that ended with `code`.
    pub fn count(&self, method: &str, volume: &str, code: &str) -> usize {
        self.calls()
            .iter()
            .filter(|c| c["method"] == method && c["volume_id"] == volume && c["code"] == code)
            .count()
    }

    /// Waits until `n` calls of `method` for `volume` ended with `code` (the
    /// driver journals a call as it answers, so the journal may trail what
    /// the agent saw), then checks there are exactly `n`.
    pub fn expect(&self, method: &str, volume: &str, code: &str, n: usize) {
        wait_for(&format!("{n} {method} {volume} {code}"), || {
            self.count(method, volume, code) >= n
        });
        let got = self.count(method, volume, code);
        if got != n {
            // Every call for the volume, to tell which one was extra.
            let calls: Vec<String> = self
                .calls()
                .into_iter()
                .filter(|c| c["volume_id"] == volume)
                .map(|c| c.to_string())
                .collect();
            panic!(
                "{got} calls of {method} {volume} {code}, expected {n}; the volume's calls:\n{}\n--- driver log\n{}",
                calls.join("\n"),
                self.log()
            );
        }
    }

    /// What the agent told the driver in NotifyRegistrationStatus.
    pub fn registration(&self) -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(self.state.join("registration.json")).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// The driver's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Loop devices backed by this driver's images.
    pub fn loop_devices(&self) -> Vec<String> {
        let state = self.state.display().to_string();
        std::fs::read_dir("/sys/block")
            .map(|rd| {
                rd.flatten()
                    .filter(|e| {
                        std::fs::read_to_string(e.path().join("loop/backing_file"))
                            .is_ok_and(|b| b.trim().starts_with(&state))
                    })
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.kill();
        for dev in self.loop_devices() {
            let _ = Command::new("losetup")
                .args(["-d", &format!("/dev/{dev}")])
                .status();
        }
    }
}

/// Waits (up to 60 s, a limit that only catches hangs) for `cond`, showing
/// status and both logs when it gives up.
pub fn wait_or_dump(
    env: &Env,
    agent: &crate::support::Agent,
    driver: &Driver,
    what: &str,
    mut cond: impl FnMut() -> bool,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !cond() {
        if std::time::Instant::now() > deadline {
            panic!(
                "gave up waiting for: {what}\n--- status\n{:#?}\n--- agent log\n{}\n--- driver log\n{}",
                env.status(),
                agent.log(),
                driver.log()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
