//! Events on pods, as the kubelet's volume manager records them
//! (`pkg/volume/util/operationexecutor`): a failed set-up is a `Warning`
//! `FailedMount` (`FailedMapVolume` for a raw block volume) saying
//! `MountVolume.SetUp failed for volume "data" : <error>`; a file system
//! grown in use is a `Normal` `FileSystemResizeSuccessful`
//! (`MountVolume.NodeExpandVolume succeeded for volume "data" <node>`), a
//! failed one `FileSystemResizeFailed`. Like the kubelet, volmgr records no
//! event for a successful mount (`SuccessfulMountVolume` is gone from the
//! kubelet) nor for tear-down. volmgr never attaches (the attach/detach
//! controller does); when the volume's VolumeAttachment reports an attach
//! error, a pod waiting for it gets `FailedAttachVolume`
//! (`AttachVolume.Attach failed for volume "data" : <error>`, the message
//! the controller records) so `kubectl describe pod` tells why it waits.
//! A pod whose claim (or its volume) cannot be read from the API server
//! gets the kubelet's pod-level `FailedMount` (`Unable to attach or mount
//! volumes: ... error processing PVC default/data: failed to fetch PVC
//! from API server: <the server's message>`,
//! [`wait_for_attach_and_mount`]), sent by the API pod source through
//! [`SourceEvents`].
//!
//! Events come from [`VolumeManager::add_event_listener`]; the listener
//! never blocks: it hands the event to a bounded channel and counts what
//! it drops when the channel is full. One task publishes them through
//! kube-rs' [`kube::runtime::events::Recorder`] (events.k8s.io/v1; a
//! repeat of an event becomes a PATCH of its series), after a token bucket
//! per (pod, volume, reason) so a failing volume retried with backoff does
//! not flood the API server; the pod source's events go through the same
//! kind of bucket, per (pod, reason).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;
use tokio::sync::{mpsc, watch};
use volmgr::cache::world::{VolumeEvent, VolumeEventKind, VolumeOperation};
use volmgr::volume::PodUid;
use volmgr::volumemanager::VolumeManager;

/// The event reasons (the kubelet's `pkg/kubelet/events`).
pub mod reason {
    /// A volume could not be set up (or its device mounted).
    pub const FAILED_MOUNT: &str = "FailedMount";
    /// A raw block volume could not be mapped.
    pub const FAILED_MAP_VOLUME: &str = "FailedMapVolume";
    /// The volume's attachment to the node failed.
    pub const FAILED_ATTACH_VOLUME: &str = "FailedAttachVolume";
    /// A file system was grown in use.
    pub const FILE_SYSTEM_RESIZE_SUCCESSFUL: &str = "FileSystemResizeSuccessful";
    /// Growing a file system in use failed.
    pub const FILE_SYSTEM_RESIZE_FAILED: &str = "FileSystemResizeFailed";
}

/// The most bytes of an event's note the API server takes.
const MAX_NOTE: usize = 1024;

/// One event for a pod: type, reason, action (the kubelet's operation
/// name) and note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    /// `Normal` or `Warning`.
    pub warning: bool,
    /// The reason.
    pub reason: &'static str,
    /// The operation (`MountVolume.SetUp`).
    pub action: &'static str,
    /// The message, as the kubelet words it.
    pub note: String,
}

/// The kubelet's event for a volume event on node `node`, if it records
/// one: `<operation> failed for volume "<name>" : <error>` (its
/// `GenerateError`) or `<operation> succeeded for volume "<name>" <node>`.
pub fn pod_event(ev: &VolumeEvent, node: &str) -> Option<PodEvent> {
    let action = ev.operation.kubelet_name(ev.block);
    let (warning, reason) = match (ev.kind, ev.operation) {
        (VolumeEventKind::Failed, VolumeOperation::SetUp | VolumeOperation::MountDevice) => (
            true,
            if ev.block {
                reason::FAILED_MAP_VOLUME
            } else {
                reason::FAILED_MOUNT
            },
        ),
        (VolumeEventKind::Failed, VolumeOperation::NodeExpand) => {
            (true, reason::FILE_SYSTEM_RESIZE_FAILED)
        }
        (VolumeEventKind::Failed, VolumeOperation::Attach) => (true, reason::FAILED_ATTACH_VOLUME),
        (VolumeEventKind::Expanded, _) => (false, reason::FILE_SYSTEM_RESIZE_SUCCESSFUL),
        _ => return None,
    };
    let note = match (&ev.error, warning) {
        (Some(e), true) => format!("{action} failed for volume {:?} : {e}", ev.volume),
        (None, true) => format!("{action} failed for volume {:?}", ev.volume),
        (_, false) => format!("{action} succeeded for volume {:?} {node}", ev.volume),
    };
    Some(PodEvent {
        warning,
        reason,
        action,
        note: truncate(note, MAX_NOTE),
    })
}

