//! Replays of issue 40's attacks on observe mode's state directory, its
//! clients and its confinement: a `--state-dir` containing ROOT or inside
//! it, a state directory another user controls, a socket another user
//! serves, what the confined agent may still do (capabilities, signals).
//! Every test runs in a private mount namespace (`support::isolated`);
//! the other user is uid 65534.

// Test-only code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::{isolated, volmgr_bin, Agent, Env};

const NOBODY: u32 = 65534;

/// Starts an observing agent with `state` as its state directory (the
/// mount table as tracer: nothing here needs eBPF), `configure` adjusting
/// its command.
fn observe(env: &Env, state: &Path, configure: impl FnOnce(&mut Command)) -> Agent {
    let state = state.to_str().unwrap().to_string();
    env.start_agent_with(
        &["--observe", "--state-dir", &state, "--tracer", "mountinfo"],
        configure,
    )
}

/// How an agent started: refused (it exited, with its log), or accepted
/// (its status socket appeared in `state`, symlinks resolved).
enum Start {
    Refused(String),
    Accepted,
}

/// Waits until `agent` exits or binds its socket in `state` (no time
/// limit but the harness's: one of the two happens).
fn outcome(agent: &mut Agent, state: &Path) -> Start {
    loop {
        if !agent.is_alive() {
            return Start::Refused(agent.log());
        }
        let sock = std::fs::canonicalize(state)
            .map(|s| s.join("volmgr.sock"))
            .unwrap_or_else(|_| state.join("volmgr.sock"));
        if std::fs::symlink_metadata(&sock).is_ok() {
            return Start::Accepted;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Asserts the agent on `state` is refused with a message containing `why`.
fn assert_refused(env: &Env, state: &Path, why: &str) -> String {
    let mut agent = observe(env, state, |_| {});
    match outcome(&mut agent, state) {
        Start::Refused(log) => {
            assert!(log.contains(why), "--state-dir {}: {log}", state.display());
            log
        }
        Start::Accepted => panic!("--state-dir {} accepted:\n{}", state.display(), agent.log()),
    }
}

#[test]
fn a_state_dir_containing_root_or_inside_it_is_refused_before_anything_is_made() {
    isolated(
        "a_state_dir_containing_root_or_inside_it_is_refused_before_anything_is_made",
        || {
            let env = Env::new();
            let parent = env.root.parent().unwrap().to_path_buf();
            let link = env.outside.join("up");
            std::os::unix::fs::symlink(&parent, &link).unwrap();
            let containing = [env.root.join(".."), link.clone(), PathBuf::from("/")];
            for state in &containing {
                assert_refused(&env, state, "contains ROOT");
            }
            for p in [parent.join("volmgr.lock"), parent.join("volmgr.sock")] {
                assert!(!p.exists(), "{} created", p.display());
            }
            assert!(!Path::new("/volmgr.lock").exists());
            // Inside ROOT: refused before it is created.
            let inside = env.root.join("state");
            assert_refused(&env, &inside, "inside ROOT");
            assert!(!inside.exists(), "{} was created", inside.display());
            assert_refused(&env, &env.root.join("pods/../state"), "`..` after");
            assert!(!env.root.join("pods").exists());
            // Through a symlink into ROOT too.
            let into = env.outside.join("into");
            std::os::unix::fs::symlink(&env.root, &into).unwrap();
            assert_refused(&env, &into.join("state"), "inside ROOT");
            assert!(!inside.exists());
        },
    );
}

#[test]
fn a_state_dir_others_control_is_refused_or_made_private() {
    isolated(
        "a_state_dir_others_control_is_refused_or_made_private",
        || {
            let env = Env::new();
            // Pre-created 0777 by another user: refused, left as it is.
            let theirs = env.outside.join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).unwrap();
            std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o777)).unwrap();
            assert_refused(&env, &theirs, "owned by uid 65534");
            assert_eq!(std::fs::read_dir(&theirs).unwrap().count(), 0);
            // A shared directory (sticky, as /tmp): refused.
            let shared = env.outside.join("shared");
            std::fs::create_dir(&shared).unwrap();
            std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
            assert_refused(&env, &shared, "shared directory");
            // The agent's own, open to others (a Kubernetes emptyDir is
            // 0777): made 0700 before the socket is bound.
            let open = env.outside.join("open");
            std::fs::create_dir(&open).unwrap();
            std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
            let mut agent = observe(&env, &open, |_| {});
            assert!(matches!(outcome(&mut agent, &open), Start::Accepted));
            let mode = std::fs::metadata(&open).unwrap().mode() & 0o7777;
            assert_eq!(mode, 0o700, "{}", agent.log());
            assert!(agent.term());
        },
    );
}

