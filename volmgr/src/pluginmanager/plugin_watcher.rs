//! The kubelet's plugin watcher (`pkg/kubelet/pluginmanager`) for CSI
//! drivers: it follows `ROOT/plugins_registry/` (inotify plus a scan at
//! start and now and then), and for every Unix socket that appears there it
//! speaks the plugin registration API as the client — `GetInfo`, validate,
//! the driver's own `NodeGetInfo` (node ID, volume limit, topology; a
//! failure fails the registration, as in the kubelet's CSI `RegisterPlugin`),
//! register the driver in the [`DriverRegistry`], then
//! `NotifyRegistrationStatus` — which is what the unmodified
//! `node-driver-registrar` sidecar expects.
//!
//! - A socket that is removed unregisters its driver. A socket that is
//!   created (`IN_CREATE`/`IN_MOVED_TO`) is registered again even if it is
//!   the same path and the same inode as before (a registrar restarted over
//!   its stale socket unlinks and binds it again, which usually reuses the
//!   inode), as the kubelet's watcher re-registers on every create event; a
//!   scan (at start, after lost events, now and then) registers again a
//!   socket whose inode or ctime changed.
//! - A registration that fails (nobody listening, a bad answer, a version
//!   that is not 1.x) is retried with exponential backoff, like the kubelet's
//!   reconciler, and reported through the problem callback (status).
//! - Files whose name starts with `.` and anything that is not a socket are
//!   ignored; subdirectories are followed, as the kubelet does.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, WatchDescriptor};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::registry::{DriverInfo, DriverRegistry};
use crate::sys::inotify::{self, InotifyFd, WatchError};
use crate::util::backoff::Backoff;

pub use super::registration::{
    get_and_validate, get_info, highest_supported_version, validate, RegistrationError, Validated,
    CSI_PLUGIN_TYPE,
};
use super::registration::{notify, Result};

/// Why the watcher could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum WatcherError {
    /// inotify could not be set up on the directory.
    #[error("plugin watcher on {path}: {source}")]
    Inotify {
        /// The directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: nix::errno::Errno,
    },
    /// The inotify descriptor could not be registered with the runtime.
    #[error("plugin watcher on {path}: {source}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Called with a socket and its registration problem (`None`: resolved).
pub type ProblemSink = Arc<dyn Fn(&Path, Option<String>) + Send + Sync>;

/// Timing of the watcher.
#[derive(Debug, Clone, Copy)]
pub struct WatcherConfig {
    /// Deadline of connecting and of each registration call.
    pub call_timeout: Duration,
    /// First retry delay of a failed registration (doubles each time).
    pub retry_initial: Duration,
    /// Longest retry delay.
    pub retry_max: Duration,
    /// Safety-net rescan of the directory.
    pub rescan_period: Duration,
}

impl Default for WatcherConfig {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_secs(10),
            retry_initial: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
            rescan_period: Duration::from_secs(60),
        }
    }
}

/// What identifies one socket file: a new inode is a new plugin instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SocketKey {
    ino: u64,
    ctime_ns: i128,
}

#[derive(Debug)]
enum Phase {
    /// To (re)try at `at`.
    Pending { at: Instant, failures: u32 },
    /// A registration attempt is running.
    InFlight { failures: u32 },
    /// Registered as driver `name` at `endpoint`.
    Registered { name: String, endpoint: PathBuf },
}

#[derive(Debug)]
struct SocketState {
    key: SocketKey,
    /// Which registration of the path this is (an attempt of an earlier one
    /// is ignored when it ends).
    generation: u64,
    phase: Phase,
}

/// The outcome of one registration attempt.
struct Attempt {
    socket: PathBuf,
    generation: u64,
    result: Result<Validated>,
}

/// Why a path is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// A socket was created there (`IN_CREATE`, `IN_MOVED_TO`): a new plugin
    /// instance, whatever its inode.
    Created,
    /// Another event (deleted, moved away, attributes): a socket that is
    /// still the same inode is the same instance.
    Changed,
    /// A scan, which cannot see events: a different inode or ctime is a new
    /// instance.
    Scanned,
}

/// The plugin watcher.
pub struct PluginWatcher {
    dir: PathBuf,
    registry: Arc<DriverRegistry>,
    config: WatcherConfig,
    problems: Option<ProblemSink>,
    sockets: HashMap<PathBuf, SocketState>,
    watches: HashMap<WatchDescriptor, PathBuf>,
    generations: u64,
}

