//! A directory of pod manifests, like the kubelet's static pod path: every
//! `*.yaml`, `*.yml` or `*.json` file (not hidden, not in subdirectories)
//! holds one or more Kubernetes objects — `v1.Pod`, or a `v1.List`/`PodList`
//! of pods; other kinds are skipped. Changes are picked up through inotify,
//! with a periodic rescan as a safety net.
//!
//! A file that cannot be read or parsed keeps the pods it last defined (a
//! half-written edit must not tear volumes down) and shows the error in
//! status; a removed file removes its pods.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

use crate::pod::{DesiredPod, PodRejected};
use crate::volume::PodUid;
use crate::volume_manager::VolumeManager;

/// Files larger than this are refused.
const MAX_FILE_BYTES: u64 = 8 << 20;

/// Why the source could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The directory is unusable.
    #[error("manifests directory {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// inotify could not be set up.
    #[error("inotify on {path}: {source}")]
    Inotify {
        /// The directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: nix::errno::Errno,
    },
}

/// Change detector for one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileKey {
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileKey {
    fn of(m: &std::fs::Metadata) -> Self {
        Self {
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        }
    }
}

#[derive(Debug, Default)]
struct FileState {
    key: Option<FileKey>,
    pods: Vec<PodUid>,
}

/// What one file yielded.
#[derive(Debug, Default)]
pub struct ParsedFile {
    /// Valid pods.
    pub pods: Vec<DesiredPod>,
    /// Pods rejected as a whole.
    pub rejected: Vec<PodRejected>,
    /// Problems that yielded no pod (unparsable documents, ...).
    pub errors: Vec<String>,
    /// Whether every document parsed (only then may pods that vanished be removed).
    pub complete: bool,
}

/// Files read before the first batch is applied (small: mounting starts early).
const FIRST_BATCH: usize = 32;
/// Files per batch after the first.
const BATCH: usize = 256;

/// Parses the text of a manifest file.
pub fn parse_manifest(text: &str, json: bool) -> ParsedFile {
    let mut out = ParsedFile {
        complete: true,
        ..ParsedFile::default()
    };
    let mut docs: Vec<Result<serde_json::Value, String>> = Vec::new();
    // Fast path: a JSON file holding exactly one pod parses straight into
    // the typed object, without an intermediate `Value`.
    if json {
        if let Ok(pod) = serde_json::from_str::<Pod>(text) {
            match DesiredPod::from_pod(&pod) {
                Ok(p) => out.pods.push(p),
                Err(r) => out.rejected.push(r),
            }
            return out;
        }
    }
    if json {
        let stream = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
        for d in stream {
            match d {
                Ok(v) => docs.push(Ok(v)),
                Err(e) => {
                    docs.push(Err(format!("invalid JSON: {e}")));
                    break;
                }
            }
        }
    } else {
        for d in serde_norway::Deserializer::from_str(text) {
            match <serde_json::Value as serde::Deserialize>::deserialize(d) {
                Ok(serde_json::Value::Null) => {}
                Ok(v) => docs.push(Ok(v)),
                Err(e) => {
                    docs.push(Err(format!("invalid YAML: {e}")));
                    break;
                }
            }
        }
    }
    for (i, d) in docs.into_iter().enumerate() {
        let doc = i + 1;
        match d {
            Err(e) => {
                out.errors.push(format!("document {doc}: {e}"));
                out.complete = false;
            }
            Ok(v) => add_object(v, doc, &mut out),
        }
    }
    out
}

fn add_object(v: serde_json::Value, doc: usize, out: &mut ParsedFile) {
    let kind = v
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or("")
        .to_string();
    match kind.as_str() {
        "Pod" => match serde_json::from_value::<Pod>(v) {
            Ok(pod) => match DesiredPod::from_pod(&pod) {
                Ok(p) => out.pods.push(p),
                Err(r) => out.rejected.push(r),
            },
            Err(e) => {
                out.errors
                    .push(format!("document {doc}: not a valid v1.Pod: {e}"));
                out.complete = false;
            }
        },
        "List" | "PodList" => {
            let items = match v {
                serde_json::Value::Object(mut o) => o.remove("items"),
                _ => None,
            };
            for item in items
                .and_then(|i| match i {
                    serde_json::Value::Array(a) => Some(a),
                    _ => None,
                })
                .into_iter()
                .flatten()
            {
                add_object(item, doc, out);
            }
        }
        "" => {
            out.errors.push(format!("document {doc}: missing \"kind\""));
            out.complete = false;
        }
        other => tracing::debug!(kind = other, "skipping non-pod object in manifests"),
    }
}

