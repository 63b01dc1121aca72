//! Benchmark: pod latency, event → all volumes set up, for pods from the
//! Kubernetes API (the in-process HTTPS fake API server of the tests, the
//! agent reaching it through kube-rs) side by side with pods from the
//! manifests directory, in one agent and one run:
//!
//! 1. **Churn**: a node at `--pods` pods (default 110, from the API), then
//!    `--churn-secs` seconds (default 20) at 10 pods/s, alternating a new
//!    API pod (clock from the object's write into the fake, which wakes the
//!    open watch at once) and a new manifest (clock from just before the
//!    rename into the directory), each replacing the oldest pod of its
//!    source; p50/p99/max per source.
//! 2. **Burst**: `--burst` pods (default 1,000) from the API at once, then
//!    as many manifests at once; per-pod latency p50/p99/max and the time
//!    until the last one is ready.
//!
//! A pod has one disk `emptyDir`; "ready" is its directory existing (what
//! the plugin's set-up creates), seen by a loop that looks every 50 µs.
//! Runs in a private mount namespace of its own (re-executes itself).
//!
//! ```text
//! cargo bench -p volmgr-cli --bench api_pods -- [--pods 110] [--churn-secs 20] [--burst 1000]
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "common/mod.rs"]
mod common;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

const NODE: &str = "bench-node";

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn uid(prefix: &str, i: usize) -> String {
    format!("{prefix}-0000-0000-0000-{i:012}")
}

fn api_pod(uid: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("p-{uid}"), "namespace": "b", "uid": uid},
        "spec": {"nodeName": NODE,
                 "containers": [{"name": "c", "image": "i", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
                 "volumes": [{"name": "v", "emptyDir": {}}]},
        "status": {"phase": "Running"}
    })
}

fn manifest(uid: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: m-{uid}, namespace: b, uid: {uid}}}\nspec:\n  containers: [{{name: c, image: i, volumeMounts: [{{name: v, mountPath: /v}}]}}]\n  volumes: [{{name: v, emptyDir: {{}}}}]\n"
    )
}

