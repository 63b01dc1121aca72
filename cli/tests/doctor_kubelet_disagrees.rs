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
                        && e.contains(&format!(
                            "(kubelet on {NODE}): Unable to attach or mount volumes: unmounted volumes=[conf"
                        ))),
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

/// The CSI driver of the attach test (never registered: nothing mounts).
const ATTACH_DRIVER: &str = "attach.example.com";
/// Its volume's handle.
const ATTACH_HANDLE: &str = "h-attach";

/// A CSIDriver that requires attachment, a PersistentVolume of it and a
/// claim `attach` bound to it.
fn attach_objects() -> String {
    format!(
        "apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {{name: {ATTACH_DRIVER}}}
spec: {{attachRequired: true}}
---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: pv-attach}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  csi: {{driver: {ATTACH_DRIVER}, volumeHandle: {ATTACH_HANDLE}}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: attach, namespace: default}}
spec:
  accessModes: [ReadWriteOnce]
  volumeName: pv-attach
  storageClassName: ''
  resources: {{requests: {{storage: 1Gi}}}}
"
    )
}

/// The names in `unattached volumes=[...]` of a kubelet's message.
fn unattached(message: &str) -> Vec<&str> {
    message
        .split_once("unattached volumes=[")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(names, _)| names.split_whitespace().collect())
        .unwrap_or_default()
}

