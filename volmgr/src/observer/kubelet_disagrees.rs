//! (l) `kubelet_disagrees`: the kubelet's events say a volume of a pod is
//! not mounted (or not attached) while the node has it mounted at the
//! pod's volume path.
//!
//! The kubelet's side is its `FailedMount` event, as `WaitForAttachAndMount`
//! (pkg/kubelet/volumemanager/volume_manager.go) ends and `syncPod` records
//! it: `Unable to attach or mount volumes: unmounted volumes=[a b],
//! unattached volumes=[b], failed to process volumes=[]: <why>` (the names
//! are the pod's volume names, sorted, as Go prints a `[]string`; older
//! kubelets said `... list of unmounted volumes=[a]. list of unattached
//! volumes=[a b]`, also read). The node's side is the mount table: a mount
//! on the volume's path under `ROOT/pods/<uid>/volumes/`.
//!
//! The rule, so that a healthy node whose kubelet failed once and then
//! succeeded never shows it: an event counts only if it was last seen at
//! least [`AFTER_MOUNT`] after observe mode first saw the volume mounted
//! (the kubelet said so again once the mount was there: an older
//! `FailedMount` is the kubelet's failure before it mounted, which it
//! retried), and within the last [`RECENT`] (a disagreement that lasts is
//! said again: the kubelet retries the pod every 10 s and its event spam
//! filter lets one event through every 5 minutes once a pod had 25). A
//! mount found when observe mode starts counts as first seen then.
//!
//! The events come from a [`PodEventLog`] (observe mode's read-back of
//! pods' events: the pods with a stuck volume and the node's `Pending`
//! pods), never from the API server during a scan.
//!
//! The attach side ([`attach`]): the kubelet says `unattached
//! volumes=[x]` of a CSI volume the node does not have mounted while x's
//! VolumeAttachment says attached (the Node's `status.volumesAttached`,
//! which the kubelet waits for, does not list it, or the kubelet has not
//! read it), or has an `attachError` (said as the cause it is).

pub mod attach;
pub mod attach_forbidden;

use std::collections::{HashMap, HashSet};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{finding, lines_at, Snapshot};
use crate::cache::desired_state_of_world::{DesiredStateOfWorld, PodVolumeEntry};
use crate::cache::out_of_band::rfc3339;
use crate::status::{FindingKind, RecentEvent};
use crate::util::escape::shortened;
use crate::volume::PodUid;

/// How much later than the mount an event must be last seen to count:
/// event times have whole seconds, and the kubelet records a volume as
/// mounted right after its mount call returns.
pub const AFTER_MOUNT: Duration = Duration::from_secs(5);

/// How recent an event must be to count.
pub const RECENT: Duration = Duration::from_secs(600);

/// Names read from one list of an event's message, at most.
const MAX_NAMES: usize = 64;

/// Bytes of an event's message a finding's evidence shows, at most.
const MAX_MESSAGE: usize = 1024;

/// Bytes of a `vol_data.json` a finding's evidence shows, at most.
const MAX_VOL_DATA: u64 = 4096;

/// The recent events of the pods on the node, as last read.
pub trait PodEventLog: Send + Sync {
    /// The events of pod `uid` as last read, newest first (empty when none
    /// were read).
    fn events_of(&self, uid: &str) -> Vec<RecentEvent>;
}

/// No events: nothing is found.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoPodEvents;

impl PodEventLog for NoPodEvents {
    fn events_of(&self, _uid: &str) -> Vec<RecentEvent> {
        Vec::new()
    }
}

/// What a kubelet event says of a pod's volumes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct KubeletSays {
    /// `unmounted volumes=[...]`.
    pub unmounted: Vec<String>,
    /// `unattached volumes=[...]`.
    pub unattached: Vec<String>,
}

/// The volume lists of a kubelet's `FailedMount` message (empty when it
/// has none).
pub fn parse_volume_lists(message: &str) -> KubeletSays {
    KubeletSays {
        unmounted: list_after(message, "unmounted volumes=["),
        unattached: list_after(message, "unattached volumes=["),
    }
}

/// The space-separated names between `key` and the next `]`.
fn list_after(message: &str, key: &str) -> Vec<String> {
    let Some(start) = message.find(key).map(|i| i + key.len()) else {
        return Vec::new();
    };
    let rest = &message[start..];
    let Some(end) = rest.find(']') else {
        return Vec::new();
    };
    rest[..end]
        .split_whitespace()
        .filter(|n| n.len() <= 253)
        .take(MAX_NAMES)
        .map(str::to_string)
        .collect()
}

