//! End-to-end tests of where CSI volumes come from, with the real agent and
//! the real test driver (`volmgr-csi-driver`), each in a private mount
//! namespace of its own:
//!
//! - driver discovery: a driver registering through `ROOT/plugins_registry`
//!   (the kubelet's plugin registration API, as node-driver-registrar serves
//!   it) shows in status, is unregistered when its socket goes away and
//!   registered again when it comes back; `--csi-driver NAME=SOCKET`;
//! - volume sources: a pod's `persistentVolumeClaim` resolved through
//!   PersistentVolumeClaim, PersistentVolume and Secret objects in the
//!   manifests directory, with per-volume errors that clear themselves, then
//!   mounted by the driver and grown when the PV's capacity grows; secret
//!   values never reach status or the agent's log.

// Test-only helpers: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/csi_driver.rs"]
mod csi_driver;
mod support;

use std::path::PathBuf;

use csi_driver::{wait_or_dump, Driver};
use support::{isolated, pod_yaml, Env};

const DRIVER: &str = "test.csi.volmgr.io";

/// The test driver serving plugin registration in `ROOT/plugins_registry`;
/// not started yet.
fn new_driver(env: &Env) -> Driver {
    let mut d = Driver::new(env, DRIVER);
    d.register_in(env.root.join("plugins_registry"));
    d
}

/// The registered drivers in status: (name, endpoint, versions).
fn drivers(env: &Env) -> Vec<(String, String, Vec<String>)> {
    env.status()
        .csi_drivers
        .into_iter()
        .map(|d| (d.name, d.endpoint, d.versions))
        .collect()
}

fn registered(env: &Env, driver: &Driver) -> bool {
    drivers(env).iter().any(|(n, e, v)| {
        n == DRIVER && std::path::Path::new(e) == driver.socket() && v == &["1.0.0"]
    })
}

#[test]
fn driver_registers_through_plugins_registry() {
    isolated("driver_registers_through_plugins_registry", || {
        let env = Env::new();
        let static_socket = env.dir.path().join("static.sock");
        let flag = format!("static.csi={}", static_socket.display());
        let agent = env.start_agent(&["--csi-driver", &flag]);
        env.wait_synced();
        let reg_dir = env.root.join("plugins_registry");
        assert!(reg_dir.is_dir(), "the agent creates ROOT/plugins_registry");
        assert_eq!(
            drivers(&env),
            vec![(
                "static.csi".to_string(),
                static_socket.display().to_string(),
                vec![]
            )],
            "--csi-driver is registered as given"
        );
        // Not sockets, or hidden: ignored.
        std::fs::write(reg_dir.join("notes.txt"), b"not a socket").unwrap();
        std::fs::create_dir(reg_dir.join("sub")).unwrap();

        // GetInfo fails until the fault is lifted: the problem shows in
        // status (by socket), the registration is retried, then succeeds.
        let mut driver = new_driver(&env);
        driver.faults(serde_json::json!([
            {"method": "GetInfo", "code": "UNAVAILABLE", "message": "not ready yet"}
        ]));
        driver.spawn();
        let socket = driver.registration_socket().display().to_string();
        env.wait_for("registration problem in status", || {
            env.status().errors.iter().any(|e| {
                e.source == socket
                    && e.error.contains("GetInfo failed")
                    && e.error.contains("not ready yet")
            })
        });
        assert!(!registered(&env, &driver));
        env.wait_for("a retry", || driver.calls_of("GetInfo").len() >= 2);
        driver.faults(serde_json::json!([]));
        env.wait_for("driver registered", || registered(&env, &driver));
        assert!(
            agent.log().contains("plugin registration failed"),
            "the failure is logged"
        );
        env.wait_for("NotifyRegistrationStatus(true)", || {
            driver
                .registration()
                .is_some_and(|r| r["plugin_registered"] == true && r["error"] == "")
        });
        assert!(drivers(&env).iter().any(|(n, _, _)| n == "static.csi"));
        // The failed attempt's problem clears once registered.
        env.wait_for("no registration problem left", || {
            env.status().errors.is_empty()
        });

        // The driver goes away (its registration socket is removed).
        driver.stop();
        assert!(!driver.registration_socket().exists());
        env.wait_for("driver unregistered", || !registered(&env, &driver));

        // And comes back: registered again.
        let before = driver.calls_of("GetInfo").len();
        driver.spawn();
        env.wait_for("driver registered again", || registered(&env, &driver));
        env.wait_for("a new GetInfo", || {
            driver.calls_of("GetInfo").len() > before
        });

        // A driver restarting in a subdirectory is found there too.
        driver.stop();
        env.wait_for("driver unregistered", || !registered(&env, &driver));
        driver.register_in(reg_dir.join("sub"));
        driver.spawn();
        env.wait_for("driver registered from a subdirectory", || {
            registered(&env, &driver)
        });

        // A restarted agent finds the socket that is already there.
        assert!(agent.term(), "agent exits 0 on SIGTERM");
        let before = driver.calls_of("GetInfo").len();
        let agent = env.start_agent(&[]);
        env.wait_for("driver registered after an agent restart", || {
            registered(&env, &driver)
        });
        assert!(driver.calls_of("GetInfo").len() > before);
        assert!(agent.term());
        env.assert_outside_untouched();
    });
}

