//! Side-by-side benchmark of the stock kubelet and the volmgr kubelet fork
//! (issue 38 §4), on the real-kubelet harness (`support/kubelet_node.rs`:
//! etcd and kube-apiserver with an audit log, a kubelet with the fake
//! container runtime, sandboxed in this test's private mount namespace).
//! `#[ignore]`d: `scripts/bench-kubelet.sh` builds the fork (release
//! libvolmgr) and runs it with `--ignored --nocapture`, printing a table.
//!
//! Each round runs both kubelets one after the other (the order alternates
//! between rounds), each on a fresh API server and node, and measures:
//!
//! - **pod start**: `VOLMGR_BENCH_PODS` pods (100) with 5 volumes each
//!   (emptyDir, Memory emptyDir, configMap, secret, projected service
//!   account token with the root CA; no automounted token) created in one
//!   `kubectl create`; a `kubectl get pods --watch` started before times,
//!   for each pod, its first event (`ADDED`) to its first event with phase
//!   `Running`, as the harness sees them (ms resolution; the same watch
//!   delay on both ends). The pods have `dnsPolicy: Default` (the node has
//!   no cluster DNS: with `ClusterFirst` both kubelets send two
//!   `MissingClusterDNS` events per pod sync) and their image
//!   `IfNotPresent`, pulled before the clock by a warm-up pod (the kubelet
//!   pulls at most 5 images a second and backs off 10 s from the sixth);
//! - **API requests per pod start**: the requests of `system:node:n1` in
//!   the audit log from just before the create until 5 s after the last
//!   pod is Running, divided by the pods (everything the kubelet sent in
//!   that window, its node status and lease updates included; a watch
//!   counts when it starts, `ResponseStarted`);
//! - **idle CPU**: with 110 pods Running (the warm-up pod included), 10 s
//!   after the last one, the kubelet process's utime + stime over
//!   `VOLMGR_BENCH_IDLE_SECS` (60): the whole kubelet (pod workers'
//!   periodic syncs, PLEG relists, status manager, node status, cAdvisor,
//!   the volume manager; in the fork, libvolmgr's threads) but not the fake
//!   runtime.
//!
//! `VOLMGR_BENCH_ROUNDS` (1) sets the rounds. Each kubelet's log is kept
//! beside the report (`bench-kubelet.KUBELET-ROUND.log`).
//! `VOLMGR_KUBELET_FORK` is the fork's binary or the directory holding it.

// Test-only code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/kubelet_node.rs"]
mod kubelet_node;
mod support;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kubelet_node::{Node, NODE};
use support::isolated;
use volmgr_kube::testing::real::RealApiServer;

/// The node's user in the audit log.
const NODE_USER: &str = "system:node:n1";
/// Pods on the node for the idle measurement (the kubelet's default
/// maxPods).
const IDLE_PODS: usize = 110;

/// An integer setting from the environment.
fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The fork's binary from `VOLMGR_KUBELET_FORK`.
fn fork_binary() -> PathBuf {
    let p = PathBuf::from(
        std::env::var_os("VOLMGR_KUBELET_FORK")
            .expect("VOLMGR_KUBELET_FORK: the fork (scripts/bench-kubelet.sh sets it)"),
    );
    if p.is_dir() {
        p.join("kubelet")
    } else {
        p
    }
}

/// What one kubelet measured in one round.
struct Figures {
    kubelet: &'static str,
    round: u64,
    /// Per pod, ADDED → Running (ms), sorted.
    start_ms: Vec<f64>,
    /// First create to the last pod Running (s).
    all_running_s: f64,
    /// The node's requests in the pod-start window, and by verb/resource.
    requests: usize,
    by_kind: BTreeMap<String, usize>,
    pods: usize,
    /// tmpfs mounts under the kubelet's root once the pods ran.
    tmpfs_mounts: usize,
    /// Idle: kubelet CPU (s), window (s), the node's requests.
    idle_cpu_s: f64,
    idle_window_s: f64,
    idle_requests: usize,
}

