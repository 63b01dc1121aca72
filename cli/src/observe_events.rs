//! Events on pods for observe mode's findings (reason `VolumeStuck`,
//! `VolumeNotMounted`, ...; see [`FindingKind::event_reason`]), through the
//! same rate limiter as the managing agent's events: at most 3 at once per
//! (pod, path, reason), then one a minute.

use std::time::{Duration, Instant};

use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;
use volmgr::status::{Finding, FindingKind};
use volmgr::volume::PodUid;

use volmgr_kube::events::RateLimiter;

/// The most bytes of an event's note the API server takes.
const MAX_NOTE: usize = 1024;

/// Publishes findings as events on their pods.
pub struct FindingEvents {
    recorder: Recorder,
    limiter: RateLimiter,
}

impl FindingEvents {
    /// Events through `client`, reported by `volmgr` on `node`.
    pub fn new(client: Client, node: &str) -> Self {
        let reporter = Reporter {
            controller: "volmgr".into(),
            instance: Some(node.to_string()),
        };
        Self {
            recorder: Recorder::new(client, reporter),
            limiter: RateLimiter::new(3, Duration::from_secs(60), 10_000),
        }
    }

    /// Records `f` on its pod, if it names a pod on the node and the
    /// limiter allows it.
    pub async fn publish(&mut self, f: &Finding) {
        let (Some(pod), Some(uid)) = (&f.pod, &f.pod_uid) else {
            return;
        };
        let (Some((namespace, name)), Ok(pod_uid)) = (pod.split_once('/'), PodUid::new(uid)) else {
            return;
        };
        let reason = f.kind.event_reason();
        if !self
            .limiter
            .allow(&pod_uid, &f.path, reason, Instant::now())
        {
            return;
        }
        let regarding = volmgr_kube::events::pod_reference(namespace, name, uid);
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note(f)),
            action: "Observe".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &regarding).await {
            tracing::warn!(pod = %pod, reason, error = %e, "recording a finding's event failed");
        }
    }
}

/// The event's note: the summary, the path and what to do, cut to what
/// the API server takes.
fn note(f: &Finding) -> String {
    let mut s = format!(
        "{} ({}): {}",
        f.summary,
        f.path,
        FindingKind::action(f.kind)
    );
    s.truncate(s.floor_char_boundary(MAX_NOTE));
    s
}