/// `volmgr doctor --state-dir DIR` (text): its exit code, stdout, stderr.
fn doctor(state: &Path) -> (i32, String, String) {
    let out = Command::new(volmgr_bin())
        .args(["doctor", "--timeout", "30", "--state-dir"])
        .arg(state)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn clients_do_not_trust_a_socket_another_user_serves() {
    isolated("clients_do_not_trust_a_socket_another_user_serves", || {
        let env = Env::new();
        // The other user reads ROOT and the manifests, as an agent of
        // their own would.
        std::fs::set_permissions(env.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let state = env.outside.join("state");
        std::fs::create_dir(&state).unwrap();
        std::os::unix::fs::chown(&state, Some(NOBODY), Some(NOBODY)).unwrap();
        // uid 65534 serves a status socket saying all is well.
        let mut fake = observe(&env, &state, |c| {
            c.uid(NOBODY).gid(NOBODY);
        });
        assert!(
            matches!(outcome(&mut fake, &state), Start::Accepted),
            "{}",
            fake.log()
        );
        let sock = state.join("volmgr.sock");
        assert_eq!(std::fs::symlink_metadata(&sock).unwrap().uid(), NOBODY);
        let (code, out, err) = doctor(&state);
        assert_eq!(
            code, 2,
            "root's doctor trusted uid 65534's socket:\n{out}{err}"
        );
        assert!(err.contains("owned by uid 65534"), "{err}");
        assert!(!out.contains("findings"), "{out}");
        let status = Command::new(volmgr_bin())
            .args(["status", "--root"])
            .arg(&state)
            .output()
            .unwrap();
        assert!(!status.status.success(), "{status:?}");
        assert!(
            String::from_utf8_lossy(&status.stderr).contains("owned by uid 65534"),
            "{status:?}"
        );
        // The socket file of root in a directory of root, served by
        // another user (moved there by them while it was open to them):
        // refused by the peer's credentials.
        let moved = env.outside.join("moved");
        std::fs::create_dir(&moved).unwrap();
        std::fs::rename(&sock, moved.join("volmgr.sock")).unwrap();
        std::os::unix::fs::lchown(moved.join("volmgr.sock"), Some(0), Some(0)).unwrap();
        let (code, out, err) = doctor(&moved);
        assert_eq!(code, 2, "{out}{err}");
        assert!(err.contains("served by uid 65534"), "{err}");
        assert!(fake.term());
    });
}

/// A capability set of `/proc/PID/status` (`CapEff`, `CapBnd`, ...).
fn cap_set(pid: u32, set: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{set}:\t")))
        .unwrap();
    u64::from_str_radix(line.trim(), 16).unwrap()
}

/// `CAP_SYS_ADMIN`.
const CAP_SYS_ADMIN: u64 = 1 << 21;

#[test]
fn the_confined_agent_has_no_sys_admin_and_cannot_signal_other_processes() {
    isolated(
        "the_confined_agent_has_no_sys_admin_and_cannot_signal_other_processes",
        || {
            let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            let env = Env::new();
            let state = env.outside.join("state");
            let mut agent = observe(&env, &state, |c| {
                c.env("VOLMGR_FAILPOINTS", "observe-signal-probe");
            });
            assert!(
                matches!(outcome(&mut agent, &state), Start::Accepted),
                "{}",
                agent.log()
            );
            let pid = agent.child.id();
            let status = Command::new(volmgr_bin())
                .args(["status", "--json", "--root"])
                .arg(&state)
                .output()
                .unwrap();
            let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
            let observe = &status["observe"];
            if last >= 39 {
                // CAP_BPF and CAP_PERFMON exist: CAP_SYS_ADMIN (remount,
                // sethostname, ...) is not kept, in any set.
                for set in ["CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb"] {
                    assert_eq!(cap_set(pid, set) & CAP_SYS_ADMIN, 0, "{set}: {observe}");
                }
                let caps = observe["capabilities"].as_str().unwrap();
                assert!(!caps.contains("CAP_SYS_ADMIN"), "{caps}");
                assert!(caps.contains("CAP_BPF"), "{caps}");
            }
            let landlock = observe["landlock"].as_str().unwrap();
            let abi: i64 = volmgr_landlock_abi();
            if abi >= 6 {
                assert!(landlock.contains("signals scoped"), "{landlock}");
                let log = agent.log();
                let probe = log
                    .lines()
                    .find(|l| l.contains("observe mode signal probe"))
                    .unwrap_or_else(|| panic!("no probe: {log}"));
                assert!(probe.contains("signal refused"), "{probe}");
            } else {
                eprintln!("landlock ABI {abi}: no signal scoping to test");
            }
            assert!(agent.term());
        },
    );
}

/// The kernel's Landlock ABI version (0 without Landlock).
fn volmgr_landlock_abi() -> i64 {
    // SAFETY: the version query takes no attribute (NULL, 0, VERSION).
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u64>(),
            0usize,
            1u32,
        )
    };
    abi.max(0)
}

