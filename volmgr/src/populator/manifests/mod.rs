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
//! [`crate::populator::objects::ObjectStore`]), and when one of them appears, changes or
//! disappears, the pods that read it are re-resolved (a missing object's
//! volume error clears itself; a PV whose capacity grew raises the desired
//! size). Like the kubelet, a volume that resolved once is not torn down
//! because its PVC, PV or Secret went away: it keeps its desired state and
//! the problem shows on the pod in status (`pods[].error`) until the object
//! is back. Secret values are never logged nor shown in status.
//!
//! A file that cannot be read or parsed keeps the pods and objects it last
//! defined (a half-written edit must not tear volumes down) and shows the
//! error in status; a removed file removes its pods and objects.

pub mod block_yaml;
mod parse;
mod read;
pub mod yaml_depth;

pub use parse::{parse_manifest, ParsedFile};

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use nix::sys::inotify::AddWatchFlags;
use tokio::sync::watch;

use crate::populator::convert::pod::{DesiredPod, PodRejected};
use crate::populator::convert::VolumeSpecError;
use crate::populator::objects::{KubeObject, ObjectRef};
use crate::populator::resolver::{PodResolver, Resolvable};
use crate::populator::PodSink;
use crate::sys::inotify::{self, WatchError};
use crate::util::fast_map::FastMap;
use crate::volume::PodUid;
use read::{is_manifest_name, read_file, FileKey, FileRead};

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

#[derive(Debug, Default)]
struct FileState {
    key: Option<FileKey>,
    pods: Vec<PodUid>,
    objects: Vec<ObjectRef>,
}

/// Files read before the first batch is applied (small: mounting starts early).
pub(crate) const FIRST_BATCH: usize = 32;
/// Files per batch after the first.
const BATCH: usize = 64;

/// The manifests-directory source.
pub struct ManifestsSource {
    dir: PathBuf,
    sink: Arc<dyn PodSink>,
    rescan_period: Duration,
    files: FastMap<OsString, FileState>,
    /// Which file defines each pod (a second definition is rejected).
    owners: FastMap<PodUid, OsString>,
    /// The objects of every file and the pods that read them.
    resolver: PodResolver,
    /// Which file defines each object (a second definition is refused).
    object_owners: FastMap<ObjectRef, OsString>,
    /// New pods of the files being synced whose volumes need objects not
    /// read yet (a PVC in a file that sorts later): resolved once every
    /// file of the sync is applied, so they never show a passing "not
    /// found". Their UIDs are reserved for their files meanwhile.
    waiting: Vec<(OsString, Arc<Pod>)>,
    /// Files that had a pod refused because another file defines its UID:
    /// read again when that UID is released.
    duplicates: FastMap<PodUid, BTreeSet<OsString>>,
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
            files: FastMap::default(),
            owners: FastMap::default(),
            object_owners: FastMap::default(),
            waiting: Vec::new(),
            duplicates: FastMap::default(),
            reread: BTreeSet::new(),
        }
    }

    /// Whether no pod of the source reads an object (its resolver follows
    /// none): for the tests a layer up, which drive the source through the
    /// manager.
    #[cfg(test)]
    pub(crate) fn follows_no_pod(&self) -> bool {
        self.resolver.follows_no_pod()
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
            self.resolver.admit(&pod.uid, resolvable);
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

#[cfg(test)]
pub(crate) mod tests;
