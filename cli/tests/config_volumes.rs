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
/// retried), each also reading `x` through its user-visible name. That read
/// may fail once when it resolved `..data` just before a swap and the
/// previous payload was removed before it opened `x` (the kubelet removes
/// it right after the swap too); read again, it must succeed. Exits 2 on a
/// mix, 3 on a name missing twice in a row.
fn start_reader(dir: &Path) -> std::process::Child {
    let script = r#"
i=0
while [ $i -lt 1000 ]; do
  cat "$V/x" >/dev/null 2>&1 || cat "$V/x" >/dev/null || exit 3
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
            // The current payload only: the previous one went with the swap.
            let st = std::fs::read_dir(&cfg).unwrap().count();
            assert_eq!(st, 4, "one payload directory left: {:?}", names(&cfg));

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
            // kubelet does) and status says why it is not updated, on the
            // pod and on its volume.
            env.remove_manifest("cm.yaml");
            env.wait_for("problem shown", || {
                let s = env.status();
                let p = s.pods.into_iter().find(|p| p.uid == "uid-late");
                p.and_then(|p| p.error)
                    .is_some_and(|e| e.contains("ConfigMap test/late not found"))
            });
            let error = env.volume_state("uid-late", "cfg").unwrap().2;
            assert!(error.is_some_and(|e| e.contains("ConfigMap test/late not found")));
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
            let pod_error = || {
                let s = env.status();
                let p = s.pods.into_iter().find(|p| p.uid == "uid-keep");
                p.and_then(|p| p.error)
            };
            env.wait_for("problem shown", || {
                pod_error().is_some_and(|e| e.contains("ConfigMap test/cm not found"))
            });
            let relabelled = pod.replace(
                "namespace: test, uid",
                "namespace: test, labels: {v: \"2\"}, uid",
            );
            env.write_manifest("p.yaml", &relabelled);
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
            // The half-done payload, `..data_tmp` and the previous go.
            env.wait_for("stale payload removed", || {
                std::fs::read_dir(&cfg).unwrap().count() == 4
            });
            assert!(!cfg.join("..data_tmp").exists());
            assert!(agent.term());
        },
    );
}

/// Every payload directory (`..<timestamp>`) of a volume.
fn payload_dirs(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("..") && n != "..data")
        .collect();
    v.sort();
    v
}

/// Every regular file under `dir` (symlinks not followed) holding `needle`.
fn files_holding(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let t = e.file_type().unwrap();
        if t.is_dir() {
            out.extend(files_holding(&e.path(), needle));
        } else if t.is_file() && std::fs::read_to_string(e.path()).unwrap().contains(needle) {
            out.push(e.path());
        }
    }
    out
}

fn secret(name: &str, data: &[(&str, &str)]) -> String {
    let d: Vec<String> = data.iter().map(|(k, v)| format!("{k}: \"{v}\"")).collect();
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: test}}\nstringData: {{{}}}\n",
        d.join(", ")
    )
}

/// Issue 25 item 4: a rotated-out secret (a revoked credential) does not
/// stay on the pod's disk. Two updates in quick succession leave exactly
/// one `..<timestamp>` directory and the old values nowhere under the
/// volume; a payload directory left behind (a crash between the swap and
/// the removal) goes at the set-up after a restart.
#[test]
fn a_rotated_out_secret_leaves_the_volume_at_once() {
    isolated("a_rotated_out_secret_leaves_the_volume_at_once", || {
        let env = Env::new();
        env.write_manifest("s.yaml", &secret("s", &[("password", "revoked-1")]));
        env.write_manifest(
            "p.yaml",
            &pod_yaml("p", "uid-rot", &[("sec", "secret: {secretName: s}")]),
        );
        let agent = env.start_agent(&[]);
        assert_eq!(env.wait_pod("uid-rot", 30.0), 0, "{}", agent.log());
        let sec = vol_dir(&env, "uid-rot", "secret", "sec");
        env.write_manifest("s.yaml", &secret("s", &[("password", "revoked-2")]));
        env.write_manifest("s.yaml", &secret("s", &[("password", "current")]));
        env.wait_for("current secret", || {
            read(&sec.join("password")).as_deref() == Some("current")
        });
        // The previous directory goes right after the swap: the reader may
        // see the new value between the two.
        env.wait_for("one payload directory", || payload_dirs(&sec).len() == 1);
        assert_eq!(payload_dirs(&sec).len(), 1, "{:?}", payload_dirs(&sec));
        let left = files_holding(&sec, "revoked");
        assert!(left.is_empty(), "old secret values left: {left:?}");

        // A payload directory left behind, then a restart.
        agent.kill9();
        let stale = sec.join("..2020_01_01_00_00_00.123456789");
        std::fs::create_dir(&stale).unwrap();
        std::fs::write(stale.join("password"), "revoked-0").unwrap();
        let agent = env.start_agent(&[]);
        env.wait_for("leftover removed", || {
            !stale.exists() && payload_dirs(&sec).len() == 1
        });
        assert!(files_holding(&sec, "revoked").is_empty());
        assert_eq!(read(&sec.join("password")).as_deref(), Some("current"));
        assert!(agent.term());
    });
}