fn is_manifest_name(name: &std::ffi::OsStr) -> Option<bool> {
    let s = name.to_str()?;
    if s.starts_with('.') {
        return None;
    }
    if s.ends_with(".json") {
        Some(true)
    } else if s.ends_with(".yaml") || s.ends_with(".yml") {
        Some(false)
    } else {
        None
    }
}

struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// The manifests-directory source.
pub struct ManifestsSource {
    dir: PathBuf,
    vm: Arc<VolumeManager>,
    rescan_period: Duration,
    files: HashMap<OsString, FileState>,
    /// Which file defines each pod (a second definition is rejected).
    owners: HashMap<PodUid, OsString>,
}

impl ManifestsSource {
    /// A source reading `dir` into `vm`.
    pub fn new(dir: PathBuf, vm: Arc<VolumeManager>, rescan_period: Duration) -> Self {
        Self {
            dir,
            vm,
            rescan_period,
            files: HashMap::new(),
            owners: HashMap::new(),
        }
    }

    /// Reads everything once, marks the desired state populated, then follows
    /// changes until `shutdown`.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<(), SourceError> {
        let inotify =
            Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).map_err(|source| {
                SourceError::Inotify {
                    path: self.dir.clone(),
                    source,
                }
            })?;
        let mask = AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF
            | AddWatchFlags::IN_ONLYDIR;
        inotify
            .add_watch(&self.dir, mask)
            .map_err(|source| SourceError::Inotify {
                path: self.dir.clone(),
                source,
            })?;
        // SAFETY: the descriptor is owned by the `Inotify` moved into the
        // `AsyncFd`, stays open for the `AsyncFd`'s whole life, and
        // `as_raw_fd` always returns that same descriptor.
        let fd =
            unsafe { AsyncFd::register(InotifyFd(inotify)) }.map_err(|e| SourceError::Dir {
                path: self.dir.clone(),
                source: std::io::Error::from(e),
            })?;
        let started = std::time::Instant::now();
        self.rescan().await;
        tracing::info!(
            files = self.files.len(),
            pods = self.owners.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "initial manifests scan done"
        );
        self.vm.set_populated();
        let mut tick = tokio::time::interval(self.rescan_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut watching = true;
        loop {
            tokio::select! {
                r = shutdown.changed() => {
                    if r.is_err() || *shutdown.borrow() {
                        return Ok(());
                    }
                }
                ready = fd.readable() => {
                    let Ok(mut guard) = ready else { continue };
                    let mut names = BTreeSet::new();
                    let mut full = false;
                    loop {
                        match guard.get_inner().0.read_events() {
                            Ok(events) => for e in events {
                                if e.mask.intersects(AddWatchFlags::IN_Q_OVERFLOW | AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF | AddWatchFlags::IN_IGNORED) {
                                    full = true;
                                    if e.mask.intersects(AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF | AddWatchFlags::IN_IGNORED) {
                                        watching = false;
                                    }
                                }
                                if let Some(n) = e.name { names.insert(n); }
                            },
                            Err(nix::errno::Errno::EAGAIN) => { guard.clear_ready(); break; }
                            Err(e) => { tracing::warn!(error = %e, "inotify read"); guard.clear_ready(); full = true; break; }
                        }
                    }
                    if full {
                        self.rescan().await;
                    } else {
                        self.sync_files(names.into_iter().collect()).await;
                    }
                }
                _ = tick.tick() => {
                    if !watching && self.dir.is_dir() {
                        watching = fd.get_ref().0.add_watch(&self.dir, mask).is_ok();
                    }
                    self.rescan().await;
                }
            }
        }
    }

    /// Looks at every file (those whose stat changed are re-read).
    pub async fn rescan(&mut self) {
        let dir = self.dir.clone();
        let listing = tokio::task::spawn_blocking(move || {
            std::fs::read_dir(&dir).map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name())
                    .collect::<Vec<_>>()
            })
        })
        .await;
        let names = match listing {
            Ok(Ok(n)) => {
                self.vm
                    .set_source_problems(&self.dir.display().to_string(), vec![], vec![]);
                n
            }
            Ok(Err(e)) => {
                // Keep every pod: a directory that vanished for a moment must
                // not tear volumes down.
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot list manifests directory");
                self.vm.set_source_problems(
                    &self.dir.display().to_string(),
                    vec![format!("cannot list the manifests directory: {e}")],
                    vec![],
                );
                return;
            }
            Err(_) => return,
        };
        let mut all: BTreeSet<OsString> = names.into_iter().collect();
        all.extend(self.files.keys().cloned());
        self.sync_files(all.into_iter().collect()).await;
    }

    /// Re-reads the named files whose stat changed, on a blocking thread, and
    /// applies the results in order.
    ///
    /// The reader streams parsed batches through a small channel while this
    /// task applies the previous ones, so reading and parsing overlap with
    /// the mounts the applied pods start; the first batch is small so the
    /// first mounts start early.
    async fn sync_files(&mut self, names: Vec<OsString>) {
        let names: Vec<(OsString, bool)> = names
            .into_iter()
            .filter_map(|n| is_manifest_name(&n).map(|json| (n, json)))
            .collect();
        if names.is_empty() {
            return;
        }
        let known: Vec<Option<FileKey>> = names
            .iter()
            .map(|(n, _)| self.files.get(n).and_then(|f| f.key))
            .collect();
        let dir = self.dir.clone();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<(OsString, FileRead)>>(4);
        let reader = tokio::task::spawn_blocking(move || {
            let mut batch = Vec::with_capacity(FIRST_BATCH);
            let mut limit = FIRST_BATCH;
            for ((name, json), known) in names.into_iter().zip(known) {
                let r = read_file(&dir.join(&name), json, known);
                batch.push((name, r));
                if batch.len() >= limit {
                    if tx.blocking_send(std::mem::take(&mut batch)).is_err() {
                        return;
                    }
                    limit = BATCH;
                }
            }
            if !batch.is_empty() {
                let _ = tx.blocking_send(batch);
            }
        });
        while let Some(batch) = rx.recv().await {
            for (name, r) in batch {
                self.apply(name, r);
            }
        }
        if let Err(e) = reader.await {
            tracing::warn!(error = %e, "manifests reader failed");
        }
    }

    fn apply(&mut self, name: OsString, r: FileRead) {
        let source = self.dir.join(&name).display().to_string();
        match r {
            FileRead::Unchanged => {}
            FileRead::Gone => {
                if let Some(old) = self.files.remove(&name) {
                    for uid in old.pods {
                        if self.owners.get(&uid) == Some(&name) {
                            self.owners.remove(&uid);
                            self.vm.delete_pod(&uid);
                            tracing::info!(pod = %uid, file = %source, "pod removed with its manifest");
                        }
                    }
                }
                self.vm.set_source_problems(&source, vec![], vec![]);
            }
            FileRead::Failed(key, e) => {
                tracing::warn!(file = %source, error = %e, "cannot read manifest; keeping the pods it defined");
                self.files.entry(name).or_default().key = key;
                self.vm.set_source_problems(&source, vec![e], vec![]);
            }
            FileRead::Parsed(key, parsed) => {
                let mut rejected = parsed.rejected;
                for r in &rejected {
                    tracing::warn!(file = %source, error = %r, "pod rejected");
                }
                for e in &parsed.errors {
                    tracing::warn!(file = %source, error = %e, "manifest problem");
                }
                let mut now = BTreeSet::new();
                for pod in parsed.pods {
                    match self.owners.get(&pod.uid) {
                        Some(owner) if owner != &name => {
                            rejected.push(PodRejected {
                                namespace: pod.namespace.clone(),
                                name: pod.name.clone(),
                                uid: Some(pod.uid.to_string()),
                                reason: format!(
                                    "pod UID {} is already defined in {}",
                                    pod.uid,
                                    self.dir.join(owner).display()
                                ),
                            });
                            continue;
                        }
                        _ => {}
                    }
                    if !now.insert(pod.uid.clone()) {
                        rejected.push(PodRejected {
                            namespace: pod.namespace.clone(),
                            name: pod.name.clone(),
                            uid: Some(pod.uid.to_string()),
                            reason: format!("pod UID {} is defined twice in this file", pod.uid),
                        });
                        continue;
                    }
                    self.owners.insert(pod.uid.clone(), name.clone());
                    self.vm.set_desired_pod(pod);
                }
                let state = self.files.entry(name.clone()).or_default();
                if parsed.complete {
                    for uid in state.pods.iter().filter(|u| !now.contains(*u)) {
                        if self.owners.get(uid) == Some(&name) {
                            self.owners.remove(uid);
                            self.vm.delete_pod(uid);
                            tracing::info!(pod = %uid, file = %source, "pod removed from its manifest");
                        }
                    }
                    state.pods = now.into_iter().collect();
                } else {
                    for uid in now {
                        if !state.pods.contains(&uid) {
                            state.pods.push(uid);
                        }
                    }
                }
                state.key = Some(key);
                self.vm
                    .set_source_problems(&source, parsed.errors, rejected);
            }
        }
    }
}