/// Stock and fork side by side: pod start p50/p99, API requests per pod
/// start, idle CPU with 110 pods (see the module's documentation).
#[test]
#[ignore = "a benchmark: scripts/bench-kubelet.sh"]
fn bench_kubelet_stock_vs_fork() {
    let _ = std::fs::remove_file(report_path());
    isolated("bench_kubelet_stock_vs_fork", || {
        let fork = fork_binary();
        assert!(fork.is_file(), "no fork at {}", fork.display());
        let rounds = knob("VOLMGR_BENCH_ROUNDS", 1);
        let pods = knob("VOLMGR_BENCH_PODS", 100) as usize;
        let idle = knob("VOLMGR_BENCH_IDLE_SECS", 60);
        assert!(pods < IDLE_PODS, "fewer than {IDLE_PODS} pods");
        let mut all = Vec::new();
        for round in 0..rounds {
            let order = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for is_fork in order {
                let f = run_one(is_fork.then_some(fork.as_path()), round, pods, idle);
                report(&print_figures(&f));
                all.push(f);
            }
        }
        report(&print_table(&all));
    });
    // The body ran in a child whose output is kept only on failure.
    print!(
        "{}",
        std::fs::read_to_string(report_path()).unwrap_or_default()
    );
}

/// Where the body writes what it reports: `VOLMGR_BENCH_OUT`, or
/// `bench-kubelet.txt` in the temporary directory.
fn report_path() -> PathBuf {
    std::env::var_os("VOLMGR_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("bench-kubelet.txt"))
}

/// Appends `text` to the report (and prints it).
fn report(text: &str) {
    use std::io::Write;
    print!("{text}");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(report_path())
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

/// One kubelet on a fresh node: the pod burst, the requests, then idle.
fn run_one(fork: Option<&Path>, round: u64, pods: usize, idle: u64) -> Figures {
    let kubelet = if fork.is_some() { "fork" } else { "stock" };
    eprintln!("round {round}: {kubelet}");
    let node = Node::start_with(fork, &[]).expect("the real Kubernetes binaries");
    if fork.is_some() {
        assert!(
            node.kubelet.log().contains("Volume manager: volmgr"),
            "the fork did not start volmgr's volume manager"
        );
    }
    let watch = PodWatch::start(&node.server);
    // The image pulled once, before the clock: the kubelet's image pulls
    // are limited to 5 a second (registryPullQPS), with 10 s back-offs.
    node.server.apply(&pod_yaml("bench-warm-up"));
    watch.wait_running(&["bench-warm-up".to_string()], 300);
    std::thread::sleep(Duration::from_secs(3));
    let before = node_requests(&node.server);
    let t0 = Instant::now();
    create_pods(&node.server, 0..pods);
    let names: Vec<String> = (0..pods).map(pod_name).collect();
    watch.wait_running(&names, 600);
    let all_running_s = t0.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(5));
    let window = since(&node.server, &before);
    let mut by_kind = BTreeMap::new();
    for kind in window.values() {
        *by_kind.entry(kind.clone()).or_insert(0) += 1;
    }
    let start_ms = watch.latencies_ms(&names);
    create_pods(&node.server, pods..IDLE_PODS - 1);
    let rest: Vec<String> = (pods..IDLE_PODS - 1).map(pod_name).collect();
    watch.wait_running(&rest, 600);
    let tmpfs_mounts = tmpfs_below(&node.env.root);
    std::thread::sleep(Duration::from_secs(10));
    let pid = node.kubelet.pid().unwrap();
    let idle_before = node_requests(&node.server);
    let (c0, w0) = (cpu_s(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(idle));
    let c1 = cpu_s(pid);
    let idle_window_s = w0.elapsed().as_secs_f64();
    let idle_requests = since(&node.server, &idle_before).len();
    // Kept beside the report, for reading what took the time.
    let log = report_path().with_extension(format!("{kubelet}-{round}.log"));
    std::fs::write(log, node.kubelet.log()).unwrap();
    Figures {
        kubelet,
        round,
        start_ms,
        all_running_s,
        requests: window.len(),
        by_kind,
        pods,
        tmpfs_mounts,
        idle_cpu_s: c1 - c0,
        idle_window_s,
        idle_requests,
    }
}

/// `bench-NNN`.
fn pod_name(i: usize) -> String {
    format!("bench-{i:03}")
}

/// Pod `name` on the node with the benchmark's 5 volumes.
fn pod_yaml(name: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  nodeName: {NODE}
  automountServiceAccountToken: false
  dnsPolicy: Default
  containers:
  - name: c
    image: busybox
    imagePullPolicy: IfNotPresent
    volumeMounts:
    - {{name: scratch, mountPath: /scratch}}
    - {{name: cache, mountPath: /cache}}
    - {{name: settings, mountPath: /settings}}
    - {{name: creds, mountPath: /creds}}
    - {{name: token, mountPath: /var/run/secrets/kubernetes.io/serviceaccount}}
  volumes:
  - {{name: scratch, emptyDir: {{}}}}
  - {{name: cache, emptyDir: {{medium: Memory, sizeLimit: 16Mi}}}}
  - {{name: settings, configMap: {{name: settings}}}}
  - {{name: creds, secret: {{secretName: creds}}}}
  - name: token
    projected:
      sources:
      - serviceAccountToken: {{path: token, expirationSeconds: 3607}}
      - configMap: {{name: kube-root-ca.crt, items: [{{key: ca.crt, path: ca.crt}}]}}
"
    )
}

/// Creates the pods `range` in one `kubectl create`.
fn create_pods(server: &RealApiServer, range: std::ops::Range<usize>) {
    if range.is_empty() {
        return;
    }
    let docs: Vec<String> = range.map(|i| pod_yaml(&pod_name(i))).collect();
    server.kubectl_ok(&["create", "-f", "-"], Some(&docs.join("---\n")));
}

/// The node's requests in the audit log so far: audit ID → `verb
/// resource[/subresource]`. A request counts once, from its first stage
/// logged (`ResponseStarted` for a watch, which completes only when it
/// ends; `ResponseComplete` for the others).
fn node_requests(server: &RealApiServer) -> HashMap<String, String> {
    let text = std::fs::read_to_string(server.dir().join("audit.log")).unwrap_or_default();
    let mut out = HashMap::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["user"]["username"] != NODE_USER {
            continue;
        }
        let s = |p: &serde_json::Value| p.as_str().unwrap_or_default().to_string();
        let mut kind = format!("{} {}", s(&v["verb"]), s(&v["objectRef"]["resource"]));
        if let Some(sub) = v["objectRef"]["subresource"].as_str() {
            kind = format!("{kind}/{sub}");
        }
        out.entry(s(&v["auditID"])).or_insert(kind);
    }
    out
}