#[test]
fn doctor_svg_replaces_a_symlink_planted_in_a_sticky_directory() {
    isolated(
        "doctor_svg_replaces_a_symlink_planted_in_a_sticky_directory",
        || {
            let env = Env::new();
            env.write_manifest(
                "web.yaml",
                &support::pod_yaml("web", "uid-web", &[("scratch", "emptyDir: {}")]),
            );
            let agent = env.start_agent(&["--tracer", "mountinfo"]);
            env.wait_synced();
            // uid 65534's sticky directory, open to all, as /tmp; its
            // owner plants out.svg -> a file of root's.
            let sticky = env.outside.join("sticky");
            std::fs::create_dir(&sticky).unwrap();
            std::os::unix::fs::chown(&sticky, Some(NOBODY), Some(NOBODY)).unwrap();
            std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
            let victim = env.outside.join("victim");
            std::fs::write(&victim, "root's data\n").unwrap();
            let out = sticky.join("out.svg");
            std::os::unix::fs::symlink(&victim, &out).unwrap();
            std::os::unix::fs::lchown(&out, Some(NOBODY), Some(NOBODY)).unwrap();
            let run = Command::new(volmgr_bin())
                .args(["doctor", "--pod", "uid-web", "--state-dir"])
                .arg(&env.root)
                .arg("--svg")
                .arg(&out)
                .output()
                .unwrap();
            assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's data\n");
            assert!(run.status.success(), "{run:?}");
            let md = std::fs::symlink_metadata(&out).unwrap();
            assert!(md.is_file(), "{md:?}");
            assert!(std::fs::read_to_string(&out).unwrap().starts_with("<svg "));
            drop(agent);
        },
    );
}

