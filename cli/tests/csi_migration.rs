//! End to end: CSI migration. A pod's claim bound to an in-tree
//! `awsElasticBlockStore` PersistentVolume, with the real agent and the
//! test driver (`volmgr-csi-driver`) registered as `ebs.csi.aws.com`, in a
//! private mount namespace: the volume waits for the VolumeAttachment the
//! attach/detach controller would create (named from the translated handle),
//! is staged at the CSI driver's global path and published with the
//! translated handle, fsType and attributes, its operations are labelled
//! `migrated="true"`, and it is torn down when the pod goes.

// Test-only helpers: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/csi_driver.rs"]
mod csi_driver;
mod support;

use std::io::Write;
use std::process::{Command, Stdio};

use csi_driver::{wait_or_dump, Driver};
use support::{isolated, Env};

const DRIVER: &str = "ebs.csi.aws.com";
/// `aws://<zone>/<id>`: csi-translation-lib's handle is the bare `vol-` ID.
const IN_TREE_ID: &str = "aws://us-west-2a/vol-0e1b2c3d4";
const HANDLE: &str = "vol-0e1b2c3d4";

/// Hex SHA-256 of `s`, computed with `sha256sum` (independently of volmgr).
fn sha256(s: &str) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

fn manifests(env: &Env) {
    env.write_manifest(
        "csidriver.yaml",
        &format!("apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {{name: {DRIVER}}}\nspec: {{attachRequired: true}}\n"),
    );
    env.write_manifest(
        "pv.yaml",
        &format!(
            "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: pv-ebs}}\nspec:\n  capacity: {{storage: 64Mi}}\n  accessModes: [ReadWriteOnce]\n  claimRef: {{namespace: test, name: claim-ebs}}\n  awsElasticBlockStore: {{volumeID: \"{IN_TREE_ID}\", fsType: ext4}}\n"
        ),
    );
    env.write_manifest(
        "pvc.yaml",
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: claim-ebs, namespace: test}\nspec: {accessModes: [ReadWriteOnce], volumeName: pv-ebs, resources: {requests: {storage: 64Mi}}}\n",
    );
    env.write_manifest(
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: test, uid: uid-ebs}\nspec:\n  nodeName: node-x\n  containers: [{name: c, image: i, volumeMounts: [{name: data, mountPath: /d}]}]\n  volumes: [{name: data, persistentVolumeClaim: {claimName: claim-ebs}}]\n",
    );
}

/// Before CSI migration the volume failed with "PersistentVolume pv-ebs is
/// not a CSI volume (source awsElasticBlockStore)" and nothing was staged.
#[test]
fn aws_ebs_pv_is_staged_and_published_by_its_csi_driver() {
    isolated(
        "aws_ebs_pv_is_staged_and_published_by_its_csi_driver",
        || {
            let env = Env::new();
            manifests(&env);
            let mut driver = Driver::new(&env, DRIVER);
            driver.register_in(env.root.join("plugins_registry"));
            driver.spawn();
            let agent = env.start_agent(&["--node-name", "node-x"]);
            // The attach/detach controller's name: "csi-" + sha256(handle +
            // driver + node), from the translated handle.
            let va = format!("csi-{}", sha256(&format!("{HANDLE}{DRIVER}node-x")));
            let error = || env.volume_state("uid-ebs", "data").and_then(|s| s.2);
            wait_or_dump(
                &env,
                &agent,
                &driver,
                "waiting for the VolumeAttachment",
                || error().is_some_and(|e| e.contains(&va) && e.contains(HANDLE)),
            );
            env.write_manifest(
            "va.yaml",
            &format!(
                "apiVersion: storage.k8s.io/v1\nkind: VolumeAttachment\nmetadata: {{name: {va}}}\nspec: {{attacher: {DRIVER}, nodeName: node-x, source: {{persistentVolumeName: pv-ebs}}}}\nstatus: {{attached: true}}\n"
            ),
        );
            wait_or_dump(&env, &agent, &driver, "volume mounted", || {
                env.volume_state("uid-ebs", "data")
                    .is_some_and(|(s, _, _)| s == "mounted")
            });
            assert_eq!(driver.count("NodeStageVolume", HANDLE, "OK"), 1);
            assert_eq!(driver.count("NodePublishVolume", HANDLE, "OK"), 1);
            let contexts = std::fs::read_to_string(driver.state().join("contexts.jsonl")).unwrap();
            let stage: serde_json::Value = contexts
                .lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .find(|c| c["method"] == "NodeStageVolume")
                .unwrap();
            assert_eq!(stage["volume_id"], HANDLE, "{stage}");
            assert_eq!(stage["volume_context"]["partition"], "0", "{stage}");
            assert_eq!(stage["access_mode"], "SINGLE_NODE_WRITER", "{stage}");
            // Staged where the kubelet stages the CSI driver's volumes.
            let staging = env
                .root
                .join("plugins/kubernetes.io/csi")
                .join(DRIVER)
                .join(sha256(HANDLE))
                .join("globalmount");
            assert_eq!(env.mount_count(&staging), 1, "{}", staging.display());
            let publish = env.csi_publish_path("uid-ebs", "pv-ebs");
            assert_eq!(env.mount_count(&publish), 1, "{}", publish.display());
            let s = env.status();
            assert_eq!(s.pods[0].volumes[0].plugin, "kubernetes.io/csi");
            let metrics = env.metrics_text();
            assert!(
            metrics.contains(&format!(
                "storage_operation_duration_seconds_count{{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/csi:{DRIVER}\",status=\"success\",migrated=\"true\"}} 1"
            )),
            "{metrics}"
        );

            env.remove_manifest("pod.yaml");
            wait_or_dump(&env, &agent, &driver, "torn down", || {
                !env.root.join("pods/uid-ebs").exists() && env.mounts().is_empty()
            });
            assert_eq!(driver.count("NodeUnpublishVolume", HANDLE, "OK"), 1);
            assert_eq!(driver.count("NodeUnstageVolume", HANDLE, "OK"), 1);
            assert!(agent.term());
            driver.stop();
            env.assert_outside_untouched();
        },
    );
}