/// A node-driver-registrar killed with SIGKILL leaves its socket behind;
/// the new instance unlinks it and binds a new one at the same path, which
/// on most file systems gets the same inode. The agent registers the new
/// instance (GetInfo, NotifyRegistrationStatus) and uses it: here the new
/// instance serves CSI on another socket, and a PVC volume is staged and
/// published through it.
#[test]
fn a_registrar_restarted_over_its_stale_socket_registers_again() {
    isolated(
        "a_registrar_restarted_over_its_stale_socket_registers_again",
        || {
            use std::os::unix::fs::MetadataExt;
            let env = Env::new();
            let agent = env.start_agent(&[]);
            env.wait_synced();
            let mut driver = new_driver(&env);
            driver.spawn();
            let notified = |d: &Driver| {
                d.registration()
                    .filter(|r| r["plugin_registered"] == true)
                    .map(|r| r["unix_ns"].clone())
            };
            wait_or_dump(&env, &agent, &driver, "first registration", || {
                registered(&env, &driver) && notified(&driver).is_some()
            });
            let first_notify = notified(&driver).unwrap();
            let get_info = driver.calls_of("GetInfo").len();
            let reg = driver.registration_socket();
            let ino = std::fs::metadata(&reg).unwrap().ino();

            driver.kill();
            assert!(reg.exists(), "SIGKILL leaves the registration socket");
            driver.move_socket(env.dir.path().join("csi-2.sock"));
            driver.spawn();
            wait_or_dump(&env, &agent, &driver, "the new instance's sockets", || {
                std::os::unix::net::UnixStream::connect(driver.socket()).is_ok()
                    && std::os::unix::net::UnixStream::connect(&reg).is_ok()
            });
            let new_ino = std::fs::metadata(&reg).unwrap().ino();
            if new_ino != ino {
                eprintln!(
                    "note: the file system gave the new socket another inode ({ino} → {new_ino})"
                );
            }
            wait_or_dump(&env, &agent, &driver, "the new instance registered", || {
                driver.calls_of("GetInfo").len() > get_info
                    && notified(&driver).is_some_and(|n| n != first_notify)
                    && registered(&env, &driver)
            });

            // The agent calls the new instance.
            env.write_manifest("pvc.yaml", PVC);
            env.write_manifest("pv.yaml", &pv_yaml("320Mi"));
            env.write_manifest("secret.yaml", SECRET);
            env.write_manifest(
                "pod.yaml",
                &pod_yaml(
                    "p",
                    "uid-pvc",
                    &[("data", "persistentVolumeClaim: {claimName: claim}")],
                ),
            );
            wait_or_dump(&env, &agent, &driver, "volume mounted", || {
                env.volume_state("uid-pvc", "data")
                    .is_some_and(|(s, _, _)| s == "mounted")
            });
            env.remove_manifest("pod.yaml");
            env.wait_for("pod torn down", || {
                !env.root.join("pods/uid-pvc").exists() && env.mounts().is_empty()
            });
            env.wait_for("unstaged", || driver.loop_devices().is_empty());
            assert!(agent.term());
            driver.stop();
            env.assert_outside_untouched();
        },
    );
}

/// A PersistentVolume of the test driver bound to claim `test/claim`.
fn pv_yaml(capacity: &str) -> String {
    format!(
        "apiVersion: v1
kind: PersistentVolume
metadata: {{name: pv-1}}
spec:
  capacity: {{storage: {capacity}}}
  accessModes: [ReadWriteOnce]
  claimRef: {{namespace: test, name: claim}}
  csi:
    driver: {DRIVER}
    volumeHandle: vol-1
    fsType: xfs
    volumeAttributes: {{size: 320Mi}}
    nodeStageSecretRef: {{name: creds, namespace: test}}
"
    )
}

const PVC: &str = "apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: PersistentVolumeClaim
  metadata: {name: claim, namespace: test}
  spec: {accessModes: [ReadWriteOnce], volumeName: pv-1, resources: {requests: {storage: 320Mi}}}
";

const SECRET: &str = "apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: test}
stringData: {password: s3cr3t-value-never-shown}
";

fn volume_error(env: &Env) -> Option<String> {
    env.volume_state("uid-pvc", "data").and_then(|(_, _, e)| e)
}

#[test]
fn pvc_resolves_through_manifest_objects() {
    isolated("pvc_resolves_through_manifest_objects", || {
        let env = Env::new();
        env.write_manifest(
            "pod.yaml",
            &pod_yaml(
                "p",
                "uid-pvc",
                &[("data", "persistentVolumeClaim: {claimName: claim}")],
            ),
        );
        let agent = env.start_agent(&[]);
        env.wait_synced();
        let err_contains = |what: &str| {
            env.wait_for(what, || {
                volume_error(&env).is_some_and(|e| e.contains(what))
            })
        };
        err_contains("PersistentVolumeClaim test/claim not found");
        env.write_manifest("pvc.yaml", PVC);
        err_contains("PersistentVolume pv-1 (bound to PersistentVolumeClaim test/claim) not found");
        env.write_manifest("pv.yaml", &pv_yaml("320Mi"));
        err_contains("Secret test/creds not found");
        env.write_manifest("secret.yaml", SECRET);
        // Resolved: the CSI plugin now waits for the driver.
        err_contains(&format!("waiting for CSI driver {DRIVER} to register"));

        let mut driver = new_driver(&env);
        driver.spawn();
        env.wait_for("volume mounted", || {
            env.volume_state("uid-pvc", "data")
                .is_some_and(|(s, _, _)| s == "mounted")
        });
        let s = env.status();
        let v = &s.pods[0].volumes[0];
        assert_eq!(v.plugin, "kubernetes.io/csi");
        let path = PathBuf::from(v.path.clone().expect("mounted path"));
        assert!(path.starts_with(env.root.join("pods/uid-pvc/volumes/kubernetes.io~csi")));
        assert_eq!(env.mount_count(&path), 1);
        std::fs::write(path.join("hello"), b"data").unwrap();
        let size = |p: &std::path::Path| {
            let st = nix::sys::statvfs::statvfs(p).unwrap();
            st.blocks() as u64 * st.fragment_size() as u64
        };
        assert!(size(&path) < 320 << 20);

        // The PV grows: NodeExpandVolume grows the image and the file system
        // (xfs: online growth needs only CAP_SYS_ADMIN; ext4's also needs
        // CAP_SYS_RESOURCE, which some machines, like the dev one, lack).
        env.write_manifest("pv.yaml", &pv_yaml("400Mi"));
        let image = driver.state().join("images/vol-1.img");
        wait_or_dump(
            &env,
            &agent,
            &driver,
            "file system grown past 320Mi",
            || size(&path) > 320 << 20,
        );
        assert!(std::fs::metadata(&image).unwrap().len() >= 400 << 20);
        env.wait_for("NodeExpandVolume journalled", || {
            !driver.calls_of("NodeExpandVolume").is_empty()
        });
        assert_eq!(std::fs::read(path.join("hello")).unwrap(), b"data");

        // The secret reached the driver's stage call, never status or logs.
        let status_json = serde_json::to_string(&env.status()).unwrap();
        assert!(!status_json.contains("s3cr3t-value"), "{status_json}");
        assert!(
            !agent.log().contains("s3cr3t-value"),
            "secret in the agent log"
        );
        assert!(
            !driver.log().contains("s3cr3t-value"),
            "secret in the driver log"
        );

        // The pod goes: unpublished and unstaged.
        env.remove_manifest("pod.yaml");
        env.wait_for("pod torn down", || {
            !env.root.join("pods/uid-pvc").exists() && env.mounts().is_empty()
        });
        env.wait_for("unstaged: loop device detached", || {
            driver.loop_devices().is_empty()
        });
        assert!(agent.term());
        driver.stop();
        env.assert_outside_untouched();
    });
}

