//! The eBPF tracer against real mount syscalls, in a private mount namespace
//! the test creates: every call of the classic and the new mount API made
//! here (through nix, raw syscalls and util-linux) is seen exactly once with
//! the right syscall, paths, fstype and return value, failures carry their
//! errno, nothing is lost, and the in-kernel histograms count the same calls.
//! Also `volmgr trace --json` and `volmgr profile --json` on real calls.
//!
//! Needs root and BPF; skips with the reason otherwise (CI is root).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use volmgr::ebpf::decode::ExtraArgs;
use volmgr::ebpf::{
    own_mount_namespace, EbpfError, EbpfTracer, MountSyscall, SyscallEvent, TraceFilter,
};

/// Mount+umount pairs of each kind through nix.
const N_NIX: usize = 50;
/// Pairs of each kind through util-linux (a process each).
const N_UTIL: usize = 10;

/// Loads the tracer on this namespace, or says why the test skips.
fn load(name: &str) -> Option<EbpfTracer> {
    let ns = own_mount_namespace().expect("own mount namespace");
    match EbpfTracer::load(TraceFilter { mnt_ns: Some(ns) }) {
        Ok(t) => Some(t),
        Err(EbpfError::NotBuilt) => {
            eprintln!("SKIP {name}: this build has no eBPF object (run scripts/bootstrap.sh)");
            None
        }
        Err(e) => panic!("loading the eBPF tracer as root failed: {e}"),
    }
}

/// Collects events until one for the sentinel path arrives (a failing
/// umount2 made after every other call), so no timing is assumed; a generous
/// guard only turns a hang into a failure.
fn collect_until_sentinel(
    rt: &tokio::runtime::Runtime,
    tracer: &mut EbpfTracer,
    sentinel: &str,
) -> Vec<(SyscallEvent, ExtraArgs)> {
    umount2(sentinel, MntFlags::empty()).expect_err("sentinel umount must fail");
    rt.block_on(async {
        let mut all = Vec::new();
        let guard = Instant::now() + Duration::from_secs(120);
        loop {
            let mut batch = Vec::new();
            tokio::select! {
                r = tracer.next_events(&mut batch) => r.expect("read events"),
                _ = tokio::time::sleep_until(guard.into()) => panic!("sentinel event never came; got {all:#?}"),
            }
            let done = batch
                .iter()
                .any(|(e, _)| e.target.as_deref() == Some(sentinel));
            all.extend(batch);
            if done {
                return all;
            }
        }
    })
}

