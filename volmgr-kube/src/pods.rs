//! The Kubernetes API as a source of pods, as the kubelet's API pod source
//! and its desired-state populator use it:
//!
//! - the node's pods by a kube-rs watcher with
//!   `fieldSelector=spec.nodeName=NODE` (list, then watch from the list's
//!   resourceVersion with bookmarks; a relist after `410 Gone`; backoff with
//!   jitter on errors). A relist ends with the full set of pods: a pod not in
//!   it was deleted meanwhile and is torn down; the others are converted
//!   again only if their spec or metadata changed, so nothing is mounted
//!   twice. An API server that is down or answers 5xx tears nothing down;
//!   volumes of pods no source knows are only cleaned once the first list
//!   came through and every pod it listed has had its objects read (a pod
//!   still waiting for them is not in the desired state yet: counting the
//!   source as ready before would tear down the volumes a restarted agent
//!   found mounted for it, as if the pod were gone).
//! - A pod's volumes are torn down when the pod is deleted, when its phase
//!   is `Succeeded` or `Failed`, or when its deletion was requested and
//!   none of its containers runs any more (the kubelet's `notRunning`);
//!   with a container runtime to ask ([`ApiPodSource::with_container_runtime`]),
//!   only once the runtime lists nothing of it running
//!   ([`super::ending_pods`]).
//! - The objects the pods read, as the Node authorizer lets a node's own
//!   credentials (`system:node:NAME`) read them, never a cluster-wide list:
//!   PersistentVolumeClaims, PersistentVolumes, VolumeAttachments and the
//!   ServiceAccounts their tokens are requested for by `get`, read again on
//!   a schedule ([`super::object_get`]); Secrets, ConfigMaps, CSIDrivers
//!   and this Node (local PVs' node affinity) each by its own watch with
//!   `fieldSelector=metadata.name=NAME` in its namespace. A read starts
//!   when a pod first refers to the object and stops when no pod does; a
//!   change re-resolves exactly the pods that read the object
//!   ([`PodResolver`]); the first read waits 200 ms, about as the kubelet's
//!   populator loop (100 ms) does (the Node authorizer's graph may not have the pod
//!   yet when its watch event arrives). A pod waits until every object it
//!   reads has been read (found or not), so nothing is set up on a
//!   resolution made before its objects were read; while it waits (an
//!   object the server refuses or cannot serve), what is mounted for it
//!   stays (it is *held*), and it holds nothing else back: the source
//!   counts as populated once the list is done and every object was tried
//!   once. A ServiceAccount the
//!   credentials may not read counts as not found (only its UID is used,
//!   see [`volmgr::populator::resolve::ObjectLookup::service_account`]).
//! - A pod held because one of its claims, or the volume a claim is bound
//!   to, cannot be read gets the kubelet's `Warning` `FailedMount` event
//!   (`Unable to attach or mount volumes: unmounted volumes=[data],
//!   unattached volumes=[], failed to process volumes=[data]: error
//!   processing PVC default/data: failed to fetch PVC from API server:
//!   <the server's message>`, [`super::events::wait_for_attach_and_mount`])
//!   when the source records events ([`ApiPodSource::with_events`]): once
//!   per change of what it says, rate-limited per pod.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use futures_util::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use volmgr::populator::convert::pod::is_terminated;
use volmgr::populator::convert::PayloadResolution;
use volmgr::populator::objects::{Kind, KindVisitor, ObjectKind, ObjectRef};
use volmgr::populator::{sub_path_status, PodResolver, PodSink, SubPathTiming};

use super::ending_pods::{EndingPods, Outcome, RuntimeAnswer};
use super::events::{wait_for_attach_and_mount, PodEvent, SourceEvents, SourcePodEvent};
use super::object_get;
use super::object_update::{watch_cause, ObjectUpdate};
use super::problems::ApiProblems;
use volmgr::cri::RuntimeClient;
use volmgr::volume::PodUid;