/// The evidence lines of finding `f`.
fn evidence(f: &serde_json::Value) -> Vec<String> {
    f["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect()
}

/// The attach side: the stock kubelet waits for the Node's
/// `status.volumesAttached` to list the claim's CSI volume `data`
/// (`VerifyControllerAttachedVolume`) and says `unattached
/// volumes=[data]` (the kubelet 1.37 records its `FailedMount` only when
/// `WaitForAttachAndMount` ends on a pod error, hence the second claim
/// `gone`, which does not exist: the event comes at every retry of the
/// pod, about every 10 s), while its VolumeAttachment (named as the attach/detach
/// controller names it, created and set attached by the test as the
/// admin) says attached: no kube-controller-manager runs, so nothing
/// records it in the Node's status. The finding shows the kubelet's
/// event, the VolumeAttachment, whether the Node lists the volume and the
/// conclusion; `doctor` exits 1. Once the Node's status lists it (patched
/// as the controller would), the finding clears (the kubelet's unattached
/// event is older than the listing). The observer is refused nothing
/// (its ClusterRole's `get` of nodes). (Before, run with the attach side
/// not wired into observe mode: the kubelet said `unmounted volumes=[data
/// gone], unattached volumes=[data]` 15 times, `doctor` listed no finding
/// and the test gave up waiting for "kubelet_disagrees reported (attach
/// side)" after 300 s.)
/// Once observe mode scanned: the attach test's CSIDriver, PV and bound
/// claim, and the VolumeAttachment under the attach/detach controller's
/// name for this node's volume, naming node `on`; its name.
fn attachment_for(node: &Node, on: &str) -> String {
    node.wait(60, "observe mode scanned", || node.scans() >= 3);
    node.server.apply(&attach_objects());
    node.server.bind("default", "attach", "pv-attach");
    let va =
        volmgr::populator::convert::csi_driver::attachment_name(ATTACH_HANDLE, ATTACH_DRIVER, NODE);
    node.server.apply(&format!(
        "apiVersion: storage.k8s.io/v1\nkind: VolumeAttachment\nmetadata: {{name: {va}}}\nspec: {{attacher: {ATTACH_DRIVER}, nodeName: {on}, source: {{persistentVolumeName: pv-attach}}}}\n"
    ));
    va
}

/// Waits until doctor reports a `kubelet_disagrees` finding (`what`), then
/// checks it is the only one, doctor exits 1, and it is about volume
/// `data` of pod `default/<pod>` (`uid`) at its CSI path; the finding.
fn the_one_disagreement(node: &Node, what: &str, pod: &str, uid: &str) -> serde_json::Value {
    node.wait(300, &format!("kubelet_disagrees reported ({what})"), || {
        !disagreements(&node.doctor().1).is_empty()
    });
    let (code, report) = node.doctor();
    assert_eq!(code, 1, "{report:#}");
    let found = disagreements(&report);
    assert_eq!(found.len(), 1, "{report:#}");
    let f = found[0].clone();
    let path = node.pod_dir(uid).join("volumes/kubernetes.io~csi/data");
    assert_eq!(f["path"], path.display().to_string(), "{f:#}");
    assert_eq!(f["pod"], format!("default/{pod}"), "{f:#}");
    assert_eq!(f["pod_uid"], uid, "{f:#}");
    assert_eq!(f["volume"], "data", "{f:#}");
    f
}

#[test]
fn kubelet_says_unattached_while_the_attachment_is_attached() {
    isolated(
        "kubelet_says_unattached_while_the_attachment_is_attached",
        || {
            let Some(node) = Node::start_observed("1h") else {
                return;
            };
            let va = attachment_for(&node, NODE);
            node.kubectl(&[
                "patch",
                "volumeattachment",
                &va,
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"attached":true}}"#,
            ]);
            let pod = PodYaml::new("waits", NODE)
                .claim("data", "attach")
                .claim("gone", "nowhere")
                .build();
            node.server.apply(&pod);
            let uid = node.uid("waits");
            node.wait(300, "the kubelet's unattached volumes=[data ...]", || {
                failed_mounts(&node, "waits")
                    .iter()
                    .any(|m| unattached(m).contains(&"data"))
            });
            let f = &the_one_disagreement(&node, "attach side", "waits", &uid);
            assert!(
                f["summary"].as_str().unwrap().contains(&format!(
                    "the kubelet says volume \"data\" is not attached (unattached volumes=[...]); its VolumeAttachment {va} says attached, the Node's status.volumesAttached does not list it"
                )),
                "{f:#}"
            );
            let ev = evidence(f);
            let has = |want: &str| ev.iter().any(|e| e.contains(want));
            assert!(has(&format!("(kubelet on {NODE}): Unable to attach or mount volumes: unmounted volumes=[data gone], unattached volumes=[data")), "{f:#}");
            assert!(has(&format!("the VolumeAttachment: {va} spec.nodeName {NODE}: attached=true (observe mode first saw it attached at ")), "{f:#}");
            assert!(has("attachError none, detachError none"), "{f:#}");
            let unique = format!("kubernetes.io/csi/{ATTACH_DRIVER}^{ATTACH_HANDLE}");
            assert!(has(&format!("the Node {NODE}: status.volumesAttached does not list it (0 volumes listed): {unique}")), "{f:#}");
            assert!(has("conclusion: the CSI attacher attached it; the Node's status.volumesAttached does not list it: the attach/detach controller in kube-controller-manager has not recorded it"), "{f:#}");
            assert_eq!(f["events"][0]["source"], "kubelet", "{f:#}");

            // The controller's side, as it would record it.
            let patch = format!(
                r#"{{"status":{{"volumesAttached":[{{"name":"{unique}","devicePath":""}}]}}}}"#
            );
            node.kubectl(&[
                "patch",
                "node",
                NODE,
                "--subresource=status",
                "--type=merge",
                "-p",
                &patch,
            ]);
            node.wait(120, "kubelet_disagrees cleared", || {
                disagreements(&node.doctor().1).is_empty()
            });
            node.scanned_again(3);
            assert_eq!(
                disagreements(&node.doctor().1),
                Vec::<serde_json::Value>::new()
            );
            assert_eq!(
                node.server.forbidden(OBSERVER),
                vec![],
                "the observer refused"
            );
        },
    );
}

