//! The recent events of pods with a stuck volume, for observe mode's
//! finding (d) (`volume_stuck`): what the kubelet, the attach/detach
//! controller or a driver said about the pod (`FailedMount`,
//! `FailedAttachVolume`, ...) is the first thing a person looks at.
//!
//! Read as `kubectl describe pod` reads them: a list of core/v1 events in
//! the pod's namespace with the field selector `involvedObject.uid=<uid>`
//! (the API server serves events.k8s.io/v1 events there too). Only the
//! newest [`PodEventsConfig::max_events`] are kept, newest first, and
//! volmgr's own events (reporting component `volmgr`: the finding itself)
//! are left out.
//!
//! The reads never hold up a scan: [`PodEvents`] reads in a task of its
//! own and the scan takes what it has. The task reads only the pods asked
//! for last ([`PodEvents::want`]), each at most once per
//! [`PodEventsConfig::refresh`], at most [`PodEventsConfig::per_round`]
//! pods a round, one request at a time, a round at most every
//! [`PodEventsConfig::round_gap`], each request within
//! [`PodEventsConfig::timeout`]: 110 stuck pods cost the API server about
//! two small lists a second at most. A failed read leaves the pod's events
//! as they were; failures are logged once until a read succeeds again.
//!
//! Besides the pods asked for, [`PodEvents::follow_pending_pods`] adds the
//! node's `Pending` pods (a list of `spec.nodeName=NODE,status.phase=Pending`,
//! metadata only, every [`PENDING_PERIOD`], at most [`PENDING_LIMIT`] pods):
//! a pod whose volume the kubelet says is not mounted stays `Pending`, and
//! when the node has that volume mounted, observe mode sees nothing stuck
//! (finding (l), `kubelet_disagrees`, needs the kubelet's event). One small
//! list a period per node, served by the API server's node index, instead
//! of a watch of every kubelet's `FailedMount` in the cluster (events have
//! no node field to select on) or a read of every pod's events.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client};
use tokio::sync::{watch, Notify};
use volmgr::status::RecentEvent;
use volmgr::util::sync::MutexExt;

/// The reporting component of volmgr's own events (left out).
pub const OWN_COMPONENT: &str = "volmgr";

/// Most events one list returns (`limit`): a pod's events are few (the
/// API server folds repeats into a count), this bounds a pathological one.
const LIST_LIMIT: u32 = 250;

/// How often the node's `Pending` pods are listed.
pub const PENDING_PERIOD: Duration = Duration::from_secs(30);

/// Most `Pending` pods whose events are read (the list's `limit`).
pub const PENDING_LIMIT: u32 = 128;

/// How pods' events are read.
#[derive(Debug, Clone, Copy)]
pub struct PodEventsConfig {
    /// Events kept per pod, newest first.
    pub max_events: usize,
    /// Shortest time between two reads of one pod's events.
    pub refresh: Duration,
    /// Pods read per round, at most.
    pub per_round: usize,
    /// Shortest time between two rounds.
    pub round_gap: Duration,
    /// Time one read may take.
    pub timeout: Duration,
}

impl Default for PodEventsConfig {
    fn default() -> Self {
        Self {
            max_events: 10,
            refresh: Duration::from_secs(60),
            per_round: 4,
            round_gap: Duration::from_secs(2),
            timeout: Duration::from_secs(5),
        }
    }
}

/// A pod whose events are read: its namespace and UID.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's UID.
    pub uid: String,
}

/// Why a pod's events could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PodEventsError {
    /// The API server did not answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The API server answered with an error.
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// A pod's events as last read.
#[derive(Debug, Default)]
struct Entry {
    events: Vec<RecentEvent>,
    /// The last read tried (`None`: never).
    tried: Option<Instant>,
}

/// What the scan and the reading task share.
#[derive(Debug, Default)]
struct Shared {
    /// The pods read (asked for or pending), and what was read of them.
    pods: BTreeMap<PodKey, Entry>,
    /// The pods asked for last ([`PodEvents::want`]).
    wanted: BTreeSet<PodKey>,
    /// The node's `Pending` pods as last listed.
    pending: BTreeSet<PodKey>,
    /// A read failed and nothing was read since (logged once).
    failing: bool,
}

