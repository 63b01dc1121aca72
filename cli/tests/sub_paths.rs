//! End-to-end tests of subPath / subPathExpr through the agent: the bind
//! mounts under `ROOT/pods/<uid>/volume-subpaths`, reported in status,
//! cleaned when the pod goes (also after `kill -9`), and a symlink planted
//! in a volume (CVE-2017-1002101) being that volume's error while the pod's
//! other volumes mount. Each test runs in a private mount namespace.

mod support;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use support::{isolated, Env};

#[allow(clippy::expect_used)]
fn ino(p: &Path) -> (u64, u64) {
    let st = std::fs::metadata(p).expect("stat");
    (st.dev(), st.ino())
}

/// Two containers: `c` mounts the emptyDir `m` twice (a subPath that does
/// not exist yet, and a subPathExpr from the downward API) and `w` mounts
/// the hostPath `h` at its `data` (or at `sub` when given).
fn pod(host: &Path, sub: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: test, uid: uid-s}}
spec:
  containers:
  - name: c
    image: i
    env: [{{name: POD, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}]
    volumeMounts:
    - {{name: m, mountPath: /all}}
    - {{name: m, mountPath: /logs, subPath: logs/app}}
    - {{name: m, mountPath: /mine, subPathExpr: "$(POD)/x"}}
  - name: w
    image: i
    volumeMounts: [{{name: h, mountPath: /data, subPath: "{sub}"}}]
  volumes:
  - {{name: m, emptyDir: {{medium: Memory}}}}
  - {{name: h, hostPath: {{path: "{}", type: Directory}}}}
"#,
        host.display()
    )
}

#[test]
fn sub_paths_are_bound_reported_and_cleaned_after_kill_9() {
    isolated(
        "sub_paths_are_bound_reported_and_cleaned_after_kill_9",
        || {
            let env = Env::new();
            let host = env.dir.path().join("host");
            std::fs::create_dir_all(host.join("data")).unwrap();
            std::fs::write(host.join("data/keep"), b"k").unwrap();
            env.write_manifest("p.yaml", &pod(&host, "data"));
            let agent = env.start_agent(&[]);
            assert_eq!(env.wait_pod("uid-s", 30.0), 0, "{}", agent.log());
            let base = env.root.join("pods/uid-s/volume-subpaths");
            let m = env.empty_dir("uid-s", "m");
            let status = env.status();
            let pod = status.pods.iter().find(|p| p.uid == "uid-s").unwrap();
            let mut seen = Vec::new();
            for v in &pod.volumes {
                for s in &v.sub_paths {
                    seen.push((
                        v.name.clone(),
                        s.container.clone(),
                        s.index,
                        s.sub_path.clone(),
                    ));
                    assert_eq!(
                        Path::new(&s.path),
                        base.join(&v.name)
                            .join(&s.container)
                            .join(s.index.to_string())
                    );
                }
            }
            seen.sort();
            assert_eq!(
                seen,
                [
                    ("h".into(), "w".into(), 0, "data".into()),
                    ("m".into(), "c".into(), 1, "logs/app".into()),
                    ("m".into(), "c".into(), 2, "web/x".into()),
                ]
            );
            // Each is a bind mount of its path inside the volume.
            for (bind, inside) in [
                (base.join("m/c/1"), m.join("logs/app")),
                (base.join("m/c/2"), m.join("web/x")),
                (base.join("h/w/0"), host.join("data")),
            ] {
                assert_eq!(env.mount_count(&bind), 1, "{}", bind.display());
                assert_eq!(ino(&bind), ino(&inside), "{}", bind.display());
            }

            // kill -9, the pod deleted meanwhile: the next agent cleans it all.
            agent.kill9();
            env.remove_manifest("p.yaml");
            let agent = env.start_agent(&[]);
            env.wait_for("pod cleaned up", || {
                !env.root.join("pods/uid-s").exists() && env.mounts().is_empty()
            });
            assert!(host.join("data/keep").exists(), "the hostPath is intact");
            assert!(agent.term());
        },
    );
}

/// A symlink to `/` in a hostPath volume, named by a subPath: that volume
/// is in error with the kubelet's message, the pod's emptyDir (and its
/// subPaths) mounts, nothing outside is bound, and deletion cleans up.
#[test]
fn a_symlink_sub_path_is_that_volumes_error() {
    isolated("a_symlink_sub_path_is_that_volumes_error", || {
        let env = Env::new();
        let host = env.dir.path().join("host");
        std::fs::create_dir_all(&host).unwrap();
        std::os::unix::fs::symlink("/", host.join("evil")).unwrap();
        env.write_manifest("p.yaml", &pod(&host, "evil/etc"));
        let agent = env.start_agent(&[]);
        env.wait_for("the hostPath volume fails", || {
            env.volume_state("uid-s", "h")
                .and_then(|s| s.2)
                .is_some_and(|e| e.contains("failed to prepare subPath"))
        });
        let (_, _, error) = env.volume_state("uid-s", "h").unwrap();
        let error = error.unwrap();
        assert!(
            error.contains("volumeMount \"h\" of container \"w\"") && error.contains("symlink"),
            "{error}"
        );
        assert_eq!(env.volume_state("uid-s", "m").unwrap().0, "mounted");
        let base = env.root.join("pods/uid-s/volume-subpaths");
        assert_eq!(env.mount_count(&base.join("m/c/1")), 1);
        assert!(
            env.mounts()
                .iter()
                .all(|m| !m.mount_point.starts_with(base.join("h"))),
            "nothing bound for the hostPath"
        );
        env.remove_manifest("p.yaml");
        env.wait_for("pod cleaned up", || {
            !env.root.join("pods/uid-s").exists() && env.mounts().is_empty()
        });
        assert!(agent.term());
    });
}

/// The most common subPath of all: one key of a configMap volume
/// (`key -> ..data/key`, symlinks inside the volume, as the kubelet's
/// atomic writer lays them out) is bound, and the container sees the file.
#[test]
fn a_config_map_key_as_a_sub_path() {
    isolated("a_config_map_key_as_a_sub_path", || {
        let env = Env::new();
        env.write_manifest(
            "cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web-conf, namespace: test}\ndata: {nginx.conf: 'worker_processes 1;'}\n",
        );
        env.write_manifest(
            "p.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: test, uid: uid-cm}\nspec:\n  containers:\n  - name: c\n    image: i\n    volumeMounts:\n    - {name: conf, mountPath: /etc/nginx/nginx.conf, subPath: nginx.conf}\n  volumes:\n  - {name: conf, configMap: {name: web-conf}}\n",
        );
        let agent = env.start_agent(&[]);
        assert_eq!(env.wait_pod("uid-cm", 30.0), 0, "{}", agent.log());
        let bound = env.root.join("pods/uid-cm/volume-subpaths/conf/c/0");
        assert_eq!(env.mount_count(&bound), 1);
        assert_eq!(
            std::fs::read_to_string(&bound).unwrap(),
            "worker_processes 1;"
        );
        let file = env
            .root
            .join("pods/uid-cm/volumes/kubernetes.io~configmap/conf/nginx.conf");
        assert_eq!(ino(&bound), ino(&file), "the key's file itself is bound");
        env.remove_manifest("p.yaml");
        env.wait_for("pod cleaned up", || {
            !env.root.join("pods/uid-cm").exists() && env.mounts().is_empty()
        });
        assert!(agent.term());
    });
}
