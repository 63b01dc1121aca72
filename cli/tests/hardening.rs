//! Replays of an adversarial run against `volmgr agent` and its clients:
//! lock-out and socket access by other local users, unbounded local
//! clients, bad durations, clients of a silent agent, control characters
//! in names. Tests that start an agent run in a private mount namespace
//! (see `support::isolated`).

// Test-only code: failing loudly is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::{isolated, pod_yaml, volmgr_bin, Env};

const NOBODY: libc::uid_t = 65534;

/// Runs `probe` in a forked child as uid/gid 65534 and returns its exit
/// status. `probe` makes raw system calls only (no allocation after fork).
fn as_nobody(probe: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child only makes async-signal-safe calls, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: plain system calls in the child.
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(NOBODY) != 0
                || libc::setuid(NOBODY) != 0
            {
                libc::_exit(100);
            }
            libc::_exit(probe());
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    libc::WEXITSTATUS(status)
}

/// Whether uid 65534 can open `lock` and take an exclusive flock on it
/// (exit 0), or why not (1: open failed, 2: flock failed).
fn nobody_can_lock(lock: &Path) -> i32 {
    let c = std::ffi::CString::new(lock.as_os_str().as_encoded_bytes()).unwrap();
    as_nobody(|| {
        // SAFETY: raw system calls on a prepared C string.
        unsafe {
            let fd = libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return 1;
            }
            if libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) != 0 {
                return 2;
            }
            0
        }
    })
}

/// Whether uid 65534 can connect to the socket at `path` (exit 0).
fn nobody_can_connect(path: &Path) -> i32 {
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr
        .sun_path
        .iter_mut()
        .zip(path.as_os_str().as_encoded_bytes())
    {
        *d = *s as libc::c_char;
    }
    as_nobody(|| {
        // SAFETY: raw system calls on a prepared address.
        unsafe {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            if libc::connect(fd, (&raw const addr).cast(), len) != 0 {
                return 1;
            }
            0
        }
    })
}

/// A child of uid 65534 holding an exclusive flock on `lock` until killed.
struct NobodyHoldsLock(libc::pid_t);

impl NobodyHoldsLock {
    fn take(lock: &Path) -> Option<Self> {
        let c = std::ffi::CString::new(lock.as_os_str().as_encoded_bytes()).unwrap();
        let mut fds = [0; 2];
        // SAFETY: a pipe to hear whether the child got the lock.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only makes async-signal-safe calls.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: plain system calls in the child.
            unsafe {
                libc::close(fds[0]);
                let ok = libc::setgroups(0, std::ptr::null()) == 0
                    && libc::setgid(NOBODY) == 0
                    && libc::setuid(NOBODY) == 0;
                let fd = if ok {
                    libc::open(c.as_ptr(), libc::O_RDONLY)
                } else {
                    -1
                };
                let locked = fd >= 0 && libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) == 0;
                let b = [u8::from(locked)];
                libc::write(fds[1], b.as_ptr().cast(), 1);
                loop {
                    libc::pause();
                }
            }
        }
        // SAFETY: our ends of the pipe.
        unsafe { libc::close(fds[1]) };
        let mut b = [0u8; 1];
        // SAFETY: reading one byte into a local buffer.
        unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) };
        // SAFETY: closing our descriptor.
        unsafe { libc::close(fds[0]) };
        let holder = Self(pid);
        (b[0] == 1).then_some(holder)
    }
}

