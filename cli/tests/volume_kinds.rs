//! End-to-end tests of the volume kinds beyond emptyDir, hostPath and CSI:
//! `image` volumes (nothing to do: the container runtime mounts them),
//! local PersistentVolumes (a bind mount of a directory on the node), and
//! ROOT's mount propagation (rshared, so the container runtime's namespace
//! sees the mounts). Each test runs in a private mount namespace of its own.

mod support;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use support::{isolated, pod_yaml, Env};

const MEM: &str = "emptyDir: {medium: Memory}";

#[test]
fn image_volume_is_mounted_beside_an_empty_dir() {
    isolated("image_volume_is_mounted_beside_an_empty_dir", || {
        let env = Env::new();
        let image = "image: {reference: \"quay.io/crio/artifact:v1\", pullPolicy: IfNotPresent}";
        env.write_manifest(
            "p.yaml",
            &pod_yaml("p", "uid-img", &[("img", image), ("m", MEM)]),
        );
        let agent = env.start_agent(&[]);
        assert_eq!(env.wait_pod("uid-img", 30.0), 0, "{}", agent.log());
        for vol in ["img", "m"] {
            let (state, _, error) = env.volume_state("uid-img", vol).unwrap();
            assert_eq!((state.as_str(), error), ("mounted", None), "{vol}");
        }
        assert_eq!(env.mount_count(&env.empty_dir("uid-img", "m")), 1);
        assert!(
            !env.root
                .join("pods/uid-img/volumes/kubernetes.io~image")
                .exists(),
            "an image volume has nothing on disk"
        );
        // After a crash, the image volume is simply set up again.
        agent.kill9();
        let agent = env.start_agent(&[]);
        assert_eq!(env.wait_pod("uid-img", 30.0), 0, "{}", agent.log());
        assert_eq!(env.volume_state("uid-img", "img").unwrap().0, "mounted");
        assert_eq!(env.mount_count(&env.empty_dir("uid-img", "m")), 1);
        env.remove_manifest("p.yaml");
        env.wait_for("pod cleaned up", || {
            !env.root.join("pods/uid-img").exists() && env.mounts().is_empty()
        });
        assert!(env.status().pods.is_empty());
        assert!(agent.term());
    });
}

/// A local PV on `path`, its claim, and a pod using it.
fn local_manifests(path: &Path, read_only: bool) -> String {
    format!(
        r#"apiVersion: v1
kind: PersistentVolume
metadata: {{name: pv-local}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  storageClassName: local
  local: {{path: "{}"}}
  claimRef: {{namespace: test, name: claim}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [node-1]}}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: claim, namespace: test}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: local
  resources: {{requests: {{storage: 1Gi}}}}
  volumeName: pv-local
---
{}"#,
        path.display(),
        pod_yaml(
            "p",
            "uid-local",
            &[(
                "data",
                &format!("persistentVolumeClaim: {{claimName: claim, readOnly: {read_only}}}"),
            )]
        )
    )
}

fn local_volume_path(env: &Env) -> PathBuf {
    env.root
        .join("pods/uid-local/volumes/kubernetes.io~local-volume/pv-local")
}

#[test]
fn local_persistent_volume_is_bound_adopted_and_released() {
    isolated(
        "local_persistent_volume_is_bound_adopted_and_released",
        || {
            let env = Env::new();
            let disk = env.dir.path().join("disks/disk1");
            std::fs::create_dir_all(&disk).unwrap();
            std::fs::write(disk.join("hello.txt"), "from the node").unwrap();
            env.write_manifest("local.yaml", &local_manifests(&disk, false));
            let agent = env.start_agent(&[]);
            assert_eq!(env.wait_pod("uid-local", 30.0), 0, "{}", agent.log());
            let vol = local_volume_path(&env);
            assert_eq!(
                std::fs::read_to_string(vol.join("hello.txt")).unwrap(),
                "from the node",
                "the pod sees the local directory"
            );
            assert_eq!(env.mount_count(&vol), 1);
            std::fs::write(vol.join("from-pod.txt"), "written by the pod").unwrap();

            // kill -9 and restart: the bind mount is adopted, not made again.
            agent.kill9();
            let agent = env.start_agent(&[]);
            env.wait_synced();
            assert_eq!(env.wait_pod("uid-local", 30.0), 0, "{}", agent.log());
            assert_eq!(env.mount_count(&vol), 1, "adopted, no second bind mount");
            assert_eq!(env.volume_state("uid-local", "data").unwrap().0, "mounted");

            env.remove_manifest("local.yaml");
            env.wait_for("pod cleaned up", || {
                !env.root.join("pods/uid-local").exists() && env.mounts().is_empty()
            });
            assert_eq!(
                std::fs::read_to_string(disk.join("hello.txt")).unwrap(),
                "from the node",
                "the local directory's files are left intact"
            );
            assert!(disk.join("from-pod.txt").exists());
            assert!(agent.term());
        },
    );
}

