//! The agent's watches on a REAL, quiet API server (etcd and
//! kube-apiserver, `volmgr_kube::testing::RealApiServer`): the real agent,
//! with the node's own credentials (`system:node:n1`, a client
//! certificate, under `--authorization-mode=Node,RBAC`), follows the
//! node's pods for [`QUIET_ENV`] seconds (default fifteen minutes) while
//! nothing changes. A real server sends no bookmark on a quiet resource:
//! a healthy watch is silent until the server ends it at its
//! `timeoutSeconds`. Status must show no error at any poll, the audit log
//! exactly one list of pods by the node (every watch resumed, never a
//! relist) and no request refused.
//!
//! Without the real binaries (no Go outside CI) the test prints why and
//! skips; `scripts/kube-binaries.sh` builds them once into a cache.

// Test-only code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::{Duration, Instant};

use support::{isolated, Env};
use volmgr_kube::testing::real::{kube_binaries, tail, Audited};
use volmgr_kube::testing::RealApiServer;

/// How long the agent follows the quiet server, in seconds.
const QUIET_ENV: &str = "VOLMGR_QUIET_WATCH_SECS";
/// [`QUIET_ENV`]'s default: longer than any server-side watch timeout the
/// agent asks for (at most 600 s), so every watch is ended by the server
/// and resumed at least once.
const QUIET_DEFAULT_SECS: u64 = 900;
const NODE: &str = "n1";
const NODE_USER: &str = "system:node:n1";
/// Between two polls of `volmgr status`.
const POLL: Duration = Duration::from_secs(3);

/// The quiet period asked for.
fn quiet_for() -> Duration {
    let secs = std::env::var(QUIET_ENV)
        .ok()
        .map(|v| {
            v.trim()
                .parse::<u64>()
                .unwrap_or_else(|e| panic!("{QUIET_ENV}={v:?}: {e}"))
        })
        .unwrap_or(QUIET_DEFAULT_SECS);
    Duration::from_secs(secs)
}

/// The node's requests of `verb` on pods.
fn pods_by_node<'a>(audit: &'a [Audited], verb: &str) -> Vec<&'a Audited> {
    audit
        .iter()
        .filter(|a| a.user == NODE_USER && a.verb == verb && a.resource == "pods")
        .collect()
}

/// `timeoutSeconds` of a request URI, if it has one.
fn timeout_seconds(uri: &str) -> Option<u64> {
    let query = uri.split_once('?')?.1;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("timeoutSeconds="))
        .and_then(|v| v.parse().ok())
}

#[test]
fn quiet_watches_live_as_long_as_the_server_lets_them() {
    // Build (or find) the binaries out here: the isolated child sees the
    // host read-only but for the temporary directory, and only reads the
    // cache.
    if std::env::var_os("VOLMGR_TEST_IN_PRIVATE_NS").is_none() && kube_binaries().is_none() {
        return;
    }
    isolated("quiet_watches_live_as_long_as_the_server_lets_them", || {
        let Some(server) = RealApiServer::start() else {
            return;
        };
        server.apply(&format!(
            "{{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{{\"name\":\"{NODE}\"}}}}"
        ));
        let kubeconfig = server.node_kubeconfig(NODE);
        let env = Env::new();
        let mut agent = env.start_agent_without_manifests(&[
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--node-name",
            NODE,
            "--tracer",
            "off",
        ]);
        let quiet = quiet_for();
        let started = Instant::now();
        let mut polls = 0u32;
        let mut synced = false;
        let fail = |what: String, agent: &support::Agent| -> ! {
            panic!(
                "{what}\n--- agent log (tail)\n{}\n--- kube-apiserver log (tail)\n{}",
                tail(&agent.log(), 60),
                tail(&server.log(), 30)
            )
        };
        while started.elapsed() < quiet {
            if !agent.is_alive() {
                fail(
                    format!("the agent died after {:?}", started.elapsed()),
                    &agent,
                );
            }
            let s = env.status();
            polls += 1;
            synced |= s.synced;
            if !s.errors.is_empty() {
                fail(
                    format!(
                        "status has errors after {} s (poll {polls}): {:?}",
                        started.elapsed().as_secs(),
                        s.errors
                    ),
                    &agent,
                );
            }
            std::thread::sleep(POLL);
        }
        assert!(synced, "status never said synced in {quiet:?}");
        let audit = server.audit();
        let lists = pods_by_node(&audit, "list");
        if lists.len() != 1 {
            fail(
                format!(
                    "{} lists of pods by {NODE_USER} (one expected: every watch resumes): {lists:#?}",
                    lists.len()
                ),
                &agent,
            );
        }
        let forbidden: Vec<&Audited> = audit
            .iter()
            .filter(|a| a.user == NODE_USER && a.code == 403)
            .collect();
        if !forbidden.is_empty() {
            fail(format!("refused requests: {forbidden:#?}"), &agent);
        }
        // Every request says who sends it: volmgr, its version and
        // platform, and the node.
        for a in audit.iter().filter(|a| a.user == NODE_USER) {
            assert!(
                a.user_agent.starts_with("volmgr/") && a.user_agent.ends_with(&format!(" {NODE}")),
                "User-Agent {:?} of {a:?}",
                a.user_agent
            );
        }
        // Every pods watch that ended (the server ends each at its
        // timeout) had asked for 5 to 10 minutes, as client-go's reflector.
        let watches = pods_by_node(&audit, "watch");
        for w in &watches {
            match timeout_seconds(&w.uri) {
                Some(t) if (300..600).contains(&t) => {}
                other => fail(
                    format!("a pods watch with timeoutSeconds {other:?}: {w:#?}"),
                    &agent,
                ),
            }
        }
        eprintln!(
            "MEASURED: {} s quiet, {polls} status polls without an error, {} pods list, {} pods watches ended by the server",
            quiet.as_secs(),
            lists.len(),
            watches.len()
        );
    });
}