/// The action of the event for a pod whose volumes wait (the kubelet's
/// `WaitForAttachAndMount`).
pub const WAIT_FOR_ATTACH_AND_MOUNT: &str = "WaitForAttachAndMount";

/// The kubelet's event when a pod's volumes cannot all be processed (its
/// `syncPod`: `Unable to attach or mount volumes: %v` of
/// `WaitForAttachAndMount`'s error): a `Warning` `FailedMount` saying
/// `Unable to attach or mount volumes: unmounted volumes=[data],
/// unattached volumes=[], failed to process volumes=[data]: <errors>`,
/// each list as Go prints a `[]string` (sorted, space separated) and the
/// errors (the populator's, e.g. `error processing PVC default/data:
/// failed to fetch PVC from API server: <the server's message>`) sorted
/// and joined by `; ` as the desired state's `PopPodErrors` returns them.
pub fn wait_for_attach_and_mount(
    unmounted: &[String],
    unattached: &[String],
    failed: &[String],
    errors: &[String],
) -> PodEvent {
    let list = |v: &[String]| {
        let mut v = v.to_vec();
        v.sort();
        v.dedup();
        format!("[{}]", v.join(" "))
    };
    let mut errors = errors.to_vec();
    errors.sort();
    errors.dedup();
    let note = format!(
        "Unable to attach or mount volumes: unmounted volumes={}, unattached volumes={}, failed to process volumes={}: {}",
        list(unmounted),
        list(unattached),
        list(failed),
        errors.join("; ")
    );
    PodEvent {
        warning: true,
        reason: reason::FAILED_MOUNT,
        action: WAIT_FOR_ATTACH_AND_MOUNT,
        note: truncate(note, MAX_NOTE),
    }
}

fn truncate(mut s: String, max: usize) -> String {
    s.truncate(s.floor_char_boundary(max));
    s
}

/// A token bucket per (pod, volume, reason): `burst` events at once, then
/// one per `refill`. Keys whose bucket is full again are forgotten when
/// more than `max_keys` are kept, so hostile churn cannot grow it.
#[derive(Debug)]
pub struct RateLimiter {
    burst: u32,
    refill: Duration,
    max_keys: usize,
    buckets: HashMap<(PodUid, String, &'static str), (f64, Instant)>,
}

impl RateLimiter {
    /// A limiter of `burst` events, one more per `refill`.
    pub fn new(burst: u32, refill: Duration, max_keys: usize) -> Self {
        Self {
            burst: burst.max(1),
            refill,
            max_keys,
            buckets: HashMap::new(),
        }
    }