/// A projected `kube-api-access` volume whose token lives an hour.
const KUBE_API_ACCESS_HOUR: &str = "projected: {defaultMode: 420, sources: [\
{serviceAccountToken: {expirationSeconds: 3600, path: token}}, \
{configMap: {name: kube-root-ca.crt, items: [{key: ca.crt, path: ca.crt}]}}]}";

fn token_pod(uid: &str, pod_sc: &str, container_sc: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {uid}, namespace: test, uid: \"{uid}\"}}\nspec:\n  securityContext: {pod_sc}\n  containers: [{{name: c, image: i, securityContext: {container_sc}, volumeMounts: [{{name: kube-api-access, mountPath: /var/run/secrets}}]}}]\n  volumes:\n  - {{name: kube-api-access, {KUBE_API_ACCESS_HOUR}}}\n"
    )
}

/// Issue 25 item 5: service account token files as the kubelet writes them
/// (`projected.go`'s FsUser rule, then the fsGroup walk): 0600 owned by the
/// user all containers run as, group read added by an fsGroup; the other
/// files keep `defaultMode`.
#[test]
fn token_files_are_owned_by_the_pods_user() {
    isolated("token_files_are_owned_by_the_pods_user", || {
        use std::os::unix::fs::MetadataExt;
        let env = Env::new();
        let tokens = env.dir.path().join("tokens");
        std::fs::create_dir_all(tokens.join("test")).unwrap();
        std::fs::write(tokens.join("test/default"), "tok\n").unwrap();
        env.write_manifest(
            "ca.yaml",
            &config_map("kube-root-ca.crt", &[("ca.crt", "CA")]),
        );
        // (uid, pod securityContext, container's, token's (uid, gid, mode),
        // ca.crt's gid)
        let cases = [
            ("uid-none", "{}", "{}", (0, 0, 0o644), 0),
            ("uid-user", "{runAsUser: 1000}", "{}", (1000, 0, 0o600), 0),
            (
                "uid-group",
                "{runAsUser: 1000, fsGroup: 2000}",
                "{}",
                (1000, 2000, 0o640),
                2000,
            ),
            (
                "uid-own",
                "{runAsUser: 1000, fsGroup: 2000}",
                "{runAsUser: 1001}",
                (1001, 2000, 0o640),
                2000,
            ),
        ];
        for (uid, pod_sc, c_sc, _, _) in &cases {
            env.write_manifest(&format!("{uid}.yaml"), &token_pod(uid, pod_sc, c_sc));
        }
        let agent = env.start_agent(&["--token-file", tokens.to_str().unwrap()]);
        for (uid, _, _, token, ca_gid) in cases {
            assert_eq!(env.wait_pod(uid, 30.0), 0, "{}", agent.log());
            let v = vol_dir(&env, uid, "projected", "kube-api-access");
            let m = std::fs::metadata(v.join("token")).unwrap();
            assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), token, "{uid}");
            assert_eq!(read(&v.join("token")).as_deref(), Some("tok"));
            let ca = std::fs::metadata(v.join("ca.crt")).unwrap();
            assert_eq!((ca.uid(), ca.gid(), ca.mode() & 0o7777), (0, ca_gid, 0o644));
        }
        assert!(agent.term());
    });
}