/// sha256 of "uid-inline" + "scratch", computed independently (Python's
/// hashlib): the kubelet's handle for that inline volume.
const INLINE_HANDLE: &str = "csi-1057494ee54b7626a4963591049135a59136d66afd43ff1e8ad645eb3cd5080c";

#[test]
fn inline_csi_volume_resolves_and_publishes() {
    isolated("inline_csi_volume_resolves_and_publishes", || {
        let env = Env::new();
        let mut driver = new_driver(&env);
        driver.spawn();
        env.write_manifest(
            "pod.yaml",
            &pod_yaml(
                "inline",
                "uid-inline",
                &[(
                    "scratch",
                    &format!("csi: {{driver: {DRIVER}, volumeAttributes: {{size: 32Mi}}, nodePublishSecretRef: {{name: pub}}}}"),
                )],
            ),
        );
        let agent = env.start_agent(&[]);
        env.wait_for("secret error", || {
            env.volume_state("uid-inline", "scratch")
                .and_then(|(_, _, e)| e)
                .is_some_and(|e| e.contains("Secret test/pub not found"))
        });
        env.write_manifest(
            "secret.yaml",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: pub, namespace: test}\ndata: {token: aW5saW5lLXNlY3JldC12YWx1ZQ==}\n",
        );
        // Once the Secret is there the volume resolves and the agent
        // publishes it (no stage: an inline volume has no device phase)
        // under the kubelet's generated handle. (The test driver itself only
        // serves staged volumes, so it refuses the call: mounting inline
        // volumes end to end needs a driver that supports them.)
        assert!(driver.calls_of("NodeStageVolume").is_empty());
        wait_or_dump(&env, &agent, &driver, "inline volume published", || {
            driver
                .calls_of("NodePublishVolume")
                .iter()
                .any(|c| c["volume_id"] == INLINE_HANDLE)
        });
        assert!(
            driver
                .calls_of("NodeStageVolume")
                .iter()
                .all(|c| c["volume_id"] != INLINE_HANDLE),
            "inline volumes are never staged"
        );
        let status_json = serde_json::to_string(&env.status()).unwrap();
        assert!(!status_json.contains("inline-secret-value"));
        assert!(!agent.log().contains("inline-secret-value"));

        env.remove_manifest("pod.yaml");
        env.wait_for("pod torn down", || {
            !env.root.join("pods/uid-inline").exists() && env.mounts().is_empty()
        });
        assert!(agent.term());
        driver.stop();
        env.assert_outside_untouched();
    });
}

/// An inline CSI volume of a pod deleted while the agent was down (killed
/// with the volume published) is found on disk at the restart,
/// unpublished under its generated handle, and the pod's directory goes.
/// The kubelet's reconstruction of such a volume has been reported to
/// fail (it looks the CSI plugin up as attachable and asks
/// `GetUniqueVolumeNameFromSpec`, which needs a PV source, so "Could not
/// construct volume information, cleaning up mounts" and the volume of a
/// pod that was Terminating is never unpublished); volmgr names an inline
/// volume per pod from `vol_data.json`. The driver (`--ephemeral`) mounts
/// a real tmpfs for it.
#[test]
fn an_inline_volume_of_a_pod_deleted_while_the_agent_was_down_is_unpublished() {
    isolated(
        "an_inline_volume_of_a_pod_deleted_while_the_agent_was_down_is_unpublished",
        || {
            let env = Env::new();
            let mut driver = new_driver(&env);
            driver.with_args(&["--ephemeral"]);
            driver.spawn();
            let volume = format!("csi: {{driver: {DRIVER}, volumeAttributes: {{size: 32Mi}}}}");
            env.write_manifest(
                "pod.yaml",
                &pod_yaml("inline", "uid-inline", &[("scratch", &volume)]),
            );
            let agent = env.start_agent(&[]);
            let path = env.csi_publish_path("uid-inline", "scratch");
            wait_or_dump(&env, &agent, &driver, "inline volume mounted", || {
                env.mount_count(&path) == 1
            });
            std::fs::write(path.join("data"), b"x").unwrap();

            agent.kill9();
            env.remove_manifest("pod.yaml");
            let agent = env.start_agent(&[]);
            wait_or_dump(
                &env,
                &agent,
                &driver,
                "unpublished after the restart",
                || {
                    driver
                        .calls_of("NodeUnpublishVolume")
                        .iter()
                        .any(|c| c["volume_id"] == INLINE_HANDLE)
                },
            );
            env.wait_for("the pod's directory removed", || {
                !env.root.join("pods/uid-inline").exists() && env.mounts().is_empty()
            });
            assert!(
                driver.calls_of("NodeStageVolume").is_empty(),
                "inline volumes are never staged"
            );
            assert!(agent.term());
            driver.stop();
            env.assert_outside_untouched();
        },
    );
}