fn cstr(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// A raw syscall; the return value or -errno, like the kernel's.
fn sys(r: libc::c_long) -> i64 {
    if r < 0 {
        -(nix::errno::Errno::last_raw() as i64)
    } else {
        r
    }
}

#[derive(Debug)]
struct Expect {
    syscall: MountSyscall,
    fstype: Option<String>,
    source: Option<String>,
    target: Option<String>,
    flags: Option<u64>,
    ret: i64,
}

fn exp(
    syscall: MountSyscall,
    fstype: Option<&str>,
    source: Option<&str>,
    target: Option<&str>,
    flags: Option<u64>,
    ret: i64,
) -> Expect {
    Expect {
        syscall,
        fstype: fstype.map(str::to_string),
        source: source.map(str::to_string),
        target: target.map(str::to_string),
        flags,
        ret,
    }
}

fn check(e: &Expect, (ev, _): &(SyscallEvent, ExtraArgs), what: &str) {
    assert_eq!(ev.syscall, e.syscall, "{what}: {ev:?}");
    assert_eq!(ev.ret, e.ret, "{what}: {ev:?}");
    assert_eq!(ev.fstype, e.fstype, "{what}: {ev:?}");
    assert_eq!(ev.source, e.source, "{what}: {ev:?}");
    assert_eq!(ev.target, e.target, "{what}: {ev:?}");
    if let Some(f) = e.flags {
        assert_eq!(ev.flags, f, "{what}: {ev:?}");
    }
}

#[test]
fn every_mount_syscall_is_seen_once() {
    support::isolated("every_mount_syscall_is_seen_once", || {
        let Some(mut tracer) = load("every_mount_syscall_is_seen_once") else {
            return;
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().canonicalize().unwrap();
        let p = |n: &str| d.join(n).to_str().unwrap().to_string();
        for n in ["t", "b", "u", "ub", "new", "clone", "src"] {
            std::fs::create_dir(d.join(n)).unwrap();
        }
        let me = std::process::id();
        let mut expected: Vec<Expect> = Vec::new();

        // Classic API through nix: tmpfs and bind pairs.
        for i in 0..N_NIX {
            let data = format!("size={}k", 64 + i);
            mount(
                Some("tmpfs"),
                p("t").as_str(),
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(data.as_str()),
            )
            .unwrap();
            expected.push(exp(
                MountSyscall::Mount,
                Some("tmpfs"),
                Some("tmpfs"),
                Some(&p("t")),
                Some(libc::MS_NOSUID | libc::MS_NODEV),
                0,
            ));
            mount(
                Some(p("src").as_str()),
                p("b").as_str(),
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .unwrap();
            expected.push(exp(
                MountSyscall::Mount,
                None,
                Some(&p("src")),
                Some(&p("b")),
                Some(libc::MS_BIND),
                0,
            ));
            umount2(p("b").as_str(), MntFlags::empty()).unwrap();
            expected.push(exp(
                MountSyscall::Umount,
                None,
                None,
                Some(&p("b")),
                Some(0),
                0,
            ));
            umount2(p("t").as_str(), MntFlags::MNT_DETACH).unwrap();
            expected.push(exp(
                MountSyscall::Umount,
                None,
                None,
                Some(&p("t")),
                Some(2),
                0,
            ));
        }
        // Failures carry their errno.
        let e = mount(
            Some("none"),
            p("t").as_str(),
            Some("no-such-fs"),
            MsFlags::empty(),
            None::<&str>,
        )
        .unwrap_err();
        assert_eq!(e, nix::errno::Errno::ENODEV);
        expected.push(exp(
            MountSyscall::Mount,
            Some("no-such-fs"),
            Some("none"),
            Some(&p("t")),
            Some(0),
            -libc::ENODEV as i64,
        ));
        let e = umount2(p("t").as_str(), MntFlags::empty()).unwrap_err();
        assert_eq!(e, nix::errno::Errno::EINVAL);
        expected.push(exp(
            MountSyscall::Umount,
            None,
            None,
            Some(&p("t")),
            Some(0),
            -libc::EINVAL as i64,
        ));

        // The new mount API through raw syscalls.
        // SAFETY (all the blocks below): raw syscalls with valid C strings,
        // a valid mount_attr and descriptors this test owns.
        let fs_name = cstr("tmpfs");
        let fd = sys(unsafe { libc::syscall(libc::SYS_fsopen, fs_name.as_ptr(), 1) });
        assert!(fd >= 0, "fsopen: {fd}");
        expected.push(exp(
            MountSyscall::Fsopen,
            Some("tmpfs"),
            None,
            None,
            Some(1),
            fd,
        ));
        let bad = cstr("no-such-fs");
        let r = sys(unsafe { libc::syscall(libc::SYS_fsopen, bad.as_ptr(), 0) });
        assert_eq!(r, -libc::ENODEV as i64);
        expected.push(exp(
            MountSyscall::Fsopen,
            Some("no-such-fs"),
            None,
            None,
            Some(0),
            r,
        ));
        let (key, val) = (cstr("size"), cstr("1m"));
        let r =
            sys(unsafe { libc::syscall(libc::SYS_fsconfig, fd, 1, key.as_ptr(), val.as_ptr(), 0) });
        assert_eq!(r, 0);
        expected.push(exp(
            MountSyscall::Fsconfig,
            Some("tmpfs"),
            Some("size"),
            Some("1m"),
            None,
            0,
        ));
        let r = sys(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fd,
                6,
                std::ptr::null::<u8>(),
                std::ptr::null::<u8>(),
                0,
            )
        });
        assert_eq!(r, 0);
        expected.push(exp(
            MountSyscall::Fsconfig,
            Some("tmpfs"),
            None,
            None,
            None,
            0,
        ));
        // fsmount(fd, FSMOUNT_CLOEXEC, MOUNT_ATTR_NODEV)
        let mfd = sys(unsafe { libc::syscall(libc::SYS_fsmount, fd, 1, 0x4) });
        assert!(mfd >= 0, "fsmount: {mfd}");
        expected.push(exp(
            MountSyscall::Fsmount,
            Some("tmpfs"),
            None,
            None,
            Some(1),
            mfd,
        ));
        let (empty, new) = (cstr(""), cstr(&p("new")));
        // move_mount(mfd, "", AT_FDCWD, new, MOVE_MOUNT_F_EMPTY_PATH)
        let r = sys(unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                mfd,
                empty.as_ptr(),
                libc::AT_FDCWD,
                new.as_ptr(),
                4,
            )
        });
        assert_eq!(r, 0);
        expected.push(exp(
            MountSyscall::MoveMount,
            Some("tmpfs"),
            Some(""),
            Some(&p("new")),
            Some(4),
            0,
        ));
        // open_tree(AT_FDCWD, new, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)
        let otflags = 1 | libc::O_CLOEXEC as u64;
        let tfd = sys(unsafe {
            libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, new.as_ptr(), otflags)
        });
        assert!(tfd >= 0, "open_tree: {tfd}");
        expected.push(exp(
            MountSyscall::OpenTree,
            None,
            Some(&p("new")),
            None,
            Some(otflags),
            tfd,
        ));
        let clone = cstr(&p("clone"));
        let r = sys(unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                tfd,
                empty.as_ptr(),
                libc::AT_FDCWD,
                clone.as_ptr(),
                4,
            )
        });
        assert_eq!(r, 0);
        expected.push(exp(
            MountSyscall::MoveMount,
            None,
            Some(""),
            Some(&p("clone")),
            Some(4),
            0,
        ));
        // mount_setattr(AT_FDCWD, clone, 0, {attr_set: MOUNT_ATTR_RDONLY}, 32)
        let attr: [u64; 4] = [1, 0, 0, 0];
        let r = sys(unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                libc::AT_FDCWD,
                clone.as_ptr(),
                0,
                attr.as_ptr(),
                32,
            )
        });
        assert_eq!(r, 0);
        expected.push(exp(
            MountSyscall::MountSetattr,
            None,
            None,
            Some(&p("clone")),
            Some(0),
            0,
        ));
        // fspick(AT_FDCWD, new, FSPICK_CLOEXEC), then reconfigure through it.
        let pfd = sys(unsafe { libc::syscall(libc::SYS_fspick, libc::AT_FDCWD, new.as_ptr(), 1) });
        assert!(pfd >= 0, "fspick: {pfd}");
        expected.push(exp(
            MountSyscall::Fspick,
            None,
            Some(&p("new")),
            None,
            Some(1),
            pfd,
        ));
        let r = sys(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                pfd,
                7,
                std::ptr::null::<u8>(),
                std::ptr::null::<u8>(),
                0,
            )
        });
        assert_eq!(r, 0);
        expected.push(exp(MountSyscall::Fsconfig, None, None, None, None, 0));
        for f in [fd, mfd, tfd, pfd] {
            nix::unistd::close(f as i32).unwrap();
        }
        umount2(p("clone").as_str(), MntFlags::empty()).unwrap();
        expected.push(exp(
            MountSyscall::Umount,
            None,
            None,
            Some(&p("clone")),
            Some(0),
            0,
        ));
        umount2(p("new").as_str(), MntFlags::empty()).unwrap();
        expected.push(exp(
            MountSyscall::Umount,
            None,
            None,
            Some(&p("new")),
            Some(0),
            0,
        ));

        // util-linux mount/umount, other processes in this namespace.
        for _ in 0..N_UTIL {
            run("mount", &["-t", "tmpfs", "-o", "size=1m", "tmpfs", &p("u")]);
            run("mount", &["--bind", &p("src"), &p("ub")]);
            run("umount", &[&p("ub")]);
            run("umount", &[&p("u")]);
        }

        let sentinel = p("sentinel-not-mounted");
        expected.push(exp(
            MountSyscall::Umount,
            None,
            None,
            Some(&sentinel),
            None,
            -libc::ENOENT as i64,
        ));
        let events = collect_until_sentinel(&rt, &mut tracer, &sentinel);

        // Everything seen was in this namespace.
        let ns = own_mount_namespace().unwrap();
        for (ev, _) in &events {
            assert_eq!(ev.mnt_ns, ns, "{ev:?}");
            assert!(ev.cgroup_id != 0, "{ev:?}");
        }
        // Our own calls: exactly the expected sequence, each once.
        let mine: Vec<_> = events
            .iter()
            .filter(|(e, _)| e.pid == me)
            .cloned()
            .collect();
        assert_eq!(
            mine.len(),
            expected.len(),
            "own calls seen: {:#?}",
            mine.iter().map(|(e, _)| e).collect::<Vec<_>>()
        );
        for (i, (e, ev)) in expected.iter().zip(&mine).enumerate() {
            check(e, ev, &format!("own call {i}"));
            assert_eq!(ev.0.tid, nix::unistd::gettid().as_raw() as u32);
            assert!(ev.0.latency_ns > 0);
        }
        let mount_setattr = mine
            .iter()
            .find(|(e, _)| e.syscall == MountSyscall::MountSetattr)
            .unwrap();
        assert_eq!(mount_setattr.1.aux, [1, 0], "attr_set/attr_clr");
        let fsmount = mine
            .iter()
            .find(|(e, _)| e.syscall == MountSyscall::Fsmount)
            .unwrap();
        assert_eq!(fsmount.1.aux[0], 0x4, "attr_flags");
        assert_eq!(fsmount.1.fds[0], fd as i32);

        // util-linux: each mount attaches exactly once at its path (through
        // mount(2), or fsmount+move_mount with a newer libmount), each
        // umount detaches once.
        let util: Vec<_> = events.iter().filter(|(e, _)| e.pid != me).collect();
        let attaches = |target: &str| {
            util.iter()
                .filter(|(e, _)| {
                    e.ret == 0
                        && e.target.as_deref() == Some(target)
                        && (e.syscall == MountSyscall::MoveMount
                            || (e.syscall == MountSyscall::Mount
                                && e.flags
                                    & (libc::MS_REMOUNT
                                        | libc::MS_PRIVATE
                                        | libc::MS_SHARED
                                        | libc::MS_SLAVE
                                        | libc::MS_UNBINDABLE)
                                    == 0))
                })
                .collect::<Vec<_>>()
        };
        let detaches = |target: &str| {
            util.iter()
                .filter(|(e, _)| {
                    e.ret == 0
                        && e.syscall == MountSyscall::Umount
                        && e.target.as_deref() == Some(target)
                })
                .count()
        };
        let u = attaches(&p("u"));
        assert_eq!(u.len(), N_UTIL, "tmpfs mounts by util-linux: {u:#?}");
        assert!(u.iter().all(|(e, _)| e.comm == "mount"));
        assert!(u
            .iter()
            .all(|(e, _)| e.syscall == MountSyscall::MoveMount
                || e.fstype.as_deref() == Some("tmpfs")));
        let ub = attaches(&p("ub"));
        assert_eq!(ub.len(), N_UTIL, "bind mounts by util-linux: {ub:#?}");
        assert!(ub
            .iter()
            .all(|(e, _)| e.syscall == MountSyscall::MoveMount || e.flags & libc::MS_BIND != 0));
        assert_eq!(detaches(&p("u")), N_UTIL);
        assert_eq!(detaches(&p("ub")), N_UTIL);

        // Nothing lost; the in-kernel histograms counted exactly the calls
        // delivered, per (syscall, result).
        assert_eq!(tracer.events_lost(), 0);
        let mut delivered: BTreeMap<(MountSyscall, bool), u64> = BTreeMap::new();
        for (e, _) in &events {
            *delivered.entry((e.syscall, e.ret < 0)).or_default() += 1;
        }
        let kernel: BTreeMap<(MountSyscall, bool), u64> = tracer
            .kernel_histograms()
            .iter()
            .map(|k| ((k.syscall, k.error), k.count()))
            .collect();
        assert_eq!(kernel, delivered);
    });
}

