//! Where the holder scan ([`super::holders`]) runs: never on the scan
//! loop's thread, and for the confined observing agent in a helper process
//! outside its Landlock domain.
//!
//! Landlock denies a confined process every ptrace access to processes
//! outside its domain, the read-only one included: `readlink` of
//! `/proc/<pid>/cwd`, `/proc/<pid>/fd/*` and `/proc/<pid>/ns/mnt` answers
//! `EACCES` for every process but the agent's own children. So observe
//! mode forks a helper ([`start`]) before it confines itself. The helper
//! keeps only what reading other processes' links needs: it becomes user
//! nobody (65534) when root, keeps `CAP_SYS_PTRACE` (ptrace read access to
//! any process's `/proc` links) and `CAP_DAC_READ_SEARCH` (the `fd`
//! directory of another user's process) and no other capability (root or
//! not: a non-root agent's file or ambient capabilities are dropped too;
//! the bounding set as far as `CAP_SETPCAP` allows), runs under
//! `no_new_privs` and a seccomp filter refusing calls a reader never needs
//! ([`helper_refused`]: `ptrace`, `process_vm_readv`/`writev`,
//! `pidfd_getfd`, signals, mounts, changing names in the file system), and
//! dies with the agent (`PR_SET_PDEATHSIG`). The filter does not look at
//! paths: with `CAP_SYS_PTRACE` an `openat` of `/proc/<pid>/mem` or
//! `environ` of any process would still succeed. What bounds that is the
//! helper's code only: it reads links, lists `fd` directories and reads
//! `stat`, `comm`, `cmdline`, `maps`, `mountinfo` and sysfs names, and a
//! request carries only mount points to compare and limits, never a path
//! to open. It answers one scan request at a time over a socket pair (a
//! JSON line each way).
//!
//! Each scan runs in a worker the helper forks for it (the helper is one
//! thread and outside Landlock: it can fork when the agent no longer can),
//! which arms `alarm` for its limit and a second and dies of `SIGALRM` if
//! a `/proc` file blocks it (a process's `maps` or `cmdline` wait for its
//! memory lock, which a thread faulting on a dead NFS or FUSE mount holds;
//! the scan skips processes in `D` state, but one may enter it after the
//! check). The helper does not wait for a worker past that limit: it
//! answers with [`Scan::helper_stuck`] set and forks a new worker for the
//! next scan, at most [`MAX_STUCK`] stuck workers not yet gone (a worker
//! in an unkillable sleep stays until its wait ends). The agent does not
//! kill or replace the helper itself: once confined it has no `CAP_KILL`
//! (the helper runs as another user) and a helper forked then would be in
//! its Landlock domain, denied the links it reads. When the helper itself
//! does not answer within a scan's wait twice in a row the caller gets
//! [`HolderScanError::Stuck`]. Without a helper (tests, or [`start`] not
//! called) the scan runs in a thread of this process, and no second one
//! starts before the first returns.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::holders::{self, Limits, Scan, Target};
use crate::sys::capabilities;
use crate::util::sync::MutexExt;

/// Why no holder scan answered.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HolderScanError {
    /// The previous scan has not answered yet.
    #[error("the previous holder scan has not returned (a process's /proc files block)")]
    StillRunning,
    /// The helper has not answered within a scan's wait this many times in
    /// a row: the scan's evidence says so (it cannot be replaced).
    #[error("helper stuck: the holder scan helper has not answered {0} scans in a row")]
    Stuck(u32),
    /// This scan did not answer in time (it goes on; its answer is dropped).
    #[error("the holder scan did not answer within {0:?}")]
    TimedOut(Duration),
    /// The helper process exited or answered nonsense.
    #[error("the holder scan helper is gone: {0}")]
    HelperGone(String),
    /// The helper or the thread could not be started.
    #[error("starting the holder scan: {0}")]
    Start(String),
}

/// What the agent asks the helper.
#[derive(Serialize, Deserialize)]
struct Request {
    targets: Vec<Target>,
    limits: Limits,
}

/// The agent's end of the helper.
struct Helper {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// An answer read in part.
    partial: Vec<u8>,
    /// A request is not answered yet.
    pending: bool,
    /// Why the helper is not used any more.
    gone: Option<String>,
    /// Scans in a row the helper did not answer within their wait.
    missed: u32,
}