/// The watcher as a library, against the real driver's registration socket:
/// a plugin that fails validation is told why (NotifyRegistrationStatus with
/// `plugin_registered: false`) and not registered; once the conflicting
/// registration is gone it registers. No mounts: no namespace needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_tells_a_refused_plugin_why() {
    use volmgr::pluginmanager::plugin_watcher::{PluginWatcher, WatcherConfig};
    use volmgr::pluginmanager::registry::DriverRegistry;

    let env = Env::new();
    let mut driver = new_driver(&env);
    std::fs::create_dir_all(driver.registration_dir().unwrap()).unwrap();
    let registry = DriverRegistry::new();
    // Another registration of the same driver with a higher version.
    registry.register(DRIVER, "/elsewhere/csi.sock".into(), vec!["1.9.0".into()]);
    let config = WatcherConfig {
        retry_initial: std::time::Duration::from_millis(20),
        retry_max: std::time::Duration::from_millis(200),
        ..WatcherConfig::default()
    };
    let watcher = PluginWatcher::new(
        driver.registration_dir().unwrap().to_path_buf(),
        std::sync::Arc::clone(&registry),
        config,
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(watcher.run(stop_rx));
    driver.spawn();
    let wait = |what: &str, cond: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !cond() {
            assert!(
                std::time::Instant::now() < deadline,
                "gave up waiting for: {what}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    let told = || driver.registration();
    tokio::task::block_in_place(|| {
        wait("NotifyRegistrationStatus(false)", &|| {
            told().is_some_and(|r| r["plugin_registered"] == false)
        })
    });
    let r = told().unwrap();
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("higher version 1.9.0"),
        "{r}"
    );
    assert_eq!(
        registry.endpoint(DRIVER),
        Some(PathBuf::from("/elsewhere/csi.sock"))
    );
    // The other registration goes: the retry registers this one.
    registry.unregister(DRIVER);
    tokio::task::block_in_place(|| {
        wait("registered", &|| {
            registry.endpoint(DRIVER).as_deref() == Some(driver.socket())
                && told().is_some_and(|r| r["plugin_registered"] == true)
        })
    });
    // The socket goes away with the driver: unregistered.
    driver.stop();
    tokio::task::block_in_place(|| wait("unregistered", &|| registry.endpoint(DRIVER).is_none()));
    stop_tx.send(true).unwrap();
    task.await.unwrap().unwrap();
}

/// The kubelet's CSI `RegisterPlugin` calls the driver's NodeGetInfo: a
/// failure fails the registration (the registrar is told why, with the
/// kubelet's words) and it is retried; the answer (node ID, volume limit)
/// is kept with the driver and shows in status.
#[test]
fn registration_calls_node_get_info_and_fails_with_it() {
    isolated("registration_calls_node_get_info_and_fails_with_it", || {
        let env = Env::new();
        let agent = env.start_agent(&[]);
        env.wait_synced();
        let mut driver = new_driver(&env);
        driver.with_args(&[
            "--max-volumes-per-node",
            "3",
            "--topology",
            "topology.test.volmgr.io/zone=z1",
        ]);
        driver.faults(serde_json::json!([
            {"method": "NodeGetInfo", "count": 1, "code": "UNAVAILABLE", "message": "not ready yet"}
        ]));
        driver.spawn();
        wait_or_dump(&env, &agent, &driver, "the registration refused", || {
            driver
                .registration()
                .is_some_and(|r| r["plugin_registered"] == false)
        });
        let error = driver.registration().unwrap()["error"].to_string();
        assert!(
            error.contains("RegisterPlugin failed at CSI.NodeGetInfo")
                && error.contains("not ready yet"),
            "{error}"
        );
        wait_or_dump(&env, &agent, &driver, "registered on the retry", || {
            registered(&env, &driver)
                && driver
                    .registration()
                    .is_some_and(|r| r["plugin_registered"] == true)
        });
        assert!(driver.calls_of("NodeGetInfo").len() >= 2);
        let d = env
            .status()
            .csi_drivers
            .into_iter()
            .find(|d| d.name == DRIVER)
            .unwrap();
        assert_eq!(d.node_id.as_deref(), Some("node-1"));
        assert_eq!(d.max_volumes_per_node, Some(3));
        assert!(agent.term());
        driver.stop();
        env.assert_outside_untouched();
    });
}

/// The driver's CSIDriver object, from the manifests directory:
/// `attachRequired` makes a PV's volume wait for its VolumeAttachment
/// (named as the kubelet names it) and pass its `attachmentMetadata` as
/// `publish_context` to NodeStage and NodePublish; `podInfoOnMount` adds
/// the pod's keys to NodePublish's volume context only; a driver that does
/// not list `Ephemeral` gets no inline volume.
#[test]
fn csidriver_object_drives_attach_pod_info_and_lifecycle_modes() {
    isolated(
        "csidriver_object_drives_attach_pod_info_and_lifecycle_modes",
        || {
            let env = Env::new();
            env.write_manifest(
                "csidriver.yaml",
                &format!(
                    "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {{name: {DRIVER}}}\nspec: {{attachRequired: true, podInfoOnMount: true, volumeLifecycleModes: [Persistent], tokenRequests: [{{audience: vault, expirationSeconds: 900}}], requiresRepublish: true}}\n"
                ),
            );
            env.write_manifest(
                "pv.yaml",
                &format!(
                    "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: pv-a}}\nspec:\n  capacity: {{storage: 64Mi}}\n  accessModes: [ReadWriteOnce]\n  claimRef: {{namespace: test, name: claim-a}}\n  csi: {{driver: {DRIVER}, volumeHandle: vol-a, fsType: xfs, volumeAttributes: {{size: 320Mi}}}}\n"
                ),
            );
            env.write_manifest(
                "pvc.yaml",
                "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: claim-a, namespace: test}\nspec: {accessModes: [ReadWriteOnce], volumeName: pv-a, resources: {requests: {storage: 64Mi}}}\n",
            );
            env.write_manifest(
                "pod.yaml",
                "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: test, uid: uid-att}\nspec:\n  nodeName: node-x\n  serviceAccountName: robot\n  containers: [{name: c, image: i, volumeMounts: [{name: data, mountPath: /d}]}]\n  volumes: [{name: data, persistentVolumeClaim: {claimName: claim-a}}]\n",
            );
            env.write_manifest(
                "inline.yaml",
                &pod_yaml(
                    "i",
                    "uid-inline",
                    &[("x", &format!("csi: {{driver: {DRIVER}}}"))],
                ),
            );
            let mut driver = new_driver(&env);
            driver.spawn();
            let token_dir = env.dir.path().join("tokens");
            std::fs::create_dir_all(token_dir.join("test")).unwrap();
            std::fs::write(token_dir.join("test/robot"), "robot-token\n").unwrap();
            let agent = env.start_agent(&[
                "--node-name",
                "node-x",
                "--token-file",
                token_dir.to_str().unwrap(),
                "--csi-republish-period",
                "300ms",
            ]);
            let va =
                volmgr::populator::convert::csi_driver::attachment_name("vol-a", DRIVER, "node-x");
            let error = |uid: &str, vol: &str| env.volume_state(uid, vol).and_then(|s| s.2);
            wait_or_dump(
                &env,
                &agent,
                &driver,
                "waiting for the VolumeAttachment",
                || {
                    error("uid-att", "data")
                        .is_some_and(|e| e.contains(&va) && e.contains("created"))
                },
            );
            wait_or_dump(&env, &agent, &driver, "inline volume refused", || {
                error("uid-inline", "x")
                    .is_some_and(|e| e.contains("does not support inline (Ephemeral) volumes"))
            });
            let attachment = |attached: bool| {
                format!(
                    "apiVersion: storage.k8s.io/v1\nkind: VolumeAttachment\nmetadata: {{name: {va}}}\nspec: {{attacher: {DRIVER}, nodeName: node-x, source: {{persistentVolumeName: pv-a}}}}\nstatus: {{attached: {attached}, attachmentMetadata: {{devicePath: /dev/fake0}}}}\n"
                )
            };
            env.write_manifest("va.yaml", &attachment(false));
            wait_or_dump(&env, &agent, &driver, "waiting for the attachment", || {
                error("uid-att", "data").is_some_and(|e| e.contains("to be attached"))
            });
            env.write_manifest("va.yaml", &attachment(true));
            wait_or_dump(&env, &agent, &driver, "volume mounted", || {
                env.volume_state("uid-att", "data")
                    .is_some_and(|(s, _, _)| s == "mounted")
            });
            let contexts: Vec<serde_json::Value> =
                std::fs::read_to_string(driver.state().join("contexts.jsonl"))
                    .unwrap()
                    .lines()
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect();
            let of = |method: &str| {
                contexts
                    .iter()
                    .rev()
                    .find(|c| c["method"] == method && c["volume_id"] == "vol-a")
                    .unwrap_or_else(|| panic!("no {method} in {contexts:?}"))
                    .clone()
            };
            let (stage, publish) = (of("NodeStageVolume"), of("NodePublishVolume"));
            for c in [&stage, &publish] {
                assert_eq!(c["publish_context"]["devicePath"], "/dev/fake0", "{c}");
            }
            assert!(
                stage["volume_context"]
                    .get("csi.storage.k8s.io/pod.name")
                    .is_none(),
                "pod info reached NodeStage: {stage}"
            );
            let ctx = &publish["volume_context"];
            assert_eq!(ctx["csi.storage.k8s.io/pod.name"], "p", "{publish}");
            assert_eq!(ctx["csi.storage.k8s.io/pod.namespace"], "test");
            assert_eq!(ctx["csi.storage.k8s.io/pod.uid"], "uid-att");
            assert_eq!(ctx["csi.storage.k8s.io/serviceAccount.name"], "robot");
            assert_eq!(ctx["csi.storage.k8s.io/ephemeral"], "false");
            assert_eq!(ctx["size"], "320Mi", "the volume's own attributes stay");
            // tokenRequests: a token per audience, bound to the pod's
            // service account, in NodePublish only.
            let key = "csi.storage.k8s.io/serviceAccount.tokens";
            let tokens: serde_json::Value =
                serde_json::from_str(ctx[key].as_str().expect("the tokens key")).unwrap();
            assert_eq!(tokens["vault"]["token"], "robot-token", "{tokens}");
            assert!(
                tokens["vault"]["expirationTimestamp"].is_string(),
                "{tokens}"
            );
            assert!(stage["volume_context"].get(key).is_none());

            // requiresRepublish: NodePublishVolume again every period on the
            // mounted volume, with a fresh token; never a second stage.
            std::fs::write(token_dir.join("test/robot"), "rotated-token\n").unwrap();
            let publishes_with = |token: &str| {
                std::fs::read_to_string(driver.state().join("contexts.jsonl"))
                    .unwrap()
                    .lines()
                    .filter(|l| l.contains("NodePublishVolume") && l.contains(token))
                    .count()
            };
            wait_or_dump(
                &env,
                &agent,
                &driver,
                "republished with the new token",
                || publishes_with("rotated-token") >= 2,
            );
            assert_eq!(driver.count("NodeStageVolume", "vol-a", "OK"), 1);
            assert_eq!(
                env.volume_state("uid-att", "data").map(|s| s.0).as_deref(),
                Some("mounted")
            );
            assert!(agent.term());
            driver.stop();
        },
    );
}

/// `Test_UncertainVolumeMountState`, "success followed by timeout
/// operation should result in mounted volume", end to end: a mounted volume
/// of a `requiresRepublish` driver whose NodePublishVolume again passes
/// `--csi-timeout` stays mounted, its data in place, never unpublished;
/// the driver back to normal republishes it; the pod deleted: torn down.
#[test]
fn a_timed_out_republish_keeps_the_volume_mounted() {
    isolated("a_timed_out_republish_keeps_the_volume_mounted", || {
        let env = Env::new();
        env.write_manifest(
            "csidriver.yaml",
            &format!(
                "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {{name: {DRIVER}}}\nspec: {{attachRequired: false, requiresRepublish: true}}\n"
            ),
        );
        env.write_manifest("pv.yaml", &pv_and_claim("rp", "ReadWriteOnce", ""));
        let vols = [("data", "persistentVolumeClaim: {claimName: claim-rp}")];
        env.write_manifest("pod.yaml", &pod_yaml("p", "uid-rp", &vols));
        let mut driver = new_driver(&env);
        driver.spawn();
        let args = ["--csi-republish-period", "200ms", "--csi-timeout", "500ms"];
        let agent = env.start_agent(&args);
        let state = || env.volume_state("uid-rp", "data").map(|s| s.0);
        wait_or_dump(&env, &agent, &driver, "volume mounted", || {
            state().as_deref() == Some("mounted")
        });
        let s = env.status();
        let path = s.pods[0].volumes[0].path.clone().unwrap();
        let file = PathBuf::from(path).join("keep");
        std::fs::write(&file, "data").unwrap();
        driver.faults(serde_json::json!([
            {"method": "NodePublishVolume", "volume_id": "vol-rp", "hang": true}
        ]));
        wait_or_dump(&env, &agent, &driver, "two republishes timed out", || {
            driver.count("NodePublishVolume", "vol-rp", "CANCELLED") >= 2
        });
        assert_eq!(state().as_deref(), Some("mounted"));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "data");
        assert_eq!(driver.calls_of("NodeUnpublishVolume").len(), 0);
        driver.faults(serde_json::json!([]));
        let ok = driver.count("NodePublishVolume", "vol-rp", "OK");
        wait_or_dump(&env, &agent, &driver, "republished", || {
            driver.count("NodePublishVolume", "vol-rp", "OK") > ok
        });
        assert_eq!(state().as_deref(), Some("mounted"));
        assert_eq!(driver.count("NodeStageVolume", "vol-rp", "OK"), 1);
        env.remove_manifest("pod.yaml");
        wait_or_dump(&env, &agent, &driver, "torn down", || {
            driver.count("NodeUnstageVolume", "vol-rp", "OK") == 1
                && !env.root.join("pods/uid-rp").exists()
        });
        assert_eq!(driver.count("NodeUnpublishVolume", "vol-rp", "OK"), 1);
        assert!(agent.term());
        driver.stop();
        env.assert_outside_untouched();
    });
}