/// How many watch events are applied under one hold of the reconciler's
/// wake-ups (a burst of pods is one reconciler pass, not one per pod).
const BATCH: usize = 256;

/// How long after a pod first refers to an object it is first read: the
/// Node authorizer lets a node read an object only once its own graph has
/// the pod that refers to it, and that graph follows the pods through the
/// server's own informer, which a pod watch can outrun (a claim read 4 ms
/// after its pod was created was refused on a real server). The kubelet
/// reads a new pod's objects from its desired-state populator's loop,
/// every 100 ms; twice that leaves a loaded server's informer time too.
const FIRST_READ_DELAY: std::time::Duration = std::time::Duration::from_millis(200);

/// A pod this source delivered.
struct KnownPod {
    /// `namespace/name`, for status.
    key: String,
    /// The pod as converted (status and bookkeeping fields cleared), to
    /// skip updates that change nothing a volume depends on.
    converted: Arc<Pod>,
    /// Whether it was rejected as a whole (its problem shows in status).
    rejected: bool,
}

/// The API pod source (see the module documentation).
pub struct ApiPodSource {
    client: Client,
    node: String,
    sink: Arc<dyn PodSink>,
    resolver: PodResolver,
    /// Delivered pods by `metadata.uid`.
    pods: HashMap<String, KnownPod>,
    /// During a (re)list: the pods listed so far.
    relist: Option<HashSet<String>>,
    /// Whether the first list came through.
    listed: bool,
    /// Whether the sink was told the desired state is populated.
    populated: bool,
    /// One watch (or `get` loop) per referenced object.
    watches: HashMap<ObjectRef, JoinHandle<()>>,
    /// The watched objects whose watch or read reported once (found,
    /// absent or unreadable): the source is populated once all have.
    reported: HashSet<ObjectRef>,
    updates_tx: mpsc::Sender<(ObjectRef, ObjectUpdate)>,
    updates_rx: mpsc::Receiver<(ObjectRef, ObjectUpdate)>,
    /// Why lists and watches fail, for status.
    problems: Arc<ApiProblems>,
    /// The followed objects tried but never read (refused, or the server
    /// failing), with the error as client-go prints it: the pods reading
    /// them are held.
    unread: HashMap<ObjectRef, String>,
    /// Where events on pods go, if the source records any.
    events: Option<SourceEvents>,
    /// The `FailedMount` note last recorded per held pod (by UID).
    recorded: HashMap<String, String>,
    /// Pods that ended stay, marked terminated, until deleted (observe
    /// mode: they are the kubelet's until then).
    keep_ended: bool,
    /// Pods gone (deleted, ended, moved) whose runtime is asked before
    /// their volumes go, when the source has a runtime to ask.
    ending: Option<EndingPods<KnownPod>>,
}

impl ApiPodSource {
    /// A source of the pods bound to `node`, writing to `sink`.
    pub fn new(client: Client, node: &str, sink: Arc<dyn PodSink>) -> Self {
        let (updates_tx, updates_rx) = mpsc::channel(1024);
        let mut resolver = PodResolver::with_confirmation(Arc::clone(&sink));
        resolver.set_node_name(node);
        // Containers start as the status says: each one's subPaths are
        // prepared once the init containers before it are done.
        resolver.set_sub_path_timing(SubPathTiming::FromStatus);
        let problems = ApiProblems::new(Arc::clone(&sink), "the client's configuration");
        Self {
            problems,
            client,
            node: node.to_string(),
            resolver,
            sink,
            pods: HashMap::new(),
            relist: None,
            listed: false,
            populated: false,
            watches: HashMap::new(),
            reported: HashSet::new(),
            updates_tx,
            updates_rx,
            unread: HashMap::new(),
            events: None,
            recorded: HashMap::new(),
            keep_ended: false,
            ending: None,
        }
    }