/// The pods' events, read in the background (see the module).
pub struct PodEvents {
    shared: Arc<Mutex<Shared>>,
    wake: Arc<Notify>,
    changed: watch::Receiver<u64>,
}

impl PodEvents {
    /// Starts the reading task on `client`; it ends with `stop`.
    pub fn start(client: Client, config: PodEventsConfig, stop: watch::Receiver<bool>) -> Self {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let wake = Arc::new(Notify::new());
        let (tx, changed) = watch::channel(0u64);
        let reader = Reader {
            client,
            config,
            shared: Arc::clone(&shared),
            changed: tx,
        };
        tokio::spawn(reader.run(Arc::clone(&wake), stop));
        Self {
            shared,
            wake,
            changed,
        }
    }

    /// The pods whose events are wanted now: the others are forgotten,
    /// new ones read soon.
    pub fn want(&self, pods: impl IntoIterator<Item = PodKey>) {
        let mut s = self.shared.locked();
        s.wanted = pods.into_iter().collect();
        s.keep_wanted();
        drop(s);
        self.wake.notify_one();
    }

    /// Also reads the events of node `node`'s `Pending` pods, listed with
    /// `client` every [`PENDING_PERIOD`] until `stop` (see the module).
    pub fn follow_pending_pods(
        self,
        client: Client,
        node: &str,
        stop: watch::Receiver<bool>,
    ) -> Self {
        let lister = PendingLister {
            client,
            node: node.to_string(),
            shared: Arc::clone(&self.shared),
            wake: Arc::clone(&self.wake),
            timeout: PodEventsConfig::default().timeout,
        };
        tokio::spawn(lister.run(stop));
        self
    }

    /// The events of pod `uid` as last read, newest first (empty before).
    pub fn events_of(&self, uid: &str) -> Vec<RecentEvent> {
        let s = self.shared.locked();
        s.pods
            .iter()
            .find(|(k, _)| k.uid == uid)
            .map(|(_, e)| e.events.clone())
            .unwrap_or_default()
    }

    /// Changes whenever a read brought a pod's events.
    pub fn changed(&self) -> watch::Receiver<u64> {
        self.changed.clone()
    }
}

impl Shared {
    /// Keeps the pods wanted or pending, adds the new ones.
    fn keep_wanted(&mut self) {
        let Self {
            pods,
            wanted,
            pending,
            ..
        } = self;
        pods.retain(|k, _| wanted.contains(k) || pending.contains(k));
        for k in wanted.iter().chain(pending.iter()) {
            if !pods.contains_key(k) {
                pods.insert(k.clone(), Entry::default());
            }
        }
    }
}

impl volmgr::observer::PodEventLog for PodEvents {
    fn events_of(&self, uid: &str) -> Vec<RecentEvent> {
        PodEvents::events_of(self, uid)
    }
}

/// The task listing the node's `Pending` pods.
struct PendingLister {
    client: Client,
    node: String,
    shared: Arc<Mutex<Shared>>,
    wake: Arc<Notify>,
    timeout: Duration,
}

impl PendingLister {
    /// Lists every [`PENDING_PERIOD`] until `stop`; a failed list keeps
    /// the pods listed before (logged once until a list works).
    async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut failing = false;
        loop {
            let listed = tokio::time::timeout(self.timeout, pending_pods(&self.client, &self.node))
                .await
                .unwrap_or(Err(PodEventsError::Timeout(self.timeout)));
            match listed {
                Ok(pods) => {
                    failing = false;
                    let mut s = self.shared.locked();
                    if s.pending != pods {
                        s.pending = pods;
                        s.keep_wanted();
                        drop(s);
                        self.wake.notify_one();
                    }
                }
                Err(e) if !std::mem::replace(&mut failing, true) => {
                    tracing::warn!(node = %self.node, error = %e,
                        "listing the node's pending pods failed (logged once)");
                }
                Err(_) => {}
            }
            tokio::select! {
                () = volmgr::util::shutdown::requested(&mut stop) => return,
                () = tokio::time::sleep(PENDING_PERIOD) => {}
            }
        }
    }
}