static HELPER: OnceLock<Mutex<Helper>> = OnceLock::new();
/// An in-process scan is running.
static RUNNING: AtomicBool = AtomicBool::new(false);

/// The longest answer read (the holders listed are bounded).
const MAX_ANSWER: usize = 16 << 20;
/// The longest request the helper reads.
const MAX_REQUEST: usize = 16 << 20;
/// How much longer than its own limit a scan is waited for.
const GRACE: Duration = Duration::from_secs(1);
/// The user the helper runs as.
const NOBODY: u32 = 65534;
/// `CAP_DAC_READ_SEARCH`, `CAP_SYS_PTRACE`.
const HELPER_CAPS: [u32; 2] = [2, 19];
/// Stuck workers (not gone yet) past which the helper forks no more and
/// answers at once that it is stuck.
pub const MAX_STUCK: usize = 4;
/// How long the helper waits for a worker beyond the scan's own limit:
/// less than the agent waits for the helper ([`GRACE`]).
const WORKER_GRACE: Duration = Duration::from_millis(500);
/// Missed scans in a row after which the helper is said to be stuck.
const MISSED_STUCK: u32 = 2;

/// Starts the helper process. Call before any thread is started (it
/// forks), and before the caller confines itself.
pub fn start() -> Result<(), HolderScanError> {
    let start = |e: std::io::Error| HolderScanError::Start(e.to_string());
    let (ours, theirs) = UnixStream::pair().map_err(start)?;
    let parent = std::process::id();
    // SAFETY: the caller has no other thread (documented), so the child
    // may allocate and run ordinary code.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            drop(ours);
            child_main(theirs, parent)
        }
        Ok(nix::unistd::ForkResult::Parent { .. }) => {
            drop(theirs);
            let reader = BufReader::new(ours.try_clone().map_err(start)?);
            let helper = Helper {
                reader,
                writer: ours,
                partial: Vec::new(),
                pending: false,
                gone: None,
                missed: 0,
            };
            let _ = HELPER.set(Mutex::new(helper));
            Ok(())
        }
        Err(e) => Err(start(e.into())),
    }
}

/// Scans for the holders of `targets` (the helper's, else in a thread),
/// within [`holders::LIMITS`].
pub fn scan(targets: &[Target]) -> Result<Scan, HolderScanError> {
    match HELPER.get() {
        Some(h) => h.locked().ask(targets, holders::LIMITS),
        None => in_process(targets.to_vec(), holders::LIMITS),
    }
}

/// How long a scan with `limits` is waited for.
fn wait_for(limits: &Limits) -> Duration {
    Duration::from_millis(limits.time_ms) + GRACE
}

