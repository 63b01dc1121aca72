//! `kubelet_disagrees` next to a REAL, stock kubelet (the real-kubelet
//! harness, `support/kubelet_node.rs`): the kubelet's `FailedMount` event
//! says `unmounted volumes=[conf ...]` while the node has `conf` mounted
//! at the pod's volume path.
//!
//! How the two sides are made to differ: pod `torn` has a configMap volume
//! `conf` whose ConfigMap does not exist (the kubelet's SetUp fails before
//! it touches the volume's directory, on every retry) and a claim that
//! does not exist (a pod error: the kubelet 1.37 records `Unable to attach
//! or mount volumes: unmounted volumes=[...]` only when
//! `WaitForAttachAndMount` ends on one, not on its time-out, and again on
//! every retry of the pod, about every 10 s). The test then mounts a tmpfs
//! on `ROOT/pods/<uid>/volumes/kubernetes.io~configmap/conf` in the test's
//! mount namespace (the observer's), behind the kubelet's back: the
//! kubelet's next event still lists `conf`.

// Test-only helpers: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/kubelet_node.rs"]
mod kubelet_node;
mod support;

use std::process::Command;

use kubelet_node::*;
use support::pod_yaml::PodYaml;
use support::{isolated, volmgr_bin};

/// The kubelet's `FailedMount` messages on pod `name`.
fn failed_mounts(node: &Node, name: &str) -> Vec<String> {
    node.kubectl(&[
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={name},reason=FailedMount"),
        "-o",
        "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ])
    .lines()
    .map(str::to_string)
    .collect()
}

/// The `kubelet_disagrees` findings of a doctor report.
fn disagreements(report: &serde_json::Value) -> Vec<serde_json::Value> {
    report["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["kind"] == "kubelet_disagrees")
        .cloned()
        .collect()
}

/// The findings other than the host's loop devices (not this node's: see
/// `real_kubelet.rs`).
fn ours(report: &serde_json::Value) -> Vec<serde_json::Value> {
    report["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["kind"] != "loop_backing_deleted")
        .cloned()
        .collect()
}

/// The kubelet says `conf` is not mounted, the node has it mounted: the
/// finding shows the kubelet's event (reason, message, count, last time,
/// source) and the mount line side by side, `doctor` exits 1 and prints
/// it; the planted mount removed, it clears. Only the kubelet's event
/// repeated after the mount counts (the events before it are the
/// kubelet's own failure, not a disagreement), the pod is read because it
/// is `Pending` (`--stuck-after 1h`: no stuck volume asks for its events),
/// and the observer's identity is refused nothing. (Before: nothing
/// reported, `doctor` exited 0.)
#[test]
fn kubelet_says_unmounted_while_the_node_has_it_mounted() {
    isolated(
        "kubelet_says_unmounted_while_the_node_has_it_mounted",
        || {
            let Some(node) = Node::start_observed("1h") else {
                return;
            };
            node.wait(60, "observe mode scanned", || node.scans() >= 3);
            let pod = PodYaml::new("torn", NODE)
                .volume("conf", "/conf", "configMap: {name: absent}")
                .claim("data", "nowhere")
                .build();
            node.server.apply(&pod);
            let uid = node.uid("torn");
            node.wait(240, "the kubelet's unmounted volumes=[conf ...]", || {
                failed_mounts(&node, "torn")
                    .iter()
                    .any(|m| m.contains("unmounted volumes=[conf"))
            });
            node.scanned_again(2);
            assert_eq!(
                disagreements(&node.doctor().1),
                Vec::<serde_json::Value>::new()
            );
            // Behind the kubelet's back.
            let conf = node
                .pod_dir(&uid)
                .join("volumes/kubernetes.io~configmap/conf");
            std::fs::create_dir_all(&conf).unwrap();
            nix::mount::mount(
                Some("planted"),
                &conf,
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                Some("size=1m"),
            )
            .unwrap();
            node.wait(300, "kubelet_disagrees reported", || {
                !disagreements(&node.doctor().1).is_empty()
            });
            let (code, report) = node.doctor();
            assert_eq!(code, 1, "{report:#}");
            let found = disagreements(&report);
            assert_eq!(found.len(), 1, "{report:#}");
            let f = &found[0];
            assert_eq!(f["path"], conf.display().to_string(), "{f:#}");
            assert_eq!(f["pod"], "default/torn", "{f:#}");
            assert_eq!(f["pod_uid"], uid.as_str(), "{f:#}");
            assert_eq!(f["volume"], "conf", "{f:#}");
            let evidence: Vec<&str> = f["evidence"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e.as_str().unwrap())
                .collect();
            assert!(
                evidence
                    .iter()
                    .any(|e| e.starts_with("the kubelet: Warning FailedMount x")
                        && e.contains(
                            "(kubelet): Unable to attach or mount volumes: unmounted volumes=[conf"
                        )),
                "{f:#}"
            );
            assert!(
                evidence
                    .iter()
                    .any(|e| e.starts_with("the node: mounted: id ")
                        && e.contains(&format!("planted on {} type tmpfs", conf.display()))),
                "{f:#}"
            );
            let ev = &f["events"][0];
            assert_eq!(ev["reason"], "FailedMount", "{f:#}");
            assert_eq!(ev["source"], "kubelet", "{f:#}");
            assert!(
                ev["count"].as_u64().unwrap() >= 2,
                "repeated after the mount: {f:#}"
            );
            let text = Command::new(volmgr_bin())
                .args(["doctor", "--state-dir"])
                .arg(&node.state)
                .output()
                .unwrap();
            assert_eq!(text.status.code(), Some(1));
            let text = String::from_utf8_lossy(&text.stdout);
            assert!(
                text.contains(
                    "- kubelet_disagrees: the kubelet says volume \"conf\" is not mounted"
                ),
                "{text}"
            );
            assert!(text.contains("    the node: mounted: id "), "{text}");
            assert!(
                text.contains("    event ") && text.contains("FailedMount"),
                "{text}"
            );
            assert!(text.contains("restart the kubelet"), "{text}");

            nix::mount::umount2(&conf, nix::mount::MntFlags::empty()).unwrap();
            node.wait(120, "kubelet_disagrees cleared", || {
                disagreements(&node.doctor().1).is_empty()
            });
            node.scanned_again(3);
            let (code, report) = node.doctor();
            assert_eq!(ours(&report), Vec::<serde_json::Value>::new(), "{report:#}");
            assert!(code == 0 || report["findings"].as_array().is_some_and(|f| !f.is_empty()));
            assert_eq!(
                node.server.forbidden(OBSERVER),
                vec![],
                "the observer refused"
            );
        },
    );
}

/// The messages of the events of pod `name`'s `volume_stuck` findings.
fn stuck_event_messages(report: &serde_json::Value, pod: &str) -> Vec<String> {
    report["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["kind"] == "volume_stuck" && f["pod"] == pod)
        .flat_map(|f| f["events"].as_array().cloned().unwrap_or_default())
        .filter_map(|e| e["message"].as_str().map(str::to_string))
        .collect()
}

/// No false alarm: the kubelet said `unmounted volumes=[data sec]` while
/// secret `late` did not exist, then mounted `sec` once it was created and
/// says `unmounted volumes=[data]` since. The old event (last seen before
/// the mount) names a volume the node now has mounted, and is not a
/// disagreement: nothing is reported once observe mode read the pod's
/// events after the mount.
#[test]
fn a_failure_before_the_mount_is_no_disagreement() {
    isolated("a_failure_before_the_mount_is_no_disagreement", || {
        let Some(node) = Node::start_observed("1s") else {
            return;
        };
        node.wait(60, "observe mode scanned", || node.scans() >= 3);
        let pod = PodYaml::new("late", NODE)
            .volume("sec", "/sec", "secret: {secretName: late}")
            .claim("data", "nowhere")
            .build();
        node.server.apply(&pod);
        let uid = node.uid("late");
        node.wait(240, "the kubelet's unmounted volumes=[data sec]", || {
            failed_mounts(&node, "late")
                .iter()
                .any(|m| m.contains("unmounted volumes=[data sec]"))
        });
        node.server.apply(
            "apiVersion: v1\nkind: Secret\nmetadata: {name: late, namespace: default}\nstringData: {k: v}\n",
        );
        let sec = node.pod_dir(&uid).join("volumes/kubernetes.io~secret/sec");
        node.wait(240, "the kubelet mounted sec", || {
            !node.mounts_below(&sec).is_empty()
        });
        node.wait(
            300,
            "the observer read the kubelet's events after the mount",
            || {
                let msgs = stuck_event_messages(&node.doctor().1, "default/late");
                msgs.iter()
                    .any(|m| m.contains("unmounted volumes=[data sec]"))
                    && msgs.iter().any(|m| m.contains("unmounted volumes=[data],"))
            },
        );
        node.scanned_again(3);
        let (_, report) = node.doctor();
        assert_eq!(
            disagreements(&report),
            Vec::<serde_json::Value>::new(),
            "{report:#}"
        );
        assert_eq!(
            node.server.forbidden(OBSERVER),
            vec![],
            "the observer refused"
        );
    });
}