#[test]
fn orphan_evidence_never_lists_through_a_symlink_out_of_root() {
    isolated(
        "orphan_evidence_never_lists_through_a_symlink_out_of_root",
        || {
            let env = Env::new();
            // Pod directories of pods not on the node: one whose `volumes`
            // is a symlink to /etc, one with a plugin directory that is a
            // symlink to /proc/self.
            let a = env.root.join("pods/uid-a");
            std::fs::create_dir_all(&a).unwrap();
            std::os::unix::fs::symlink("/etc", a.join("volumes")).unwrap();
            let b = env.root.join("pods/uid-b/volumes");
            std::fs::create_dir_all(b.join("kubernetes.io~empty-dir/left")).unwrap();
            std::os::unix::fs::symlink("/proc/self", b.join("kubernetes.io~proc")).unwrap();
            let state = env.outside.join("state");
            // What a gone pod left is reported after --stuck-after.
            let mut agent = observe(&env, &state, |c| {
                c.args(["--stuck-after", "1s", "--scan-period", "200ms"]);
            });
            assert!(matches!(outcome(&mut agent, &state), Start::Accepted));
            let report = loop {
                let out = Command::new(volmgr_bin())
                    .args(["doctor", "--json", "--state-dir"])
                    .arg(&state)
                    .output()
                    .unwrap();
                let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                let n = r["findings"].as_array().map_or(0, Vec::len);
                if n == 2 {
                    break r;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            };
            let text = report.to_string();
            let of_a = report["findings"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["path"] == a.to_str().unwrap())
                .unwrap();
            let listed: Vec<&serde_json::Value> = of_a["evidence"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|l| l.as_str().unwrap().contains("left:"))
                .collect();
            assert!(listed.is_empty(), "/etc listed: {of_a:#}");
            assert!(
                !text.contains("cmdline") && !text.contains("fd ["),
                "/proc/self listed: {report:#}"
            );
            assert!(
                text.contains("kubernetes.io~empty-dir [left]"),
                "{report:#}"
            );
            assert!(
                text.contains("kubernetes.io~proc (not listed"),
                "{report:#}"
            );
            assert!(agent.term());
        },
    );
}

/// Orphaned pod directories planted by the test below (a node's worth of
/// leftovers times a hundred); `VOLMGR_TEST_ORPHANS` sets another number
/// (to measure the agent's memory with more).
const ORPHANS: usize = 20_000;

/// Many orphaned pod directories: observe mode keeps, lists and logs at
/// most `MAX_FINDINGS_PER_KIND` of them, and counts the rest ("and N
/// more" in doctor's text, `findings_not_listed` in JSON, all of them in
/// `volmgr_findings`). Before: one finding each, with its evidence, in
/// status and in the log (1M directories: 8.7 GB RSS, a 735 MB status,
/// 1M warnings).
#[test]
fn orphaned_pod_dirs_are_capped_in_findings_and_counted() {
    isolated(
        "orphaned_pod_dirs_are_capped_in_findings_and_counted",
        || {
            let n: usize = std::env::var("VOLMGR_TEST_ORPHANS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(ORPHANS);
            let cap = volmgr::observer::MAX_FINDINGS_PER_KIND;
            let env = Env::new();
            for i in 0..n {
                let d = env.root.join(format!("pods/orphan-{i:07}/volumes"));
                std::fs::create_dir_all(d).unwrap();
            }
            let state = env.dir.path().join("state");
            let agent = observe(&env, &state, |c| {
                c.args(["--stuck-after", "1s", "--scan-period", "500ms"]);
            });
            let not_listed =
                |r: &serde_json::Value| r["findings_not_listed"]["orphaned_pod_dir"].as_u64();
            let listed = |r: &serde_json::Value| {
                r["findings"].as_array().map_or(0, |fs| {
                    fs.iter()
                        .filter(|f| f["kind"] == "orphaned_pod_dir")
                        .count()
                })
            };
            let mut report = serde_json::Value::Null;
            // Those kept wait `--stuck-after` (the kubelet's teardown), all
            // together; the rest is counted from the first scan on.
            env.wait_for("the orphans found and counted", || {
                let out = Command::new(volmgr_bin())
                    .args(["doctor", "--json", "--state-dir"])
                    .arg(&state)
                    .output()
                    .unwrap();
                report = serde_json::from_slice(&out.stdout).unwrap_or_default();
                listed(&report) > 0
            });
            let listed = listed(&report);
            assert_eq!(listed, cap, "listed");
            assert_eq!(not_listed(&report), Some((n - cap) as u64), "counted");
            let text = Command::new(volmgr_bin())
                .args(["doctor", "--state-dir"])
                .arg(&state)
                .output()
                .unwrap();
            assert_eq!(text.status.code(), Some(1));
            let text = String::from_utf8_lossy(&text.stdout);
            let more = format!("... and {} more orphaned_pod_dir", n - cap);
            assert!(text.contains(&more), "{more} in\n{text}");
            let logged = agent
                .log()
                .lines()
                .filter(|l| l.contains("orphaned pod"))
                .count();
            assert!(logged <= cap, "{logged} orphans logged");
            let s = std::fs::read_to_string(format!("/proc/{}/status", agent.child.id())).unwrap();
            let rss = s
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .unwrap()
                .trim()
                .to_string();
            eprintln!("peak RSS with {n} orphaned pod directories: {rss}");
        },
    );
}
