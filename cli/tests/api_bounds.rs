//! End-to-end tests of the bounds on the agent's API server traffic
//! (issue 28): descriptors at 800 followed objects under `ulimit -n 1024`,
//! memory under a server whose pods list or watch line never ends, and the
//! cause in status (and once in the log) when the API server answers
//! garbage, never answers, drips, has a certificate of another CA or
//! refuses connections. The real agent, against servers on 127.0.0.1; each
//! test runs in a private mount namespace and ends by itself (its longest
//! wait is the 30 s answer deadline, well within a minute).

// Test-only code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::HashSet;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{isolated, pod_yaml, Agent, Env};
use volmgr_kube::testing::{FakeApiServer, HostileServer, Mode};

const NODE: &str = "node-a";
const LOCAL: &str = "d4444444-0000-0000-0000-000000000004";
/// The target for the agent's peak RSS under a hostile server.
const RSS_LIMIT_KIB: u64 = 256 << 10;

/// Waits for `cond` up to `limit` (a deadline that only catches hangs).
fn wait(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "gave up waiting for: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Prints a measured figure, and appends it to the file `VOLMGR_MEASURED`
/// names (under the temporary directory) if set: the isolated child's
/// output is only shown when it fails.
fn measured(line: &str) {
    eprintln!("MEASURED: {line}");
    if let Some(path) = std::env::var_os("VOLMGR_MEASURED") {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        writeln!(f, "{line}").unwrap();
    }
}

/// A field of `/proc/PID/status` in KiB (`VmHWM`: peak RSS).
fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The agent's TCP sockets connected to `port` (from its descriptors and
/// the namespace's `/proc/net/tcp*`).
fn sockets_to(pid: u32, port: u16) -> usize {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|t| {
            let t = t.to_string_lossy().into_owned();
            Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut n = 0;
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let remote_port = f[2].rsplit(':').next().unwrap();
            if u16::from_str_radix(remote_port, 16).unwrap() == port && inodes.contains(f[9]) {
                n += 1;
            }
        }
    }
    n
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// A pod bound to this node with `volumes`, each mounted by its container.
fn api_pod(name: &str, uid: &str, volumes: Vec<Value>) -> Value {
    let mounts: Vec<Value> = volumes
        .iter()
        .map(|v| json!({"name": v["name"], "mountPath": format!("/m/{}", v["name"].as_str().unwrap())}))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "test", "uid": uid},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "i", "volumeMounts": mounts}],
                 "volumes": volumes},
        "status": {"phase": "Running"}
    })
}

/// Whether every volume of pod `uid` is mounted (and there are `count`).
fn all_mounted(env: &Env, uid: &str, count: usize) -> bool {
    let s = env.status();
    s.pods
        .iter()
        .find(|p| p.uid == uid)
        .is_some_and(|p| p.volumes.len() == count && p.volumes.iter().all(|v| v.state == "mounted"))
}

/// One pod with 800 configMap volumes and a small pod, under `ulimit -n
/// 1024` (soft and hard): both mounted, no EMFILE, status answers, and the
/// API traffic over at most 16 descriptors (one HTTP/2 connection here).
#[test]
fn eight_hundred_config_maps_use_a_few_descriptors() {
    isolated("eight_hundred_config_maps_use_a_few_descriptors", || {
        const N: usize = 800;
        let env = Env::new();
        let api = FakeApiServer::start();
        let kubeconfig = api.write_kubeconfig(env.dir.path());
        let mut volumes = Vec::new();
        for i in 0..N {
            api.apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("cm-{i}"), "namespace": "test"}, "data": {"k": format!("v{i}")}}));
            volumes
                .push(json!({"name": format!("cm-{i}"), "configMap": {"name": format!("cm-{i}")}}));
        }
        let big = "e5555555-0000-0000-0000-000000000005";
        let small = "f6666666-0000-0000-0000-000000000006";
        api.apply(api_pod("big", big, volumes));
        api.apply(api_pod(
            "small",
            small,
            vec![json!({"name": "scratch", "emptyDir": {"medium": "Memory"}})],
        ));
        let agent = env.start_agent_with(
            &[
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--node-name",
                NODE,
            ],
            |cmd| {
                // SAFETY: setrlimit only, between fork and exec.
                unsafe {
                    cmd.pre_exec(|| {
                        let lim = libc::rlimit {
                            rlim_cur: 1024,
                            rlim_max: 1024,
                        };
                        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            },
        );
        let pid = agent.child.id();
        let mut most = 0;
        wait("both pods mounted", Duration::from_secs(600), || {
            most = most.max(sockets_to(pid, api.addr.port()));
            all_mounted(&env, small, 1) && all_mounted(&env, big, N)
        });
        most = most.max(sockets_to(pid, api.addr.port()));
        let log = agent.log();
        assert!(
            !log.contains("Too many open files"),
            "EMFILE in the log:\n{}",
            &log[log.len().saturating_sub(4000)..]
        );
        assert!(
            most <= 16,
            "{most} connections to the API server at {N} objects"
        );
        assert!(api.open_connections() <= 16, "{}", api.open_connections());
        measured(&format!(
            "{N} configMaps: at most {most} sockets to the API server, {} descriptors open, peak RSS {} KiB",
            open_fds(pid),
            proc_status_kib(pid, "VmHWM")
        ));
        // The local API still answers.
        assert!(env.status().pods.len() >= 2);
        drop(agent);
    });
}

