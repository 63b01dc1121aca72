//! End-to-end test of the CSI driver's node volume limit (NodeGetInfo's
//! `max_volumes_per_node`), with the real agent and the real test driver
//! (`volmgr-csi-driver --max-volumes-per-node 2`) registering through
//! `ROOT/plugins_registry`, in a private mount namespace: a volume beyond
//! the limit is refused with a clear error in its pod's status, volumes
//! already in use are not, a restart counts what it adopts, and the refused
//! volume mounts once another one of the driver is gone.

// Test-only helpers: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/csi_driver.rs"]
mod csi_driver;
mod support;

use csi_driver::{wait_or_dump, Driver};
use support::{isolated, Agent, Env};

const DRIVER: &str = "limit.csi.volmgr.io";

const LIMIT_ERROR: &str =
    "node limit of 2 volumes of driver \"limit.csi.volmgr.io\" reached (2 in use)";

/// PersistentVolume `pv-<n>` (handle `vol-<n>`) of the driver and its claim
/// `claim-<n>`.
fn pv_yaml(n: &str, block: bool) -> String {
    let mode = if block { "Block" } else { "Filesystem" };
    format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: pv-{n}}}\nspec:\n  capacity: {{storage: 64Mi}}\n  accessModes: [ReadWriteMany]\n  volumeMode: {mode}\n  claimRef: {{namespace: test, name: claim-{n}}}\n  csi: {{driver: {DRIVER}, volumeHandle: vol-{n}, fsType: ext4, volumeAttributes: {{size: 64Mi}}}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: claim-{n}, namespace: test}}\nspec: {{volumeName: pv-{n}, accessModes: [ReadWriteMany], volumeMode: {mode}}}\n"
    )
}

/// Pod `uid-<name>` using claim `claim-<claim>` as volume `data`.
fn pod_yaml(name: &str, claim: &str) -> String {
    support::pod_yaml(
        name,
        &format!("uid-{name}"),
        &[(
            "data",
            &format!("persistentVolumeClaim: {{claimName: claim-{claim}}}"),
        )],
    )
}

/// Pod `uid-<name>` using claim `claim-<claim>` as the block device `data`.
fn block_pod_yaml(name: &str, claim: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: test, uid: uid-{name}}}\nspec:\n  containers: [{{name: c, image: i, volumeDevices: [{{name: data, devicePath: /dev/xvda}}]}}]\n  volumes: [{{name: data, persistentVolumeClaim: {{claimName: claim-{claim}}}}}]\n")
}

/// (state, error) of pod `uid-<name>`'s volume `data`.
fn state(env: &Env, name: &str) -> Option<(String, Option<String>)> {
    env.volume_state(&format!("uid-{name}"), "data")
        .map(|(s, _, e)| (s, e))
}

fn mounted(env: &Env, name: &str) -> bool {
    state(env, name).is_some_and(|(s, _)| s == "mounted")
}

fn refused(env: &Env, name: &str) -> bool {
    state(env, name).is_some_and(|(s, e)| s == "error" && e.as_deref() == Some(LIMIT_ERROR))
}

/// NodeStageVolume calls of the driver that succeeded, per volume handle.
fn staged_ok(driver: &Driver, handle: &str) -> usize {
    driver.count("NodeStageVolume", handle, "OK")
}

/// `volmgr wait --pod uid-c` ends, when its timeout passes, with the
/// kubelet's `VolumeAttachLimitExceededError` text (before: volmgr's own
/// timeout text).
fn assert_wait_rejects_at_the_limit(env: &Env) {
    let out = std::process::Command::new(support::volmgr_bin())
        .args(["wait", "--pod", "uid-c", "--timeout", "1", "--root"])
        .arg(&env.root)
        .output()
        .expect("run volmgr wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let want = format!(
        "volmgr: Node has reached its volume attachment limit, rejecting pod. \
         unmounted volumes=[data], unattached volumes=[data], failed to process volumes=[]: {LIMIT_ERROR}"
    );
    assert_eq!(stderr.trim_end(), want);
}