    /// Before a pod's volumes are torn down (deleted, ended, moved off the
    /// node), waits until `runtime` lists none of its containers running
    /// and none of its sandboxes ready ([`super::ending_pods`]).
    pub fn with_container_runtime(mut self, runtime: RuntimeClient) -> Self {
        self.ending = Some(EndingPods::new(runtime));
        self
    }

    /// Keeps the pods that ended ([`is_terminated`]) in the desired state,
    /// marked terminated (none of their volumes needed), until they are
    /// deleted or leave the node, rather than removing them: observe mode,
    /// where such a pod's directory is still the kubelet's.
    pub fn keeping_ended_pods(mut self, keep: bool) -> Self {
        self.keep_ended = keep;
        self
    }

    /// Records the kubelet's `FailedMount` on pods held for a claim (or its
    /// volume) that cannot be read, through `events` (manager mode; an
    /// observer records none: the node's kubelet does).
    pub fn with_events(mut self, events: SourceEvents) -> Self {
        self.events = Some(events);
        self
    }

    /// Names where the client's CA comes from in TLS errors (e.g.
    /// `kubeconfig /etc/kubeconfig`).
    pub fn with_ca_origin(mut self, ca: &str) -> Self {
        self.problems = ApiProblems::new(Arc::clone(&self.sink), ca);
        self
    }

    /// Resolves the pods' payload volumes as `payloads` says. With
    /// [`PayloadResolution::NamesOnly`] (observe mode) the source reads,
    /// watches and waits for no ConfigMap, Secret, ClusterTrustBundle,
    /// ServiceAccount, nor this Node: the Node's allocatable (downwardAPI
    /// limits, a memory emptyDir's size) and labels (local PVs' node
    /// affinity, checked by the kubelet) change no volume's name either.
    pub fn with_payload_resolution(mut self, payloads: PayloadResolution) -> Self {
        self.resolver.set_payload_resolution(payloads);
        if payloads == PayloadResolution::NamesOnly {
            self.resolver.set_node_name("");
        }
        self
    }