/// The agent on a hostile server with a manifests pod: the manifests pod
/// is mounted, status says why the API source is not synced or failing (containing
/// `expected`), the log says it once, the agent stays up, and its peak
/// RSS stays under [`RSS_LIMIT_KIB`].
fn hostile(name: &str, mode: Mode, expected: &str) {
    isolated(name, || {
        let env = Env::new();
        let server = HostileServer::start(mode);
        let kubeconfig = server.write_kubeconfig(env.dir.path());
        env.write_manifest(
            "local.yaml",
            &pod_yaml("local", LOCAL, &[("scratch", "emptyDir: {medium: Memory}")]),
        );
        let mut agent: Agent = env.start_agent(&[
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--node-name",
            NODE,
        ]);
        wait("the manifests pod mounted", Duration::from_secs(60), || {
            all_mounted(&env, LOCAL, 1)
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        let last = loop {
            let s = env.status();
            // The endless watch line comes after a list that worked.
            let unsynced = !s.synced || mode == Mode::EndlessWatchLine;
            if unsynced
                && s.errors
                    .iter()
                    .any(|e| e.source == "api" && e.error.contains(expected))
            {
                break s.errors;
            }
            if Instant::now() > deadline {
                let log = agent.log();
                let api: Vec<&str> = log.lines().filter(|l| l.contains("apiserver")).collect();
                panic!(
                    "status never named {expected:?}: errors {:?}, synced {}; log:\n{}",
                    s.errors,
                    s.synced,
                    api[api.len().saturating_sub(20)..].join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        if matches!(mode, Mode::EndlessList | Mode::EndlessWatchLine) {
            // A few more rounds of the hostile answer, then the peak.
            let seen = server.requests();
            wait("three more requests", Duration::from_secs(60), || {
                server.requests() >= seen + 3
            });
        }
        assert!(agent.is_alive(), "the agent died:\n{}", agent.log());
        let peak = proc_status_kib(agent.child.id(), "VmHWM");
        measured(&format!(
            "{mode:?}: peak RSS {peak} KiB; status errors {last:?}"
        ));
        assert!(peak <= RSS_LIMIT_KIB, "peak RSS {peak} KiB under {mode:?}");
        let log = agent.log();
        let lines = log
            .lines()
            .filter(|l| l.contains("API server: ") && l.contains(expected))
            .count();
        assert_eq!(lines, 1, "the cause logged {lines} times:\n{log}");
        assert!(all_mounted(&env, LOCAL, 1));
    });
}

#[test]
fn api_garbage_is_named_in_status() {
    hostile(
        "api_garbage_is_named_in_status",
        Mode::Garbage,
        "invalid JSON in the pods list at byte ",
    );
}

#[test]
fn api_silence_is_named_in_status() {
    hostile(
        "api_silence_is_named_in_status",
        Mode::Silent,
        "no answer in 30 s (pods list)",
    );
}

#[test]
fn api_drip_is_named_in_status() {
    hostile(
        "api_drip_is_named_in_status",
        Mode::Drip,
        "the pods list did not arrive within 30 s",
    );
}

#[test]
fn api_wrong_ca_is_named_in_status() {
    hostile(
        "api_wrong_ca_is_named_in_status",
        Mode::WrongCa,
        "TLS: certificate signed by unknown authority (CA from kubeconfig ",
    );
}

#[test]
fn api_refused_connection_is_named_in_status() {
    hostile(
        "api_refused_connection_is_named_in_status",
        Mode::Refused,
        "connection refused",
    );
}

#[test]
fn an_endless_pods_list_is_cut() {
    hostile(
        "an_endless_pods_list_is_cut",
        Mode::EndlessList,
        "the pods list is over 32 MiB",
    );
}

#[test]
fn an_endless_watch_line_is_cut() {
    hostile(
        "an_endless_watch_line_is_cut",
        Mode::EndlessWatchLine,
        "the pods watch event is over 8 MiB",
    );
}