fn run(cmd: &str, args: &[&str]) {
    let st = Command::new(cmd).args(args).status().unwrap();
    assert!(st.success(), "{cmd} {args:?}: {st}");
}

/// Starts a `volmgr` command and waits for its "ready" line on stderr.
fn start(args: &[&str], ready: &str) -> (std::process::Child, std::thread::JoinHandle<String>) {
    let mut child = Command::new(support::volmgr_bin())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "volmgr {args:?} exited before being ready"
        );
        if line.contains(ready) {
            break;
        }
        if line.contains("built without the eBPF object") {
            panic!("volmgr was built without the eBPF object: {line}");
        }
    }
    let rest = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    (child, rest)
}

fn tmpfs_pairs(dir: &Path, n: usize) {
    let t = dir.join("t");
    std::fs::create_dir_all(&t).unwrap();
    for _ in 0..n {
        mount(
            Some("tmpfs"),
            &t,
            Some("tmpfs"),
            MsFlags::empty(),
            None::<&str>,
        )
        .unwrap();
        umount2(&t, MntFlags::empty()).unwrap();
    }
    // A failing one.
    mount(
        Some("none"),
        &t,
        Some("no-such-fs"),
        MsFlags::empty(),
        None::<&str>,
    )
    .unwrap_err();
}

