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
//! nobody (65534) with `CAP_SYS_PTRACE` (ptrace read access to any
//! process's `/proc` links) and `CAP_DAC_READ_SEARCH` (the `fd` directory
//! of another user's process) and nothing else, bounding set included,
//! under `no_new_privs` and a seccomp filter that refuses what that
//! capability would allow beyond reading (`ptrace`, other processes' memory
//! and descriptors, signals, mounts, names in the file system:
//! [`HELPER_REFUSED`]), and dies with the agent (`PR_SET_PDEATHSIG`). It
//! answers one scan request at a time over a socket pair (a JSON line each
//! way).
//!
//! A scan that does not answer within its limit and a grace second (a
//! process's `maps` blocks while it holds its memory lock, stuck on a dead
//! NFS server) is left running: the caller gets [`HolderScanError`] and
//! no second scan starts before the first answers. Without a helper (tests,
//! or [`start`] not called) the scan runs in a thread of this process.

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
                Err(HolderScanError::TimedOut(_)) => return Err(HolderScanError::StillRunning),
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
        }
        r
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
        let scan = holders::scan(
            Path::new("/proc"),
            Path::new("/sys"),
            &req.targets,
            &req.limits,
        );
        let Ok(mut answer) = serde_json::to_vec(&scan) else {
            return;
        };
        answer.push(b'\n');
        if out.write_all(&answer).is_err() {
            return;
        }
    }
}

/// The helper's own confinement: user nobody (when root) with
/// [`HELPER_CAPS`] only, `no_new_privs`.
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
        capabilities::keep_only(&HELPER_CAPS)?;
    }
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // What `CAP_SYS_PTRACE` would allow beyond reading links, and what a
    // reader never needs: refused by seccomp (`ENOSYS`) for good.
    crate::sys::seccomp::fail_with_enosys(&HELPER_REFUSED).map_err(std::io::Error::from)
}

/// System calls the helper can never make: tracing, reading or writing
/// another process's memory, taking its descriptors, signalling, and
/// changing mounts or names in the file system.
const HELPER_REFUSED: [u32; 16] = [
    libc::SYS_ptrace as u32,
    libc::SYS_process_vm_readv as u32,
    libc::SYS_process_vm_writev as u32,
    libc::SYS_pidfd_getfd as u32,
    libc::SYS_pidfd_send_signal as u32,
    libc::SYS_kill as u32,
    libc::SYS_tkill as u32,
    libc::SYS_tgkill as u32,
    libc::SYS_mount as u32,
    libc::SYS_umount2 as u32,
    libc::SYS_unlinkat as u32,
    libc::SYS_renameat2 as u32,
    libc::SYS_mkdirat as u32,
    libc::SYS_symlinkat as u32,
    libc::SYS_linkat as u32,
    libc::SYS_fchmodat as u32,
];