    /// Follows the node's pods and the objects they read until `shutdown`.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let api: Api<Pod> = Api::all(self.client.clone());
        let config =
            super::transport::watcher_config().fields(&format!("spec.nodeName={}", self.node));
        let mut pods = watcher::watcher(api, config)
            .backoff(super::backoff::watch_backoff())
            .boxed();
        tracing::info!(node = %self.node, "following the node's pods on the API server");
        loop {
            tokio::select! {
                () = volmgr::util::shutdown::requested(&mut shutdown) => break,
                ev = pods.next() => {
                    let Some(ev) = ev else { break };
                    let _hold = self.sink.hold_wakes();
                    self.on_pod_event(ev);
                    for _ in 1..BATCH {
                        match pods.next().now_or_never() {
                            Some(Some(ev)) => self.on_pod_event(ev),
                            _ => break,
                        }
                    }
                    self.sync_watches();
                    // A deleted pod may have been the last one waiting.
                    self.set_populated_when_settled();
                    self.record_waits();
                }
                answer = next_runtime_answer(&mut self.ending) => {
                    let _hold = self.sink.hold_wakes();
                    self.on_runtime_answer(answer);
                }
                Some((r, update)) = self.updates_rx.recv() => {
                    let _hold = self.sink.hold_wakes();
                    self.on_object(r, update);
                    while let Ok((r, update)) = self.updates_rx.try_recv() {
                        self.on_object(r, update);
                    }
                    self.sync_watches();
                    self.set_populated_when_settled();
                    self.record_waits();
                }
            }
        }
        for (_, task) in self.watches.drain() {
            task.abort();
        }
    }

    fn on_pod_event(&mut self, ev: Result<Event<Pod>, watcher::Error>) {
        // `Init` only starts a (re)list: not a sign the server answers.
        if matches!(&ev, Ok(e) if !matches!(e, Event::Init)) {
            self.problems.works("pods");
        }
        match ev {
            Ok(Event::Init) => self.relist = Some(HashSet::new()),
            Ok(Event::InitApply(pod)) => {
                if let (Some(listed), Some(uid)) = (&mut self.relist, &pod.metadata.uid) {
                    listed.insert(uid.clone());
                }
                self.apply_pod(pod);
            }
            Ok(Event::InitDone) => self.finish_relist(),
            Ok(Event::Apply(pod)) => self.apply_pod(pod),
            Ok(Event::Delete(pod)) => {
                if let Some(uid) = &pod.metadata.uid {
                    self.remove_pod(uid);
                }
            }
            // The watcher retries with backoff; nothing is torn down. The
            // cause shows in status (and the log, once per change).
            Err(e) => {
                tracing::debug!(node = %self.node, error = %e, "pod watch failed; retrying");
                self.problems.failed("pods", &e);
            }
        }
    }

    /// The end of a (re)list: pods not listed are gone.
    fn finish_relist(&mut self) {
        let Some(listed) = self.relist.take() else {
            return;
        };
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|uid| !listed.contains(*uid))
            .cloned()
            .collect();
        for uid in gone {
            tracing::info!(pod = %uid, "pod gone from the API server's list");
            self.remove_pod(&uid);
        }
        // Populated once the objects these pods read were tried: after the
        // batch's `sync_watches` (see `run`).
        self.listed = true;
    }

    /// Tells the sink the desired state is populated once the first list
    /// is done and every object the listed pods read was tried once
    /// (found, absent, or unreadable). A pod still held back for an
    /// object that cannot be read is not gone: the sink keeps what is
    /// mounted for it (`PodSink::set_held`), and it holds no other pod's
    /// tear-down back.
    fn set_populated_when_settled(&mut self) {
        if self.populated || !self.listed || self.watches.keys().any(|r| !self.reported.contains(r))
        {
            return;
        }
        self.populated = true;
        tracing::info!(
            pods = self.pods.len(),
            "initial pod list from the API server done and the listed pods' objects read"
        );
        self.sink.set_populated();
    }

    fn apply_pod(&mut self, pod: Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(self.node.as_str()) {
            // Not (or no longer) this node's.
            self.remove_pod(&uid);
            return;
        }
        let ended = is_terminated(&pod);
        if ended && !self.keep_ended {
            self.remove_pod(&uid);
            return;
        }
        // Back before its runtime was gone (not seen in practice: UIDs are
        // not reused): converted again below, then what was kept released.
        let returning = self
            .ending
            .as_mut()
            .and_then(|e| e.take(&uid))
            .map(|(key, _)| self.sink.set_source_problems(&key, vec![], vec![]))
            .is_some();
        if !ended
            && pod.metadata.deletion_timestamp.is_some()
            && self.stop_reading_terminating(&uid)
        {
            return;
        }
        let mut converted = for_conversion(pod);
        if ended {
            // What conversion reads as ended.
            converted.status.get_or_insert_with(Default::default).phase = Some("Succeeded".into());
        }
        let converted = Arc::new(converted);
        if self
            .pods
            .get(&uid)
            .is_some_and(|k| k.converted == converted)
        {
            return;
        }
        let key = pod_key(&converted);
        let was_rejected = self.pods.get(&uid).is_some_and(|k| k.rejected);
        let rejected = match self.resolver.upsert_pod(Arc::clone(&converted)) {
            Ok(_) => {
                if was_rejected {
                    self.sink.set_source_problems(&key, vec![], vec![]);
                }
                false
            }
            Err(r) => {
                tracing::warn!(pod = %key, reason = %r.reason, "pod rejected");
                self.sink.set_source_problems(&key, vec![], vec![r]);
                true
            }
        };
        if returning {
            if let Ok(pod_uid) = PodUid::new(&uid) {
                self.resolver.release_kept(&pod_uid);
            }
        }
        self.pods.insert(
            uid,
            KnownPod {
                key,
                converted,
                rejected,
            },
        );
    }

    /// A known pod whose deletion began and whose containers may still run:
    /// nothing of it is read again and its desired volumes stay as they are
    /// ([`PodResolver::stop_reading`]) until it ends or goes. Whether its
    /// update is to be skipped (not when it is new or was rejected: it is
    /// then converted as any other).
    fn stop_reading_terminating(&mut self, uid: &str) -> bool {
        let (Some(known), Ok(pod_uid)) = (self.pods.get(uid), PodUid::new(uid)) else {
            return false;
        };
        if known.rejected {
            return false;
        }
        if self.resolver.stop_reading(&pod_uid) {
            tracing::info!(pod = %known.key, %uid, "pod terminating: its objects are not read again");
        }
        true
    }

    /// A pod gone: its volumes are torn down now, or once its runtime is
    /// gone when the source has a runtime to ask.
    fn remove_pod(&mut self, uid: &str) {
        let Some(known) = self.pods.remove(uid) else {
            return;
        };
        if let (Some(ending), Ok(pod_uid)) = (&mut self.ending, PodUid::new(uid)) {
            tracing::info!(pod = %known.key, %uid, "pod gone: its volumes stay until the container runtime says nothing of it runs");
            if known.rejected {
                self.sink.set_source_problems(&known.key, vec![], vec![]);
            }
            // Nothing of it is read (the Node authorizer refuses a gone
            // pod's objects) nor set up any more; what is mounted stays.
            self.resolver.delete_pod_keeping_mounts(&pod_uid);
            let key = known.key.clone();
            ending.start(uid, key, known);
            return;
        }
        self.delete_known(uid, known);
    }

    /// The runtime answered about a pod waiting for it.
    fn on_runtime_answer(&mut self, answer: RuntimeAnswer) {
        let Some(ending) = &mut self.ending else {
            return;
        };
        match ending.on_answer(answer) {
            Outcome::Removed { uid, key, .. } => {
                tracing::info!(pod = %key, %uid, "nothing of the pod runs any more: tearing its volumes down");
                self.sink.set_source_problems(&key, vec![], vec![]);
                if let Ok(uid) = PodUid::new(&uid) {
                    self.resolver.release_kept(&uid);
                }
            }
            Outcome::Waiting { key, note } => {
                tracing::warn!(pod = %key, "{note}");
                self.sink.set_source_problems(&key, vec![note], vec![]);
            }
            Outcome::Unchanged => {}
        }
    }

    /// Removes a pod from the desired state: its volumes are torn down.
    fn delete_known(&mut self, uid: &str, known: KnownPod) {
        if known.rejected {
            self.sink.set_source_problems(&known.key, vec![], vec![]);
        }
        if let Ok(uid) = PodUid::new(uid) {
            if self.keep_ended {
                // Observe mode tears nothing down: the kubelet does.
                tracing::info!(pod = %known.key, %uid, "pod removed from the node");
            } else {
                tracing::info!(pod = %known.key, %uid, "pod removed: tearing its volumes down");
            }
            self.resolver.delete_pod(&uid);
        }
    }

    fn on_object(&mut self, r: ObjectRef, update: ObjectUpdate) {
        if !self.watches.contains_key(&r) {
            // A late message from a watch just dropped.
            return;
        }
        let newly = self.reported.insert(r.clone());
        if let ObjectUpdate::Unreadable(cause) = update {
            // Tried: the pods reading it stay held (status says why). One
            // read before keeps them as they were: they are not held.
            if newly || self.unread.contains_key(&r) {
                self.unread.insert(r, cause);
            }
            return;
        }
        self.unread.remove(&r);
        if r.is_any() {
            match update {
                ObjectUpdate::Listed(all) => self.resolver.confirm_kind(r.kind, all),
                ObjectUpdate::Present(obj) => {
                    self.resolver.confirm_object(&obj.reference(), Some(obj))
                }
                ObjectUpdate::Deleted(gone) => self.resolver.confirm_object(&gone, None),
                ObjectUpdate::Absent | ObjectUpdate::Unreadable(_) => {}
            }
            return;
        }
        match update {
            ObjectUpdate::Present(obj) if obj.reference() == r => {
                self.resolver.confirm_object(&r, Some(obj));
            }
            ObjectUpdate::Present(obj) => {
                tracing::warn!(object = %r, got = %obj.reference(), "watch answered another object; ignored");
            }
            ObjectUpdate::Absent => self.resolver.confirm_object(&r, None),
            ObjectUpdate::Unreadable(_) => {}
            ObjectUpdate::Listed(_) | ObjectUpdate::Deleted(_) => {
                tracing::warn!(object = %r, "a whole-kind update from a watch by name; ignored")
            }
        }
    }

    /// Records `FailedMount` on each pod held for a claim or volume that
    /// cannot be read, when what it would say changed (rate-limited per pod
    /// by the events' token bucket); forgets the pods no longer held so.
    fn record_waits(&mut self) {
        let Some(events) = &self.events else {
            return;
        };
        if self.unread.is_empty() && self.recorded.is_empty() {
            return;
        }
        let mut waiting = Vec::new();
        for (uid, known) in &self.pods {
            if known.rejected {
                continue;
            }
            if let Some(ev) = self.wait_event(&known.converted) {
                waiting.push((uid.clone(), ev));
            }
        }
        self.recorded
            .retain(|uid, _| waiting.iter().any(|(u, _)| u == uid));
        for (uid, event) in waiting {
            if self.recorded.get(&uid) == Some(&event.note) {
                continue;
            }
            let Some(known) = self.pods.get(&uid) else {
                continue;
            };
            let Ok(pod_uid) = PodUid::new(&uid) else {
                continue;
            };
            let meta = &known.converted.metadata;
            self.recorded.insert(uid, event.note.clone());
            events.send(SourcePodEvent {
                uid: pod_uid,
                namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
                name: meta.name.clone().unwrap_or_default(),
                event,
            });
        }
    }

    /// The kubelet's `FailedMount` for `pod` if a claim one of its
    /// containers uses, or the volume it is bound to, cannot be read: as
    /// its desired-state populator says it (`error processing PVC ns/c:
    /// failed to fetch PVC from API server: ...`, or `failed to fetch PV
    /// pv from API server: ...`), each such volume unmounted and not
    /// processed.
    fn wait_event(&self, pod: &Pod) -> Option<PodEvent> {
        let spec = pod.spec.as_ref()?;
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
        let used = used_volumes(pod);
        let mut failed = Vec::new();
        let mut errors = Vec::new();
        for v in spec.volumes.iter().flatten() {
            if !used.contains(v.name.as_str()) {
                continue;
            }
            let claim = match (&v.persistent_volume_claim, &v.ephemeral) {
                (Some(c), _) => c.claim_name.clone(),
                (None, Some(_)) => format!("{pod_name}-{}", v.name),
                (None, None) => continue,
            };
            let pvc = ObjectRef::new(ObjectKind::PersistentVolumeClaim, ns, &claim);
            let error = if let Some(cause) = self.unread.get(&pvc) {
                format!("failed to fetch PVC from API server: {cause}")
            } else {
                let pv = self
                    .resolver
                    .objects()
                    .get::<PersistentVolumeClaim>(ns, &claim)
                    .and_then(|c| c.spec.as_ref()?.volume_name.clone())
                    .filter(|pv| !pv.is_empty());
                let Some(pv) = pv else { continue };
                let r = ObjectRef::new(ObjectKind::PersistentVolume, "", &pv);
                let Some(cause) = self.unread.get(&r) else {
                    continue;
                };
                format!("failed to fetch PV {pv} from API server: {cause}")
            };
            failed.push(v.name.clone());
            errors.push(format!("error processing PVC {ns}/{claim}: {error}"));
        }
        if failed.is_empty() {
            return None;
        }
        Some(wait_for_attach_and_mount(&failed, &[], &failed, &errors))
    }

    /// Starts a watch for every object a pod reads that has none, and
    /// stops those no pod reads any more (forgetting their objects).
    fn sync_watches(&mut self) {
        // One watch per object, or per kind for a kind followed whole; no
        // other wildcard (any PV) is watched: a node may not list those.
        let wanted: BTreeSet<ObjectRef> = self
            .resolver
            .referenced_objects()
            .into_iter()
            .filter_map(|r| match (r.kind.followed_whole(), r.is_any()) {
                (true, _) => Some(ObjectRef::any(r.kind)),
                (false, true) => None,
                (false, false) => Some(r),
            })
            .collect();
        let dropped: Vec<ObjectRef> = self
            .watches
            .keys()
            .filter(|r| !wanted.contains(*r))
            .cloned()
            .collect();
        for r in dropped {
            if let Some(task) = self.watches.remove(&r) {
                task.abort();
            }
            self.reported.remove(&r);
            self.unread.remove(&r);
            self.resolver.unconfirm_object(&r);
            self.problems.works(&r.to_string());
            tracing::debug!(object = %r, "no pod reads it any more: watch stopped");
        }
        for r in wanted {
            if !self.watches.contains_key(&r) {
                tracing::debug!(object = %r, "watching");
                let task = tokio::spawn(watch_object(
                    self.client.clone(),
                    r.clone(),
                    self.updates_tx.clone(),
                    Arc::clone(&self.problems),
                ));
                self.watches.insert(r, task);
            }
        }
    }
}