/// The node's `Pending` pods (metadata only), at most [`PENDING_LIMIT`].
pub async fn pending_pods(client: &Client, node: &str) -> Result<BTreeSet<PodKey>, PodEventsError> {
    let api: Api<Pod> = Api::all(client.clone());
    let params = ListParams::default()
        .fields(&format!(
            "spec.nodeName={},status.phase=Pending",
            escape_value(node)
        ))
        .limit(PENDING_LIMIT);
    let list = api.list_metadata(&params).await?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|p| {
            Some(PodKey {
                namespace: p.metadata.namespace?,
                uid: p.metadata.uid?,
            })
        })
        .collect())
}

/// The reading task.
struct Reader {
    client: Client,
    config: PodEventsConfig,
    shared: Arc<Mutex<Shared>>,
    changed: watch::Sender<u64>,
}

impl Reader {
    /// Reads rounds while pods are due; waits for [`PodEvents::want`] or
    /// the refresh period between; ends with `stop`.
    async fn run(self, wake: Arc<Notify>, mut stop: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                () = volmgr::util::shutdown::requested(&mut stop) => return,
                () = wake.notified() => {}
                () = tokio::time::sleep(self.config.refresh) => {}
            }
            while self.round().await > 0 {
                tokio::select! {
                    () = volmgr::util::shutdown::requested(&mut stop) => return,
                    () = tokio::time::sleep(self.config.round_gap) => {}
                }
            }
        }
    }

    /// One round: reads the pods due (at most `per_round`, one at a time);
    /// returns how many were tried.
    async fn round(&self) -> usize {
        let due = {
            let mut s = self.shared.locked();
            let due = due(&s.pods, &self.config, Instant::now());
            for k in &due {
                if let Some(e) = s.pods.get_mut(k) {
                    e.tried = Some(Instant::now());
                }
            }
            due
        };
        for pod in &due {
            let read = tokio::time::timeout(
                self.config.timeout,
                read_pod_events(&self.client, pod, self.config.max_events),
            )
            .await
            .unwrap_or(Err(PodEventsError::Timeout(self.config.timeout)));
            self.record(pod, read);
        }
        due.len()
    }

    /// Keeps what was read of `pod` (a failure keeps the previous events)
    /// and logs a failure once.
    fn record(&self, pod: &PodKey, read: Result<Vec<RecentEvent>, PodEventsError>) {
        let mut s = self.shared.locked();
        match read {
            Ok(events) => {
                if std::mem::take(&mut s.failing) {
                    tracing::info!("reading pods' events works again");
                }
                let Some(e) = s.pods.get_mut(pod) else {
                    return;
                };
                if e.events != events {
                    e.events = events;
                    self.changed.send_modify(|v| *v += 1);
                }
            }
            Err(err) => {
                if !std::mem::replace(&mut s.failing, true) {
                    tracing::warn!(namespace = %pod.namespace, uid = %pod.uid, error = %err,
                        "reading a pod's events failed (the findings keep the events read before; logged once)");
                }
            }
        }
    }
}

/// The pods to read now: never tried first, then the longest ago, each
/// tried at least `refresh` ago; at most `per_round`.
fn due(pods: &BTreeMap<PodKey, Entry>, config: &PodEventsConfig, now: Instant) -> Vec<PodKey> {
    let mut due: Vec<(Option<Instant>, &PodKey)> = pods
        .iter()
        .filter(|(_, e)| {
            e.tried
                .is_none_or(|t| now.saturating_duration_since(t) >= config.refresh)
        })
        .map(|(k, e)| (e.tried, k))
        .collect();
    due.sort();
    due.into_iter()
        .take(config.per_round)
        .map(|(_, k)| k.clone())
        .collect()
}

/// Reads the events of `pod` (core/v1, `involvedObject.uid`), its newest
/// `max` first, volmgr's own left out.
pub async fn read_pod_events(
    client: &Client,
    pod: &PodKey,
    max: usize,
) -> Result<Vec<RecentEvent>, PodEventsError> {
    let api: Api<Event> = Api::namespaced(client.clone(), &pod.namespace);
    let params = ListParams::default()
        .fields(&format!("involvedObject.uid={}", escape_value(&pod.uid)))
        .limit(LIST_LIMIT);
    let list = api.list(&params).await?;
    Ok(newest(list.items, max))
}

/// The newest `max` of `events`, newest first, without volmgr's own.
pub fn newest(events: Vec<Event>, max: usize) -> Vec<RecentEvent> {
    let mut out: Vec<(Option<Timestamp>, RecentEvent)> =
        events.into_iter().filter_map(recent_event).collect();
    out.sort_by_key(|e| std::cmp::Reverse(e.0));
    out.truncate(max);
    out.into_iter().map(|(_, e)| e).collect()
}