impl PluginWatcher {
    /// A watcher of `dir` (which must exist) registering into `registry`.
    pub fn new(dir: PathBuf, registry: Arc<DriverRegistry>, config: WatcherConfig) -> Self {
        Self {
            dir,
            registry,
            config,
            problems: None,
            sockets: HashMap::new(),
            watches: HashMap::new(),
            generations: 0,
        }
    }

    /// Reports registration problems (and their end) to `sink`.
    pub fn with_problem_sink(mut self, sink: ProblemSink) -> Self {
        self.problems = Some(sink);
        self
    }

    fn mask() -> AddWatchFlags {
        AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_ATTRIB
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF
            | AddWatchFlags::IN_ONLYDIR
    }

    /// Scans the directory, then follows changes until `shutdown`. Drivers it
    /// registered stay registered when it stops (the agent is stopping).
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<(), WatcherError> {
        let (fd, wd) = inotify::watch(&self.dir, Self::mask()).map_err(|e| match e {
            WatchError::Inotify(source) => WatcherError::Inotify {
                path: self.dir.clone(),
                source,
            },
            WatchError::Register(source) => WatcherError::Io {
                path: self.dir.clone(),
                source,
            },
        })?;
        self.watches.insert(wd, self.dir.clone());
        let (tx, mut rx) = mpsc::unbounded_channel::<Attempt>();
        self.rescan(fd.get_ref());
        tracing::info!(dir = %self.dir.display(), sockets = self.sockets.len(), "plugin watcher started");
        let mut tick = tokio::time::interval(self.config.rescan_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            self.start_due(&tx);
            let next = self.next_retry();
            tokio::select! {
                () = crate::util::shutdown::requested(&mut shutdown) => return Ok(()),
                batch = inotify::next_batch(&fd) => {
                    let Ok(batch) = batch else { continue };
                    self.apply_batch(batch, fd.get_ref());
                }
                Some(a) = rx.recv() => self.finish(a),
                _ = sleep_until(next) => {}
                _ = tick.tick() => {
                    if !self.watches.values().any(|d| d == &self.dir) && self.dir.is_dir() {
                        if let Ok(wd) = fd.get_ref().0.add_watch(&self.dir, Self::mask()) {
                            self.watches.insert(wd, self.dir.clone());
                        }
                    }
                    self.rescan(fd.get_ref());
                }
            }
        }
    }

    /// Follows one batch of inotify events: the changed paths are looked at
    /// (a path created in the batch as a new plugin instance, even when it
    /// was deleted in the same batch and has the same inode), or the whole
    /// tree is walked again when events may have been lost or a watched
    /// directory went away.
    fn apply_batch(&mut self, batch: inotify::Batch, inotify: &InotifyFd) {
        let mut full = batch.lost_events();
        if let Some(e) = batch.error {
            tracing::warn!(error = %e, "plugin watcher: inotify read");
        }
        let created = AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO;
        let mut changed: Vec<(PathBuf, Seen)> = Vec::new();
        for e in batch.events {
            let gone = AddWatchFlags::IN_IGNORED
                | AddWatchFlags::IN_DELETE_SELF
                | AddWatchFlags::IN_MOVE_SELF;
            if e.mask.intersects(gone) {
                self.watches.remove(&e.wd);
                full = true;
            }
            let (Some(dir), Some(name)) = (self.watches.get(&e.wd), e.name) else {
                continue;
            };
            let path = dir.join(name);
            let seen = if e.mask.intersects(created) {
                Seen::Created
            } else {
                Seen::Changed
            };
            match changed.iter_mut().find(|(p, _)| *p == path) {
                Some((_, s)) if seen == Seen::Created => *s = Seen::Created,
                Some(_) => {}
                None => changed.push((path, seen)),
            }
        }
        if full {
            self.rescan(inotify);
        }
        for (p, seen) in changed {
            // After a rescan, only creations are news.
            if !full || seen == Seen::Created {
                self.look_at(&p, seen, inotify);
            }
        }
    }

    /// Walks the whole tree: new sockets become pending, vanished ones are
    /// unregistered, subdirectories are watched.
    fn rescan(&mut self, inotify: &InotifyFd) {
        let mut found = Vec::new();
        let mut dirs = vec![self.dir.clone()];
        while let Some(d) = dirs.pop() {
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in rd.flatten() {
                let p = e.path();
                if is_hidden(&e.file_name()) {
                    continue;
                }
                match e.file_type() {
                    Ok(t) if t.is_dir() => {
                        self.watch_dir(&p, inotify);
                        dirs.push(p);
                    }
                    Ok(t) if t.is_socket() => found.push(p),
                    _ => {}
                }
            }
        }
        let gone: Vec<PathBuf> = self
            .sockets
            .keys()
            .filter(|p| !found.contains(p))
            .cloned()
            .collect();
        for p in gone {
            self.remove(&p);
        }
        for p in found {
            self.look_at(&p, Seen::Scanned, inotify);
        }
    }