#[test]
fn read_only_local_persistent_volume() {
    isolated("read_only_local_persistent_volume", || {
        let env = Env::new();
        let disk = env.dir.path().join("disk-ro");
        std::fs::create_dir_all(&disk).unwrap();
        std::fs::write(disk.join("hello.txt"), "ro").unwrap();
        env.write_manifest("local.yaml", &local_manifests(&disk, true));
        let agent = env.start_agent(&[]);
        assert_eq!(env.wait_pod("uid-local", 30.0), 0, "{}", agent.log());
        let vol = local_volume_path(&env);
        let m = env.mounts();
        let m = m.iter().find(|m| m.mount_point == vol).unwrap();
        assert!(m.read_only(), "{m:?}");
        let err = std::fs::write(vol.join("nope"), "x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EROFS));
        assert!(agent.term());
    });
}

/// A local PV of the whole root file system (`local.path: /`) is bound:
/// the volume shows `/` itself; deleting the pod releases it.
#[test]
fn local_persistent_volume_of_the_root_directory() {
    isolated("local_persistent_volume_of_the_root_directory", || {
        use std::os::unix::fs::MetadataExt;
        let env = Env::new();
        env.write_manifest("local.yaml", &local_manifests(Path::new("/"), true));
        let agent = env.start_agent(&[]);
        assert_eq!(env.wait_pod("uid-local", 30.0), 0, "{}", agent.log());
        let vol = local_volume_path(&env);
        let (seen, root) = (
            std::fs::metadata(&vol).unwrap(),
            std::fs::metadata("/").unwrap(),
        );
        assert_eq!((seen.dev(), seen.ino()), (root.dev(), root.ino()));
        assert_eq!(env.mount_count(&vol), 1);
        env.remove_manifest("local.yaml");
        env.wait_for("pod cleaned up", || {
            !env.root.join("pods/uid-local").exists() && env.mounts().is_empty()
        });
        assert!(agent.term());
    });
}

/// The optional fields (`shared:N`, ...) of the top mount at `path` in a
/// mountinfo file.
fn propagation_of(mountinfo: &str, path: &Path) -> Option<Vec<String>> {
    volmgr::sys::mountinfo::parse(mountinfo)
        .ok()?
        .into_iter()
        .rfind(|m| m.mount_point == path)
        .map(|m| m.optional_fields)
}

#[test]
fn root_is_rshared_so_mounts_reach_a_cloned_namespace() {
    isolated("root_is_rshared_so_mounts_reach_a_cloned_namespace", || {
        let env = Env::new();
        let agent = env.start_agent(&[]);
        env.wait_synced();
        assert_eq!(env.status().root_propagation, "rshared");
        let own = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let fields = propagation_of(&own, &env.root).expect("ROOT is a mount point");
        assert!(
            fields.iter().any(|f| f.starts_with("shared:")),
            "ROOT is shared: {fields:?}"
        );
        // A "container runtime": a child in a mount namespace cloned now,
        // with propagation unchanged (not made private).
        let mut runtime = Command::new("sleep");
        runtime.arg("600").stdin(Stdio::null());
        // SAFETY: only async-signal-safe syscalls between fork and exec.
        unsafe {
            runtime.pre_exec(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
                Ok(())
            });
        }
        let mut runtime = runtime.spawn().unwrap();
        let theirs = format!("/proc/{}/mountinfo", runtime.id());
        // A mount the agent makes after the clone reaches the runtime.
        env.write_manifest("p.yaml", &pod_yaml("p", "uid-prop", &[("m", MEM)]));
        assert_eq!(env.wait_pod("uid-prop", 30.0), 0, "{}", agent.log());
        let vol = env.empty_dir("uid-prop", "m");
        let seen = |path: &Path| {
            let text = std::fs::read_to_string(&theirs).unwrap();
            propagation_of(&text, path).is_some()
        };
        env.wait_for("the tmpfs propagated to the runtime's namespace", || {
            seen(&vol)
        });
        // And its unmount too.
        env.remove_manifest("p.yaml");
        env.wait_for("the unmount propagated", || !seen(&vol));
        let _ = runtime.kill();
        let _ = runtime.wait();
        assert!(agent.term());
    });
}