/// longhorn/longhorn#4188: the VolumeAttachment the kubelet waits for
/// names another node. The claim's CSI volume `data` is listed in the
/// Node's `status.volumesAttached` (patched as a stale status after a
/// reboot would have it: the kubelet passes `VerifyControllerAttachedVolume`
/// and calls `WaitForAttach`), while its VolumeAttachment, under the name
/// the attach/detach controller gives it for this node, says
/// `spec.nodeName: some-other-node`: the real Node authorizer refuses the
/// stock kubelet's GET (`MountVolume.WaitForAttach failed ... has GET
/// error for volume attachment csi-...: ... is forbidden ... no
/// relationship found between node 'n1' and this object`). The finding
/// names the VolumeAttachment and both nodes, shows the kubelet's event
/// and the VolumeAttachment as observe mode read it; `doctor` exits 1;
/// once the VolumeAttachment is deleted, the finding says none exists (the
/// kubelet's GET is still refused: the longhorn case). The observer is
/// refused nothing. (Before, run with `attach_forbidden::evaluate` not
/// called: the kubelet said `has GET error for volume attachment csi-...`
/// and the test gave up waiting for "kubelet_disagrees reported
/// (forbidden)" after 90 s.)
#[test]
fn kubelet_may_not_read_an_attachment_naming_another_node() {
    isolated(
        "kubelet_may_not_read_an_attachment_naming_another_node",
        || {
            let Some(node) = Node::start_observed("1h") else {
                return;
            };
            let va = attachment_for(&node, "some-other-node");
            node.kubectl(&[
                "patch",
                "volumeattachment",
                &va,
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"attached":true}}"#,
            ]);
            let unique = format!("kubernetes.io/csi/{ATTACH_DRIVER}^{ATTACH_HANDLE}");
            let patch = format!(
                r#"{{"status":{{"volumesAttached":[{{"name":"{unique}","devicePath":""}}]}}}}"#
            );
            node.kubectl(&[
                "patch",
                "node",
                NODE,
                "--subresource=status",
                "--type=merge",
                "-p",
                &patch,
            ]);
            let pod = PodYaml::new("moved", NODE).claim("data", "attach").build();
            node.server.apply(&pod);
            let uid = node.uid("moved");
            let refused = format!("has GET error for volume attachment {va}");
            node.wait(300, "the kubelet's GET error for volume attachment", || {
                failed_mounts(&node, "moved")
                    .iter()
                    .any(|m| m.contains(&refused))
            });
            let f = &the_one_disagreement(&node, "forbidden", "moved", &uid);
            assert!(
                f["summary"].as_str().unwrap().contains(&format!(
                    "the kubelet may not read VolumeAttachment {va} (volume \"data\") because it names node some-other-node, not {NODE}: the volume is still attached there"
                )),
                "{f:#}"
            );
            let ev = evidence(f);
            let has = |want: &str| ev.iter().any(|e| e.contains(want));
            assert!(
                has("the kubelet: Warning FailedMount")
                    && has("MountVolume.WaitForAttach failed for volume"),
                "{f:#}"
            );
            assert!(
                has(&refused) && has("no relationship found between node 'n1' and this object"),
                "{f:#}"
            );
            assert!(has(&format!("the VolumeAttachment: {va} spec.nodeName some-other-node: attached=true, attachError none, detachError none")), "{f:#}");
            assert!(has("conclusion: the Node authorizer lets node n1's kubelet read only VolumeAttachments whose spec.nodeName is n1"), "{f:#}");

            node.kubectl(&["delete", "volumeattachment", &va, "--wait=false"]);
            let absent = format!("the kubelet may not read VolumeAttachment {va} (volume \"data\"): no such VolumeAttachment exists");
            node.wait(120, "kubelet_disagrees says none exists", || {
                disagreements(&node.doctor().1)
                    .iter()
                    .any(|f| f["summary"].as_str().unwrap_or("").contains(&absent))
            });
            let (code, report) = node.doctor();
            assert_eq!(code, 1, "{report:#}");
            let found = disagreements(&report);
            assert_eq!(found.len(), 1, "{report:#}");
            assert!(
                evidence(&found[0])
                    .iter()
                    .any(|e| e.contains(&format!("the VolumeAttachment: {va} does not exist"))),
                "{report:#}"
            );
            assert_eq!(
                node.server.forbidden(OBSERVER),
                vec![],
                "the observer refused"
            );
        },
    );
}