    /// Whether an event for `key` may go out at `now` (takes a token).
    pub fn allow(
        &mut self,
        pod: &PodUid,
        volume: &str,
        reason: &'static str,
        now: Instant,
    ) -> bool {
        let (burst, refill) = (f64::from(self.burst), self.refill.as_secs_f64());
        let level = |(tokens, at): (f64, Instant), now: Instant| {
            let gained = if refill > 0.0 {
                now.saturating_duration_since(at).as_secs_f64() / refill
            } else {
                burst
            };
            (tokens + gained).min(burst)
        };
        if self.buckets.len() >= self.max_keys {
            self.buckets.retain(|_, b| level(*b, now) < burst);
        }
        let key = (pod.clone(), volume.to_string(), reason);
        let tokens = self.buckets.get(&key).map_or(burst, |b| level(*b, now));
        if tokens < 1.0 {
            return false;
        }
        if self.buckets.len() < self.max_keys || self.buckets.contains_key(&key) {
            self.buckets.insert(key, (tokens - 1.0, now));
        }
        true
    }
}

/// Looks up a pod's namespace and name by UID (the volume manager's desired
/// state); the seam the tests replace.
pub type PodNames = Arc<dyn Fn(&PodUid) -> Option<(Arc<str>, Arc<str>)> + Send + Sync>;

/// Counters of the event pipeline.
#[derive(Debug, Default)]
pub struct EventCounters {
    /// Events dropped because the channel was full.
    pub dropped: AtomicU64,
    /// Events left out by the rate limiter.
    pub limited: AtomicU64,
    /// Events published.
    pub published: AtomicU64,
    /// Events the API server refused (or was unreachable for).
    pub failed: AtomicU64,
}

/// Settings of the event pipeline.
#[derive(Debug, Clone, Copy)]
pub struct EventConfig {
    /// Events waiting to be published at most.
    pub queue: usize,
    /// Events at once per (pod, volume, reason).
    pub burst: u32,
    /// One more event per (pod, volume, reason) each period.
    pub refill: Duration,
}

impl Default for EventConfig {
    fn default() -> Self {
        Self {
            queue: 1024,
            burst: 3,
            refill: Duration::from_secs(60),
        }
    }
}

/// Records the volume manager's events on pods through `client` until
/// `shutdown`: registers the listener with `vm` and spawns the publishing
/// task (on the current tokio runtime). The entry point the agent calls.
pub fn start(
    client: Client,
    node: &str,
    vm: &Arc<VolumeManager>,
    config: EventConfig,
    shutdown: watch::Receiver<bool>,
) -> Arc<EventCounters> {
    let weak = Arc::downgrade(vm);
    let names: PodNames = Arc::new(move |uid| weak.upgrade().and_then(|vm| vm.pod_name(uid)));
    let (listener, publisher) = pipeline(client, node, names, config);
    let counters = Arc::clone(&publisher.emitter.counters);
    vm.add_event_listener(listener);
    tokio::spawn(publisher.run(shutdown));
    counters
}

/// The listener to register and the publisher to run, joined by a bounded
/// channel.
pub fn pipeline(
    client: Client,
    node: &str,
    names: PodNames,
    config: EventConfig,
) -> (volmgr::cache::world::EventListener, Publisher) {
    let (tx, rx) = mpsc::channel::<VolumeEvent>(config.queue.max(1));
    let emitter = Emitter::new(client, node, config);
    let dropped = Arc::clone(&emitter.counters);
    let listener: volmgr::cache::world::EventListener = Arc::new(move |ev: &VolumeEvent| {
        // Only what may become an event is queued.
        if pod_event(ev, "").is_some() && tx.try_send(ev.clone()).is_err() {
            dropped.dropped.fetch_add(1, Ordering::Relaxed);
        }
    });
    let publisher = Publisher {
        emitter,
        node: node.to_string(),
        names,
        rx,
    };
    (listener, publisher)
}

/// Publishes queued events.
pub struct Publisher {
    emitter: Emitter,
    node: String,
    names: PodNames,
    rx: mpsc::Receiver<VolumeEvent>,
}

impl Publisher {
    /// Publishes until `shutdown` or until the listener is gone.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        loop {
            let ev = tokio::select! {
                () = volmgr::util::shutdown::requested(&mut shutdown) => return,
                ev = self.rx.recv() => match ev { Some(ev) => ev, None => return },
            };
            self.publish(&ev, Instant::now()).await;
        }
    }

    /// Publishes one volume event (if the kubelet records one, the pod is
    /// known and the limiter allows it).
    pub async fn publish(&mut self, ev: &VolumeEvent, now: Instant) {
        let Some(pe) = pod_event(ev, &self.node) else {
            return;
        };
        let Some((namespace, name)) = (self.names)(&ev.pod_uid) else {
            return;
        };
        self.emitter
            .emit(&ev.pod_uid, &namespace, &name, &ev.volume, pe, now)
            .await;
    }
}

/// The rate limiter and kube-rs' recorder, shared by the volume events'
/// publisher and the pod source's.
struct Emitter {
    client: Client,
    reporter: Reporter,
    recorder: Recorder,
    limiter: RateLimiter,
    counters: Arc<EventCounters>,
    /// With `Some`, one recorder per (pod, note): a note that changed is a
    /// new event, as the kubelet's recorder makes it (kube-rs' recorder
    /// would count it as a repeat of the first, whose note stays).
    per_note: Option<HashMap<(PodUid, String), Recorder>>,
}