/// `TestFindAndAddNewPods_WithReprocessPodAndVolumeRetrievalError` end to
/// end with a CSI volume: the claim of a mounted volume deleted, then the
/// pod changed (processed again while its volume no longer resolves): the
/// volume stays published with its data, the error on the pod; the claim
/// back: the error goes, nothing published again; the pod deleted:
/// unpublished and unstaged.
#[test]
fn a_pod_changed_while_its_claim_is_gone_keeps_the_volume() {
    isolated(
        "a_pod_changed_while_its_claim_is_gone_keeps_the_volume",
        || {
            let env = Env::new();
            let both = pv_and_claim("kp", "ReadWriteOnce", "");
            let (pv, claim) = both.split_once("---\n").unwrap();
            env.write_manifest("pv.yaml", pv);
            env.write_manifest("pvc.yaml", claim);
            let pod = pod_yaml(
                "p",
                "uid-kp",
                &[("data", "persistentVolumeClaim: {claimName: claim-kp}")],
            );
            env.write_manifest("pod.yaml", &pod);
            let mut driver = new_driver(&env);
            driver.spawn();
            let agent = env.start_agent(&[]);
            let state = || env.volume_state("uid-kp", "data").map(|s| s.0);
            wait_or_dump(&env, &agent, &driver, "volume mounted", || {
                state().as_deref() == Some("mounted")
            });
            let path = env.status().pods[0].volumes[0].path.clone().unwrap();
            let file = PathBuf::from(path).join("keep");
            std::fs::write(&file, "data").unwrap();
            env.remove_manifest("pvc.yaml");
            let pod_error = || {
                let s = env.status();
                let p = s.pods.into_iter().find(|p| p.uid == "uid-kp");
                p.and_then(|p| p.error)
            };
            wait_or_dump(&env, &agent, &driver, "problem shown", || {
                pod_error().is_some_and(|e| e.contains("claim-kp not found"))
            });
            let relabelled = pod.replace(
                "namespace: test, uid",
                "namespace: test, labels: {v: \"2\"}, uid",
            );
            env.write_manifest("pod.yaml", &relabelled);
            wait_or_dump(&env, &agent, &driver, "error on the pod", || {
                pod_error().is_some_and(|e| e.contains("claim-kp"))
            });
            assert_eq!(state().as_deref(), Some("mounted"));
            assert_eq!(std::fs::read_to_string(&file).unwrap(), "data");
            assert_eq!(driver.calls_of("NodeUnpublishVolume").len(), 0);
            env.write_manifest("pvc.yaml", claim);
            wait_or_dump(&env, &agent, &driver, "error cleared", || {
                pod_error().is_none()
            });
            assert_eq!(state().as_deref(), Some("mounted"));
            assert_eq!(driver.count("NodePublishVolume", "vol-kp", "OK"), 1);
            env.remove_manifest("pod.yaml");
            wait_or_dump(&env, &agent, &driver, "torn down", || {
                driver.count("NodeUnstageVolume", "vol-kp", "OK") == 1
                    && !env.root.join("pods/uid-kp").exists()
            });
            assert_eq!(driver.count("NodeUnpublishVolume", "vol-kp", "OK"), 1);
            assert!(agent.term());
            driver.stop();
            env.assert_outside_untouched();
        },
    );
}