/// A UTC RFC 3339 time (`2026-01-01T00:02:00Z`, fractions and `+00:00`
/// accepted) as a [`SystemTime`].
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    // Digits only: `parse` alone would take `+1`.
    let num = |r: std::ops::Range<usize>| {
        let d = s.get(r)?;
        d.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| d.parse::<i64>().ok())?
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &s[19..];
    let mut nanos = 0u32;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        let f = &frac[..digits.min(9)];
        nanos = format!("{f:0<9}").parse().ok()?;
        rest = &frac[digits..];
    }
    if !matches!(rest, "Z" | "z" | "+00:00")
        || !(1..=12).contains(&mo)
        || !(1..=31).contains(&d)
        || h > 23
        || mi > 59
        || sec > 60
    {
        return None;
    }
    // Howard Hinnant's days_from_civil.
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if mo > 2 { mo - 3 } else { mo + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = u64::try_from(days * 86_400 + h * 3600 + mi * 60 + sec).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::new(secs, nanos))
}

/// The detector's state: since when each pod volume's path is seen
/// mounted, and where the pods' events come from.
pub(super) struct Detector {
    events: Arc<dyn PodEventLog>,
    /// The node whose kubelet's events count (any, when not set).
    node: Option<String>,
    attachments: Arc<dyn attach::AttachmentLog>,
    mounted_since: HashMap<PathBuf, SystemTime>,
}

impl Default for Detector {
    fn default() -> Self {
        Self {
            events: Arc::new(NoPodEvents),
            node: None,
            attachments: Arc::new(attach::NoAttachments),
            mounted_since: HashMap::new(),
        }
    }
}

impl super::Observer {
    /// Where the pods' events come from (for
    /// [`FindingKind::KubeletDisagrees`]); without it, nothing is found.
    pub fn set_pod_events(&mut self, events: Arc<dyn PodEventLog>) {
        self.kubelet.events = events;
    }

    /// Only the events of node `node`'s kubelet count for
    /// [`FindingKind::KubeletDisagrees`] ([`from_kubelet`]).
    pub fn set_kubelet_node(&mut self, node: &str) {
        self.kubelet.node = Some(node.to_string());
    }

    /// Where the VolumeAttachments and the Node's `status.volumesAttached`
    /// come from (the attach side of [`FindingKind::KubeletDisagrees`]);
    /// without it, the attach side finds nothing.
    pub fn set_attachments(&mut self, log: Arc<dyn attach::AttachmentLog>) {
        self.kubelet.attachments = log;
    }
}

/// An event of the kubelet naming a volume, and how.
struct Said<'a> {
    event: &'a RecentEvent,
    at: SystemTime,
    list: &'static str,
}

impl Detector {
    /// The findings: each desired pod's volume mounted at its path that a
    /// recent kubelet event (see the module) says is unmounted or
    /// unattached; each one not mounted that it says is unattached while
    /// its VolumeAttachment says attached or failed ([`attach`]), whose
    /// VolumeAttachments are asked for.
    pub(super) fn evaluate(
        &mut self,
        snap: &Snapshot,
        dsw: &DesiredStateOfWorld,
        out: &mut Vec<crate::status::Finding>,
    ) {
        let now = SystemTime::now();
        let mut seen = HashSet::new();
        let mut wanted = Vec::new();
        for (uid, pod) in dsw.pods().filter(|(_, p)| !p.terminated) {
            let mut events: Option<Vec<RecentEvent>> = None;
            for v in &pod.volumes {
                let events = events.get_or_insert_with(|| {
                    let mut all = self.events.events_of(uid.as_str());
                    all.retain(|e| from_kubelet(e, self.node.as_deref()));
                    all
                });
                let Some(path) = mounted_at(snap, uid, v) else {
                    let vol = attach::Volume {
                        uid,
                        pod: format!("{}/{}", pod.namespace, pod.name),
                        v,
                    };
                    let log = self.attachments.as_ref();
                    attach::evaluate(log, snap, dsw, &vol, events, &mut wanted, out);
                    let node = self.node.as_deref();
                    let scan = attach_forbidden::Scan {
                        log,
                        node,
                        snap,
                        dsw,
                    };
                    attach_forbidden::evaluate(&scan, &vol, events, &mut wanted, out);
                    continue;
                };
                let since = *self.mounted_since.entry(path.clone()).or_insert(now);
                seen.insert(path.clone());
                let Some(said) = kubelet_said(events, &v.outer_name, since, now) else {
                    continue;
                };
                let mut f = disagreement(snap, &path, &v.outer_name, &said, since);
                f.pod_uid = Some(uid.as_str().to_string());
                f.pod = Some(format!("{}/{}", pod.namespace, pod.name));
                out.push(f);
            }
        }
        self.mounted_since.retain(|p, _| seen.contains(p));
        wanted.sort();
        wanted.dedup();
        self.attachments.want(wanted);
    }
}