impl Emitter {
    fn new(client: Client, node: &str, config: EventConfig) -> Self {
        let reporter = Reporter {
            controller: "volmgr".into(),
            instance: Some(node.to_string()),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            client,
            reporter,
            limiter: RateLimiter::new(config.burst, config.refill, 10_000),
            counters: Arc::new(EventCounters::default()),
            per_note: None,
        }
    }

    /// The recorder of `note` on pod `uid`.
    fn recorder_for(&mut self, uid: &PodUid, note: &str) -> Recorder {
        let Some(map) = &mut self.per_note else {
            return self.recorder.clone();
        };
        if map.len() >= 10_000 {
            map.clear();
        }
        let (client, reporter) = (&self.client, &self.reporter);
        map.entry((uid.clone(), note.to_string()))
            .or_insert_with(|| Recorder::new(client.clone(), reporter.clone()))
            .clone()
    }

    /// Records `pe` on pod `namespace/name` (`uid`) if the limiter allows
    /// it for (`uid`, `key`, reason).
    async fn emit(
        &mut self,
        uid: &PodUid,
        namespace: &str,
        name: &str,
        key: &str,
        pe: PodEvent,
        now: Instant,
    ) {
        if !self.limiter.allow(uid, key, pe.reason, now) {
            self.counters.limited.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let regarding = pod_reference(namespace, name, uid.as_str());
        let recorder = self.recorder_for(uid, &pe.note);
        let event = Event {
            type_: if pe.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: pe.reason.into(),
            note: Some(pe.note),
            action: pe.action.into(),
            secondary: None,
        };
        match recorder.publish(&event, &regarding).await {
            Ok(()) => {
                self.counters.published.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(pod = %uid, key, reason = pe.reason, error = %e, "recording an event failed");
            }
        }
    }
}

/// An event a pod source records on a pod itself (not a volume's: the
/// kubelet's `WaitForAttachAndMount` failure of a pod whose claims cannot
/// be read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourcePodEvent {
    /// The pod's UID.
    pub uid: PodUid,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The event.
    pub event: PodEvent,
}

/// Where a pod source hands its events: a bounded channel to a publishing
/// task (the same token bucket per (pod, reason) and kube-rs recorder as
/// the volume events). Sending never blocks: past the queue's room an
/// event is dropped and counted.
#[derive(Clone)]
pub struct SourceEvents {
    tx: mpsc::Sender<SourcePodEvent>,
    counters: Arc<EventCounters>,
}

impl SourceEvents {
    /// Starts the publishing task (on the current tokio runtime) for
    /// events recorded through `client` as node `node`'s volmgr, until
    /// `shutdown`.
    pub fn start(
        client: Client,
        node: &str,
        config: EventConfig,
        mut shutdown: watch::Receiver<bool>,
    ) -> Self {
        let (tx, mut rx) = mpsc::channel::<SourcePodEvent>(config.queue.max(1));
        let mut emitter = Emitter::new(client, node, config);
        emitter.per_note = Some(HashMap::new());
        let counters = Arc::clone(&emitter.counters);
        tokio::spawn(async move {
            loop {
                let ev = tokio::select! {
                    () = volmgr::util::shutdown::requested(&mut shutdown) => return,
                    ev = rx.recv() => match ev { Some(ev) => ev, None => return },
                };
                emitter
                    .emit(
                        &ev.uid,
                        &ev.namespace,
                        &ev.name,
                        "",
                        ev.event,
                        Instant::now(),
                    )
                    .await;
            }
        });
        Self { tx, counters }
    }