enum FileRead {
    Unchanged,
    Gone,
    Failed(Option<FileKey>, String),
    Parsed(FileKey, ParsedFile),
}

fn read_file(path: &Path, json: bool, known: Option<FileKey>) -> FileRead {
    let gone_or = |what: &str, e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::NotFound {
            FileRead::Gone
        } else {
            FileRead::Failed(None, format!("{what}: {e}"))
        }
    };
    // A file already read is only stat'ed (a rescan opens nothing that did
    // not change); a new one is opened at once and stat'ed through its
    // descriptor.
    if let Some(known) = known {
        match std::fs::metadata(path) {
            Ok(m) if m.is_file() && FileKey::of(&m) == known => return FileRead::Unchanged,
            Ok(m) if !m.is_file() => return FileRead::Gone,
            Ok(_) => {}
            Err(e) => return gone_or("stat", e),
        }
    }
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => return gone_or("open", e),
    };
    let meta = match file.metadata() {
        Ok(m) => m,
        Err(e) => return gone_or("stat", e),
    };
    if !meta.is_file() {
        return FileRead::Gone;
    }
    let key = FileKey::of(&meta);
    if known == Some(key) {
        return FileRead::Unchanged;
    }
    if meta.len() > MAX_FILE_BYTES {
        return FileRead::Failed(
            Some(key),
            format!("file is larger than {MAX_FILE_BYTES} bytes"),
        );
    }
    let bytes = match read_sized(&mut file, meta.len()) {
        Ok(b) => b,
        Err(e) => return FileRead::Failed(Some(key), format!("read: {e}")),
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return FileRead::Failed(Some(key), "file is not valid UTF-8".into());
    };
    FileRead::Parsed(key, parse_manifest(&text, json))
}