/// The node's requests since `before` (an earlier [`node_requests`]).
fn since(server: &RealApiServer, before: &HashMap<String, String>) -> HashMap<String, String> {
    let mut now = node_requests(server);
    now.retain(|id, _| !before.contains_key(id));
    now
}

/// tmpfs mounts at or below `dir` in this namespace.
fn tmpfs_below(dir: &Path) -> usize {
    volmgr::sys::mountinfo::read_self()
        .unwrap()
        .into_iter()
        .filter(|m| m.mount_point.starts_with(dir) && m.fstype == "tmpfs")
        .count()
}

/// utime + stime (s) of process `pid`, every thread's.
fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command name: state is field 3, utime 14, stime 15.
    let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0 // USER_HZ
}

/// Per pod name: when it was first seen, and first seen `Running`.
type Seen = Arc<Mutex<HashMap<String, (Instant, Option<Instant>)>>>;

/// `kubectl get pods --watch`: when each pod was first seen, and first
/// seen `Running`.
struct PodWatch {
    child: Child,
    seen: Seen,
}

impl PodWatch {
    fn start(server: &RealApiServer) -> Self {
        let mut cmd = server.kubectl();
        cmd.args(["get", "pods", "-n", "default", "--watch", "-o"])
            .arg("jsonpath={.metadata.name} {.status.phase}{\"\\n\"}")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().unwrap();
        let out = child.stdout.take().unwrap();
        let seen: Seen = Arc::default();
        let s = seen.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let now = Instant::now();
                let mut it = line.split_whitespace();
                let (Some(name), phase) = (it.next(), it.next()) else {
                    continue;
                };
                let mut s = s.lock().unwrap();
                let e = s.entry(name.to_string()).or_insert((now, None));
                if phase == Some("Running") && e.1.is_none() {
                    e.1 = Some(now);
                }
            }
        });
        Self { child, seen }
    }

    /// Waits up to `secs` until every pod of `names` was seen Running.
    fn wait_running(&self, names: &[String], secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let left = {
                let s = self.seen.lock().unwrap();
                names
                    .iter()
                    .filter(|n| s.get(*n).and_then(|e| e.1).is_none())
                    .count()
            };
            if left == 0 {
                return;
            }
            assert!(Instant::now() < deadline, "{left} pods not Running");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// ADDED → Running of `names` (ms), sorted.
    fn latencies_ms(&self, names: &[String]) -> Vec<f64> {
        let s = self.seen.lock().unwrap();
        let mut v: Vec<f64> = names
            .iter()
            .map(|n| {
                let (added, running) = s[n];
                (running.unwrap() - added).as_secs_f64() * 1e3
            })
            .collect();
        v.sort_by(f64::total_cmp);
        v
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `q` quantile of sorted `v` (nearest rank).
fn quantile(v: &[f64], q: f64) -> f64 {
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// One run's figures and its request breakdown.
fn print_figures(f: &Figures) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    writeln!(
        out,
        "{} round {}: pod start p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms, all Running {:.1} s; \
         {} requests ({:.2}/pod); tmpfs mounts {}; idle CPU {:.2} s over {:.1} s; idle requests {}",
        f.kubelet,
        f.round,
        quantile(&f.start_ms, 0.5),
        quantile(&f.start_ms, 0.99),
        f.start_ms.last().copied().unwrap_or(0.0),
        f.all_running_s,
        f.requests,
        f.requests as f64 / f.pods as f64,
        f.tmpfs_mounts,
        f.idle_cpu_s,
        f.idle_window_s,
        f.idle_requests
    )
    .unwrap();
    for (kind, n) in &f.by_kind {
        writeln!(out, "    {n:5} {}", kind.escape_debug()).unwrap();
    }
    out
}

/// The table of every run, and the fork ÷ stock ratios of the medians.
fn print_table(all: &[Figures]) -> String {
    use std::fmt::Write;
    let mut out = String::from("\n| kubelet | round | pods | p50 (ms) | p99 (ms) | all Running (s) | requests / pod | idle CPU, % of a core | idle requests / min |\n|---|---|---|---|---|---|---|---|---|\n");
    for f in all {
        let pct = |s: f64| 100.0 * s / f.idle_window_s;
        writeln!(
            out,
            "| {} | {} | {} | {:.0} | {:.0} | {:.1} | {:.2} | {:.2} % | {:.1} |",
            f.kubelet,
            f.round,
            f.pods,
            quantile(&f.start_ms, 0.5),
            quantile(&f.start_ms, 0.99),
            f.all_running_s,
            f.requests as f64 / f.pods as f64,
            pct(f.idle_cpu_s),
            f.idle_requests as f64 * 60.0 / f.idle_window_s
        )
        .unwrap();
    }
    let median = |k: &str, g: &dyn Fn(&Figures) -> f64| {
        let mut v: Vec<f64> = all.iter().filter(|f| f.kubelet == k).map(g).collect();
        v.sort_by(f64::total_cmp);
        (v[(v.len() - 1) / 2] + v[v.len() / 2]) / 2.0
    };
    let ratio = |g: &dyn Fn(&Figures) -> f64| median("fork", g) / median("stock", g);
    writeln!(
        out,
        "\nfork ÷ stock (medians over rounds): p50 {:.2}x, p99 {:.2}x, requests/pod {:.2}x, idle CPU {:.2}x",
        ratio(&|f| quantile(&f.start_ms, 0.5)),
        ratio(&|f| quantile(&f.start_ms, 0.99)),
        ratio(&|f| f.requests as f64 / f.pods as f64),
        ratio(&|f| f.idle_cpu_s / f.idle_window_s)
    )
    .unwrap();
    out
}