    /// Queues `ev` for publishing (dropped and counted when the queue is
    /// full).
    pub fn send(&self, ev: SourcePodEvent) {
        if self.tx.try_send(ev).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The pipeline's counters.
    pub fn counters(&self) -> &Arc<EventCounters> {
        &self.counters
    }
}

/// The reference of an event about a pod (`regarding`).
pub fn pod_reference(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(namespace.to_string()),
        name: Some(name.to_string()),
        uid: Some(uid.to_string()),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::testing::FakeApiServer;
    use volmgr::volume::UniqueVolumeName;

    fn ev(
        kind: VolumeEventKind,
        op: VolumeOperation,
        block: bool,
        err: Option<&str>,
    ) -> VolumeEvent {
        VolumeEvent {
            kind,
            pod_uid: PodUid::new("uid-1").unwrap(),
            volume: "data".into(),
            volume_name: UniqueVolumeName::new("kubernetes.io/csi/d^v1"),
            path: None,
            error: err.map(String::from),
            operation: op,
            block,
        }
    }

    #[test]
    fn kubelet_reasons_and_messages() {
        use VolumeEventKind as K;
        use VolumeOperation as O;
        let e = |k, o, b, err| pod_event(&ev(k, o, b, err), "node-1");
        let f = e(K::Failed, O::SetUp, false, Some("rpc error: boom")).unwrap();
        assert_eq!(
            (f.warning, f.reason, f.note.as_str()),
            (
                true,
                "FailedMount",
                "MountVolume.SetUp failed for volume \"data\" : rpc error: boom"
            )
        );
        let f = e(K::Failed, O::MountDevice, false, Some("x")).unwrap();
        assert_eq!(
            f.note,
            "MountVolume.MountDevice failed for volume \"data\" : x"
        );
        let f = e(K::Failed, O::SetUp, true, Some("x")).unwrap();
        assert_eq!(f.reason, "FailedMapVolume");
        assert_eq!(
            f.note,
            "MapVolume.MapPodDevice failed for volume \"data\" : x"
        );
        let f = e(K::Failed, O::Attach, false, Some("in use")).unwrap();
        assert_eq!(
            (f.warning, f.reason, f.note.as_str()),
            (
                true,
                "FailedAttachVolume",
                "AttachVolume.Attach failed for volume \"data\" : in use"
            )
        );
        assert_eq!(
            e(K::Failed, O::MountDevice, true, Some("x"))
                .unwrap()
                .action,
            "MapVolume.SetUpDevice"
        );
        let f = e(K::Failed, O::NodeExpand, false, Some("x")).unwrap();
        assert_eq!(f.reason, "FileSystemResizeFailed");
        assert_eq!(
            f.note,
            "MountVolume.NodeExpandVolume failed for volume \"data\" : x"
        );
        let s = e(K::Expanded, O::NodeExpand, false, None).unwrap();
        assert_eq!(
            (s.warning, s.reason, s.note.as_str()),
            (
                false,
                "FileSystemResizeSuccessful",
                "MountVolume.NodeExpandVolume succeeded for volume \"data\" node-1"
            )
        );
        // Never a success event for a mount, nothing for tear-down or
        // out-of-band findings.
        assert_eq!(e(K::Mounted, O::SetUp, false, None), None);
        assert_eq!(e(K::Unmounted, O::TearDown, false, None), None);
        assert_eq!(e(K::Failed, O::TearDown, false, Some("x")), None);
        assert_eq!(e(K::LostOutOfBand, O::OutOfBand, false, None), None);
        // Notes fit the API's limit, cut on a character boundary.
        let long = "é".repeat(2000);
        let f = e(K::Failed, O::SetUp, false, Some(&long)).unwrap();
        assert!(f.note.len() <= MAX_NOTE && f.note.len() > MAX_NOTE - 2);
    }

    /// The kubelet's pod-level `FailedMount` (`syncPod`'s `Unable to attach
    /// or mount volumes: %v` of `WaitForAttachAndMount`'s error): lists as
    /// Go prints a sorted `[]string`, errors sorted and joined by `; `.
    #[test]
    fn wait_for_attach_and_mount_as_the_kubelet_words_it() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let e = wait_for_attach_and_mount(
            &s(&["logs", "data"]),
            &[],
            &s(&["logs", "data"]),
            &s(&[
                "error processing PVC default/logs: x",
                "error processing PVC default/data: y",
            ]),
        );
        assert_eq!(
            (e.warning, e.reason, e.action),
            (true, "FailedMount", "WaitForAttachAndMount")
        );
        assert_eq!(
            e.note,
            "Unable to attach or mount volumes: unmounted volumes=[data logs], unattached \
             volumes=[], failed to process volumes=[data logs]: error processing PVC \
             default/data: y; error processing PVC default/logs: x"
        );
        let long = vec!["é".repeat(2000)];
        let e = wait_for_attach_and_mount(&s(&["data"]), &[], &s(&["data"]), &long);
        assert!(e.note.len() <= MAX_NOTE);
    }