/// PersistentVolume `pv-NAME` (volume `vol-NAME` of the test driver, 64Mi,
/// access mode `mode`, `csi_extra` added to its `csi` fields) bound to
/// claim `test/claim-NAME`, as one two-document manifest.
fn pv_and_claim(name: &str, mode: &str, csi_extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: pv-{name}}}\nspec:\n  capacity: {{storage: 64Mi}}\n  accessModes: [{mode}]\n  claimRef: {{namespace: test, name: claim-{name}}}\n  csi: {{driver: {DRIVER}, volumeHandle: vol-{name}{csi_extra}}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: claim-{name}, namespace: test}}\nspec: {{accessModes: [{mode}], volumeName: pv-{name}, resources: {{requests: {{storage: 64Mi}}}}}}\n"
    )
}

/// ReadWriteOnce and ReadWriteOncePod PVs of a driver with a CSIDriver
/// that has `seLinuxMount: true`, used by a pod with an SELinux level.
fn write_access_mode_manifests(env: &Env) {
    env.write_manifest(
        "csidriver.yaml",
        &format!(
            "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {{name: {DRIVER}}}\nspec: {{attachRequired: false, seLinuxMount: true}}\n"
        ),
    );
    for (name, mode) in [("rwo", "ReadWriteOnce"), ("rwop", "ReadWriteOncePod")] {
        env.write_manifest(&format!("{name}.yaml"), &pv_and_claim(name, mode, ""));
    }
    env.write_manifest(
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: test, uid: uid-modes}\nspec:\n  securityContext: {seLinuxOptions: {level: 's0:c1,c2'}}\n  containers: [{name: c, image: i, volumeMounts: [{name: rwo, mountPath: /a}, {name: rwop, mountPath: /b}]}]\n  volumes: [{name: rwo, persistentVolumeClaim: {claimName: claim-rwo}}, {name: rwop, persistentVolumeClaim: {claimName: claim-rwop}}]\n",
    );
}