    fn watch_dir(&mut self, dir: &Path, inotify: &InotifyFd) {
        if self.watches.values().any(|d| d == dir) {
            return;
        }
        match inotify.0.add_watch(dir, Self::mask()) {
            Ok(wd) => {
                self.watches.insert(wd, dir.to_path_buf());
            }
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "plugin watcher: cannot watch")
            }
        }
    }

    /// Brings one path's state up to date with the file system; `seen` tells
    /// whether a socket there is a new plugin instance.
    fn look_at(&mut self, path: &Path, seen: Seen, inotify: &InotifyFd) {
        let hidden = path.file_name().is_none_or(is_hidden);
        let meta = if hidden {
            None
        } else {
            std::fs::symlink_metadata(path).ok()
        };
        match meta {
            Some(m) if m.file_type().is_dir() => {
                self.watch_dir(path, inotify);
                self.rescan(inotify);
            }
            Some(m) if m.file_type().is_socket() => {
                let key = SocketKey {
                    ino: m.ino(),
                    ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
                };
                self.socket_seen(path, key, seen);
            }
            _ => {
                if self.sockets.contains_key(path) {
                    self.remove(path);
                }
                // A directory that went away takes its sockets with it.
                let under: Vec<PathBuf> = self
                    .sockets
                    .keys()
                    .filter(|p| p.starts_with(path) && p.as_path() != path)
                    .cloned()
                    .collect();
                for p in under {
                    self.remove(&p);
                }
            }
        }
    }

    /// A socket at `path` with `key`: registered afresh if it is a new
    /// plugin instance (see [`Seen`]), or not known yet.
    fn socket_seen(&mut self, path: &Path, key: SocketKey, seen: Seen) {
        let Some(state) = self.sockets.get_mut(path) else {
            self.add(path, key);
            return;
        };
        let renew = match seen {
            Seen::Created => true,
            Seen::Changed => state.key.ino != key.ino,
            Seen::Scanned => state.key != key,
        };
        if !renew {
            // The same instance (a chmod, say): remember its ctime, so the
            // next scan does not mistake it for a new one.
            state.key = key;
            return;
        }
        if let Phase::Pending { .. } = state.phase {
            // Nothing in flight nor registered: try the new instance now.
            state.key = key;
            state.phase = Phase::Pending {
                at: Instant::now(),
                failures: 0,
            };
            return;
        }
        // Replaced: the new plugin instance registers afresh (the kubelet
        // unregisters the old registration first, too).
        tracing::info!(socket = %path.display(), "plugin socket created again: registering the new instance");
        self.remove(path);
        self.add(path, key);
    }

    fn add(&mut self, path: &Path, key: SocketKey) {
        tracing::info!(socket = %path.display(), "plugin socket found");
        self.generations += 1;
        self.sockets.insert(
            path.to_path_buf(),
            SocketState {
                key,
                generation: self.generations,
                phase: Phase::Pending {
                    at: Instant::now(),
                    failures: 0,
                },
            },
        );
    }

    fn remove(&mut self, path: &Path) {
        let Some(s) = self.sockets.remove(path) else {
            return;
        };
        tracing::info!(socket = %path.display(), "plugin socket removed");
        if let Phase::Registered { name, endpoint } = s.phase {
            self.registry.unregister_endpoint(&name, &endpoint);
        }
        if let Some(sink) = &self.problems {
            sink(path, None);
        }
    }

    fn next_retry(&self) -> Option<Instant> {
        self.sockets
            .values()
            .filter_map(|s| match s.phase {
                Phase::Pending { at, .. } => Some(at),
                _ => None,
            })
            .min()
    }

    /// Starts a registration attempt for every socket that is due.
    fn start_due(&mut self, tx: &mpsc::UnboundedSender<Attempt>) {
        let now = Instant::now();
        for (path, s) in &mut self.sockets {
            let Phase::Pending { at, failures } = s.phase else {
                continue;
            };
            if at > now {
                continue;
            }
            s.phase = Phase::InFlight { failures };
            let (socket, generation, tx) = (path.clone(), s.generation, tx.clone());
            let (registry, timeout) = (Arc::clone(&self.registry), self.config.call_timeout);
            tokio::spawn(async move {
                let result = get_and_validate(&socket, &registry, timeout).await;
                let _ = tx.send(Attempt {
                    socket,
                    generation,
                    result,
                });
            });
        }
    }

    /// Records the outcome of an attempt.
    fn finish(&mut self, a: Attempt) {
        let current = self
            .sockets
            .get_mut(&a.socket)
            .filter(|s| s.generation == a.generation && matches!(s.phase, Phase::InFlight { .. }));
        let Some(state) = current else {
            // The socket went away (or was replaced) meanwhile: nothing was
            // registered for it.
            return;
        };
        let failures = match state.phase {
            Phase::InFlight { failures } => failures,
            _ => 0,
        };
        match a.result {
            Ok(v) => {
                self.registry.register_driver(DriverInfo {
                    name: v.name.clone(),
                    endpoint: v.endpoint.clone(),
                    versions: v.versions.clone(),
                    node: Some(v.node.clone()),
                });
                state.phase = Phase::Registered {
                    name: v.name.clone(),
                    endpoint: v.endpoint.clone(),
                };
                if let Some(sink) = &self.problems {
                    sink(&a.socket, None);
                }
                // Registration first, then the news (as the kubelet does).
                let (socket, timeout) = (a.socket, self.config.call_timeout);
                tokio::spawn(async move {
                    let mut client = v.client;
                    // Like the kubelet: the driver stays registered even if
                    // the plugin does not take the news.
                    if let Err(e) = notify(&mut client, true, "", timeout).await {
                        tracing::warn!(driver = %v.name, socket = %socket.display(), error = %e, "NotifyRegistrationStatus failed; the driver stays registered");
                    }
                });
            }
            Err(e) => {
                let delay = Backoff::new(self.config.retry_initial, 2, self.config.retry_max)
                    .delay(failures.saturating_add(1));
                tracing::warn!(socket = %a.socket.display(), error = %e, retry_in_ms = delay.as_millis() as u64, "plugin registration failed");
                state.phase = Phase::Pending {
                    at: Instant::now() + delay,
                    failures: failures.saturating_add(1),
                };
                if let Some(sink) = &self.problems {
                    sink(&a.socket, Some(e.to_string()));
                }
            }
        }
    }
}