/// Issue 28 item 5: an optional Secret deleted while mounted empties what
/// it gave (the kubelet writes the payload without it); a non-optional
/// one keeps its files and the error shows on the pod's volume.
#[test]
fn deleted_optional_sources_leave_the_volume() {
    isolated("deleted_optional_sources_leave_the_volume", || {
        let env = Env::new();
        env.write_manifest("s.yaml", &secret("s", &[("password", "opt-secret")]));
        env.write_manifest("s2.yaml", &secret("s2", &[("password", "req-secret")]));
        env.write_manifest("cm.yaml", &config_map("cm", &[("a", "1")]));
        let proj =
            "projected: {sources: [{secret: {name: s, optional: true}}, {configMap: {name: cm}}]}";
        let vols = [
            ("opt", "secret: {secretName: s, optional: true}"),
            ("req", "secret: {secretName: s2}"),
            ("proj", proj),
        ];
        env.write_manifest("p.yaml", &pod_yaml("p", "uid-del", &vols));
        let agent = env.start_agent(&[]);
        assert_eq!(env.wait_pod("uid-del", 30.0), 0, "{}", agent.log());
        let opt = vol_dir(&env, "uid-del", "secret", "opt");
        let req = vol_dir(&env, "uid-del", "secret", "req");
        let proj = vol_dir(&env, "uid-del", "projected", "proj");
        assert_eq!(names(&opt), vec!["..data", "password"]);
        assert_eq!(names(&proj), vec!["..data", "a", "password"]);

        env.remove_manifest("s.yaml");
        env.wait_for("optional secret gone", || {
            names(&opt) == ["..data"] && names(&proj) == ["..data", "a"]
        });
        assert!(files_holding(&opt, "opt-secret").is_empty());
        assert!(files_holding(&proj, "opt-secret").is_empty());
        assert_eq!(read(&proj.join("a")).as_deref(), Some("1"));
        assert_eq!(env.volume_state("uid-del", "opt").unwrap().0, "mounted");

        // Not optional: the files stay, the error is on the pod's volume.
        env.remove_manifest("s2.yaml");
        env.wait_for("error on the volume", || {
            env.volume_state("uid-del", "req")
                .and_then(|(_, _, e)| e)
                .is_some_and(|e| e.contains("Secret test/s2 not found"))
        });
        assert_eq!(read(&req.join("password")).as_deref(), Some("req-secret"));
        assert_eq!(env.volume_state("uid-del", "req").unwrap().0, "mounted");

        // Back: written again, the error gone.
        env.write_manifest("s.yaml", &secret("s", &[("password", "new")]));
        env.write_manifest("s2.yaml", &secret("s2", &[("password", "new2")]));
        env.wait_for("secrets back", || {
            read(&opt.join("password")).as_deref() == Some("new")
                && read(&proj.join("password")).as_deref() == Some("new")
                && read(&req.join("password")).as_deref() == Some("new2")
        });
        env.wait_for("error cleared", || {
            env.volume_state("uid-del", "req").unwrap().2.is_none()
        });
        assert!(agent.term());
    });
}

/// Issue 28 item 6: a ConfigMap of 10,000 keys (about 150 KB, valid for the
/// API server) is mounted whole.
#[test]
fn a_config_map_of_10000_keys_is_mounted_whole() {
    isolated("a_config_map_of_10000_keys_is_mounted_whole", || {
        let env = Env::new();
        let data: Vec<(String, String)> = (0..10_000)
            .map(|i| (format!("key-{i:05}"), format!("value-{i}")))
            .collect();
        let pairs: Vec<(&str, &str)> = data.iter().map(|(k, v)| (&**k, &**v)).collect();
        env.write_manifest("cm.yaml", &config_map("big", &pairs));
        env.write_manifest(
            "p.yaml",
            &pod_yaml("p", "uid-big", &[("cfg", "configMap: {name: big}")]),
        );
        let agent = env.start_agent(&[]);
        let started = std::time::Instant::now();
        assert_eq!(env.wait_pod("uid-big", 300.0), 0, "{}", agent.log());
        eprintln!("10,000-key configMap mounted in {:?}", started.elapsed());
        let cfg = vol_dir(&env, "uid-big", "configmap", "cfg");
        assert_eq!(names(&cfg).len(), 10_001, "..data and 10,000 names");
        for (k, v) in &data {
            assert_eq!(read(&cfg.join(k)).as_deref(), Some(v.as_str()), "{k}");
        }
        assert!(agent.term());
    });
}