/// Whether event `e` is the kubelet's (reported by `kubelet`, exactly) on
/// node `node` (when known): another component's event, or another node's
/// kubelet's, does not count. A core/v1 event's source is what its writer
/// says: the event counted is shown as evidence, with its source and host.
pub fn from_kubelet(e: &RecentEvent, node: Option<&str>) -> bool {
    e.source == "kubelet" && node.is_none_or(|n| e.host == n)
}

/// The newest kubelet event naming `volume` as unmounted or unattached,
/// last seen [`AFTER_MOUNT`] after `since` and within [`RECENT`] of `now`.
fn kubelet_said<'a>(
    events: &'a [RecentEvent],
    volume: &str,
    since: SystemTime,
    now: SystemTime,
) -> Option<Said<'a>> {
    events
        .iter()
        .filter_map(|e| {
            let at = parse_rfc3339(&e.last_time)?;
            let after_mount = at.duration_since(since).is_ok_and(|d| d >= AFTER_MOUNT);
            let recent = now.duration_since(at).map_or(true, |d| d <= RECENT);
            if !(after_mount && recent) {
                return None;
            }
            let says = parse_volume_lists(&e.message);
            let list = if says.unmounted.iter().any(|n| n == volume) {
                "unmounted"
            } else if says.unattached.iter().any(|n| n == volume) {
                "unattached"
            } else {
                return None;
            };
            Some(Said { event: e, at, list })
        })
        .max_by_key(|s| s.at)
}

/// Where the node has pod `uid`'s volume `v` mounted: its path in the
/// rebuilt actual state, or `ROOT/pods/<uid>/volumes/<plugin>/<name>`,
/// when that is a mount point.
fn mounted_at(snap: &Snapshot, uid: &PodUid, v: &PodVolumeEntry) -> Option<PathBuf> {
    if let Some(m) = v
        .resolution
        .name()
        .and_then(|name| snap.asw.pod_mount(name, uid))
    {
        if snap.table.is_mount_point(&m.path) {
            return Some(m.path.clone());
        }
    }
    let plugin = v.resolution.plugin()?.replace('/', "~");
    if v.outer_name.is_empty() || v.outer_name.contains('/') || v.outer_name.starts_with('.') {
        return None;
    }
    let path = snap
        .root
        .join("pods")
        .join(uid.as_str())
        .join("volumes")
        .join(plugin)
        .join(&v.outer_name);
    snap.table.is_mount_point(&path).then_some(path)
}

/// The finding: the kubelet's event and the node's mount side by side.
fn disagreement(
    snap: &Snapshot,
    path: &Path,
    volume: &str,
    said: &Said<'_>,
    since: SystemTime,
) -> crate::status::Finding {
    let e = said.event;
    let what = if said.list == "unmounted" {
        "mounted"
    } else {
        "attached"
    };
    let mut f = finding(
        FindingKind::KubeletDisagrees,
        path.display().to_string(),
        format!("the kubelet says volume {volume:?} is not {what} ({} volumes=[...]); the node has it mounted", said.list),
    );
    f.volume = Some(volume.to_string());
    f.since = Some(rfc3339(since));
    f.evidence.push(kubelet_line(e));
    let lines = lines_at(&snap.table, path);
    f.evidence
        .extend(lines.into_iter().map(|l| format!("the node: {l}")));
    f.evidence.push(format!(
        "first seen mounted by observe mode at {}; the event was last seen {}s after",
        rfc3339(since),
        said.at.duration_since(since).unwrap_or_default().as_secs()
    ));
    if let Some(data) = vol_data(path) {
        f.evidence.push(data);
    }
    f.events.push(e.clone());
    f
}

/// The kubelet's event as evidence.
fn kubelet_line(e: &RecentEvent) -> String {
    format!(
        "the kubelet: {} {} x{} last {} ({}{}{}): {}",
        e.type_,
        e.reason,
        e.count,
        e.last_time,
        e.source,
        if e.host.is_empty() { "" } else { " on " },
        crate::util::escape::printable(&e.host),
        shortened(&e.message, MAX_MESSAGE)
    )
}