#[test]
fn trace_and_profile_commands() {
    support::isolated("trace_and_profile_commands", || {
        if !volmgr::ebpf::object_built() {
            eprintln!("SKIP trace_and_profile_commands: this build has no eBPF object");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().canonicalize().unwrap();
        let n = 20;

        // trace --json: exactly our calls, one JSON object each.
        let (child, rest) = start(
            &["trace", "--json", "--count", &(2 * n + 1).to_string()],
            "tracing",
        );
        tmpfs_pairs(&d, n);
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", rest.join().unwrap());
        let stderr = rest.join().unwrap();
        assert!(
            stderr.contains(&format!("{} events, 0 lost", 2 * n + 1)),
            "{stderr}"
        );
        let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2 * n + 1);
        let target = d.join("t").to_str().unwrap().to_string();
        for (i, l) in lines.iter().enumerate() {
            assert_eq!(l["pid"], std::process::id(), "{l}");
            assert_eq!(l["target"], target.as_str(), "{l}");
            let (syscall, ret) = if i == 2 * n {
                ("mount", -libc::ENODEV as i64)
            } else if i % 2 == 0 {
                ("mount", 0)
            } else {
                ("umount2", 0)
            };
            assert_eq!(l["syscall"], syscall, "{l}");
            assert_eq!(l["ret"], ret, "{l}");
            if ret < 0 {
                assert_eq!(l["errno"], "ENODEV", "{l}");
            }
            if syscall == "mount" {
                assert_eq!(l["source"], if ret < 0 { "none" } else { "tmpfs" });
            }
            assert!(l["latency_ns"].as_u64().unwrap() > 0);
            assert!(l["call"].as_str().unwrap().starts_with(syscall));
        }

        // profile --json: counts per syscall and fstype, errors, nothing lost.
        let svg = d.join("p.svg");
        let (child, rest) = start(
            &[
                "profile",
                "--duration",
                "1h",
                "--json",
                "--svg",
                svg.to_str().unwrap(),
            ],
            "profiling",
        );
        tmpfs_pairs(&d, n);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        )
        .unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = rest.join().unwrap();
        assert!(out.status.success(), "{stderr}");
        let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(p["events_lost"], 0, "{p}");
        assert_eq!(p["events"], 2 * n + 1, "{p}");
        let row = |syscall: &str, fstype: &str| {
            p["rows"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["syscall"] == syscall && r["fstype"] == fstype)
                .cloned()
                .unwrap_or_else(|| panic!("no row {syscall} {fstype}: {p}"))
        };
        let m = row("mount", "tmpfs");
        assert_eq!(m["count"], n);
        assert_eq!(m["errors"], 0);
        assert!(m["p50_ns"].as_u64().unwrap() <= m["p99_ns"].as_u64().unwrap());
        assert!(m["p99_ns"].as_u64().unwrap() <= m["max_ns"].as_u64().unwrap());
        let u = row("umount2", "");
        assert_eq!(u["count"], n);
        // An unknown type is labelled `other` (the labels are a fixed set).
        let f = row("mount", "other");
        assert_eq!(f["count"], 1);
        assert_eq!(f["errors"], 1);
        let kernel_mounts: u64 = p["kernel"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|k| k["syscall"] == "mount")
            .map(|k| k["count"].as_u64().unwrap())
            .sum();
        assert_eq!(kernel_mounts, n as u64 + 1);
        let svg = std::fs::read_to_string(&svg).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("mount tmpfs (n=20"),
            "{svg}"
        );
    });
}