/// Fills the file system of `dir` (a small tmpfs) with `dir/filler`, to the
/// last block.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![7u8; 4096];
    loop {
        match f.write_all(&chunk) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    path
}

/// A node's disk fills up under ROOT (the kubelet's root on a full
/// `/var/lib`): a configMap update that cannot be written fails with a clear
/// error and leaves the old payload whole (no half-written payload or
/// `..data_tmp` left to eat what space returns); a pod arriving meanwhile
/// gets the error too; other pods keep their volumes; once space is freed,
/// the update lands and the new pod mounts, by the operations' own retries.
#[test]
fn a_full_disk_fails_the_update_and_keeps_the_old_payload() {
    isolated(
        "a_full_disk_fails_the_update_and_keeps_the_old_payload",
        || {
            let env = Env::new();
            let st = Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
                .arg(&env.root)
                .status()
                .unwrap();
            assert!(st.success(), "mount a 2 MiB tmpfs on ROOT");
            env.write_manifest("cm.yaml", &config_map("cm", &[("x", "old"), ("y", "old")]));
            env.write_manifest(
                "p.yaml",
                &pod_yaml(
                    "p",
                    "uid-full",
                    &[
                        ("cfg", "configMap: {name: cm}"),
                        ("mem", "emptyDir: {medium: Memory, sizeLimit: 1Mi}"),
                    ],
                ),
            );
            let agent = env.start_agent(&[]);
            assert_eq!(env.wait_pod("uid-full", 30.0), 0, "{}", agent.log());
            let cfg = vol_dir(&env, "uid-full", "configmap", "cfg");
            let before = payload_dirs(&cfg);
            assert_eq!(before.len(), 1, "{before:?}");

            let filler = fill(&env.root);
            let big = "n".repeat(64 * 1024);
            env.write_manifest("cm.yaml", &config_map("cm", &[("x", &big), ("y", &big)]));
            env.write_manifest(
                "q.yaml",
                &pod_yaml("q", "uid-late", &[("cfg", "configMap: {name: cm}")]),
            );
            let error_of = |uid: &str| {
                env.volume_state(uid, "cfg")
                    .and_then(|(_, _, e)| e)
                    .unwrap_or_default()
            };
            env.wait_for("the update fails on the full disk", || {
                error_of("uid-full").contains("No space left on device")
            });
            env.wait_for("the new pod's set-up fails on the full disk", || {
                error_of("uid-late").contains("No space left on device")
            });
            // The old payload, whole; nothing half-written left behind.
            assert_eq!(
                (read(&cfg.join("x")), read(&cfg.join("y"))),
                (Some("old".into()), Some("old".into()))
            );
            assert_eq!(payload_dirs(&cfg), before, "half-written payload left");
            assert!(!cfg.join("..data_tmp").exists());
            // The pod's other volume is untouched, and so is its pod.
            assert!(is_tmpfs(&env, &env.empty_dir("uid-full", "mem")));
            assert_eq!(env.wait_pod("uid-full", 1.0), 0, "pod p lost its volumes");

            std::fs::remove_file(filler).unwrap();
            env.wait_for("the update lands once space is back", || {
                read(&cfg.join("x")).as_deref() == Some(&*big)
            });
            assert_eq!(read(&cfg.join("y")).as_deref(), Some(&*big));
            assert_eq!(env.wait_pod("uid-late", 60.0), 0, "{}", agent.log());
            let late = vol_dir(&env, "uid-late", "configmap", "cfg");
            assert_eq!(read(&late.join("x")).as_deref(), Some(&*big));
            env.wait_for("the update's error is cleared", || {
                error_of("uid-full").is_empty()
            });
            env.assert_outside_untouched();
            assert!(agent.term());
        },
    );
}