/// What the driver's stage and publish of `volume` were given, last first.
fn capabilities_seen(driver: &Driver, volume: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(driver.state().join("contexts.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|c| c["volume_id"] == volume)
        .collect()
}

/// The kubelet's access mode mapper against a real driver: without the
/// SINGLE_NODE_MULTI_WRITER capability (which the test driver then refuses
/// the new modes for, as a driver built before them does) ReadWriteOnce and
/// ReadWriteOncePod are both SINGLE_NODE_WRITER; with it, they are
/// SINGLE_NODE_MULTI_WRITER and SINGLE_NODE_SINGLE_WRITER. A CSIDriver with
/// `seLinuxMount` gets the pod's SELinux label as `context=` on both
/// volumes (the `SELinuxMount` feature gate is on by default), and only
/// where the host has SELinux (here the test checks whichever this host
/// is; `selinux_mount_labels_every_access_mode_and_refuses_a_conflicting_pod`
/// takes SELinux as on).
#[test]
fn access_modes_follow_the_capability_and_selinux_mounts_need_selinux() {
    isolated(
        "access_modes_follow_the_capability_and_selinux_mounts_need_selinux",
        || {
            let selinux = volmgr::sys::selinux::enabled();
            let context = "context=\"system_u:object_r:container_file_t:s0:c1,c2\"";
            for (snmw, rwo_mode, rwop_mode) in [
                (false, "SINGLE_NODE_WRITER", "SINGLE_NODE_WRITER"),
                (
                    true,
                    "SINGLE_NODE_MULTI_WRITER",
                    "SINGLE_NODE_SINGLE_WRITER",
                ),
            ] {
                let env = Env::new();
                write_access_mode_manifests(&env);
                let mut driver = new_driver(&env);
                if snmw {
                    driver.with_args(&["--single-node-multi-writer"]);
                }
                driver.spawn();
                let agent = env.start_agent(&[]);
                wait_or_dump(&env, &agent, &driver, "both volumes mounted", || {
                    ["rwo", "rwop"].iter().all(|v| {
                        env.volume_state("uid-modes", v)
                            .is_some_and(|(s, _, _)| s == "mounted")
                    })
                });
                for (volume, mode, label) in [
                    ("vol-rwo", rwo_mode, selinux),
                    ("vol-rwop", rwop_mode, selinux),
                ] {
                    let seen = capabilities_seen(&driver, volume);
                    let methods: Vec<&str> =
                        seen.iter().filter_map(|c| c["method"].as_str()).collect();
                    assert_eq!(
                        methods,
                        ["NodeStageVolume", "NodePublishVolume"],
                        "{seen:?}"
                    );
                    for c in &seen {
                        assert_eq!(c["access_mode"], mode, "snmw={snmw}: {c}");
                        let flags: Vec<&str> = c["mount_flags"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .filter_map(|f| f.as_str())
                            .collect();
                        assert_eq!(flags.contains(&context), label, "selinux={selinux}: {c}");
                    }
                }
            }
        },
    );
}

/// The pod's fsGroup reaches a driver with VOLUME_MOUNT_GROUP in both
/// NodeStageVolume and NodePublishVolume (`volume_mount_group`, as the
/// kubelet's `MountDevice` and `SetUp` pass it; the driver then owns the
/// file system's root with it); a driver without the capability gets no
/// group (it would refuse one) and volmgr gives the volume the group itself.
#[test]
fn volume_mount_group_reaches_stage_and_publish_of_capable_drivers() {
    isolated(
        "volume_mount_group_reaches_stage_and_publish_of_capable_drivers",
        || {
            use std::os::unix::fs::MetadataExt;
            for capable in [false, true] {
                let env = Env::new();
                env.write_manifest(
                    "pv.yaml",
                    &pv_and_claim("mg", "ReadWriteOnce", ", fsType: ext4"),
                );
                env.write_manifest(
                    "pod.yaml",
                    "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: test, uid: uid-mg}\nspec:\n  securityContext: {fsGroup: 3000}\n  containers: [{name: c, image: i, volumeMounts: [{name: data, mountPath: /d}]}]\n  volumes: [{name: data, persistentVolumeClaim: {claimName: claim-mg}}]\n",
                );
                let mut driver = new_driver(&env);
                if capable {
                    driver.with_args(&["--volume-mount-group"]);
                }
                driver.spawn();
                let agent = env.start_agent(&[]);
                wait_or_dump(&env, &agent, &driver, "volume mounted", || {
                    env.volume_state("uid-mg", "data")
                        .is_some_and(|(s, _, _)| s == "mounted")
                });
                let seen = capabilities_seen(&driver, "vol-mg");
                let groups: Vec<(&str, &str)> = seen
                    .iter()
                    .map(|c| {
                        (
                            c["method"].as_str().unwrap(),
                            c["volume_mount_group"].as_str().unwrap(),
                        )
                    })
                    .collect();
                let group = if capable { "3000" } else { "" };
                assert_eq!(
                    groups,
                    [("NodeStageVolume", group), ("NodePublishVolume", group)],
                    "capable={capable}"
                );
                let root = env
                    .root
                    .join("pods/uid-mg/volumes/kubernetes.io~csi/pv-mg/mount");
                let meta = std::fs::metadata(&root).unwrap();
                assert_eq!(meta.gid(), 3000, "capable={capable}");
                assert_eq!(
                    meta.mode() & 0o2070,
                    0o2070,
                    "capable={capable}: {:o}",
                    meta.mode()
                );
            }
        },
    );
}

/// `seLinuxMount` with the `SELinuxMount` feature gate (GA and on in
/// Kubernetes 1.37), on a host taken to have SELinux
/// (`--selinux-enabled=true`; this kernel accepts and ignores `context=`
/// on the driver's tmpfs when it has no SELinux): a ReadWriteOnce volume
/// is staged and published with its pod's label as `context="..."`; a
/// second pod with another label on it is refused with the kubelet's
/// error (`desired_state_of_world.go`), shown in status and counted in
/// `volume_manager_selinux_volume_context_mismatch_errors_total`; once the
/// first pod is gone, the second gets the volume with its own label. With
/// `--feature-gates SELinuxMount=false`, only ReadWriteOncePod volumes get
/// a label, and the second pod is a warning, not an error. Before, only
/// ReadWriteOncePod volumes had a label and nothing compared two pods'.
#[test]
fn selinux_mount_labels_every_access_mode_and_refuses_a_conflicting_pod() {
    isolated(
        "selinux_mount_labels_every_access_mode_and_refuses_a_conflicting_pod",
        || {
            let label = |l: &str| format!("system_u:object_r:container_file_t:{l}");
            for gate in [true, false] {
                let env = Env::new();
                write_access_mode_manifests(&env);
                let pod_b = |level: &str| {
                    format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: b, namespace: test, uid: uid-b}}\nspec:\n  securityContext: {{seLinuxOptions: {{level: '{level}'}}}}\n  containers: [{{name: c, image: i, volumeMounts: [{{name: rwo, mountPath: /a}}]}}]\n  volumes: [{{name: rwo, persistentVolumeClaim: {{claimName: claim-rwo}}}}]\n"
                )
                };
                let mut driver = new_driver(&env);
                driver.spawn();
                let gates = format!("SELinuxMount={gate}");
                let agent = env.start_agent(&["--selinux-enabled=true", "--feature-gates", &gates]);
                wait_or_dump(&env, &agent, &driver, "pod p mounted", || {
                    ["rwo", "rwop"].iter().all(|v| {
                        env.volume_state("uid-modes", v)
                            .is_some_and(|(s, _, _)| s == "mounted")
                    })
                });
                env.write_manifest("b.yaml", &pod_b("s0:c3,c4"));
                let want = format!(
                    "conflicting SELinux labels of volume pv-rwo: {:?} and {:?}",
                    label("s0:c1,c2"),
                    label("s0:c3,c4")
                );
                if gate {
                    wait_or_dump(&env, &agent, &driver, "pod b refused", || {
                        env.volume_state("uid-b", "rwo")
                            .is_some_and(|(_, _, e)| e.as_deref() == Some(want.as_str()))
                    });
                    let metrics = env.metrics_text();
                    let line = "volume_manager_selinux_volume_context_mismatch_errors_total{volume_plugin=\"kubernetes.io/csi/test.csi.volmgr.io\",access_mode=\"RWO\"} 1";
                    assert!(metrics.lines().any(|l| l == line), "{metrics}");
                    let text = std::process::Command::new(support::volmgr_bin())
                        .args(["status", "--root"])
                        .arg(&env.root)
                        .output()
                        .unwrap();
                    let text = String::from_utf8_lossy(&text.stdout);
                    assert!(
                        text.contains("conflicting SELinux labels of volume pv-rwo"),
                        "{text}"
                    );
                    // `volmgr wait` (the kubelet's WaitForAttachAndMount)
                    // ends with the pod error, not the timeout's text.
                    let wait = std::process::Command::new(support::volmgr_bin())
                        .args(["wait", "--pod", "uid-b", "--timeout", "600", "--root"])
                        .arg(&env.root)
                        .output()
                        .unwrap();
                    let said = String::from_utf8_lossy(&wait.stderr).to_string()
                        + &String::from_utf8_lossy(&wait.stdout);
                    assert_eq!(wait.status.code(), Some(1), "{said}");
                    assert!(said.contains("failed to process volumes=[rwo]"), "{said}");
                    assert!(said.contains(&want), "{said}");
                } else {
                    wait_or_dump(&env, &agent, &driver, "pod b mounted", || {
                        env.volume_state("uid-b", "rwo")
                            .is_some_and(|(s, _, _)| s == "mounted")
                    });
                    let metrics = env.metrics_text();
                    assert!(metrics.contains("volume_manager_selinux_volume_context_mismatch_warnings_total{volume_plugin=\"kubernetes.io/csi/test.csi.volmgr.io\",access_mode=\"RWO\"} 1"), "{metrics}");
                }
                let flag = |l: &str| format!("context={:?}", label(l));
                for (volume, labelled) in [("vol-rwo", gate), ("vol-rwop", true)] {
                    let seen = capabilities_seen(&driver, volume);
                    assert!(!seen.is_empty());
                    for c in &seen {
                        let flags: Vec<&str> = c["mount_flags"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .filter_map(|f| f.as_str())
                            .collect();
                        assert_eq!(
                            flags.contains(&flag("s0:c1,c2").as_str()),
                            labelled,
                            "gate={gate}: {c}"
                        );
                    }
                }
                if gate {
                    // Pod p goes: pod b gets the volume, with its own label.
                    env.remove_manifest("pod.yaml");
                    wait_or_dump(&env, &agent, &driver, "pod b mounted", || {
                        env.volume_state("uid-b", "rwo")
                            .is_some_and(|(s, _, _)| s == "mounted")
                    });
                    let seen = capabilities_seen(&driver, "vol-rwo");
                    let publish = seen
                        .iter()
                        .rfind(|c| c["method"] == "NodePublishVolume")
                        .unwrap();
                    let flags = publish["mount_flags"].to_string();
                    assert!(flags.contains("s0:c3,c4"), "{publish}");
                }
            }
        },
    );
}