fn write_atomic(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

fn ready(root: &Path, uid: &str) -> PathBuf {
    root.join(format!("pods/{uid}/volumes/kubernetes.io~empty-dir/v"))
}

/// Waits (untimed, generous) for every path; returns when each was first
/// seen, in order.
fn wait_all(paths: &[PathBuf]) -> Vec<Instant> {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut seen: Vec<Option<Instant>> = vec![None; paths.len()];
    let mut left = paths.len();
    while left > 0 {
        assert!(Instant::now() < deadline, "gave up waiting for pods");
        for (i, p) in paths.iter().enumerate() {
            if seen[i].is_none() && p.exists() {
                seen[i] = Some(Instant::now());
                left -= 1;
            }
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    seen.into_iter().map(|s| s.unwrap()).collect()
}

fn ms(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    v[i].as_secs_f64() * 1e3
}

fn report(what: &str, v: &mut [Duration]) {
    println!(
        "{what}: n={} p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        v.len(),
        ms(v, 0.5),
        ms(v, 0.99),
        ms(v, 1.0)
    );
}

struct Bench {
    api: volmgr_kube::testing::FakeApiServer,
    root: PathBuf,
    manifests: PathBuf,
}

impl Bench {
    fn api_start(&self, uid: &str) -> Instant {
        let t0 = Instant::now();
        self.api.apply(api_pod(uid));
        t0
    }

    fn manifest_start(&self, uid: &str) -> Instant {
        let t0 = Instant::now();
        write_atomic(&self.manifests, &format!("{uid}.yaml"), &manifest(uid));
        t0
    }

    fn churn(&self, initial: usize, secs: u64) -> (Vec<Duration>, Vec<Duration>) {
        let mut api_pods: VecDeque<String> = (0..initial).map(|i| uid("aaaaaaaa", i)).collect();
        for u in &api_pods {
            self.api.apply(api_pod(u));
        }
        let paths: Vec<PathBuf> = api_pods.iter().map(|u| ready(&self.root, u)).collect();
        wait_all(&paths);
        let mut manifest_pods: VecDeque<String> = VecDeque::new();
        let (mut from_api, mut from_manifests) = (Vec::new(), Vec::new());
        let end = Instant::now() + Duration::from_secs(secs);
        let mut i = 0;
        while Instant::now() < end {
            let tick = Instant::now();
            if i % 2 == 0 {
                let u = uid("cccccccc", i);
                let t0 = self.api_start(&u);
                from_api.push(wait_all(&[ready(&self.root, &u)])[0] - t0);
                api_pods.push_back(u);
                if let Some(old) = api_pods.pop_front() {
                    self.api.delete("Pod", "b", &format!("p-{old}"), false);
                }
            } else {
                let u = uid("dddddddd", i);
                let t0 = self.manifest_start(&u);
                from_manifests.push(wait_all(&[ready(&self.root, &u)])[0] - t0);
                manifest_pods.push_back(u);
                if manifest_pods.len() > 10 {
                    let old = manifest_pods.pop_front().unwrap();
                    std::fs::remove_file(self.manifests.join(format!("{old}.yaml"))).unwrap();
                }
            }
            i += 1;
            std::thread::sleep(Duration::from_millis(100).saturating_sub(tick.elapsed()));
        }
        (from_api, from_manifests)
    }

    /// `n` pods at once from one source; per-pod latencies and the time to
    /// the last one.
    fn burst(&self, n: usize, prefix: &str, api: bool) -> (Vec<Duration>, Duration) {
        let uids: Vec<String> = (0..n).map(|i| uid(prefix, i)).collect();
        let t_first = Instant::now();
        let starts: Vec<Instant> = uids
            .iter()
            .map(|u| {
                if api {
                    self.api_start(u)
                } else {
                    self.manifest_start(u)
                }
            })
            .collect();
        let paths: Vec<PathBuf> = uids.iter().map(|u| ready(&self.root, u)).collect();
        let seen = wait_all(&paths);
        let lat = seen.iter().zip(&starts).map(|(s, t)| *s - *t).collect();
        let last = seen.iter().max().unwrap().duration_since(t_first);
        (lat, last)
    }
}

fn main() {
    let flags = common::flags(&["--pods", "--churn-secs", "--burst"]);
    let pods: usize = common::flag(&flags, "--pods", 110);
    let churn_secs: u64 = common::flag(&flags, "--churn-secs", 20);
    let burst: usize = common::flag(&flags, "--burst", 1000);
    if !common::in_private_mount_namespace() {
        return;
    }
    println!("{}", common::machine());
    let base = tempfile::tempdir().unwrap();
    let (root, manifests) = (base.path().join("root"), base.path().join("m"));
    for d in [&root, &manifests] {
        std::fs::create_dir_all(d).unwrap();
    }
    let root = root.canonicalize().unwrap();
    let api = volmgr_kube::testing::FakeApiServer::start();
    let kubeconfig = api.write_kubeconfig(base.path());
    let log = std::fs::File::create(base.path().join("agent.log")).unwrap();
    let _agent = Agent(
        Command::new(env!("CARGO_BIN_EXE_volmgr"))
            .arg("agent")
            .arg("--root")
            .arg(&root)
            .arg("--manifests")
            .arg(&manifests)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--node-name", NODE, "--tracer", "off"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let b = Bench {
        api,
        root,
        manifests,
    };
    let (mut a, mut m) = b.churn(pods, churn_secs);
    println!("churn: {pods} API pods, then 10 pods/s for {churn_secs} s, alternating sources");
    report("  API pod, watch event -> ready", &mut a);
    report("  manifest, rename -> ready", &mut m);
    let (mut a, last_a) = b.burst(burst, "eeeeeeee", true);
    let (mut m, last_m) = b.burst(burst, "ffffffff", false);
    println!("burst: {burst} pods at once from each source");
    report("  API pods, watch event -> ready", &mut a);
    println!(
        "    last ready {:.1} ms after the first event",
        last_a.as_secs_f64() * 1e3
    );
    report("  manifests, rename -> ready", &mut m);
    println!(
        "    last ready {:.1} ms after the first rename",
        last_m.as_secs_f64() * 1e3
    );
}