/// `vol_data.json` beside a CSI volume's mount point, its first
/// [`MAX_VOL_DATA`] bytes, escaped.
fn vol_data(path: &Path) -> Option<String> {
    let file = path.parent()?.join(crate::plugins::csi::VOL_DATA_FILE);
    let mut text = Vec::new();
    std::fs::File::open(&file)
        .ok()?
        .take(MAX_VOL_DATA + 1)
        .read_to_end(&mut text)
        .ok()?;
    let cut = text.len() > MAX_VOL_DATA as usize;
    text.truncate(MAX_VOL_DATA as usize);
    let text = String::from_utf8_lossy(&text);
    let more = if cut { " ..." } else { "" };
    Some(format!(
        "{}: {}{more}",
        file.display(),
        crate::util::escape::printable(text.trim())
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_the_kubelets_lists() {
        let m = "Unable to attach or mount volumes: unmounted volumes=[conf data], unattached volumes=[data], failed to process volumes=[data]: error processing PVC default/nowhere";
        let says = parse_volume_lists(m);
        assert_eq!(says.unmounted, ["conf", "data"]);
        assert_eq!(says.unattached, ["data"]);
        let old = "Unable to mount volumes for pod \"p_ns(u)\": timeout expired waiting for volumes to attach or mount for pod \"ns\"/\"p\". list of unmounted volumes=[x]. list of unattached volumes=[x y]";
        let says = parse_volume_lists(old);
        assert_eq!(says.unmounted, ["x"]);
        assert_eq!(says.unattached, ["x", "y"]);
        let empty = parse_volume_lists("unmounted volumes=[], unattached volumes=[");
        assert_eq!(empty, KubeletSays::default());
        assert_eq!(
            parse_volume_lists("MountVolume.SetUp failed for volume \"x\""),
            KubeletSays::default()
        );
    }

    #[test]
    fn parses_event_times() {
        let t = parse_rfc3339("2026-11-28T23:39:31Z").unwrap();
        assert_eq!(rfc3339(t), "2026-11-28T23:39:31.000Z");
        let t = parse_rfc3339("2024-02-29T00:00:00.250000Z").unwrap();
        assert_eq!(rfc3339(t), "2024-02-29T00:00:00.250Z");
        assert!(parse_rfc3339("2026-11-28T23:39:31+02:00").is_none());
        assert!(parse_rfc3339("yesterday").is_none());
        for bad in [
            "2026-11-28T23-39-31Z",
            "2026-11-28T+1:39:31Z",
            "2026-11-28T24:00:00Z",
            "2026-11-28T23:60:00Z",
            "2026-11-28T23:39:61Z",
        ] {
            assert!(parse_rfc3339(bad).is_none(), "{bad}");
        }
    }

    /// Only the kubelet's own events count, of this node's kubelet when
    /// the node is known: another component's (`kubelet-helper`), or
    /// another node's kubelet's, do not (before, any source containing
    /// "kubelet" counted).
    #[test]
    fn only_this_nodes_kubelet_counts() {
        let mut e = event("x", SystemTime::UNIX_EPOCH, "kubelet");
        assert!(from_kubelet(&e, None));
        e.host = "n1".into();
        assert!(from_kubelet(&e, Some("n1")));
        assert!(!from_kubelet(&e, Some("n2")));
        e.source = "kubelet-helper".into();
        assert!(!from_kubelet(&e, None));
    }

    fn event(message: &str, last: SystemTime, source: &str) -> RecentEvent {
        RecentEvent {
            type_: "Warning".into(),
            reason: "FailedMount".into(),
            message: message.into(),
            count: 3,
            last_time: rfc3339(last),
            source: source.into(),
            host: String::new(),
        }
    }

    /// Only events last seen after the mount (by [`AFTER_MOUNT`]) and
    /// within [`RECENT`] count.
    #[test]
    fn only_recent_events_after_the_mount_count() {
        let mount = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let now = mount + Duration::from_secs(60);
        let msg = "Unable to attach or mount volumes: unmounted volumes=[conf], unattached volumes=[], failed to process volumes=[]: x";
        let before = [event(msg, mount - Duration::from_secs(1), "kubelet")];
        assert!(kubelet_said(&before, "conf", mount, now).is_none());
        let same_second = [event(msg, mount + Duration::from_secs(1), "kubelet")];
        assert!(kubelet_said(&same_second, "conf", mount, now).is_none());
        let after = [event(msg, mount + Duration::from_secs(20), "kubelet")];
        let said = kubelet_said(&after, "conf", mount, now).unwrap();
        assert_eq!(said.list, "unmounted");
        assert!(kubelet_said(&after, "other", mount, now).is_none());
        let later = now + RECENT + Duration::from_secs(30);
        assert!(kubelet_said(&after, "conf", mount, later).is_none());
        // Another component's events are left out before
        // (`only_this_nodes_kubelet_counts`).
    }
}