/// One event as a finding shows it, with when it was last seen; `None`
/// for volmgr's own.
fn recent_event(e: Event) -> Option<(Option<Timestamp>, RecentEvent)> {
    let host = e
        .reporting_instance
        .clone()
        .filter(|h| !h.is_empty())
        .or_else(|| e.source.as_ref().and_then(|s| s.host.clone()))
        .unwrap_or_default();
    let source = e
        .reporting_component
        .filter(|c| !c.is_empty())
        .or_else(|| e.source.and_then(|s| s.component))
        .unwrap_or_default();
    if source == OWN_COMPONENT {
        return None;
    }
    let series_last = e
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0));
    let last = series_last
        .or(e.last_timestamp.map(|t| t.0))
        .or(e.event_time.map(|t| t.0))
        .or(e.first_timestamp.map(|t| t.0))
        .or(e.metadata.creation_timestamp.map(|t| t.0));
    let count = e
        .series
        .and_then(|s| s.count)
        .or(e.count)
        .unwrap_or(1)
        .max(1);
    Some((
        last,
        RecentEvent {
            type_: e.type_.unwrap_or_default(),
            reason: e.reason.unwrap_or_default(),
            message: e.message.unwrap_or_default(),
            count: u32::try_from(count).unwrap_or(1),
            last_time: last.map(|t| t.to_string()).unwrap_or_default(),
            source,
            host,
        },
    ))
}