fn is_hidden(name: &OsStr) -> bool {
    name.as_encoded_bytes().first() == Some(&b'.')
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::inotify::InotifyEvent;

    /// A watcher of `dir` with `socket` registered as driver `d` (as if its
    /// registration had succeeded), and the inotify instance it follows.
    fn registered_watcher(
        dir: &Path,
        socket: &Path,
    ) -> (
        PluginWatcher,
        Arc<DriverRegistry>,
        InotifyFd,
        WatchDescriptor,
    ) {
        let registry = DriverRegistry::new();
        let mut w = PluginWatcher::new(
            dir.to_path_buf(),
            Arc::clone(&registry),
            WatcherConfig::default(),
        );
        let inotify = InotifyFd(
            nix::sys::inotify::Inotify::init(nix::sys::inotify::InitFlags::IN_NONBLOCK).unwrap(),
        );
        let wd = inotify.0.add_watch(dir, PluginWatcher::mask()).unwrap();
        w.watches.insert(wd, dir.to_path_buf());
        w.rescan(&inotify);
        let s = w.sockets.get_mut(socket).unwrap();
        s.phase = Phase::Registered {
            name: "d".into(),
            endpoint: "/csi.sock".into(),
        };
        registry.register("d", "/csi.sock".into(), vec!["1.0.0".into()]);
        (w, registry, inotify, wd)
    }

    fn event(wd: WatchDescriptor, mask: AddWatchFlags, name: &str) -> InotifyEvent {
        InotifyEvent {
            wd,
            mask,
            cookie: 0,
            name: Some(name.into()),
        }
    }

    fn batch(events: Vec<InotifyEvent>) -> inotify::Batch {
        inotify::Batch {
            events,
            error: None,
        }
    }

    /// A registrar restarted over its stale socket unlinks it and binds a
    /// new one at the same path, usually with the same inode: the delete
    /// and the create, even in one batch, register the new instance again
    /// (the kubelet re-registers on every create event). Other events of
    /// the same inode do not; a scan registers again only a socket whose
    /// inode or ctime changed.
    #[test]
    fn a_socket_created_again_at_the_same_inode_registers_again() {
        use AddWatchFlags as F;
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("d-reg.sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let (mut w, registry, fd, wd) = registered_watcher(dir.path(), &sock);
        let generation = w.sockets[&sock].generation;
        let registered =
            |w: &PluginWatcher| matches!(w.sockets[&sock].phase, Phase::Registered { .. });

        // Attributes changed, or a scan of an unchanged socket: nothing to do.
        w.apply_batch(batch(vec![event(wd, F::IN_ATTRIB, "d-reg.sock")]), &fd);
        w.rescan(&fd);
        assert!(registered(&w));
        assert_eq!(registry.endpoint("d"), Some(PathBuf::from("/csi.sock")));

        // Deleted and created again in one batch; the file (what the watcher
        // sees afterwards) is the very same inode.
        w.apply_batch(
            batch(vec![
                event(wd, F::IN_DELETE, "d-reg.sock"),
                event(wd, F::IN_CREATE, "d-reg.sock"),
            ]),
            &fd,
        );
        let s = &w.sockets[&sock];
        assert!(
            matches!(s.phase, Phase::Pending { failures: 0, .. }),
            "{:?}",
            s.phase
        );
        assert!(s.generation > generation, "a new registration");
        assert_eq!(registry.endpoint("d"), None, "the old registration is gone");

        // Moved into place (a registrar that renames its socket): the same.
        let (mut w, registry, fd, wd) = registered_watcher(dir.path(), &sock);
        w.apply_batch(batch(vec![event(wd, F::IN_MOVED_TO, "d-reg.sock")]), &fd);
        assert!(matches!(w.sockets[&sock].phase, Phase::Pending { .. }));
        assert_eq!(registry.endpoint("d"), None);

        // Events lost (a rescan) with the create among them: registered again.
        let (mut w, _registry, fd, wd) = registered_watcher(dir.path(), &sock);
        w.apply_batch(
            batch(vec![
                event(wd, F::IN_Q_OVERFLOW, "x"),
                event(wd, F::IN_CREATE, "d-reg.sock"),
            ]),
            &fd,
        );
        assert!(matches!(w.sockets[&sock].phase, Phase::Pending { .. }));

        // A scan that finds the ctime changed (events it never saw).
        let (mut w, _registry, fd, _wd) = registered_watcher(dir.path(), &sock);
        std::thread::sleep(Duration::from_millis(20));
        nix::sys::stat::fchmodat(
            nix::fcntl::AT_FDCWD,
            &sock,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            nix::sys::stat::FchmodatFlags::FollowSymlink,
        )
        .unwrap();
        w.rescan(&fd);
        assert!(matches!(w.sockets[&sock].phase, Phase::Pending { .. }));
    }

    /// A socket nobody serves (bound, then the listener closed) is retried
    /// and its error reported; hidden files and non-sockets are ignored; the
    /// problem clears when the socket goes away.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dead_sockets_are_retried_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("not-a-socket"), b"x").unwrap();
        let dead = dir.path().join("dead-reg.sock");
        drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
        drop(std::os::unix::net::UnixListener::bind(dir.path().join(".hidden.sock")).unwrap());
        let registry = DriverRegistry::new();
        let (ptx, mut prx) = mpsc::unbounded_channel::<(PathBuf, Option<String>)>();
        let sink: ProblemSink = Arc::new(move |p, e| {
            let _ = ptx.send((p.to_path_buf(), e));
        });
        let config = WatcherConfig {
            call_timeout: Duration::from_secs(5),
            retry_initial: Duration::from_millis(10),
            retry_max: Duration::from_millis(50),
            rescan_period: Duration::from_secs(3600),
        };
        let w = PluginWatcher::new(dir.path().to_path_buf(), Arc::clone(&registry), config)
            .with_problem_sink(sink);
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(w.run(stop_rx));
        // Two failed attempts: it is retried.
        for _ in 0..2 {
            let (p, e) = prx.recv().await.unwrap();
            assert_eq!(p, dead);
            assert!(e.unwrap().contains("cannot connect"));
        }
        assert!(registry.drivers().is_empty());
        std::fs::remove_file(&dead).unwrap();
        loop {
            let (p, e) = prx.recv().await.unwrap();
            assert_eq!(p, dead, "only the dead socket is ever tried");
            if e.is_none() {
                break;
            }
        }
        stop_tx.send(true).unwrap();
        task.await.unwrap().unwrap();
    }
}