/// The scan in a thread of this process, waited for at most its limit.
fn in_process(targets: Vec<Target>, limits: Limits) -> Result<Scan, HolderScanError> {
    if RUNNING.swap(true, Ordering::SeqCst) {
        return Err(HolderScanError::StillRunning);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("holder-scan".into())
        .spawn(move || {
            let s = holders::scan(Path::new("/proc"), Path::new("/sys"), &targets, &limits);
            RUNNING.store(false, Ordering::SeqCst);
            let _ = tx.send(s);
        });
    if let Err(e) = spawned {
        RUNNING.store(false, Ordering::SeqCst);
        return Err(HolderScanError::Start(e.to_string()));
    }
    let wait = wait_for(&limits);
    rx.recv_timeout(wait)
        .map_err(|_| HolderScanError::TimedOut(wait))
}

impl Helper {
    /// One request, its answer waited for at most its limit.
    fn ask(&mut self, targets: &[Target], limits: Limits) -> Result<Scan, HolderScanError> {
        if let Some(why) = &self.gone {
            return Err(HolderScanError::HelperGone(why.clone()));
        }
        if self.pending {
            match self.answer(Duration::from_millis(1)) {
                Ok(_late) => self.pending = false,
                Err(HolderScanError::TimedOut(_)) => {
                    self.missed += 1;
                    return Err(self.still_running());
                }
                Err(e) => return Err(e),
            }
        }
        let req = Request {
            targets: targets.to_vec(),
            limits,
        };
        let mut line = serde_json::to_vec(&req).map_err(|e| self.fail(e.to_string()))?;
        line.push(b'\n');
        let _ = self.writer.set_write_timeout(Some(GRACE));
        if let Err(e) = self.writer.write_all(&line) {
            return Err(self.fail(e.to_string()));
        }
        let wait = wait_for(&limits);
        let r = self.answer(wait);
        if matches!(r, Err(HolderScanError::TimedOut(_))) {
            self.pending = true;
            self.missed += 1;
            if self.missed >= MISSED_STUCK {
                return Err(HolderScanError::Stuck(self.missed));
            }
            return r;
        }
        self.missed = 0;
        r
    }

    /// [`HolderScanError::Stuck`] once [`MISSED_STUCK`] scans in a row were
    /// missed, else [`HolderScanError::StillRunning`].
    fn still_running(&self) -> HolderScanError {
        if self.missed >= MISSED_STUCK {
            HolderScanError::Stuck(self.missed)
        } else {
            HolderScanError::StillRunning
        }
    }

    /// Reads one answer, waiting at most `wait`.
    fn answer(&mut self, wait: Duration) -> Result<Scan, HolderScanError> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let _ = self
                .reader
                .get_ref()
                .set_read_timeout(Some(left.max(Duration::from_millis(1))));
            let room = MAX_ANSWER.saturating_sub(self.partial.len()) as u64;
            match (&mut self.reader)
                .take(room)
                .read_until(b'\n', &mut self.partial)
            {
                Ok(0) => return Err(self.fail("closed, or its answer too long".into())),
                Ok(_) if self.partial.ends_with(b"\n") => {
                    let line = std::mem::take(&mut self.partial);
                    return serde_json::from_slice(&line).map_err(|e| self.fail(e.to_string()));
                }
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if Instant::now() >= deadline {
                        return Err(HolderScanError::TimedOut(wait));
                    }
                }
                Err(e) => return Err(self.fail(e.to_string())),
            }
        }
    }

    /// Gives the helper up.
    fn fail(&mut self, why: String) -> HolderScanError {
        self.gone = Some(why.clone());
        HolderScanError::HelperGone(why)
    }
}

/// The helper: drops what it does not need, then answers requests until
/// the agent closes its end.
fn child_main(sock: UnixStream, parent: u32) -> ! {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    if std::os::unix::process::parent_id() != parent {
        // SAFETY: ending this process without running the parent's
        // destructors.
        unsafe { libc::_exit(0) };
    }
    if let Err(e) = drop_privileges() {
        eprintln!("volmgr holder scan helper: not started: {e}");
        // SAFETY: as above.
        unsafe { libc::_exit(1) };
    }
    serve(sock);
    // SAFETY: as above.
    unsafe { libc::_exit(0) }
}

/// Answers each request line with the scan's JSON line.
fn serve(sock: UnixStream) {
    let Ok(mut out) = sock.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(sock);
    let mut workers = Workers::default();
    loop {
        let mut line = Vec::new();
        match (&mut reader)
            .take(MAX_REQUEST as u64)
            .read_until(b'\n', &mut line)
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let Ok(req) = serde_json::from_slice::<Request>(&line) else {
            return;
        };
        let scan = workers.scan(&req);
        let Ok(mut answer) = serde_json::to_vec(&scan) else {
            return;
        };
        answer.push(b'\n');
        if out.write_all(&answer).is_err() {
            return;
        }
    }
}

/// The workers of the helper stuck in a scan, not gone yet.
struct Workers {
    stuck: Vec<nix::unistd::Pid>,
    /// What a worker runs: [`run_scan`] (tests: one that blocks).
    run: fn(&Request) -> Scan,
}

impl Default for Workers {
    fn default() -> Self {
        Workers {
            stuck: Vec::new(),
            run: run_scan,
        }
    }
}

/// The holder scan of `req` on this host's `/proc` and `/sys`.
fn run_scan(req: &Request) -> Scan {
    holders::scan(
        Path::new("/proc"),
        Path::new("/sys"),
        &req.targets,
        &req.limits,
    )
}

