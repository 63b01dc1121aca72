//! End-to-end tests of configMap, secret, downwardAPI and projected volumes
//! from the manifests directory (ConfigMap and Secret documents stand in for
//! the API server): contents and the kubelet's atomic-writer layout, updates
//! in place while another process reads, missing and optional objects,
//! tmpfs for secret and projected volumes, the standard `kube-api-access`
//! volume with `--token-file` and its refresh, and a crash mid-update. Each
//! test runs in a private mount namespace of its own.

// Test-only code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use support::{isolated, pod_yaml, Env};

fn config_map(name: &str, data: &[(&str, &str)]) -> String {
    let d: Vec<String> = data.iter().map(|(k, v)| format!("{k}: \"{v}\"")).collect();
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: test}}\ndata: {{{}}}\n",
        d.join(", ")
    )
}

fn vol_dir(env: &Env, uid: &str, plugin: &str, vol: &str) -> PathBuf {
    env.root
        .join("pods")
        .join(uid)
        .join("volumes")
        .join(format!("kubernetes.io~{plugin}"))
        .join(vol)
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("..2"))
        .collect();
    v.sort();
    v
}

fn is_tmpfs(env: &Env, p: &Path) -> bool {
    env.mounts()
        .iter()
        .any(|m| m.mount_point == p && m.fstype == "tmpfs")
}

