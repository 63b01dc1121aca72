//! A directory of pod manifests, like the kubelet's static pod path: every
//! `*.yaml`, `*.yml` or `*.json` file (not hidden, not in subdirectories)
//! holds one or more Kubernetes objects — `v1.Pod`, `v1.PersistentVolumeClaim`,
//! `v1.PersistentVolume`, `v1.Secret`, `v1.ConfigMap`, `v1.ServiceAccount`,
//! `storage.k8s.io/v1.CSIDriver` and `VolumeAttachment`,
//! `certificates.k8s.io` `ClusterTrustBundle` (`v1`, `v1beta1` or
//! `v1alpha1`), or a `v1.List` (or
//! typed list: `PodList`, `PersistentVolumeList`, ...) of them; other
//! kinds are skipped. Changes are picked up through inotify, with a periodic
//! rescan as a safety net.
//!
//! PVCs, PVs and Secrets stand in for the API server: a pod's
//! `persistentVolumeClaim` volume resolves through them (see
//! [`crate::populator::pod::ObjectLookup`]), and when one of them appears, changes or
//! disappears, the pods that read it are re-resolved (a missing object's
//! volume error clears itself; a PV whose capacity grew raises the desired
//! size). Like the kubelet, a volume that resolved once is not torn down
//! because its PVC, PV or Secret went away: it keeps its last resolution and
//! the problem shows in status (source `pod NS/NAME (UID)`) until the object
//! is back or the pod changes. Secret values are never logged nor shown in
//! status.
//!
//! A file that cannot be read or parsed keeps the pods and objects it last
//! defined (a half-written edit must not tear volumes down) and shows the
//! error in status; a removed file removes its pods and objects.

use std::collections::{BTreeSet, HashMap};
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount,
};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::inotify::AddWatchFlags;
use nix::sys::stat::{FileStat, Mode};
use tokio::sync::watch;

use crate::populator::objects::{KubeObject, ObjectRef};
use crate::populator::pod::{DesiredPod, PodRejected, VolumeSpecError};
use crate::populator::resolver::{PodResolver, Resolvable};
use crate::populator::{yaml_depth, PodSink};
use crate::sys::inotify::{self, WatchError};
use crate::volume::PodUid;

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
    fn of(st: &FileStat) -> Self {
        Self {
            ino: st.st_ino,
            size: u64::try_from(st.st_size).unwrap_or(0),
            mtime_ns: i128::from(st.st_mtime) * 1_000_000_000 + i128::from(st.st_mtime_nsec),
            ctime_ns: i128::from(st.st_ctime) * 1_000_000_000 + i128::from(st.st_ctime_nsec),
        }
    }
}