impl Workers {
    /// `req`'s scan in a worker forked for it, waited for at most its limit
    /// and [`WORKER_GRACE`]; a scan with [`Scan::helper_stuck`] set when
    /// the worker does not answer by then (or cannot be started).
    fn scan(&mut self, req: &Request) -> Scan {
        self.reap();
        if self.stuck.len() >= MAX_STUCK {
            return stuck_scan(format!(
                "{} earlier scans have not returned (a process's /proc files block); none started",
                self.stuck.len()
            ));
        }
        let Ok((mut ours, theirs)) = UnixStream::pair() else {
            return stuck_scan("no socket for a worker".into());
        };
        // SAFETY: the helper has one thread: the child may allocate.
        let pid = match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => {
                drop(ours);
                worker_main(theirs, req, self.run)
            }
            Ok(nix::unistd::ForkResult::Parent { child }) => child,
            Err(e) => return stuck_scan(format!("no worker: {e}")),
        };
        drop(theirs);
        let wait = Duration::from_millis(req.limits.time_ms) + WORKER_GRACE;
        let _ = ours.set_read_timeout(Some(wait));
        let mut answer = Vec::new();
        let read = (&mut ours).take(MAX_ANSWER as u64).read_to_end(&mut answer);
        let scan = match read {
            Ok(_) => serde_json::from_slice::<Scan>(&answer).ok(),
            Err(_) => None,
        };
        self.stuck.push(pid);
        self.reap();
        scan.unwrap_or_else(|| {
            stuck_scan(format!(
                "the scan did not return within {wait:?} (a process's /proc files block); its worker ends at SIGALRM unless its wait is unkillable"
            ))
        })
    }

    /// Forgets the workers that are gone.
    fn reap(&mut self) {
        use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
        self.stuck.retain(|pid| {
            matches!(
                waitpid(*pid, Some(WaitPidFlag::WNOHANG)),
                Ok(WaitStatus::StillAlive)
            )
        });
    }
}

/// A scan that examined nothing, the helper stuck for `why`.
fn stuck_scan(why: String) -> Scan {
    Scan {
        helper_stuck: Some(why),
        ..Scan::default()
    }
}

/// A worker: one scan, its answer written to `sock`, ended by `SIGALRM`
/// one second past the scan's limit if a `/proc` file blocks it.
fn worker_main(mut sock: UnixStream, req: &Request, run: fn(&Request) -> Scan) -> ! {
    // SAFETY: prctl and alarm with integer arguments only.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        let secs = req.limits.time_ms.div_ceil(1000).saturating_add(1);
        libc::alarm(u32::try_from(secs).unwrap_or(u32::MAX));
    }
    let scan = run(req);
    if let Ok(answer) = serde_json::to_vec(&scan) {
        let _ = sock.write_all(&answer);
    }
    // SAFETY: ending this process without running the helper's
    // destructors.
    unsafe { libc::_exit(0) }
}

/// The helper's own confinement: user nobody (when root), [`HELPER_CAPS`]
/// only (root or not), `no_new_privs`, [`helper_refused`] refused.
fn drop_privileges() -> std::io::Result<()> {
    let last = capabilities::last_cap(40);
    capabilities::drop_bounding_except(last, &HELPER_CAPS);
    if nix::unistd::geteuid().is_root() {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let (uid, gid) = (
            nix::unistd::Uid::from_raw(NOBODY),
            nix::unistd::Gid::from_raw(NOBODY),
        );
        nix::unistd::setgroups(&[])?;
        nix::unistd::setresgid(gid, gid, gid)?;
        nix::unistd::setresuid(uid, uid, uid)?;
    }
    // Root or not: a non-root agent may hold file or ambient capabilities.
    capabilities::keep_only(&HELPER_CAPS)?;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // What `CAP_SYS_PTRACE` would allow beyond reading links, and what a
    // reader never needs: refused by seccomp (`ENOSYS`) for good.
    crate::sys::seccomp::fail_with_enosys(&helper_refused()).map_err(std::io::Error::from)
}