fn start_agent(env: &Env) -> Agent {
    env.start_agent(&["--node-name", "node-1"])
}

#[test]
fn driver_volume_limit_refuses_then_admits() {
    isolated("driver_volume_limit_refuses_then_admits", || {
        let env = Env::new();
        let mut driver = Driver::new(&env, DRIVER);
        driver.register_in(env.root.join("plugins_registry"));
        driver.with_args(&["--max-volumes-per-node", "2"]);
        driver.spawn();
        let mut agent = start_agent(&env);
        wait_or_dump(
            &env,
            &agent,
            &driver,
            "driver registered with its limit",
            || {
                env.status()
                    .csi_drivers
                    .iter()
                    .any(|d| d.name == DRIVER && d.max_volumes_per_node == Some(2))
            },
        );
        for n in ["a", "b"] {
            env.write_manifest(&format!("pv-{n}.yaml"), &pv_yaml(n, false));
        }
        env.write_manifest("pv-c.yaml", &pv_yaml("c", true));
        env.write_manifest("a.yaml", &pod_yaml("a", "a"));
        env.write_manifest("b.yaml", &pod_yaml("b", "b"));
        wait_or_dump(&env, &agent, &driver, "a and b mounted", || {
            mounted(&env, "a") && mounted(&env, "b")
        });

        // The third volume (a block one) is refused before any call for it:
        // the pod shows why, the others are not affected.
        env.write_manifest("c.yaml", &block_pod_yaml("c", "c"));
        wait_or_dump(&env, &agent, &driver, "c refused at the limit", || {
            refused(&env, "c")
        });
        // Retried with backoff, refused each time.
        wait_or_dump(&env, &agent, &driver, "c retried", || {
            env.volume_state("uid-c", "data")
                .is_some_and(|(_, attempts, _)| attempts >= 2)
        });
        assert!(refused(&env, "c"), "{:?}", state(&env, "c"));
        assert_wait_rejects_at_the_limit(&env);
        assert!(driver
            .calls_of("NodeStageVolume")
            .iter()
            .all(|c| c["volume_id"] != "vol-c"));
        assert!(mounted(&env, "a") && mounted(&env, "b"));

        // A second pod sharing a volume already in use is not refused.
        env.write_manifest("a2.yaml", &pod_yaml("a2", "a"));
        wait_or_dump(&env, &agent, &driver, "a2 mounted (shares a)", || {
            mounted(&env, "a2")
        });
        assert_eq!(staged_ok(&driver, "vol-a"), 1, "staged once");

        // A restart adopts the two volumes in use: they are not set up
        // again nor refused, and c is still refused.
        agent.kill9();
        agent = start_agent(&env);
        wait_or_dump(&env, &agent, &driver, "c refused after the restart", || {
            refused(&env, "c") && ["a", "a2", "b"].iter().all(|p| mounted(&env, p))
        });
        assert_eq!(staged_ok(&driver, "vol-a"), 1, "adopted, not staged again");
        assert_eq!(staged_ok(&driver, "vol-b"), 1, "adopted, not staged again");
        assert!(driver
            .calls_of("NodeStageVolume")
            .iter()
            .all(|c| c["volume_id"] != "vol-c"));

        // b goes: its volume is unstaged, and c gets the place.
        env.remove_manifest("b.yaml");
        wait_or_dump(&env, &agent, &driver, "c mounted once b is gone", || {
            mounted(&env, "c")
        });
        assert_eq!(driver.count("NodeUnstageVolume", "vol-b", "OK"), 1);
        assert_eq!(staged_ok(&driver, "vol-c"), 1);
        assert_eq!(state(&env, "c").and_then(|(_, e)| e), None);

        for p in ["a", "a2", "c"] {
            env.remove_manifest(&format!("{p}.yaml"));
        }
        wait_or_dump(&env, &agent, &driver, "everything torn down", || {
            env.mounts().is_empty() && driver.loop_devices().is_empty()
        });
        assert!(agent.term());
        driver.stop();
        env.assert_outside_untouched();
    });
}