    #[test]
    fn token_bucket_per_pod_volume_and_reason() {
        let mut l = RateLimiter::new(2, Duration::from_secs(60), 100);
        let (p, q) = (PodUid::new("p").unwrap(), PodUid::new("q").unwrap());
        let t0 = Instant::now();
        assert!(l.allow(&p, "v", "FailedMount", t0));
        assert!(l.allow(&p, "v", "FailedMount", t0));
        assert!(!l.allow(&p, "v", "FailedMount", t0), "burst used up");
        // Other keys have their own bucket.
        assert!(l.allow(&q, "v", "FailedMount", t0));
        assert!(l.allow(&p, "w", "FailedMount", t0));
        assert!(l.allow(&p, "v", "FileSystemResizeFailed", t0));
        // One token back per refill period.
        assert!(!l.allow(&p, "v", "FailedMount", t0 + Duration::from_secs(59)));
        assert!(l.allow(&p, "v", "FailedMount", t0 + Duration::from_secs(61)));
        assert!(!l.allow(&p, "v", "FailedMount", t0 + Duration::from_secs(62)));
        // The map stays bounded: full buckets are forgotten first, and a
        // key that does not fit is still limited to its first event.
        let mut l = RateLimiter::new(1, Duration::from_secs(60), 2);
        assert!(l.allow(&p, "a", "r", t0));
        assert!(l.allow(&p, "b", "r", t0));
        assert!(l.allow(&p, "c", "r", t0));
        assert!(l.buckets.len() <= 2);
    }

    /// Through kube-rs' recorder to the fake: the first event is a POST of
    /// an events.k8s.io/v1 Event regarding the pod, a repeat a PATCH of
    /// its series; the limiter holds back the rest; an unknown pod and a
    /// success without an event publish nothing; a full queue drops and
    /// counts.
    #[tokio::test]
    async fn events_reach_the_api_rate_limited() {
        let api = FakeApiServer::in_memory();
        let names: PodNames = Arc::new(|uid: &PodUid| {
            (uid.as_str() == "uid-1").then(|| (Arc::from("ns"), Arc::from("web-0")))
        });
        let config = EventConfig {
            queue: 2,
            burst: 2,
            refill: Duration::from_secs(3600),
        };
        let (listener, mut publisher) = pipeline(api.client(), "node-1", names, config);
        let failed = ev(
            VolumeEventKind::Failed,
            VolumeOperation::SetUp,
            false,
            Some("driver not ready"),
        );
        let now = Instant::now();
        for _ in 0..5 {
            publisher.publish(&failed, now).await;
        }
        publisher
            .publish(
                &ev(
                    VolumeEventKind::Mounted,
                    VolumeOperation::SetUp,
                    false,
                    None,
                ),
                now,
            )
            .await;
        let mut other = failed.clone();
        other.pod_uid = PodUid::new("gone").unwrap();
        publisher.publish(&other, now).await;

        let reqs = api.take_requests();
        let calls: Vec<_> = reqs.iter().map(|r| r.method.as_str()).collect();
        assert_eq!(calls, ["POST", "PATCH"]);
        assert_eq!(reqs[0].path, "/apis/events.k8s.io/v1/namespaces/ns/events");
        let b = &reqs[0].body;
        assert_eq!(b["type"], "Warning");
        assert_eq!(b["reason"], "FailedMount");
        assert_eq!(b["action"], "MountVolume.SetUp");
        assert_eq!(
            b["note"],
            "MountVolume.SetUp failed for volume \"data\" : driver not ready"
        );
        assert_eq!(b["regarding"]["kind"], "Pod");
        assert_eq!(b["regarding"]["name"], "web-0");
        assert_eq!(b["regarding"]["uid"], "uid-1");
        assert_eq!(b["reportingController"], "volmgr");
        assert_eq!(b["reportingInstance"], "node-1");
        assert_eq!(reqs[1].body["series"]["count"], 2);
        let c = &publisher.emitter.counters;
        assert_eq!(c.published.load(Ordering::Relaxed), 2);
        assert_eq!(c.limited.load(Ordering::Relaxed), 3);

        // The listener never blocks: past the queue's room it drops.
        for _ in 0..5 {
            listener(&failed);
        }
        listener(&ev(
            VolumeEventKind::Mounted,
            VolumeOperation::SetUp,
            false,
            None,
        ));
        assert_eq!(c.dropped.load(Ordering::Relaxed), 3);
    }
}