/// System calls the helper (and its workers) can never make: tracing,
/// reading or writing another process's memory through `process_vm_*`,
/// taking its descriptors, signalling, changing mounts, and changing names
/// or modes in the file system (the older x86_64 calls included). Not
/// refused: `openat` (paths are not looked at), `alarm`, `fork`.
fn helper_refused() -> Vec<u32> {
    let mut nrs = vec![
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_pidfd_getfd,
        libc::SYS_pidfd_send_signal,
        libc::SYS_kill,
        libc::SYS_tkill,
        libc::SYS_tgkill,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_unlinkat,
        libc::SYS_renameat2,
        libc::SYS_mkdirat,
        libc::SYS_symlinkat,
        libc::SYS_linkat,
        libc::SYS_fchmodat,
        libc::SYS_fchmod,
        libc::SYS_fchown,
        libc::SYS_fchownat,
    ];
    #[cfg(target_arch = "x86_64")]
    nrs.extend([
        libc::SYS_unlink,
        libc::SYS_rename,
        libc::SYS_renameat,
        libc::SYS_mkdir,
        libc::SYS_rmdir,
        libc::SYS_symlink,
        libc::SYS_link,
        libc::SYS_chmod,
        libc::SYS_chown,
        libc::SYS_lchown,
    ]);
    nrs.into_iter().map(|n| n as u32).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::sys::test_child::{run_in_child, Child};

    /// A capability set of this thread (`CapPrm`, `CapEff`) from
    /// `/proc/thread-self/status`.
    fn caps(which: &str) -> u64 {
        std::fs::read_to_string("/proc/thread-self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix(which))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap()
    }

    /// A non-root process with capabilities (here root's, kept across
    /// `setresuid`) keeps only the helper's two: before, `keep_only` ran
    /// for root only and a non-root agent's capabilities all went to the
    /// helper. The older x86_64 calls are refused too (`unlink` was let
    /// through before: `ENOENT` for a missing file).
    #[test]
    fn the_helper_keeps_two_capabilities_even_when_not_root() {
        run_in_child(
            crate::test_name!("the_helper_keeps_two_capabilities_even_when_not_root"),
            Child::PrivateMounts,
            || {
                // SAFETY: prctl with integer arguments only.
                assert_eq!(unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) }, 0);
                let u = nix::unistd::Uid::from_raw(1000);
                nix::unistd::setresuid(u, u, u).unwrap();
                assert!(caps("CapPrm:").count_ones() > 2, "{:#x}", caps("CapPrm:"));
                drop_privileges().unwrap();
                let kept = (1u64 << 2) | (1 << 19);
                assert_eq!(caps("CapPrm:"), kept, "{:#x}", caps("CapPrm:"));
                assert_eq!(caps("CapEff:"), kept);
                #[cfg(target_arch = "x86_64")]
                {
                    // Refused before the path is looked at: not ENOENT.
                    let c = c"/nonexistent/volmgr-helper-test";
                    // SAFETY: a valid NUL-terminated path.
                    let rc = unsafe { libc::syscall(libc::SYS_unlink, c.as_ptr()) };
                    let e = nix::errno::Errno::last();
                    assert_eq!((rc, e), (-1, nix::errno::Errno::ENOSYS));
                }
            },
        );
    }

    /// Blocks like a read of a process's `maps` behind a hung mount.
    fn blocks(_: &Request) -> Scan {
        std::thread::sleep(Duration::from_secs(3600));
        Scan::default()
    }

    /// A scan that does not return: the helper answers that it is stuck
    /// (before, it waited with the scan for good and every later scan of
    /// the agent was refused as still running), its worker dies of
    /// `SIGALRM`, and the next scan runs in a new worker.
    #[test]
    fn a_blocked_scan_is_answered_as_stuck_and_the_next_one_runs() {
        run_in_child(
            crate::test_name!("a_blocked_scan_is_answered_as_stuck_and_the_next_one_runs"),
            Child::PrivateMounts,
            || {
                let req = Request {
                    targets: Vec::new(),
                    limits: Limits {
                        time_ms: 0,
                        ..holders::LIMITS
                    },
                };
                let mut w = Workers {
                    stuck: Vec::new(),
                    run: blocks,
                };
                let s = w.scan(&req);
                let why = s.helper_stuck.clone().unwrap();
                assert!(why.contains("did not return"), "{why}");
                assert!(!s.complete() && s.summary().contains("helper stuck"));
                assert_eq!(w.stuck.len(), 1);
                let deadline = Instant::now() + Duration::from_secs(60);
                while !w.stuck.is_empty() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                    w.reap();
                }
                assert!(w.stuck.is_empty(), "the worker outlived its alarm");
                w.run = |_| Scan {
                    processes: 7,
                    ..Scan::default()
                };
                let s = w.scan(&req);
                assert_eq!((s.processes, s.helper_stuck), (7, None));
            },
        );
    }
}