/// Whether `st` is a regular file.
fn is_regular(st: &FileStat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

#[derive(Debug, Default)]
struct FileState {
    key: Option<FileKey>,
    pods: Vec<PodUid>,
    objects: Vec<ObjectRef>,
}

/// What one file yielded.
#[derive(Debug, Default)]
pub struct ParsedFile {
    /// Valid pods.
    pub pods: Vec<DesiredPod>,
    /// Pods whose volumes read other objects (PVCs, Secrets): converted when
    /// applied, against the objects known then.
    pub unresolved: Vec<Arc<Pod>>,
    /// PersistentVolumes, PersistentVolumeClaims and Secrets.
    pub objects: Vec<KubeObject>,
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
const BATCH: usize = 64;

/// Parses the text of a manifest file.
///
/// Nesting is bounded, so that one file cannot stall the others: JSON by
/// serde_json's recursion limit (128 levels; an "invalid JSON ... recursion
/// limit exceeded" error), YAML by [`yaml_depth::check`] before parsing
/// ([`yaml_depth::MAX_DEPTH`] levels; the documents before the one that
/// goes too deep are read, that one and the rest are not).
pub fn parse_manifest(text: &str, json: bool) -> ParsedFile {
    let mut out = ParsedFile {
        complete: true,
        ..ParsedFile::default()
    };
    // Fast path: a JSON file holding exactly one pod parses straight into
    // the typed object, without an intermediate `Value`.
    if json {
        if let Ok(pod) = serde_json::from_str::<Pod>(text) {
            add_pod(pod, &mut out);
            return out;
        }
    }
    let docs = if json {
        json_documents(text)
    } else {
        yaml_documents(text)
    };
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

/// The documents of a JSON stream, up to the first that does not parse.
fn json_documents(text: &str) -> Vec<Result<serde_json::Value, String>> {
    let mut docs = Vec::new();
    for d in serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>() {
        match d {
            Ok(v) => docs.push(Ok(v)),
            Err(e) => {
                docs.push(Err(format!("invalid JSON: {e}")));
                break;
            }
        }
    }
    docs
}

/// The documents of a YAML stream, up to the first that does not parse or
/// nests deeper than [`yaml_depth::MAX_DEPTH`] (not parsed at all).
fn yaml_documents(text: &str) -> Vec<Result<serde_json::Value, String>> {
    let (text, too_deep) = match yaml_depth::check(text) {
        Ok(()) => (text, None),
        Err(e) => (text.get(..e.document_start).unwrap_or(""), Some(e)),
    };
    let mut docs = Vec::new();
    for d in serde_norway::Deserializer::from_str(text) {
        match <serde_json::Value as serde::Deserialize>::deserialize(d) {
            Ok(serde_json::Value::Null) => {}
            Ok(v) => docs.push(Ok(v)),
            Err(e) => {
                docs.push(Err(format!("invalid YAML: {e}")));
                return docs;
            }
        }
    }
    if let Some(e) = too_deep {
        docs.push(Err(format!(
            "invalid YAML: {e}; this document and those after it are not read"
        )));
    }
    docs
}

fn add_object(v: serde_json::Value, doc: usize, out: &mut ParsedFile) {
    let kind = v
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or("")
        .to_string();
    match kind.as_str() {
        "Pod" => {
            if let Some(pod) = decode::<Pod>(v, doc, "Pod", out) {
                add_pod(pod, out);
            }
        }
        "PersistentVolume" => {
            if let Some(o) = decode::<PersistentVolume>(v, doc, "PersistentVolume", out) {
                add_named(KubeObject::PersistentVolume(Arc::new(o)), doc, out);
            }
        }
        "PersistentVolumeClaim" => {
            if let Some(o) = decode::<PersistentVolumeClaim>(v, doc, "PersistentVolumeClaim", out) {
                add_named(KubeObject::PersistentVolumeClaim(Arc::new(o)), doc, out);
            }
        }
        "Secret" => add_secret(v, doc, out),
        "ConfigMap" => {
            if let Some(o) = decode::<ConfigMap>(v, doc, "ConfigMap", out) {
                add_named(KubeObject::ConfigMap(Arc::new(o)), doc, out);
            }
        }
        "CSIDriver" => {
            if let Some(o) = decode::<CSIDriver>(v, doc, "CSIDriver", out) {
                add_named(KubeObject::CsiDriver(Arc::new(o)), doc, out);
            }
        }
        "VolumeAttachment" => {
            if let Some(o) = decode::<VolumeAttachment>(v, doc, "VolumeAttachment", out) {
                add_named(KubeObject::VolumeAttachment(Arc::new(o)), doc, out);
            }
        }
        "ServiceAccount" => {
            if let Some(o) = decode::<ServiceAccount>(v, doc, "ServiceAccount", out) {
                add_named(KubeObject::ServiceAccount(Arc::new(o)), doc, out);
            }
        }
        "ClusterTrustBundle" => {
            let v = crate::populator::objects::as_v1_trust_bundle(v);
            if let Some(o) = decode::<ClusterTrustBundle>(v, doc, "ClusterTrustBundle", out) {
                add_named(KubeObject::ClusterTrustBundle(Arc::new(o)), doc, out);
            }
        }
        "List"
        | "PodList"
        | "PersistentVolumeList"
        | "PersistentVolumeClaimList"
        | "SecretList"
        | "ConfigMapList"
        | "CSIDriverList"
        | "VolumeAttachmentList"
        | "ServiceAccountList"
        | "ClusterTrustBundleList" => add_list(v, &kind, doc, out),
        "" => {
            out.errors.push(format!("document {doc}: missing \"kind\""));
            out.complete = false;
        }
        other => tracing::debug!(kind = other, "skipping non-pod object in manifests"),
    }
}

/// Decodes a document as a `v1.KIND`, or records why it is not one.
fn decode<T: serde::de::DeserializeOwned>(
    v: serde_json::Value,
    doc: usize,
    kind: &str,
    out: &mut ParsedFile,
) -> Option<T> {
    match serde_json::from_value::<T>(v) {
        Ok(o) => Some(o),
        Err(e) => {
            out.errors
                .push(format!("document {doc}: not a valid v1.{kind}: {e}"));
            out.complete = false;
            None
        }
    }
}

/// A Secret: like [`decode`], but an error never quotes the document (the
/// parser's message could quote a secret value).
fn add_secret(v: serde_json::Value, doc: usize, out: &mut ParsedFile) {
    let name = v
        .pointer("/metadata/name")
        .and_then(|n| n.as_str())
        .unwrap_or("")
        .to_string();
    match serde_json::from_value::<Secret>(v) {
        Ok(o) => add_named(KubeObject::Secret(Arc::new(o)), doc, out),
        Err(e) => {
            out.errors.push(format!(
                "document {doc}: Secret {name:?} is not a valid v1.Secret (details withheld, they could quote a secret value; near line {}, column {})",
                e.line(),
                e.column()
            ));
            out.complete = false;
        }
    }
}

/// The items of a `v1.List` or a typed list. Items of a typed list (as the
/// API server returns them) carry no kind of their own.
fn add_list(v: serde_json::Value, kind: &str, doc: usize, out: &mut ParsedFile) {
    let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
    let items = match v {
        serde_json::Value::Object(mut o) => o.remove("items"),
        _ => None,
    };
    let items = match items {
        Some(serde_json::Value::Array(a)) => a,
        _ => Vec::new(),
    };
    for mut item in items {
        if let (Some(k), serde_json::Value::Object(o)) = (item_kind, &mut item) {
            o.entry("kind").or_insert_with(|| k.into());
            let api_version = match k {
                "CSIDriver" | "VolumeAttachment" => "storage.k8s.io/v1",
                "ClusterTrustBundle" => "certificates.k8s.io/v1",
                _ => "v1",
            };
            o.entry("apiVersion").or_insert_with(|| api_version.into());
        }
        add_object(item, doc, out);
    }
}

fn add_pod(pod: Pod, out: &mut ParsedFile) {
    if crate::populator::pod::needs_objects(&pod) {
        out.unresolved.push(Arc::new(pod));
        return;
    }
    match DesiredPod::from_pod(&pod) {
        Ok(p) => out.pods.push(p),
        Err(r) => out.rejected.push(r),
    }
}

fn add_named(obj: KubeObject, doc: usize, out: &mut ParsedFile) {
    let r = obj.reference();
    if r.name.is_empty() {
        out.errors
            .push(format!("document {doc}: {r}: metadata.name is required"));
        out.complete = false;
        return;
    }
    out.objects.push(obj);
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

/// The manifests-directory source.
pub struct ManifestsSource {
    dir: PathBuf,
    sink: Arc<dyn PodSink>,
    rescan_period: Duration,
    files: HashMap<OsString, FileState>,
    /// Which file defines each pod (a second definition is rejected).
    owners: HashMap<PodUid, OsString>,
    /// The objects of every file and the pods that read them.
    resolver: PodResolver,
    /// Which file defines each object (a second definition is refused).
    object_owners: HashMap<ObjectRef, OsString>,
    /// New pods of the files being synced whose volumes need objects not
    /// read yet (a PVC in a file that sorts later): resolved once every
    /// file of the sync is applied, so they never show a passing "not
    /// found". Their UIDs are reserved for their files meanwhile.
    waiting: Vec<(OsString, Arc<Pod>)>,
    /// Files that had a pod refused because another file defines its UID:
    /// read again when that UID is released.
    duplicates: HashMap<PodUid, BTreeSet<OsString>>,
    /// Files to read again at the end of the current sync.
    reread: BTreeSet<OsString>,
}

impl ManifestsSource {
    /// A source reading `dir` into `sink` (the populator).
    pub fn new(dir: PathBuf, sink: Arc<dyn PodSink>, rescan_period: Duration) -> Self {
        Self {
            resolver: PodResolver::new(Arc::clone(&sink)),
            dir,
            sink,
            rescan_period,
            files: HashMap::new(),
            owners: HashMap::new(),
            object_owners: HashMap::new(),
            waiting: Vec::new(),
            duplicates: HashMap::new(),
            reread: BTreeSet::new(),
        }
    }

    /// Reads everything once, marks the desired state populated, then follows
    /// changes until `shutdown`.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<(), SourceError> {
        let mask = AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF
            | AddWatchFlags::IN_ONLYDIR;
        let (fd, _) = inotify::watch(&self.dir, mask).map_err(|e| match e {
            WatchError::Inotify(source) => SourceError::Inotify {
                path: self.dir.clone(),
                source,
            },
            WatchError::Register(source) => SourceError::Dir {
                path: self.dir.clone(),
                source,
            },
        })?;
        let started = std::time::Instant::now();
        self.rescan().await;
        tracing::info!(
            files = self.files.len(),
            pods = self.owners.len(),
            objects = self.resolver.objects().len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "initial manifests scan done"
        );
        self.sink.set_populated();
        let mut tick = tokio::time::interval(self.rescan_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut watching = true;
        loop {
            tokio::select! {
                () = crate::util::shutdown::requested(&mut shutdown) => return Ok(()),
                batch = inotify::next_batch(&fd) => {
                    let Ok(batch) = batch else { continue };
                    let mut names = BTreeSet::new();
                    let mut full = batch.lost_events();
                    if let Some(e) = batch.error { tracing::warn!(error = %e, "inotify read"); }
                    for e in batch.events {
                        if e.mask.intersects(AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF | AddWatchFlags::IN_IGNORED) {
                            full = true;
                            watching = false;
                        }
                        if let Some(n) = e.name { names.insert(n); }
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
                    // The listing and any parsing are freed: hand the pages
                    // back (after the start-up storm, this is the first
                    // chance to shed what reading every manifest left).
                    tokio::task::spawn_blocking(crate::sys::memory::release_free_heap);
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
                self.sink
                    .set_source_problems(&self.dir.display().to_string(), vec![], vec![]);
                n
            }
            Ok(Err(e)) => {
                // Keep every pod: a directory that vanished for a moment must
                // not tear volumes down.
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot list manifests directory");
                self.sink.set_source_problems(
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

    /// Re-reads the named files whose stat changed (see [`Self::sync_once`]),
    /// then the files whose refused duplicate pods may now be admitted.
    async fn sync_files(&mut self, mut names: Vec<OsString>) {
        loop {
            self.sync_once(names).await;
            if self.reread.is_empty() {
                return;
            }
            names = std::mem::take(&mut self.reread).into_iter().collect();
        }
    }

    /// A file released pod `uid`: the files that defined it too are read
    /// again (the first of them gets it).
    fn release_owner(&mut self, uid: &PodUid) {
        self.owners.remove(uid);
        for name in self.duplicates.remove(uid).unwrap_or_default() {
            if let Some(f) = self.files.get_mut(&name) {
                f.key = None;
                self.reread.insert(name);
            }
        }
    }

    /// Re-reads the named files whose stat changed, on a blocking thread, and
    /// applies the results in order.
    ///
    /// The reader streams parsed batches through a small channel while this
    /// task applies the previous ones, so reading and parsing overlap with
    /// the mounts the applied pods start; the first batch is small so the
    /// first mounts start early.
    async fn sync_once(&mut self, names: Vec<OsString>) {
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
            // Files are named relative to one descriptor of the directory:
            // a rescan of 10,000 unchanged files walks one path component
            // each, not the whole path.
            let dir_fd = std::fs::File::open(&dir);
            let mut batch = Vec::with_capacity(FIRST_BATCH);
            let mut limit = FIRST_BATCH;
            for ((name, json), known) in names.into_iter().zip(known) {
                let r = match &dir_fd {
                    Ok(d) => read_file(d, &name, json, known),
                    // As for each file: a directory that is gone takes its
                    // files with it (a rescan keeps them: it lists first).
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => FileRead::Gone,
                    Err(e) => FileRead::Failed(None, format!("open directory: {e}")),
                };
                // Nothing to apply (and `apply` never sees it): an idle
                // rescan sends nothing across.
                if matches!(r, FileRead::Unchanged) {
                    continue;
                }
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
            // The reconciler hears of the batch once, not once per pod.
            let _hold = self.sink.hold_wakes();
            for (name, r) in batch {
                self.apply(name, r);
            }
        }
        if let Err(e) = reader.await {
            tracing::warn!(error = %e, "manifests reader failed");
        }
        self.admit_waiting();
    }

    /// Whether `pod`, new, needs an object that is missing: it waits for
    /// the end of the sync (the object may be in a file not applied yet).
    fn waits_for_objects(&self, pod: &DesiredPod) -> bool {
        !self.owners.contains_key(&pod.uid)
            && pod
                .volumes
                .iter()
                .any(|v| matches!(v.source, Err(VolumeSpecError::Missing(_))))
    }

    /// At the end of a sync: resolves and admits the pods that waited for
    /// its objects (those still missing are volume errors now).
    fn admit_waiting(&mut self) {
        let waiting = std::mem::take(&mut self.waiting);
        if waiting.is_empty() {
            return;
        }
        let _hold = self.sink.hold_wakes();
        for (name, raw) in waiting {
            let resolved = self.resolver.resolve(&raw);
            let Ok((pod, deps)) = resolved else {
                continue; // Rejection depends on the pod alone: not deferred.
            };
            // The reservation made when it was deferred.
            if self.owners.get(&pod.uid) != Some(&name) {
                continue;
            }
            self.owners.remove(&pod.uid);
            let mut rejected = Vec::new();
            let now = self.admit_pods(&name, vec![(pod, Some((raw, deps)))], &mut rejected);
            if let Some(state) = self.files.get_mut(&name) {
                for uid in now {
                    if !state.pods.contains(&uid) {
                        state.pods.push(uid);
                    }
                }
            }
            for r in rejected {
                tracing::warn!(file = %self.dir.join(&name).display(), error = %r, "pod rejected");
            }
        }
    }

    fn apply(&mut self, name: OsString, r: FileRead) {
        let source = self.dir.join(&name).display().to_string();
        match r {
            FileRead::Unchanged => {}
            FileRead::Gone => self.apply_gone(&name, &source),
            FileRead::Failed(key, e) => {
                tracing::warn!(file = %source, error = %e, "cannot read manifest; keeping the pods it defined");
                self.files.entry(name).or_default().key = key;
                self.sink.set_source_problems(&source, vec![e], vec![]);
            }
            FileRead::Parsed(key, parsed) => self.apply_parsed(name, &source, key, parsed),
        }
    }

    /// A file that is gone takes its pods and objects with it.
    fn apply_gone(&mut self, name: &OsString, source: &str) {
        if let Some(old) = self.files.remove(name) {
            for uid in old.pods {
                if self.owners.get(&uid) == Some(name) {
                    self.release_owner(&uid);
                    self.resolver.forget_pod(&uid);
                    self.sink.delete_pod(&uid);
                    tracing::info!(pod = %uid, file = %source, "pod removed with its manifest");
                }
            }
            let mut changed = BTreeSet::new();
            for r in old.objects {
                if self.object_owners.get(&r) == Some(name) {
                    self.object_owners.remove(&r);
                    if self.resolver.remove_object(&r) {
                        tracing::info!(object = %r, file = %source, "object removed with its manifest");
                        changed.insert(r);
                    }
                }
            }
            self.resolver.reresolve(&changed, &BTreeSet::new());
        }
        self.sink.set_source_problems(source, vec![], vec![]);
    }

    /// A file that parsed: its objects first (so its pods resolve against
    /// them), then its pods; what it no longer defines goes, if it parsed
    /// completely.
    fn apply_parsed(&mut self, name: OsString, source: &str, key: FileKey, parsed: ParsedFile) {
        let mut rejected = parsed.rejected;
        let mut errors = parsed.errors;
        let changed =
            self.apply_objects(&name, source, parsed.objects, parsed.complete, &mut errors);
        let mut pods: Vec<(DesiredPod, Option<Resolvable>)> =
            parsed.pods.into_iter().map(|p| (p, None)).collect();
        for raw in parsed.unresolved {
            match self.resolver.resolve(&raw) {
                Ok((pod, _)) if self.waits_for_objects(&pod) => {
                    self.owners.insert(pod.uid, name.clone());
                    self.waiting.push((name.clone(), raw));
                }
                Ok((pod, deps)) => pods.push((pod, Some((raw, deps)))),
                Err(r) => rejected.push(r),
            }
        }
        for r in &rejected {
            tracing::warn!(file = %source, error = %r, "pod rejected");
        }
        for e in &errors {
            tracing::warn!(file = %source, error = %e, "manifest problem");
        }
        let now = self.admit_pods(&name, pods, &mut rejected);
        self.retire_pods(&name, source, now, parsed.complete, &changed);
        if let Some(state) = self.files.get_mut(&name) {
            state.key = Some(key);
        }
        self.sink.set_source_problems(source, errors, rejected);
    }

    /// Stores the objects of a file (a second definition elsewhere or in the
    /// same file is an error); with `complete`, objects the file no longer
    /// defines go. Returns the objects that changed.
    fn apply_objects(
        &mut self,
        name: &OsString,
        source: &str,
        objects: Vec<KubeObject>,
        complete: bool,
        errors: &mut Vec<String>,
    ) -> BTreeSet<ObjectRef> {
        let mut changed = BTreeSet::new();
        let mut now_objects = BTreeSet::new();
        for obj in objects {
            let r = obj.reference();
            if let Some(owner) = self.object_owners.get(&r).filter(|o| *o != name) {
                errors.push(format!(
                    "{r} is already defined in {}",
                    self.dir.join(owner).display()
                ));
                continue;
            }
            if !now_objects.insert(r.clone()) {
                errors.push(format!("{r} is defined twice in this file"));
                continue;
            }
            self.object_owners.insert(r.clone(), name.clone());
            if self.resolver.store_object(obj) {
                tracing::info!(object = %r, file = %source, "object added or changed");
                changed.insert(r);
            }
        }
        let state = self.files.entry(name.clone()).or_default();
        if !complete {
            for r in now_objects {
                if !state.objects.contains(&r) {
                    state.objects.push(r);
                }
            }
            return changed;
        }
        for r in state.objects.iter().filter(|r| !now_objects.contains(*r)) {
            if self.object_owners.get(r) == Some(name) {
                self.object_owners.remove(r);
                if self.resolver.remove_object(r) {
                    tracing::info!(object = %r, file = %source, "object removed from its manifest");
                    changed.insert(r.clone());
                }
            }
        }
        state.objects = now_objects.into_iter().collect();
        changed
    }

    /// Hands a file's pods to the populator, refusing a UID another file
    /// (or this one) already defines. Returns the UIDs admitted.
    fn admit_pods(
        &mut self,
        name: &OsString,
        pods: Vec<(DesiredPod, Option<Resolvable>)>,
        rejected: &mut Vec<PodRejected>,
    ) -> BTreeSet<PodUid> {
        let mut now = BTreeSet::new();
        for (pod, resolvable) in pods {
            let duplicate = match self.owners.get(&pod.uid) {
                Some(owner) if owner != name => Some(format!(
                    "pod UID {} is already defined in {}",
                    pod.uid,
                    self.dir.join(owner).display()
                )),
                _ if now.contains(&pod.uid) => {
                    Some(format!("pod UID {} is defined twice in this file", pod.uid))
                }
                _ => None,
            };
            if let Some(reason) = duplicate {
                if self.owners.get(&pod.uid).is_some_and(|o| o != name) {
                    self.duplicates
                        .entry(pod.uid.clone())
                        .or_default()
                        .insert(name.clone());
                }
                rejected.push(PodRejected {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    uid: Some(pod.uid.to_string()),
                    reason,
                });
                continue;
            }
            now.insert(pod.uid.clone());
            self.owners.insert(pod.uid.clone(), name.clone());
            let pod = self.resolver.admit(pod, resolvable);
            self.sink.set_pod(pod);
        }
        now
    }

    /// Records the pods a file now defines; with `complete`, the pods it no
    /// longer defines are deleted. Then re-resolves the pods of other files
    /// that read a `changed` object.
    fn retire_pods(
        &mut self,
        name: &OsString,
        source: &str,
        now: BTreeSet<PodUid>,
        complete: bool,
        changed: &BTreeSet<ObjectRef>,
    ) {
        let state = self.files.entry(name.clone()).or_default();
        if !complete {
            for uid in &now {
                if !state.pods.contains(uid) {
                    state.pods.push(uid.clone());
                }
            }
            self.resolver.reresolve(changed, &now);
            return;
        }
        let mut gone = Vec::new();
        for uid in state.pods.iter().filter(|u| !now.contains(*u)) {
            if self.owners.get(uid) == Some(name) {
                gone.push(uid.clone());
                self.sink.delete_pod(uid);
                tracing::info!(pod = %uid, file = %source, "pod removed from its manifest");
            }
        }
        for uid in &gone {
            self.release_owner(uid);
            self.resolver.forget_pod(uid);
        }
        self.resolver.reresolve(changed, &now);
        let state = self.files.entry(name.clone()).or_default();
        state.pods = now.into_iter().collect();
    }
}

enum FileRead {
    Unchanged,
    Gone,
    Failed(Option<FileKey>, String),
    Parsed(FileKey, ParsedFile),
}

fn read_file(dir: &std::fs::File, name: &OsStr, json: bool, known: Option<FileKey>) -> FileRead {
    let gone_or = |what: &str, e: Errno| {
        if e == Errno::ENOENT {
            FileRead::Gone
        } else {
            FileRead::Failed(None, format!("{what}: {}", std::io::Error::from(e)))
        }
    };
    // A file already read is only stat'ed (a rescan opens nothing that did
    // not change); a new one is opened at once and stat'ed through its
    // descriptor.
    if let Some(known) = known {
        match nix::sys::stat::fstatat(dir, name, AtFlags::empty()) {
            Ok(st) if is_regular(&st) && FileKey::of(&st) == known => return FileRead::Unchanged,
            Ok(st) if !is_regular(&st) => return FileRead::Gone,
            Ok(_) => {}
            Err(e) => return gone_or("stat", e),
        }
    }
    // O_NONBLOCK: a FIFO named like a manifest must not block the reader
    // (it is then found not to be a regular file); regular files ignore it.
    let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK;
    let mut file = match nix::fcntl::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => std::fs::File::from(fd),
        Err(e) => return gone_or("open", e),
    };
    let meta = match nix::sys::stat::fstat(&file) {
        Ok(m) => m,
        Err(e) => return gone_or("stat", e),
    };
    if !is_regular(&meta) {
        return FileRead::Gone;
    }
    let key = FileKey::of(&meta);
    if known == Some(key) {
        return FileRead::Unchanged;
    }
    let len = u64::try_from(meta.st_size).unwrap_or(0);
    if len > MAX_FILE_BYTES {
        return FileRead::Failed(
            Some(key),
            format!("file is larger than {MAX_FILE_BYTES} bytes"),
        );
    }
    let bytes = match read_sized(&mut file, len) {
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
    use crate::volumemanager::VolumeManager;
    use std::path::Path;

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

    #[test]
    fn reads_volume_objects_and_defers_pods_that_need_them() {
        let text = r#"
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-1}
spec: {csi: {driver: d, volumeHandle: h}}
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: PersistentVolumeClaim, metadata: {name: c, namespace: ns}, spec: {volumeName: pv-1}}
- {apiVersion: v1, kind: Secret, metadata: {name: s}, stringData: {password: hunter2}}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ns, uid: uid-p}
spec:
  containers: [{name: c, image: i, volumeMounts: [{name: v, mountPath: /v}]}]
  volumes: [{name: v, persistentVolumeClaim: {claimName: c}}]
"#;
        let p = parse_manifest(text, false);
        assert!(p.errors.is_empty() && p.complete, "{:?}", p.errors);
        assert!(p.pods.is_empty());
        assert_eq!(p.unresolved.len(), 1);
        let refs: Vec<String> = p
            .objects
            .iter()
            .map(|o| o.reference().to_string())
            .collect();
        assert_eq!(
            refs,
            vec![
                "PersistentVolume pv-1",
                "PersistentVolumeClaim ns/c",
                "Secret default/s"
            ]
        );
        assert!(!format!("{p:?}").contains("hunter2"));

        // Typed lists, whose items carry no kind.
        let p = parse_manifest(
            r#"{"apiVersion":"v1","kind":"PersistentVolumeList","items":[{"metadata":{"name":"a"},"spec":{}}]}
{"apiVersion":"v1","kind":"SecretList","items":[{"metadata":{"name":"s"},"data":{}}]}
{"apiVersion":"v1","kind":"PodList","items":[{"metadata":{"name":"p"},"spec":{"containers":[]}}]}"#,
            true,
        );
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert_eq!(p.objects.len(), 2);
        assert_eq!(p.pods.len(), 1);

        // A JSON Secret is not mistaken for a pod by the fast path.
        let p = parse_manifest(
            r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"data":{"k":"dg=="}}"#,
            true,
        );
        assert_eq!(p.objects.len(), 1, "{:?}", p.errors);

        // Errors: a nameless object; a bad Secret never quotes its values.
        let p = parse_manifest(
            "apiVersion: v1\nkind: PersistentVolume\nmetadata: {}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata: {k: [hunter2]}\n",
            false,
        );
        assert!(!p.complete);
        assert_eq!(p.errors.len(), 2, "{:?}", p.errors);
        assert!(
            p.errors[0].contains("metadata.name is required"),
            "{:?}",
            p.errors
        );
        assert!(
            p.errors[1].contains("not a valid v1.Secret"),
            "{:?}",
            p.errors
        );
        assert!(!p.errors[1].contains("hunter2"), "{:?}", p.errors);
    }

    /// A stand-in CSI plugin (this test is about sources, not mounting): one
    /// volume per handle, like the real one.
    struct CsiStandIn;

    #[async_trait::async_trait]
    impl crate::plugins::VolumePlugin for CsiStandIn {
        fn name(&self) -> &str {
            "test/csi"
        }
        fn can_support(&self, source: &crate::volume::VolumeSource) -> bool {
            matches!(source, crate::volume::VolumeSource::Csi(_))
        }
        fn unique_volume_name(
            &self,
            pod: &PodUid,
            spec: &crate::volume::VolumeSpec,
        ) -> crate::volume::UniqueVolumeName {
            match &spec.source {
                crate::volume::VolumeSource::Csi(c) if !c.ephemeral => {
                    crate::volume::UniqueVolumeName::new(format!("test/csi/{}", c.volume_handle))
                }
                _ => crate::volume::UniqueVolumeName::per_pod("test/csi", pod, &spec.name),
            }
        }
        async fn set_up(
            &self,
            _req: crate::plugins::MountRequest,
        ) -> Result<PathBuf, crate::plugins::VolumeError> {
            Err(crate::plugins::VolumeError::InvalidSpec(
                "not mounted in this test".into(),
            ))
        }
        async fn tear_down(
            &self,
            _req: crate::plugins::UnmountRequest,
        ) -> Result<(), crate::plugins::VolumeError> {
            Ok(())
        }
        fn verify(
            &self,
            _spec: &crate::volume::VolumeSpec,
            _path: &Path,
            _table: crate::sys::mount_table::MountTableView<'_>,
        ) -> bool {
            false
        }
    }

    /// Writes a file atomically (a new inode, so the change is always seen).
    fn put(dir: &Path, name: &str, text: &str) {
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
    }

    /// The volume of pod `uid`: its error, or its CSI source.
    fn volume_of(vm: &VolumeManager, uid: &str) -> Result<crate::volume::CsiVolumeSource, String> {
        let dsw = vm.world().dsw();
        let uid = PodUid::new(uid).unwrap();
        let entry = dsw.pod(&uid).expect("pod is desired");
        let name = entry.volumes[0].volume.clone()?;
        let v = dsw.volume(&name).expect("volume is desired");
        let p = v.pods.get(&uid).expect("pod in volume");
        match &p.spec.source {
            crate::volume::VolumeSource::Csi(c) => Ok((**c).clone()),
            other => panic!("not CSI: {other:?}"),
        }
    }

    const PVC_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ns, uid: uid-p}
spec:
  containers: [{name: c, image: i, volumeMounts: [{name: v, mountPath: /v}]}]
  volumes: [{name: v, persistentVolumeClaim: {claimName: claim}}]
"#;

    fn pv_yaml(size: &str, secret: bool) -> String {
        let secret = if secret {
            ", nodeStageSecretRef: {name: creds, namespace: ns}"
        } else {
            ""
        };
        format!("apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: pv-1}}\nspec:\n  capacity: {{storage: {size}}}\n  claimRef: {{namespace: ns, name: claim}}\n  csi: {{driver: test.csi, volumeHandle: vol-1{secret}}}\n")
    }

    /// A manager on a temporary ROOT (recording fake mounter) and a manifests
    /// source on a temporary directory (no periodic rescan); the directories
    /// live as long as the returned guards.
    fn source_on_temp_dirs() -> (
        tempfile::TempDir,
        tempfile::TempDir,
        Arc<VolumeManager>,
        ManifestsSource,
    ) {
        let root = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let vm = VolumeManager::new(
            crate::volumemanager::Config::new(root.path()),
            Arc::new(crate::sys::fake::FakeMounter::default()),
        )
        .unwrap();
        let src = ManifestsSource::new(
            dir.path().to_path_buf(),
            vm.pod_sink(),
            Duration::from_secs(3600),
        );
        (root, dir, vm, src)
    }

    /// A rescan, bounded so that a regression fails instead of hanging: a
    /// reader stuck in `open()` on the FIFO is released by opening it for
    /// writing, then the test fails.
    async fn rescan_or_fail(src: &mut ManifestsSource, fifo: &Path) {
        if tokio::time::timeout(Duration::from_secs(20), src.rescan())
            .await
            .is_err()
        {
            use std::os::unix::fs::OpenOptionsExt;
            let _writer = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(fifo);
            std::thread::sleep(Duration::from_millis(100));
            panic!("the rescan blocked on a FIFO");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fifo_named_like_a_manifest_neither_blocks_nor_yields_pods() {
        // Opening a FIFO for reading blocks until a writer comes: the reader
        // opens non-blocking and then sees it is not a regular file.
        let (_root, dir, vm, mut src) = source_on_temp_dirs();
        let fifo = dir.path().join("fifo.yaml");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();
        put(
            dir.path(),
            "pod.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ns, uid: uid-f}\nspec:\n  containers: [{name: c, image: i, volumeMounts: [{name: v, mountPath: /v}]}]\n  volumes: [{name: v, emptyDir: {}}]\n",
        );
        rescan_or_fail(&mut src, &fifo).await;
        let uids: Vec<String> = vm
            .world()
            .dsw()
            .pods()
            .map(|(u, _)| u.as_str().to_string())
            .collect();
        assert_eq!(uids, vec!["uid-f".to_string()]);
        // A second pass (the FIFO now has no known key either) too.
        rescan_or_fail(&mut src, &fifo).await;
    }

    /// The manager's sink, recording each pod it is given and whether one
    /// of its volumes was an error then.
    struct Recording(Arc<dyn PodSink>, std::sync::Mutex<Vec<(String, bool)>>);

    impl PodSink for Recording {
        fn set_pod(&self, pod: DesiredPod) {
            let failed = pod.volumes.iter().any(|v| v.source.is_err());
            self.1.lock().unwrap().push((pod.uid.to_string(), failed));
            self.0.set_pod(pod)
        }
        fn delete_pod(&self, uid: &PodUid) -> bool {
            self.0.delete_pod(uid)
        }
        fn set_source_problems(&self, source: &str, e: Vec<String>, r: Vec<PodRejected>) {
            self.0.set_source_problems(source, e, r)
        }
        fn set_populated(&self) {
            self.0.set_populated()
        }
        fn hold_wakes(&self) -> crate::cache::world::WakeHold {
            self.0.hold_wakes()
        }
    }

    /// At start-up a pod whose file sorts before its PVC's and PV's (here
    /// beyond the first batch of files) waits for them: it is resolved once,
    /// without a passing "not found" error; a pod that needs no object does
    /// not wait for it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pod_waits_for_the_objects_of_the_same_scan() {
        let (_root, dir, vm, _) = source_on_temp_dirs();
        vm.register_plugin(Arc::new(CsiStandIn)).unwrap();
        let sink = Arc::new(Recording(vm.pod_sink(), Default::default()));
        let mut src = ManifestsSource::new(
            dir.path().to_path_buf(),
            Arc::clone(&sink) as Arc<dyn PodSink>,
            Duration::from_secs(3600),
        );
        let d = dir.path();
        put(d, "a-pod.yaml", PVC_POD);
        put(
            d,
            "b-plain.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: e, namespace: ns, uid: uid-e}\nspec:\n  containers: [{name: c, image: i, volumeMounts: [{name: v, mountPath: /v}]}]\n  volumes: [{name: v, emptyDir: {}}]\n",
        );
        for i in 0..FIRST_BATCH {
            put(
                d,
                &format!("m-{i:02}.yaml"),
                "apiVersion: v1\nkind: List\nitems: []\n",
            );
        }
        put(d, "z-pv.yaml", &pv_yaml("64Mi", false));
        put(d, "z-pvc.yaml", "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: claim, namespace: ns}\nspec: {volumeName: pv-1}\n");
        src.rescan().await;
        assert_eq!(volume_of(&vm, "uid-p").unwrap().volume_handle, "vol-1");
        let given = sink.1.lock().unwrap().clone();
        assert_eq!(
            given,
            vec![("uid-e".to_string(), false), ("uid-p".to_string(), false)],
            "the pod without objects first; the other once, resolved"
        );
        assert!(vm.status().errors.is_empty(), "{:?}", vm.status().errors);

        // Still owned by its file: a rescan changes nothing, and removing
        // the file removes the pod.
        src.rescan().await;
        assert_eq!(sink.1.lock().unwrap().len(), 2);
        std::fs::remove_file(d.join("a-pod.yaml")).unwrap();
        src.rescan().await;
        assert!(vm
            .world()
            .dsw()
            .pod(&PodUid::new("uid-p").unwrap())
            .is_none());

        // An object that is missing for good: the error once the scan ends.
        put(
            d,
            "a-pod.yaml",
            &PVC_POD.replace("claimName: claim", "claimName: other"),
        );
        src.rescan().await;
        let e = volume_of(&vm, "uid-p").unwrap_err();
        assert!(
            e.contains("PersistentVolumeClaim ns/other not found"),
            "{e}"
        );
    }

    /// 100,000 levels of `{a: …}` (about 500 KB), or of `[…]` in JSON.
    fn deep(json: bool) -> String {
        let n = 100_000;
        if json {
            format!("{}1{}", "[".repeat(n), "]".repeat(n))
        } else {
            format!("{}x{}", "{a: ".repeat(n), "}".repeat(n))
        }
    }

    #[test]
    fn deeply_nested_documents_are_rejected() {
        let p = parse_manifest(&format!("{POD}---\n{}\n", deep(false)), false);
        assert!(!p.complete);
        assert_eq!(p.pods.len(), 1, "the document before is read");
        assert_eq!(p.errors.len(), 1, "{:?}", p.errors);
        assert!(
            p.errors[0].contains("document 2: invalid YAML: collections nested deeper than 64 levels (line 9, column"),
            "{:?}",
            p.errors
        );
        // JSON: serde_json's recursion limit (128) stops a deep value...
        let p = parse_manifest(&deep(true), true);
        assert!(!p.complete);
        assert!(
            p.errors[0].contains("invalid JSON: recursion limit exceeded"),
            "{:?}",
            p.errors
        );
        // ... and skips an unknown field however deep without recursing
        // (in linear time), as any unknown field.
        let n = 100_000;
        let text = format!(
            "{{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{{\"name\":\"p\",\"namespace\":\"ns\"}},\"x\":{}1{}}}",
            "{\"a\":".repeat(n),
            "}".repeat(n)
        );
        let p = parse_manifest(&text, true);
        assert!(p.complete && p.pods.len() == 1, "{:?}", p.errors);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deeply_nested_file_does_not_hold_other_pods_back() {
        let (_root, dir, vm, mut src) = source_on_temp_dirs();
        put(dir.path(), "deep.yaml", &deep(false));
        put(dir.path(), "deep.json", &deep(true));
        put(dir.path(), "pod.yaml", POD);
        // Bounded, so that a regression fails instead of taking minutes.
        tokio::time::timeout(Duration::from_secs(60), src.rescan())
            .await
            .expect("the rescan finishes");
        assert!(vm
            .world()
            .dsw()
            .pod(&PodUid::new("uid-a").unwrap())
            .is_some());
        let st = vm.status();
        for (file, error) in [
            ("deep.yaml", "nested deeper than 64 levels"),
            ("deep.json", "recursion limit exceeded"),
        ] {
            assert!(
                st.errors
                    .iter()
                    .any(|e| e.source.ends_with(file) && e.error.contains(error)),
                "{file}: {:?}",
                st.errors
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_duplicate_pod_is_admitted_once_its_owner_file_goes() {
        let (_root, dir, vm, mut src) = source_on_temp_dirs();
        let d = dir.path();
        let name_of = |vm: &VolumeManager| {
            vm.world()
                .dsw()
                .pod(&PodUid::new("uid-a").unwrap())
                .map(|p| p.name.clone())
        };
        put(d, "a.yaml", POD);
        src.rescan().await;
        put(d, "b.yaml", &POD.replace("name: a,", "name: b,"));
        src.rescan().await;
        assert_eq!(name_of(&vm).as_deref(), Some("a"));
        // The owner goes: b.yaml (unchanged on disk) now defines the pod.
        std::fs::remove_file(d.join("a.yaml")).unwrap();
        src.rescan().await;
        assert_eq!(name_of(&vm).as_deref(), Some("b"));
        // Likewise when the owner file stops defining it.
        put(d, "c.yaml", &POD.replace("name: a,", "name: c,"));
        src.rescan().await;
        put(d, "b.yaml", &POD.replace("uid-a", "uid-other"));
        src.rescan().await;
        assert_eq!(name_of(&vm).as_deref(), Some("c"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pods_are_re_resolved_when_their_objects_change() {
        let (_root, dir, vm, mut src) = source_on_temp_dirs();
        vm.register_plugin(Arc::new(CsiStandIn)).unwrap();
        let d = dir.path();
        put(d, "pod.yaml", PVC_POD);
        src.rescan().await;
        let e = volume_of(&vm, "uid-p").unwrap_err();
        assert!(
            e.contains("PersistentVolumeClaim ns/claim not found"),
            "{e}"
        );

        // The claim appears, not bound yet; then the PV binds it by claimRef.
        put(d, "pvc.yaml", "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: claim, namespace: ns}\nspec: {}\n");
        src.rescan().await;
        let e = volume_of(&vm, "uid-p").unwrap_err();
        assert!(e.contains("is not bound"), "{e}");
        // The PV needs a stage secret that is missing; then it appears (its
        // value never in status).
        put(d, "pv.yaml", &pv_yaml("64Mi", true));
        src.rescan().await;
        let e = volume_of(&vm, "uid-p").unwrap_err();
        assert!(e.contains("Secret ns/creds not found"), "{e}");
        put(
            d,
            "secret.json",
            r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"creds","namespace":"ns"},"stringData":{"password":"hunter2"}}"#,
        );
        src.rescan().await;
        let c = volume_of(&vm, "uid-p").unwrap();
        assert_eq!(
            (c.volume_handle.as_str(), c.capacity_bytes),
            ("vol-1", Some(64 << 20))
        );
        assert_eq!(c.node_stage_secrets.unwrap().0["password"], "hunter2");
        let json = serde_json::to_string(&vm.status()).unwrap();
        assert!(!json.contains("hunter2"), "{json}");

        // A resize raises the desired capacity.
        put(d, "pv.yaml", &pv_yaml("128Mi", true));
        src.rescan().await;
        assert_eq!(
            volume_of(&vm, "uid-p").unwrap().capacity_bytes,
            Some(128 << 20)
        );

        // A half-written PV file keeps the last good PV and reports the error.
        put(
            d,
            "pv.yaml",
            "apiVersion: v1\nkind: PersistentVolume\nmetadata: [\n",
        );
        src.rescan().await;
        assert_eq!(
            volume_of(&vm, "uid-p").unwrap().capacity_bytes,
            Some(128 << 20)
        );
        let st = vm.status();
        assert!(
            st.errors
                .iter()
                .any(|e| e.source.ends_with("pv.yaml") && e.error.contains("invalid YAML")),
            "{:?}",
            st.errors
        );
        put(d, "pv.yaml", &pv_yaml("128Mi", true));
        src.rescan().await;

        // The same object in two files: the second is refused.
        put(d, "dup.yaml", &pv_yaml("1Gi", true));
        src.rescan().await;
        assert_eq!(
            volume_of(&vm, "uid-p").unwrap().capacity_bytes,
            Some(128 << 20)
        );
        assert!(vm
            .status()
            .errors
            .iter()
            .any(|e| e.source.ends_with("dup.yaml")
                && e.error
                    .contains("PersistentVolume pv-1 is already defined in")));
        std::fs::remove_file(d.join("dup.yaml")).unwrap();

        // The PV goes away with its file: the pod's volume stays as last
        // resolved (like the kubelet), and the problem shows in status.
        std::fs::remove_file(d.join("pv.yaml")).unwrap();
        src.rescan().await;
        assert_eq!(
            volume_of(&vm, "uid-p").unwrap().capacity_bytes,
            Some(128 << 20)
        );
        let stale = |vm: &VolumeManager| {
            vm.status()
                .errors
                .into_iter()
                .find(|e| e.source == "pod ns/p (uid-p)")
                .map(|e| e.error)
        };
        let e = stale(&vm).expect("stale volume reported");
        assert!(
            e.contains("is not bound") && e.contains("stays as last resolved"),
            "{e}"
        );
        put(d, "pv.yaml", &pv_yaml("128Mi", true));
        src.rescan().await;
        assert_eq!(stale(&vm), None);

        // A changed pod is resolved afresh: a volume that no longer
        // resolves (a claim that does not exist) keeps its desired state,
        // the error on the pod (the kubelet's populator for a pod it
        // processed before: nothing torn down under a running pod).
        put(
            d,
            "pod.yaml",
            &PVC_POD.replace("claimName: claim", "claimName: other"),
        );
        src.rescan().await;
        assert_eq!(
            volume_of(&vm, "uid-p").unwrap().capacity_bytes,
            Some(128 << 20)
        );
        let e = vm.status().pods[0].error.clone().unwrap();
        assert!(
            e.contains("PersistentVolumeClaim ns/other not found"),
            "{e}"
        );

        // A pod that no longer uses a PVC stops being re-resolved.
        put(
            d,
            "pod.yaml",
            &PVC_POD.replace("persistentVolumeClaim: {claimName: claim}", "emptyDir: {}"),
        );
        src.rescan().await;
        assert!(src.resolver.follows_no_pod());
        put(d, "pv.yaml", &pv_yaml("64Mi", false));
        src.rescan().await;
        std::fs::remove_file(d.join("pod.yaml")).unwrap();
        src.rescan().await;
        assert!(vm
            .world()
            .dsw()
            .pod(&PodUid::new("uid-p").unwrap())
            .is_none());
        assert!(src.resolver.follows_no_pod());
    }
}