/// The volumes a pod's containers (init, app and ephemeral) mount or map:
/// the kubelet processes only those (`GetPodVolumeNames`).
/// The runtime's next answer about a pod waiting for it (never, without a
/// runtime to ask).
async fn next_runtime_answer(ending: &mut Option<EndingPods<KnownPod>>) -> RuntimeAnswer {
    match ending {
        Some(e) => e.next().await,
        None => std::future::pending().await,
    }
}

fn used_volumes(pod: &Pod) -> HashSet<&str> {
    let mut used = HashSet::new();
    let Some(spec) = pod.spec.as_ref() else {
        return used;
    };
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in containers {
        used.extend(c.volume_mounts.iter().flatten().map(|m| m.name.as_str()));
        used.extend(c.volume_devices.iter().flatten().map(|d| d.name.as_str()));
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        used.extend(c.volume_mounts.iter().flatten().map(|m| m.name.as_str()));
        used.extend(c.volume_devices.iter().flatten().map(|d| d.name.as_str()));
    }
    used
}

/// `namespace/name` of a pod.
fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// The pod without what changes all the time and no volume depends on
/// (status, resourceVersion, managed fields): two updates that differ only
/// there convert to the same desired pod. Of the status, only the init
/// containers that are done stay: a container's subPaths are prepared once
/// the init containers before it are ([`sub_path_status`]).
fn for_conversion(mut pod: Pod) -> Pod {
    pod.status = sub_path_status(&pod);
    pod.metadata.resource_version = None;
    pod.metadata.managed_fields = None;
    pod.metadata.generation = None;
    pod
}