#[test]
fn mount_namespace_filter() {
    support::isolated("mount_namespace_filter", || {
        let Some(mut own) = load("mount_namespace_filter") else {
            return;
        };
        let mut all = EbpfTracer::load(TraceFilter { mnt_ns: None }).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().canonicalize().unwrap();
        let other = d.join("other");
        std::fs::create_dir(&other).unwrap();
        let other = other.to_str().unwrap().to_string();
        // A mount and an unmount in another, new mount namespace.
        run(
            "unshare",
            &[
                "-m",
                "--propagation",
                "private",
                "sh",
                "-c",
                &format!("mount -t tmpfs tmpfs '{other}' && umount '{other}'"),
            ],
        );
        let sentinel = d.join("sentinel").to_str().unwrap().to_string();
        let seen_own = collect_until_sentinel(&rt, &mut own, &sentinel);
        // The sentinel was called once; the second collection waits for
        // the same event in the other tracer's ring.
        let seen_all = rt.block_on(async {
            let mut got = Vec::new();
            let guard = Instant::now() + Duration::from_secs(120);
            loop {
                let mut batch = Vec::new();
                tokio::select! {
                    r = all.next_events(&mut batch) => r.expect("read events"),
                    _ = tokio::time::sleep_until(guard.into()) => panic!("sentinel never seen by the all-namespaces tracer"),
                }
                let done = batch.iter().any(|(e, _)| e.target.as_deref() == Some(sentinel.as_str()));
                got.extend(batch);
                if done {
                    return got;
                }
            }
        });
        let ns = own_mount_namespace().unwrap();
        let on_other = |v: &[(SyscallEvent, ExtraArgs)]| {
            v.iter()
                .filter(|(e, _)| e.target.as_deref() == Some(other.as_str()))
                .map(|(e, _)| (e.syscall, e.ret, e.mnt_ns))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            on_other(&seen_own),
            vec![],
            "filtered tracer saw another namespace"
        );
        let o = on_other(&seen_all);
        assert!(
            o.iter()
                .any(|&(s, r, n)| s == MountSyscall::Mount && r == 0 && n != ns && n != 0),
            "{o:?}"
        );
        assert!(
            o.iter()
                .any(|&(s, r, n)| s == MountSyscall::Umount && r == 0 && n != ns),
            "{o:?}"
        );
        assert!(seen_own.iter().all(|(e, _)| e.mnt_ns == ns));
    });
}