impl Drop for NobodyHoldsLock {
    fn drop(&mut self) {
        // SAFETY: our own child.
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn other_users_cannot_lock_out_or_reach_the_agent() {
    isolated("other_users_cannot_lock_out_or_reach_the_agent", || {
        let env = Env::new();
        // Others may traverse to ROOT (as to /var/lib/kubelet).
        std::fs::set_permissions(env.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::remove_dir(&env.root).unwrap();
        // SAFETY: umask only affects this (test) process and its children.
        unsafe { libc::umask(0) };
        let agent = env.start_agent(&["--tracer", "off"]);
        env.wait_synced();
        let lock = env.root.join("volmgr.lock");
        let sock = env.root.join("volmgr.sock");
        assert_eq!(mode(&env.root), 0o750, "ROOT created 0750 under umask 000");
        assert_eq!(mode(&lock), 0o600);
        assert_eq!(mode(&sock), 0o600);
        assert_eq!(mode(&env.root.join("plugins_registry")), 0o750);
        assert!(agent.term());

        // ROOT 0755 and a lock file left 0644 (as older versions made it):
        // another user takes the lock before the agent starts.
        std::fs::set_permissions(&env.root, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o644)).unwrap();
        let holder = NobodyHoldsLock::take(&lock).expect("nobody can lock a 0644 lock file");
        let mut agent = env.start_agent(&["--tracer", "off"]);
        env.wait_synced();
        assert!(agent.is_alive(), "agent refused to start:\n{}", agent.log());
        assert_eq!(mode(&lock), 0o600);
        // Now nobody can neither open the lock nor reach the socket.
        assert_eq!(nobody_can_lock(&lock), 1, "lock opened by another user");
        assert_eq!(
            nobody_can_connect(&sock),
            1,
            "socket reached by another user"
        );
        drop(holder);
        // A second agent (same user) is still refused.
        let second = env.start_agent(&["--tracer", "off"]);
        assert!(!second.wait_exit().success());
        assert!(agent.term());
    });
}

/// Whether the agent closed `s` (end of file or reset), reading whatever it
/// sent first; `false` while it is open and silent.
fn closed(s: &mut UnixStream) -> bool {
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// The agent's resident memory in KiB.
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Connections: `greedy` send many status requests and never read; `long`
/// send a line longer than the agent takes, without its end.
fn flood(sock: &Path, greedy: usize, long: usize) -> Vec<UnixStream> {
    let requests = "{\"method\":\"status\"}\n".repeat(200);
    let partial = vec![b'x'; 100 << 10];
    let mut conns = Vec::new();
    for i in 0..greedy + long {
        let mut s = UnixStream::connect(sock).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        let _ = if i < greedy {
            s.write_all(requests.as_bytes())
        } else {
            s.write_all(&partial)
        };
        s.set_nonblocking(true).unwrap();
        conns.push(s);
    }
    conns
}

#[test]
fn local_clients_are_bounded() {
    isolated("local_clients_are_bounded", || {
        let env = Env::new();
        // A status of some size: 40 pods of 10 volumes (plain directories).
        let vols: Vec<(String, &str)> =
            (0..10).map(|i| (format!("v{i}"), "emptyDir: {}")).collect();
        let vols: Vec<(&str, &str)> = vols.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        for p in 0..40 {
            env.write_manifest(
                &format!("p{p}.yaml"),
                &pod_yaml(&format!("p{p}"), &format!("uid-{p}"), &vols),
            );
        }
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let addr = format!("127.0.0.1:{port}");
        // A low open-file limit: at most 256/4 = 64 clients over both
        // listeners; without bounds the agent runs out of descriptors.
        let mut agent = env.start_agent_with(&["--tracer", "off", "--metrics-addr", &addr], |c| {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit between fork and exec.
            unsafe {
                c.pre_exec(|| {
                    let lim = libc::rlimit {
                        rlim_cur: 256,
                        rlim_max: 256,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        });
        assert_eq!(env.wait_pod("uid-39", 60.0), 0);
        let pid = agent.child.id();

        // 300 status clients that never read, 100 with an endless line,
        // 200 idle metrics clients.
        let mut conns = flood(&env.root.join("volmgr.sock"), 300, 100);
        let mut idle: Vec<std::net::TcpStream> = (0..200)
            .filter_map(|_| std::net::TcpStream::connect(&addr).ok())
            .collect();
        assert!(rss_kib(pid) < 512 << 10, "agent RSS {} KiB", rss_kib(pid));
        // At most 64 are kept: the rest are closed (and, once their
        // deadlines pass, all of them).
        let n = conns.len();
        env.wait_for("refused or timed-out clients closed", || {
            conns.iter_mut().map(closed).filter(|c| *c).count() >= n - 64
        });
        for s in &idle {
            s.set_nonblocking(true).unwrap();
        }
        let n = idle.len();
        env.wait_for("refused metrics clients closed", || {
            let closed = idle
                .iter_mut()
                .map(|s| {
                    let mut b = [0u8; 256];
                    loop {
                        match s.read(&mut b) {
                            Ok(0) => return true,
                            Ok(_) => {}
                            Err(e) => return e.kind() != std::io::ErrorKind::WouldBlock,
                        }
                    }
                })
                .filter(|c| *c)
                .count();
            closed >= n.saturating_sub(64)
        });
        // The agent still works: it answers, reads a new manifest (the
        // directory is still readable) and mounts.
        env.status();
        env.write_manifest(
            "new.yaml",
            &pod_yaml("new", "uid-new", &[("v", "emptyDir: {}")]),
        );
        assert_eq!(env.wait_pod("uid-new", 60.0), 0);
        assert!(rss_kib(pid) < 512 << 10, "agent RSS {} KiB", rss_kib(pid));
        assert!(agent.is_alive());
        drop(conns);
        drop(idle);
    });
}

#[test]
fn zero_periods_are_refused_at_parse_time() {
    let dir = tempfile::tempdir().unwrap();
    for flag in [
        "--rescan-period",
        "--resync-period",
        "--backoff-initial",
        "--backoff-max",
        "--csi-timeout",
    ] {
        let out = Command::new(volmgr_bin())
            .arg("agent")
            .arg("--root")
            .arg(dir.path().join("root"))
            .arg("--manifests")
            .arg(dir.path())
            .args([flag, "0s"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} 0s accepted");
        assert!(err.contains("must be at least 1ms"), "{flag}: {err}");
        assert!(!dir.path().join("root").exists(), "{flag}: the agent ran");
    }
}

/// Runs `cmd`, killing it (and failing) if it runs past a generous limit.
fn run_bounded(cmd: &mut Command) -> std::process::Output {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} hung on an agent that never answers");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn clients_give_up_on_an_agent_that_never_answers() {
    let dir = tempfile::tempdir().unwrap();
    // Accepts connections (the backlog) and never answers.
    let _silent = std::os::unix::net::UnixListener::bind(dir.path().join("volmgr.sock")).unwrap();
    let out = run_bounded(
        Command::new(volmgr_bin())
            .args(["wait", "--pod", "uid-x", "--timeout", "1", "--root"])
            .arg(dir.path()),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("did not answer"), "{err}");
    let out = run_bounded(
        Command::new(volmgr_bin())
            .args(["status", "--timeout", "1", "--root"])
            .arg(dir.path()),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("did not answer"), "{err}");
}

#[test]
fn control_characters_in_names_are_escaped() {
    isolated("control_characters_in_names_are_escaped", || {
        let env = Env::new();
        // A name no pod may have (rejected), quoted in status and the log.
        let forged = "x\\nFORGED INFO volmgr: all good\\u001b]0;pwned\\u0007";
        env.write_manifest(
            "bad.yaml",
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: \"{forged}\", namespace: test, uid: \"../bad\"}}\nspec: {{containers: []}}\n"
            ),
        );
        env.write_manifest(
            "ok.yaml",
            &pod_yaml("ok", "uid-ok", &[("v", "emptyDir: {}")]),
        );
        let agent = env.start_agent(&["--tracer", "off"]);
        assert_eq!(env.wait_pod("uid-ok", 30.0), 0);
        let json = env.status();
        assert!(
            serde_json::to_string(&json).unwrap().contains("FORGED"),
            "the rejected pod shows in status"
        );
        let out = Command::new(volmgr_bin())
            .args(["status", "--root"])
            .arg(&env.root)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("FORGED"), "{text}");
        for (what, s) in [("status", text.to_string()), ("log", agent.log())] {
            // No escape sequence at all: the name's are quoted, and the
            // log, written to a file, has no colours.
            assert!(!s.contains('\u{1b}') && !s.contains('\u{7}'), "{what}: {s}");
            assert!(
                s.lines().all(|l| !l.starts_with("FORGED")),
                "{what} has a forged line:\n{s}"
            );
        }
    });
}

/// Lowers the agent's open-file limit to 256: then 64 clients over both
/// listeners, 48 per listener, 24 per peer (see `cli/src/limits.rs`).
fn low_nofile(c: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit between fork and exec.
    unsafe {
        c.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 256,
                rlim_max: 256,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// One `GET path` on a new connection: the whole answer (the agent
/// closes after it), or the error.
fn http_get(addr: &str, path: &str) -> std::io::Result<String> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

#[test]
fn idle_metrics_clients_do_not_keep_healthz_out() {
    isolated("idle_metrics_clients_do_not_keep_healthz_out", || {
        let env = Env::new();
        let addr = support::free_port();
        let _agent = env.start_agent(&["--tracer", "off", "--metrics-addr", &addr]);
        env.wait_for("metrics endpoint up", || {
            http_get(&addr, "/healthz").is_ok_and(|r| r.starts_with("HTTP/1.1 200"))
        });
        // 100 connections that never send a request (the agent takes 64
        // per listener at most): /healthz is answered at once, not after
        // they give up, and so is /metrics.
        let mut idle: Vec<std::net::TcpStream> = (0..100)
            .map(|_| std::net::TcpStream::connect(&addr).unwrap())
            .collect();
        let health = http_get(&addr, "/healthz").unwrap();
        assert!(health.starts_with("HTTP/1.1 200 OK\r\n"), "{health}");
        assert!(health.ends_with("\r\n\r\nok\n"), "{health}");
        let metrics = http_get(&addr, "/metrics").unwrap();
        assert!(metrics.starts_with("HTTP/1.1 200 OK\r\n"), "{metrics}");
        // The answers' heads and bodies, as the agent always sent them.
        assert!(
            health.contains("\r\nContent-Type: text/plain\r\n"),
            "{health}"
        );
        assert!(health.contains("\r\nContent-Length: 3\r\n"), "{health}");
        assert!(metrics.contains("\r\nContent-Type: text/plain; version=0.0.4\r\n"));
        let other = http_get(&addr, "/metrics?x=1").unwrap();
        assert!(other.starts_with("HTTP/1.1 404 Not Found\r\n"), "{other}");
        assert!(other.ends_with("\r\n\r\nnot found\n"), "{other}");
        // Idle connections are closed within seconds, all of them.
        for s in &idle {
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        }
        for s in &mut idle {
            let mut b = [0u8; 256];
            let n = s.read(&mut b).unwrap_or(0);
            assert!(n == 0 || b.starts_with(b"HTTP/1.1 503"), "{:?}", &b[..n]);
        }
    });
}

/// `volmgr status --json` on `root`, bounded.
fn status_once(root: &Path) -> std::process::Output {
    run_bounded(
        Command::new(volmgr_bin())
            .args(["status", "--json", "--timeout", "30", "--root"])
            .arg(root),
    )
}

#[test]
fn idle_or_busy_socket_clients_do_not_break_status() {
    isolated("idle_or_busy_socket_clients_do_not_break_status", || {
        let env = Env::new();
        let _agent = env.start_agent_with(&["--tracer", "off"], low_nofile);
        env.status();
        let sock = env.root.join("volmgr.sock");
        // 200 clients that connect and send nothing: status still answers.
        let idle: Vec<UnixStream> = (0..200)
            .map(|_| UnixStream::connect(&sock).unwrap())
            .collect();
        let out = status_once(&env.root);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        drop(idle);
        // 200 clients that each wait for a pod that never comes: 24 (this
        // user's share) are kept, the rest are told to retry. Status is
        // then told so too, in words, not with a broken pipe.
        let wait = "{\"method\":\"wait\",\"pod\":\"uid-never\",\"timeout_ms\":120000}\n";
        let mut waiting: Vec<UnixStream> = (0..200)
            .map(|_| {
                let mut s = UnixStream::connect(&sock).unwrap();
                s.write_all(wait.as_bytes()).unwrap();
                s.set_nonblocking(true).unwrap();
                s
            })
            .collect();
        env.wait_for("all but 24 waiting clients closed", || {
            waiting.iter_mut().map(closed).filter(|c| *c).count() >= 200 - 24
        });
        let out = status_once(&env.root);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "status answered with 24 waiting");
        assert!(
            err.contains("too many clients") && err.contains("retry"),
            "{err}"
        );
        assert!(
            !err.contains("Broken pipe") && !err.contains("reset"),
            "{err}"
        );
        // Room again once they are gone.
        drop(waiting);
        env.status();
    });
}