/// Follows one object until the task is aborted: by `get`
/// ([`object_get::poll`]) for the kinds a node may only get, else
/// [`follow`] by name (a kind followed whole is listed and watched whole),
/// [`FIRST_READ_DELAY`] after a pod first referred to it.
async fn watch_object(
    client: Client,
    r: ObjectRef,
    tx: mpsc::Sender<(ObjectRef, ObjectUpdate)>,
    problems: Arc<ApiProblems>,
) {
    if r.kind.followed_whole() {
        return super::trust_bundles::follow_all(client, r, tx).await;
    }
    tokio::time::sleep(FIRST_READ_DELAY).await;
    let by_get = object_get::read_by_get(r.kind);
    r.kind
        .visit(FollowKind {
            client,
            by_get,
            out: Followed { tx, problems },
            r,
        })
        .await
}

/// [`follow`] or [`object_get::poll`] for a kind learnt at run time.
struct FollowKind {
    client: Client,
    r: ObjectRef,
    /// Read by `get` rather than watched.
    by_get: bool,
    out: Followed,
}

impl FollowKind {
    fn run<K: Kind>(self, api: Api<K>) -> futures_util::future::BoxFuture<'static, ()> {
        if self.by_get {
            let Followed { tx, problems } = self.out;
            Box::pin(object_get::poll(api, self.r, tx, problems))
        } else {
            Box::pin(follow(api, self.r, self.out))
        }
    }
}