/// Reads a regular file whose size `fstat` gave: one `read` of one byte more
/// than that size normally returns everything (a short read of a regular
/// file means end of file); a file that grew meanwhile is read on, up to
/// [`MAX_FILE_BYTES`] (its change is seen again through inotify).
fn read_sized(file: &mut std::fs::File, len: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let want = usize::try_from(len).unwrap_or(usize::MAX).saturating_add(1);
    let mut buf = vec![0u8; want];
    let mut filled = 0;
    loop {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => {
                filled += n;
                if filled < buf.len() {
                    break;
                }
                if buf.len() as u64 > MAX_FILE_BYTES {
                    return Err(std::io::Error::other(format!(
                        "file grew past {MAX_FILE_BYTES} bytes"
                    )));
                }
                buf.resize(buf.len() * 2, 0);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: ns, uid: uid-a}
spec:
  containers: [{name: c, image: i, volumeMounts: [{name: v, mountPath: /v}]}]
  volumes: [{name: v, emptyDir: {medium: Memory}}]
"#;

    #[test]
    fn multi_document_yaml_and_lists() {
        let text = format!(
            "{POD}---\n{}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: x}}\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Pod\n  metadata: {{name: c}}\n  spec: {{containers: []}}\n",
            POD.replace("name: a,", "name: b,").replace("uid-a", "uid-b")
        );
        let p = parse_manifest(&text, false);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert!(p.complete);
        assert_eq!(p.pods.len(), 3);
        assert_eq!(p.pods[0].uid.as_str(), "uid-a");
        assert_eq!(p.pods[1].uid.as_str(), "uid-b");
    }

    #[test]
    fn json_stream() {
        let one =
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[]}}"#;
        let p = parse_manifest(&format!("{one}\n{}", one.replace("\"a\"", "\"b\"")), true);
        assert_eq!(p.pods.len(), 2);
        assert!(p.complete);
    }

    #[test]
    fn errors_are_reported_per_document() {
        let p = parse_manifest("kind: Pod\nmetadata: [\n", false);
        assert!(!p.complete);
        assert!(p.errors[0].contains("invalid YAML"), "{:?}", p.errors);
        let p = parse_manifest("apiVersion: v1\nmetadata: {name: a}\n", false);
        assert!(p.errors[0].contains("missing \"kind\""));
        let p = parse_manifest(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a, uid: ../x}\nspec: {containers: []}\n",
            false,
        );
        assert!(p.complete);
        assert_eq!(p.rejected.len(), 1);
        let p = parse_manifest(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: 3}\n",
            false,
        );
        assert!(!p.complete);
        assert!(p.errors[0].contains("not a valid v1.Pod"), "{:?}", p.errors);
    }

    #[test]
    fn manifest_names() {
        assert_eq!(is_manifest_name("a.yaml".as_ref()), Some(false));
        assert_eq!(is_manifest_name("a.yml".as_ref()), Some(false));
        assert_eq!(is_manifest_name("a.json".as_ref()), Some(true));
        assert_eq!(is_manifest_name(".a.yaml".as_ref()), None);
        assert_eq!(is_manifest_name("a.yaml.swp".as_ref()), None);
    }
}