/// A reader in another process: 1,000 snapshots of keys `x` and `y` (through
/// one resolution of `..data`, as a reader that wants a consistent view
/// does; a snapshot whose payload was replaced and removed meanwhile is
/// retried), each also reading `x` through its user-visible name, which must
/// never be missing. Exits 2 on a mix, 3 on a missing file.
fn start_reader(dir: &Path) -> std::process::Child {
    let script = r#"
i=0
while [ $i -lt 1000 ]; do
  cat "$V/x" >/dev/null || exit 3
  if cd "$V/..data" 2>/dev/null; then
    if a=$(cat x 2>/dev/null) && b=$(cat y 2>/dev/null); then
      [ "$a" = "$b" ] || { echo "mix: $a $b"; exit 2; }
      i=$((i+1))
    fi
    cd /
  fi
done
"#;
    Command::new("sh")
        .args(["-c", script])
        .env("V", dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn config_map_secret_and_downward_api_volumes_and_updates() {
    isolated(
        "config_map_secret_and_downward_api_volumes_and_updates",
        || {
            let env = Env::new();
            env.write_manifest("cm.yaml", &config_map("cm", &[("x", "0"), ("y", "0")]));
            env.write_manifest(
            "s.yaml",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s, namespace: test}\ndata: {k: aHVudGVyMg==}\n",
        );
            let vols = [
                ("cfg", "configMap: {name: cm}"),
                ("sec", "secret: {secretName: s, defaultMode: 256}"),
                ("opt", "configMap: {name: absent, optional: true}"),
                (
                    "dapi",
                    "downwardAPI: {items: [{path: ns, fieldRef: {fieldPath: metadata.namespace}}]}",
                ),
            ];
            env.write_manifest("p.yaml", &pod_yaml("p", "uid-cm", &vols));
            let agent = env.start_agent(&[]);
            assert_eq!(env.wait_pod("uid-cm", 30.0), 0, "{}", agent.log());
            let cfg = vol_dir(&env, "uid-cm", "configmap", "cfg");
            let sec = vol_dir(&env, "uid-cm", "secret", "sec");
            let opt = vol_dir(&env, "uid-cm", "configmap", "opt");
            let dapi = vol_dir(&env, "uid-cm", "downward-api", "dapi");
            assert_eq!(names(&cfg), vec!["..data", "x", "y"]);
            assert_eq!(
                std::fs::read_link(cfg.join("x")).unwrap(),
                Path::new("..data/x")
            );
            assert_eq!(read(&cfg.join("x")).as_deref(), Some("0"));
            assert_eq!(read(&sec.join("k")).as_deref(), Some("hunter2"));
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(sec.join("k"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o400);
            assert!(is_tmpfs(&env, &sec), "secret not on a tmpfs");
            assert!(!is_tmpfs(&env, &cfg), "configMap on a tmpfs");
            assert_eq!(names(&opt), vec!["..data"], "optional and missing: empty");
            assert_eq!(read(&dapi.join("ns")).as_deref(), Some("test"));
            let content = |vol: &str| {
                let s = env.status();
                let p = s.pods.iter().find(|p| p.uid == "uid-cm").unwrap();
                p.volumes
                    .iter()
                    .find(|v| v.name == vol)
                    .unwrap()
                    .content
                    .clone()
                    .unwrap()
            };
            let first = content("cfg");
            assert_eq!(first.writes, 1);

            // Updates while another process reads.
            let mut reader = start_reader(&cfg);
            let mut n = 0;
            while reader.try_wait().unwrap().is_none() {
                n += 1;
                let v = n.to_string();
                env.write_manifest("cm.yaml", &config_map("cm", &[("x", &v), ("y", &v)]));
                env.wait_for("update visible", || {
                    read(&cfg.join("x")).as_deref() == Some(&*v)
                });
            }
            let out = reader.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "reader: {:?} {}",
                out.status,
                String::from_utf8_lossy(&out.stdout)
            );
            assert!(n > 1, "no update happened while reading");
            let last = content("cfg");
            assert_eq!(last.writes, 1 + n as u64);
            assert_ne!(last.generation, first.generation);
            assert_eq!(read(&cfg.join("y")), Some(n.to_string()));
            // The current payload and the previous one.
            let st = std::fs::read_dir(&cfg).unwrap().count();
            assert_eq!(st, 5, "two payload directories left: {:?}", names(&cfg));

            // Pod deletion removes the tmpfs and the directories.
            env.remove_manifest("p.yaml");
            env.wait_for("pod cleaned up", || {
                !env.root.join("pods/uid-cm").exists() && env.mounts().is_empty()
            });
            env.assert_outside_untouched();
            assert!(agent.term());
        },
    );
}

#[test]
fn a_missing_config_map_is_an_error_until_it_is_created() {
    isolated(
        "a_missing_config_map_is_an_error_until_it_is_created",
        || {
            let env = Env::new();
            env.write_manifest(
                "p.yaml",
                &pod_yaml("p", "uid-late", &[("cfg", "configMap: {name: late}")]),
            );
            let agent = env.start_agent(&[]);
            env.wait_for("error shown", || {
                env.volume_state("uid-late", "cfg")
                    .and_then(|(_, _, e)| e)
                    .is_some_and(|e| e.contains("ConfigMap test/late not found"))
            });
            env.write_manifest("cm.yaml", &config_map("late", &[("k", "v")]));
            assert_eq!(env.wait_pod("uid-late", 30.0), 0, "{}", agent.log());
            let cfg = vol_dir(&env, "uid-late", "configmap", "cfg");
            assert_eq!(read(&cfg.join("k")).as_deref(), Some("v"));
            // Deleted while mounted: the volume keeps its content (as the
            // kubelet does) and status says why it is not updated.
            env.remove_manifest("cm.yaml");
            env.wait_for("problem shown", || {
                env.status()
                    .errors
                    .iter()
                    .any(|e| e.error.contains("ConfigMap test/late not found"))
            });
            assert_eq!(read(&cfg.join("k")).as_deref(), Some("v"));
            assert_eq!(env.volume_state("uid-late", "cfg").unwrap().0, "mounted");
            // Back with another value: updated in place.
            env.write_manifest("cm.yaml", &config_map("late", &[("k", "w")]));
            env.wait_for("updated", || read(&cfg.join("k")).as_deref() == Some("w"));
            assert!(agent.term());
        },
    );
}

/// `TestFindAndAddNewPods_WithReprocessPodAndVolumeRetrievalError` end to
/// end: the configMap of a mounted volume deleted, then the pod changed (so
/// processed again while the volume no longer resolves): the volume stays
/// with its files and the error shows on the pod; the configMap back: the
/// error goes and the volume is updated in place; the pod deleted: torn
/// down.
#[test]
fn a_pod_changed_while_its_config_map_is_gone_keeps_the_volume() {
    isolated(
        "a_pod_changed_while_its_config_map_is_gone_keeps_the_volume",
        || {
            let env = Env::new();
            env.write_manifest("cm.yaml", &config_map("cm", &[("k", "v")]));
            let pod = pod_yaml("p", "uid-keep", &[("cfg", "configMap: {name: cm}")]);
            env.write_manifest("p.yaml", &pod);
            let agent = env.start_agent(&[]);
            assert_eq!(env.wait_pod("uid-keep", 30.0), 0, "{}", agent.log());
            let cfg = vol_dir(&env, "uid-keep", "configmap", "cfg");
            assert_eq!(read(&cfg.join("k")).as_deref(), Some("v"));
            env.remove_manifest("cm.yaml");
            env.wait_for("problem shown", || {
                env.status()
                    .errors
                    .iter()
                    .any(|e| e.error.contains("ConfigMap test/cm not found"))
            });
            let relabelled = pod.replace(
                "namespace: test, uid",
                "namespace: test, labels: {v: \"2\"}, uid",
            );
            env.write_manifest("p.yaml", &relabelled);
            let pod_error = || {
                let s = env.status();
                let p = s.pods.into_iter().find(|p| p.uid == "uid-keep");
                p.and_then(|p| p.error)
            };
            env.wait_for("error on the pod", || {
                pod_error().is_some_and(|e| e.contains("ConfigMap test/cm not found"))
            });
            assert_eq!(read(&cfg.join("k")).as_deref(), Some("v"));
            let (state, _, error) = env.volume_state("uid-keep", "cfg").unwrap();
            assert_eq!(state, "mounted");
            assert!(error.unwrap().contains("ConfigMap test/cm not found"));
            // Back with another value: updated in place, the error gone.
            env.write_manifest("cm.yaml", &config_map("cm", &[("k", "w")]));
            env.wait_for("updated", || read(&cfg.join("k")).as_deref() == Some("w"));
            env.wait_for("error cleared", || pod_error().is_none());
            assert_eq!(env.volume_state("uid-keep", "cfg").unwrap().0, "mounted");
            env.remove_manifest("p.yaml");
            env.wait_for("pod cleaned up", || {
                !env.root.join("pods/uid-keep").exists()
            });
            env.assert_outside_untouched();
            assert!(agent.term());
        },
    );
}

const KUBE_API_ACCESS: &str = "projected: {defaultMode: 420, sources: [\
{serviceAccountToken: {expirationSeconds: 2, path: token}}, \
{configMap: {name: kube-root-ca.crt, items: [{key: ca.crt, path: ca.crt}]}}, \
{downwardAPI: {items: [{path: namespace, fieldRef: {apiVersion: v1, fieldPath: metadata.namespace}}]}}]}";

#[test]
fn kube_api_access_volume_with_a_token_file_and_refresh() {
    isolated(
        "kube_api_access_volume_with_a_token_file_and_refresh",
        || {
            let env = Env::new();
            let tokens = env.dir.path().join("tokens");
            std::fs::create_dir_all(tokens.join("test")).unwrap();
            std::fs::write(tokens.join("test/default"), "tok-1\n").unwrap();
            env.write_manifest(
                "ca.yaml",
                &config_map("kube-root-ca.crt", &[("ca.crt", "CA")]),
            );
            env.write_manifest(
                "p.yaml",
                &pod_yaml("p", "uid-kaa", &[("kube-api-access-x", KUBE_API_ACCESS)]),
            );
            let agent = env.start_agent(&["--token-file", tokens.to_str().unwrap()]);
            assert_eq!(env.wait_pod("uid-kaa", 30.0), 0, "{}", agent.log());
            let v = vol_dir(&env, "uid-kaa", "projected", "kube-api-access-x");
            assert!(is_tmpfs(&env, &v), "projected not on a tmpfs");
            assert_eq!(names(&v), vec!["..data", "ca.crt", "namespace", "token"]);
            assert_eq!(read(&v.join("token")).as_deref(), Some("tok-1"));
            assert_eq!(read(&v.join("ca.crt")).as_deref(), Some("CA"));
            assert_eq!(read(&v.join("namespace")).as_deref(), Some("test"));
            // A 2 s token is replaced after 1.6 s; the old one stays until then.
            std::fs::write(tokens.join("test/default"), "tok-2\n").unwrap();
            env.wait_for("token refreshed", || {
                read(&v.join("token")).as_deref() == Some("tok-2")
            });
            assert!(agent.term());

            // Without a token source: an error on that volume, saying why.
            let env2 = Env::new();
            env2.write_manifest(
                "ca.yaml",
                &config_map("kube-root-ca.crt", &[("ca.crt", "CA")]),
            );
            env2.write_manifest(
                "p.yaml",
                &pod_yaml("p", "uid-kaa", &[("kube-api-access-x", KUBE_API_ACCESS)]),
            );
            let agent = env2.start_agent(&[]);
            env2.wait_for("token error shown", || {
                env2.volume_state("uid-kaa", "kube-api-access-x")
                    .and_then(|(_, _, e)| e)
                    .is_some_and(|e| e.contains("--token-file"))
            });
            assert!(agent.term());
        },
    );
}

/// kill -9 (a failpoint abort) after the new payload is written and before
/// the swap: the volume holds the old payload; the next agent swaps the new
/// one in and removes the half-done directory.
#[test]
fn a_crash_during_an_update_leaves_the_old_or_the_new_payload() {
    isolated(
        "a_crash_during_an_update_leaves_the_old_or_the_new_payload",
        || {
            let env = Env::new();
            env.write_manifest("cm.yaml", &config_map("cm", &[("x", "old"), ("y", "old")]));
            env.write_manifest(
                "p.yaml",
                &pod_yaml("p", "uid-crash", &[("cfg", "configMap: {name: cm}")]),
            );
            let agent = env.start_agent(&[]);
            assert_eq!(env.wait_pod("uid-crash", 30.0), 0, "{}", agent.log());
            agent.kill9();
            env.write_manifest("cm.yaml", &config_map("cm", &[("x", "new"), ("y", "new")]));
            let agent =
                env.start_agent_env(&[], &[("VOLMGR_FAILPOINTS", "atomic_writer.before_swap")]);
            let status = agent.wait_exit();
            assert!(!status.success());
            let cfg = vol_dir(&env, "uid-crash", "configmap", "cfg");
            assert_eq!(
                (read(&cfg.join("x")), read(&cfg.join("y"))),
                (Some("old".into()), Some("old".into()))
            );
            let all = std::fs::read_dir(&cfg).unwrap().count();
            assert_eq!(all, 6, "a half-done payload and ..data_tmp are left");
            let agent = env.start_agent(&[]);
            env.wait_for("new payload", || {
                read(&cfg.join("x")).as_deref() == Some("new")
            });
            assert_eq!(read(&cfg.join("y")).as_deref(), Some("new"));
            // The half-done payload and `..data_tmp` go, the previous stays.
            env.wait_for("stale payload removed", || {
                std::fs::read_dir(&cfg).unwrap().count() == 5
            });
            assert!(!cfg.join("..data_tmp").exists());
            assert!(agent.term());
        },
    );
}