impl KindVisitor for FollowKind {
    type Out = futures_util::future::BoxFuture<'static, ()>;
    fn namespaced<K: Kind + k8s_openapi::Resource<Scope = NamespaceResourceScope>>(
        self,
    ) -> Self::Out {
        let api = Api::<K>::namespaced(self.client.clone(), &self.r.namespace);
        self.run(api)
    }
    fn cluster<K: Kind + k8s_openapi::Resource<Scope = ClusterResourceScope>>(self) -> Self::Out {
        let api = Api::<K>::all(self.client.clone());
        self.run(api)
    }
}

/// Where a watch of one object sends what it finds, and its problems.
struct Followed {
    tx: mpsc::Sender<(ObjectRef, ObjectUpdate)>,
    problems: Arc<ApiProblems>,
}

/// Lists and watches the one object `r` names, sending what it finds.
async fn follow<K: Kind>(api: Api<K>, r: ObjectRef, out: Followed) {
    let Followed { tx, problems } = out;
    let what = r.to_string();
    let config = super::transport::watcher_config().fields(&format!("metadata.name={}", r.name));
    let mut events = watcher::watcher(api, config)
        .backoff(super::backoff::watch_backoff())
        .boxed();
    let mut listed: Option<K> = None;
    // Whether anything was sent: the first failure says the object was tried.
    let mut reported = false;
    while let Some(ev) = events.next().await {
        if matches!(&ev, Ok(e) if !matches!(e, Event::Init)) {
            problems.works(&what);
        }
        let update = match ev {
            Ok(Event::Init) => {
                listed = None;
                continue;
            }
            Ok(Event::InitApply(o)) => {
                listed = Some(o);
                continue;
            }
            Ok(Event::InitDone) => match listed.take() {
                Some(o) => ObjectUpdate::Present(K::wrap(Arc::new(o))),
                None => ObjectUpdate::Absent,
            },
            Ok(Event::Apply(o)) => ObjectUpdate::Present(K::wrap(Arc::new(o))),
            Ok(Event::Delete(_)) => ObjectUpdate::Absent,
            Err(e) => {
                tracing::debug!(object = %r, error = %e, "watch failed; retrying");
                problems.failed(&what, &e);
                if reported {
                    continue;
                }
                ObjectUpdate::Unreadable(watch_cause(&e))
            }
        };
        reported = true;
        if tx.send((r.clone(), update)).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn status_only_updates_convert_the_same() {
        let a = pod(
            json!({"metadata": {"name": "p", "uid": "u", "resourceVersion": "1"},
            "spec": {"containers": []}, "status": {"phase": "Pending"}}),
        );
        let b = pod(
            json!({"metadata": {"name": "p", "uid": "u", "resourceVersion": "2"},
            "spec": {"containers": []}, "status": {"phase": "Running"}}),
        );
        assert_eq!(for_conversion(a.clone()), for_conversion(b));
        let c = pod(
            json!({"metadata": {"name": "p", "uid": "u", "labels": {"a": "b"}},
            "spec": {"containers": []}}),
        );
        assert_ne!(
            for_conversion(a),
            for_conversion(c),
            "labels feed downwardAPI volumes"
        );
    }
}
