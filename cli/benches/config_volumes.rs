//! Benchmark: configMap and projected volumes, from the manifests directory
//! (the API source comes later; the manifests source stands in for it).
//!
//! 1. **Update latency**: `--pods` pods (default 100) mount one configMap;
//!    per update, the ConfigMap manifest is rewritten (temporary file +
//!    rename) and the clock runs from just before the rename until each
//!    pod's file shows the new value (this process reads the 100 files in a
//!    loop). p50/p99/max over all pods × `--updates` updates.
//! 2. **Pod start-up**: event (the pod's manifest renamed into place) →
//!    volume ready (its files visible), for a pod with the standard
//!    `kube-api-access` projected volume (token from `--token-file`,
//!    `kube-root-ca.crt`, namespace) against the same pod with only an
//!    `emptyDir`, alternating, `--starts` pods each, in one run.
//!
//! Runs in a private mount namespace of its own (re-executes itself).
//!
//! ```text
//! cargo bench -p volmgr-cli --bench config_volumes -- [--pods 100] [--updates 20] [--starts 30]
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn write_atomic(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

fn config_map(name: &str, data: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: b}}\ndata: {{{data}}}\n")
}

fn pod(name: &str, uid: &str, volume: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: b, uid: {uid}}}\nspec:\n  containers: [{{name: c, image: i, volumeMounts: [{{name: v, mountPath: /v}}]}}]\n  volumes: [{{name: v, {volume}}}]\n"
    )
}

fn vol(root: &Path, uid: &str, plugin: &str) -> PathBuf {
    root.join(format!("pods/{uid}/volumes/kubernetes.io~{plugin}/v"))
}

/// Waits (untimed, generous) for `cond`.
fn wait(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !cond() {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    v[i].as_secs_f64() * 1e3
}

fn update_latency(root: &Path, manifests: &Path, pods: usize, updates: usize) -> Vec<Duration> {
    let files: Vec<PathBuf> = (0..pods)
        .map(|i| vol(root, &format!("u-{i}"), "configmap").join("k"))
        .collect();
    wait("pods mounted", || {
        files
            .iter()
            .all(|f| std::fs::read_to_string(f).is_ok_and(|s| s == "0"))
    });
    let mut samples = Vec::new();
    for u in 1..=updates {
        let want = u.to_string();
        let t0 = Instant::now();
        write_atomic(
            manifests,
            "cm.yaml",
            &config_map("cm", &format!("k: \"{u}\"")),
        );
        let mut seen = vec![None; pods];
        while seen.iter().any(Option::is_none) {
            for (i, f) in files.iter().enumerate() {
                if seen[i].is_none() && std::fs::read_to_string(f).is_ok_and(|s| s == want) {
                    seen[i] = Some(t0.elapsed());
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "update {u} never arrived"
            );
        }
        samples.extend(seen.into_iter().flatten());
    }
    samples
}

const KUBE_API_ACCESS: &str = "projected: {defaultMode: 420, sources: [{serviceAccountToken: {expirationSeconds: 3607, path: token}}, {configMap: {name: kube-root-ca.crt, items: [{key: ca.crt, path: ca.crt}]}}, {downwardAPI: {items: [{path: namespace, fieldRef: {apiVersion: v1, fieldPath: metadata.namespace}}]}}]}";

/// Start-up of `starts` pods of each kind, alternating: (projected, emptyDir).
fn start_up(root: &Path, manifests: &Path, starts: usize) -> (Vec<Duration>, Vec<Duration>) {
    let (mut projected, mut empty) = (Vec::new(), Vec::new());
    for i in 0..starts * 2 {
        let is_projected = i % 2 == 0;
        let uid = format!("s-{i}");
        let (volume, ready) = if is_projected {
            (KUBE_API_ACCESS, vol(root, &uid, "projected").join("token"))
        } else {
            ("emptyDir: {}", vol(root, &uid, "empty-dir"))
        };
        let t0 = Instant::now();
        write_atomic(
            manifests,
            &format!("s-{i}.yaml"),
            &pod(&format!("s-{i}"), &uid, volume),
        );
        wait("pod started", || ready.exists());
        let d = t0.elapsed();
        if is_projected {
            projected.push(d);
        } else {
            empty.push(d);
        }
    }
    (projected, empty)
}

fn main() {
    let flags = common::flags(&["--pods", "--updates", "--starts"]);
    let pods: usize = common::flag(&flags, "--pods", 100);
    let updates: usize = common::flag(&flags, "--updates", 20);
    let starts: usize = common::flag(&flags, "--starts", 30);
    if !common::in_private_mount_namespace() {
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let (root, manifests, tokens) = (
        base.path().join("root"),
        base.path().join("m"),
        base.path().join("t"),
    );
    for d in [&root, &manifests, &tokens.join("b")] {
        std::fs::create_dir_all(d).unwrap();
    }
    let root = root.canonicalize().unwrap();
    std::fs::write(tokens.join("b/default"), "token").unwrap();
    write_atomic(&manifests, "cm.yaml", &config_map("cm", "k: \"0\""));
    write_atomic(
        &manifests,
        "ca.yaml",
        &config_map("kube-root-ca.crt", "ca.crt: CA"),
    );
    let all: String = (0..pods)
        .map(|i| {
            pod(
                &format!("p-{i}"),
                &format!("u-{i}"),
                "configMap: {name: cm}",
            )
        })
        .collect();
    write_atomic(&manifests, "pods.yaml", &all);
    let log = std::fs::File::create(base.path().join("agent.log")).unwrap();
    let _agent = Agent(
        Command::new(env!("CARGO_BIN_EXE_volmgr"))
            .arg("agent")
            .arg("--root")
            .arg(&root)
            .arg("--manifests")
            .arg(&manifests)
            .arg("--token-file")
            .arg(&tokens)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let mut lat = update_latency(&root, &manifests, pods, updates);
    println!(
        "configMap update -> visible in {pods} pods ({} samples): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        lat.len(),
        pct(&mut lat, 0.50),
        pct(&mut lat, 0.99),
        pct(&mut lat, 1.0)
    );
    let (mut p, mut e) = start_up(&root, &manifests, starts);
    println!(
        "pod start-up, event -> ready ({starts} each, alternating): kube-api-access projected p50 {:.1} ms p99 {:.1} ms; emptyDir p50 {:.1} ms p99 {:.1} ms",
        pct(&mut p, 0.5),
        pct(&mut p, 0.99),
        pct(&mut e, 0.5),
        pct(&mut e, 0.99)
    );
}