/// A field selector value escaped as the API server reads it
/// (apimachinery's `fields.EscapeValue`).
fn escape_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::testing::FakeApiServer;
    use serde_json::json;

    fn event(name: &str, uid: &str, reason: &str, last: &str, count: i32) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "Event",
               "metadata": {"name": name, "namespace": "ns"},
               "involvedObject": {"kind": "Pod", "namespace": "ns", "name": "p", "uid": uid},
               "type": "Warning", "reason": reason, "message": format!("{reason} of {uid}"),
               "count": count, "lastTimestamp": last, "source": {"component": "kubelet"}})
    }

    fn pod(uid: &str) -> PodKey {
        PodKey {
            namespace: "ns".into(),
            uid: uid.into(),
        }
    }

    /// Only the pod's events (by UID, in its namespace), the newest first,
    /// at most `max`; volmgr's own (events.k8s.io/v1, as the recorder
    /// writes them) left out; a series' count and last time win.
    #[tokio::test]
    async fn a_pods_events_newest_first() {
        let fake = FakeApiServer::in_memory();
        fake.apply(event("a", "u1", "Old", "2026-01-01T00:00:00Z", 1));
        fake.apply(event("b", "u1", "FailedMount", "2026-01-01T00:02:00Z", 3));
        fake.apply(event("c", "u1", "Scheduled", "2026-01-01T00:01:00Z", 1));
        fake.apply(event("d", "u2", "Other", "2026-01-01T00:03:00Z", 1));
        fake.apply(json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "own", "namespace": "ns"},
            "regarding": {"kind": "Pod", "namespace": "ns", "name": "p", "uid": "u1"},
            "type": "Warning", "reason": "VolumeStuck", "note": "stuck", "action": "Observe",
            "eventTime": "2026-01-01T00:04:00.000000Z", "reportingController": "volmgr",
            "reportingInstance": "node-1"}));
        let got = read_pod_events(&fake.client(), &pod("u1"), 2)
            .await
            .unwrap();
        let reasons: Vec<_> = got.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(reasons, ["FailedMount", "Scheduled"]);
        assert_eq!(got[0].count, 3);
        assert_eq!(got[0].type_, "Warning");
        assert_eq!(got[0].message, "FailedMount of u1");
        assert_eq!(got[0].last_time, "2026-01-01T00:02:00Z");
        assert_eq!(got[0].source, "kubelet");
        let req = fake.take_requests().pop().unwrap();
        assert_eq!(req.path, "/api/v1/namespaces/ns/events");
        assert!(
            req.query.contains("fieldSelector=involvedObject.uid%3Du1"),
            "{}",
            req.query
        );
        // The own event (written through events.k8s.io/v1) is listed by
        // the same selector (one object, two APIs), and left out here.
        let api: Api<Event> = Api::namespaced(fake.client(), "ns");
        let listed = api
            .list(&ListParams::default().fields("involvedObject.uid=u1"))
            .await
            .unwrap();
        assert_eq!(listed.items.len(), 4);
        let own = listed
            .items
            .iter()
            .find(|e| e.reason.as_deref() == Some("VolumeStuck"));
        assert_eq!(own.unwrap().reporting_component.as_deref(), Some("volmgr"));
        let all = read_pod_events(&fake.client(), &pod("u1"), 10).await;
        assert_eq!(all.unwrap().len(), 3);
    }

    /// A round reads at most `per_round` pods, never-read ones first, none
    /// read within `refresh`; a failed read keeps the events read before.
    #[tokio::test]
    async fn rounds_are_bounded_and_a_failure_keeps_the_events() {
        let fake = FakeApiServer::in_memory();
        fake.apply(event("a", "u1", "FailedMount", "2026-01-01T00:00:00Z", 1));
        let config = PodEventsConfig {
            per_round: 2,
            refresh: Duration::from_secs(3600),
            ..PodEventsConfig::default()
        };
        let (tx, mut changed) = watch::channel(0u64);
        let reader = Reader {
            client: fake.client(),
            config,
            shared: Arc::new(Mutex::new(Shared::default())),
            changed: tx,
        };
        let events = PodEvents {
            shared: Arc::clone(&reader.shared),
            wake: Arc::new(Notify::new()),
            changed: changed.clone(),
        };
        events.want(["u1", "u2", "u3"].map(pod));
        assert_eq!(reader.round().await, 2);
        assert_eq!(reader.round().await, 1);
        assert_eq!(reader.round().await, 0, "each read once per refresh");
        assert_eq!(fake.take_requests().len(), 3);
        assert_eq!(events.events_of("u1")[0].reason, "FailedMount");
        assert!(changed.has_changed().unwrap());
        changed.mark_unchanged();

        // Due again; the API server fails: the events stay.
        reader
            .shared
            .locked()
            .pods
            .values_mut()
            .for_each(|e| e.tried = None);
        fake.set_unavailable(true);
        assert_eq!(reader.round().await, 2);
        assert_eq!(events.events_of("u1")[0].reason, "FailedMount");
        assert!(reader.shared.locked().failing);
        assert!(!changed.has_changed().unwrap());
        fake.set_unavailable(false);
        assert_eq!(reader.round().await, 1);
        assert!(!reader.shared.locked().failing);
        // A pod no longer wanted is forgotten.
        events.want([pod("u2")]);
        assert!(events.events_of("u1").is_empty());
    }

    /// The node's Pending pods: by node and phase, metadata only; wanted
    /// with the pods asked for, forgotten once neither.
    #[tokio::test]
    async fn the_nodes_pending_pods_are_read_too() {
        let fake = FakeApiServer::in_memory();
        for (name, node, phase) in [
            ("a", "n1", "Pending"),
            ("b", "n1", "Running"),
            ("c", "n2", "Pending"),
        ] {
            fake.apply(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}")},
                "spec": {"nodeName": node, "containers": []}, "status": {"phase": phase}}));
        }
        let got = pending_pods(&fake.client(), "n1").await.unwrap();
        assert_eq!(got.into_iter().collect::<Vec<_>>(), [pod("u-a")]);
        let req = fake.take_requests().pop().unwrap();
        assert_eq!(req.path, "/api/v1/pods");
        assert!(
            req.query.contains("status.phase%3DPending"),
            "{}",
            req.query
        );
        let (_tx, changed) = watch::channel(0u64);
        let events = PodEvents {
            shared: Arc::new(Mutex::new(Shared::default())),
            wake: Arc::new(Notify::new()),
            changed,
        };
        events.shared.locked().pending = [pod("u-a")].into();
        events.want([pod("u1")]);
        let keys: Vec<_> = events.shared.locked().pods.keys().cloned().collect();
        assert_eq!(keys, [pod("u-a"), pod("u1")]);
        events.shared.locked().pending.clear();
        events.want([]);
        assert!(events.shared.locked().pods.is_empty());
    }

    #[test]
    fn field_selector_values_are_escaped() {
        assert_eq!(escape_value(r"a,b=c\d"), r"a\,b\=c\\d");
    }
}
