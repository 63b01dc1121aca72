//! The attach side of `kubelet_disagrees`: the kubelet's `FailedMount`
//! event says `unattached volumes=[x]` while x's VolumeAttachment to this
//! node says `status.attached: true`.
//!
//! With controller-managed attach (every kubelet but a standalone one),
//! the kubelet's reconciler waits in `VerifyControllerAttachedVolume`
//! until the Node's `status.volumesAttached` lists the volume
//! (`kubernetes.io/csi/<driver>^<handle>`), which only the attach/detach
//! controller of kube-controller-manager writes, after the CSI attacher
//! set the VolumeAttachment (`csi-<sha256(handle + driver + node)>`)
//! attached. A person sees the pod in `ContainerCreating` with
//! "unattached volumes" and no reason; the evidence names the side that
//! lags:
//!
//! - the VolumeAttachment is attached, the Node does not list the volume:
//!   the attach/detach controller has not recorded it (counted once the
//!   Node, read at least [`super::AFTER_MOUNT`] after observe mode first
//!   saw the VolumeAttachment attached, still does not list it);
//! - the Node lists it too: the kubelet has not read it (counted when the
//!   kubelet's event was last seen [`super::AFTER_MOUNT`] after observe
//!   mode first saw the Node list it);
//! - the VolumeAttachment has an `attachError`: no disagreement, the
//!   attach failed and the kubelet rightly waits; said as such.
//!
//! Only a pod volume the node does not have mounted is judged here (a
//! mounted one is the mount side's). The VolumeAttachments and the Node
//! come from an [`AttachmentLog`] (observe mode reads, in the background,
//! only the VolumeAttachments the scan asks for: those of volumes the
//! kubelet recently said are unattached), never from the API server
//! during a scan.

use std::path::PathBuf;
use std::time::SystemTime;

use super::{kubelet_line, parse_rfc3339, parse_volume_lists, AFTER_MOUNT, RECENT};
use crate::cache::desired_state_of_world::{DesiredStateOfWorld, PodVolumeEntry};
use crate::cache::out_of_band::rfc3339;
use crate::observer::{finding, Snapshot};
use crate::populator::convert::csi_driver::attachment_name;
use crate::status::{Finding, FindingKind, RecentEvent};
use crate::util::escape::{printable, shortened};
use crate::volume::{PodUid, VolumeSource};

/// Bytes of an `attachError` or `detachError` message kept, at most.
pub const MAX_ERROR: usize = 1024;

/// A VolumeAttachment as last read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttachmentSeen {
    /// Its name.
    pub name: String,
    /// `spec.nodeName`.
    pub node_name: String,
    /// `status.attached`.
    pub attached: bool,
    /// `status.attachError.message` (at most [`MAX_ERROR`] bytes).
    pub attach_error: Option<String>,
    /// `status.detachError.message` (at most [`MAX_ERROR`] bytes).
    pub detach_error: Option<String>,
    /// Since when observe mode sees it attached.
    pub attached_since: Option<SystemTime>,
}

/// The Node's `status.volumesAttached` as last read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAttached {
    /// The names listed, each with since when observe mode sees it listed.
    pub listed: Vec<(String, SystemTime)>,
    /// When it was read.
    pub read_at: SystemTime,
}

/// The VolumeAttachments of the node's volumes and the Node's
/// `status.volumesAttached`, as last read.
pub trait AttachmentLog: Send + Sync {
    /// The node's name (the VolumeAttachments' `spec.nodeName`).
    fn node(&self) -> String;
    /// The VolumeAttachments wanted now (by name): the others are
    /// forgotten, new ones read soon.
    fn want(&self, names: Vec<String>);
    /// VolumeAttachment `name` as last read (`None`: not read, or absent).
    fn attachment(&self, name: &str) -> Option<AttachmentSeen>;
    /// Whether VolumeAttachment `name` was read and does not exist
    /// (`false`: not read yet, or it exists).
    fn absent(&self, _name: &str) -> bool {
        false
    }
    /// The Node's `status.volumesAttached` as last read (`None`: not read).
    fn node_attached(&self) -> Option<NodeAttached>;
}

/// No API server: nothing is found.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoAttachments;

impl AttachmentLog for NoAttachments {
    fn node(&self) -> String {
        String::new()
    }
    fn want(&self, _names: Vec<String>) {}
    fn attachment(&self, _name: &str) -> Option<AttachmentSeen> {
        None
    }
    fn node_attached(&self) -> Option<NodeAttached> {
        None
    }
}

/// What a pod volume's attachment is: its VolumeAttachment's name and,
/// when known, the name the Node's `status.volumesAttached` gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `csi-<sha256(handle + driver + node)>`.
    pub attachment: String,
    /// `kubernetes.io/csi/<driver>^<handle>` (unknown for a volume that
    /// failed to resolve).
    pub unique: Option<String>,
}

/// The attach side's verdict on one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Attached, the Node does not list it: the attach/detach controller
    /// has not recorded it.
    NotRecorded,
    /// Attached and listed by the Node since then: the kubelet has not
    /// read it.
    NotRead(SystemTime),
    /// The attach failed (`attachError`): the kubelet is right.
    AttachFailed,
}

/// The verdict on a volume the kubelet last said is unattached at `said`,
/// with its VolumeAttachment `va` and the Node as read; `None` when there
/// is nothing to say (not attached yet, another node, too early to tell).
pub fn judge(
    va: &AttachmentSeen,
    unique: Option<&str>,
    node: Option<&NodeAttached>,
    node_name: &str,
    said: SystemTime,
) -> Option<Verdict> {
    if va.node_name != node_name {
        return None;
    }
    if va.attach_error.is_some() {
        return Some(Verdict::AttachFailed);
    }
    let since = va.attached_since.filter(|_| va.attached)?;
    let (unique, node) = (unique?, node?);
    match node.listed.iter().find(|(n, _)| n == unique) {
        Some((_, listed)) => {
            let after = said.duration_since(*listed).is_ok_and(|d| d >= AFTER_MOUNT);
            after.then_some(Verdict::NotRead(*listed))
        }
        None => {
            let after = node
                .read_at
                .duration_since(since)
                .is_ok_and(|d| d >= AFTER_MOUNT);
            after.then_some(Verdict::NotRecorded)
        }
    }
}

/// The VolumeAttachment and Node name of pod `uid`'s volume `v` on node
/// `node`: a CSI PersistentVolume's whose driver attaches (desired), or
/// the VolumeAttachment a failed one waits for (named in its error).
pub fn target(
    dsw: &DesiredStateOfWorld,
    uid: &PodUid,
    v: &PodVolumeEntry,
    node: &str,
) -> Option<Target> {
    if node.is_empty() {
        return None;
    }
    let Some(name) = v.resolution.name() else {
        let error = v.resolution.error()?;
        return attachment_named_in(error).map(|attachment| Target {
            attachment,
            unique: None,
        });
    };
    let spec = &dsw.volume(name)?.pods.get(uid)?.spec;
    let VolumeSource::Csi(c) = &spec.source else {
        return None;
    };
    c.can_attach().then(|| Target {
        attachment: attachment_name(&c.volume_handle, &c.driver, node),
        unique: Some(format!(
            "kubernetes.io/csi/{}^{}",
            c.driver, c.volume_handle
        )),
    })
}

/// The VolumeAttachment (`csi-` and 64 hex digits) a resolution error
/// names (`VolumeAttachment csi-... failed to attach: ...`).
pub fn attachment_named_in(error: &str) -> Option<String> {
    const KEY: &str = "VolumeAttachment csi-";
    let start = error.find(KEY)? + KEY.len() - "csi-".len();
    let name = error.get(start..start + 68)?;
    name[4..]
        .bytes()
        .all(|b| b.is_ascii_hexdigit())
        .then(|| name.to_string())
}

/// The newest kubelet event within [`RECENT`] of `now` listing `volume` as
/// unattached, with when it was last seen.
pub fn said_unattached<'a>(
    events: &'a [RecentEvent],
    volume: &str,
    now: SystemTime,
) -> Option<(&'a RecentEvent, SystemTime)> {
    events
        .iter()
        .filter_map(|e| {
            let at = parse_rfc3339(&e.last_time)?;
            let recent = now.duration_since(at).map_or(true, |d| d <= RECENT);
            let says = parse_volume_lists(&e.message);
            (recent && says.unattached.iter().any(|n| n == volume)).then_some((e, at))
        })
        .max_by_key(|(_, at)| *at)
}

/// One pod volume the node does not have mounted, as the attach side
/// judges it.
pub(in crate::observer) struct Volume<'a> {
    /// The pod's UID.
    pub uid: &'a PodUid,
    /// `namespace/name`.
    pub pod: String,
    /// The volume.
    pub v: &'a PodVolumeEntry,
}

/// Judges `vol` against the pod's `events` and `log`: its finding into
/// `out`; the VolumeAttachment to read into `wanted`.
pub(in crate::observer) fn evaluate(
    log: &dyn AttachmentLog,
    snap: &Snapshot,
    dsw: &DesiredStateOfWorld,
    vol: &Volume<'_>,
    events: &[RecentEvent],
    wanted: &mut Vec<String>,
    out: &mut Vec<Finding>,
) {
    let node = log.node();
    let Some(t) = target(dsw, vol.uid, vol.v, &node) else {
        return;
    };
    let now = SystemTime::now();
    let Some((event, at)) = said_unattached(events, &vol.v.outer_name, now) else {
        return;
    };
    wanted.push(t.attachment.clone());
    let Some(va) = log.attachment(&t.attachment) else {
        return;
    };
    let node_seen = log.node_attached();
    let Some(verdict) = judge(&va, t.unique.as_deref(), node_seen.as_ref(), &node, at) else {
        return;
    };
    let name = &vol.v.outer_name;
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return;
    }
    let path = snap
        .root
        .join("pods")
        .join(vol.uid.as_str())
        .join("volumes/kubernetes.io~csi")
        .join(name);
    let seen = Seen {
        event,
        va: &va,
        unique: t.unique.as_deref(),
        node: node_seen.as_ref(),
        node_name: &node,
    };
    let mut f = attach_finding(path, &vol.v.outer_name, &verdict, &seen);
    f.pod_uid = Some(vol.uid.as_str().to_string());
    f.pod = Some(vol.pod.clone());
    out.push(f);
}

/// What the finding shows side by side.
pub struct Seen<'a> {
    /// The kubelet's event.
    pub event: &'a RecentEvent,
    /// The VolumeAttachment.
    pub va: &'a AttachmentSeen,
    /// The volume's name in the Node's `status.volumesAttached`.
    pub unique: Option<&'a str>,
    /// The Node as read.
    pub node: Option<&'a NodeAttached>,
    /// The node's name.
    pub node_name: &'a str,
}

/// The finding of `verdict` on `volume` at `path`.
pub fn attach_finding(path: PathBuf, volume: &str, verdict: &Verdict, s: &Seen<'_>) -> Finding {
    let va = s.va;
    let summary = match verdict {
        Verdict::NotRecorded => format!(
            "the kubelet says volume {volume:?} is not attached (unattached volumes=[...]); its VolumeAttachment {} says attached, the Node's status.volumesAttached does not list it",
            va.name
        ),
        Verdict::NotRead(_) => format!(
            "the kubelet says volume {volume:?} is not attached (unattached volumes=[...]); its VolumeAttachment {} says attached and the Node's status.volumesAttached lists it",
            va.name
        ),
        Verdict::AttachFailed => format!(
            "the kubelet says volume {volume:?} is not attached, and it is not: its VolumeAttachment {} failed to attach (attachError)",
            va.name
        ),
    };
    let mut f = finding(
        FindingKind::KubeletDisagrees,
        path.display().to_string(),
        summary,
    );
    f.volume = Some(volume.to_string());
    f.since = va.attached_since.map(rfc3339);
    f.evidence.push(kubelet_line(s.event));
    f.evidence.push(attachment_line(va));
    if let Some(line) = node_line(s) {
        f.evidence.push(line);
    }
    f.evidence
        .push(format!("conclusion: {}", conclusion(verdict, s)));
    f.events.push(s.event.clone());
    f
}

/// The VolumeAttachment as evidence (its errors escaped and bounded).
fn attachment_line(va: &AttachmentSeen) -> String {
    let err = |e: &Option<String>| {
        e.as_deref().map_or("none".to_string(), |m| {
            format!("{:?}", shortened(&printable(m), MAX_ERROR))
        })
    };
    let since = va
        .attached_since
        .map(|t| format!(" (observe mode first saw it attached at {})", rfc3339(t)))
        .unwrap_or_default();
    format!(
        "the VolumeAttachment: {} spec.nodeName {}: attached={}{since}, attachError {}, detachError {}",
        va.name,
        printable(&va.node_name),
        va.attached,
        err(&va.attach_error),
        err(&va.detach_error)
    )
}

/// Whether the Node lists the volume, as evidence.
fn node_line(s: &Seen<'_>) -> Option<String> {
    let (unique, node) = (s.unique?, s.node?);
    let listed = match node.listed.iter().find(|(n, _)| n == unique) {
        Some((_, since)) => format!("lists it (seen listed since {})", rfc3339(*since)),
        None => format!("does not list it ({} volumes listed)", node.listed.len()),
    };
    Some(format!(
        "the Node {}: status.volumesAttached {listed}: {} (read at {})",
        printable(s.node_name),
        printable(unique),
        rfc3339(node.read_at)
    ))
}

/// The conclusion in plain words.
fn conclusion(verdict: &Verdict, s: &Seen<'_>) -> String {
    match verdict {
        Verdict::NotRecorded => "the CSI attacher attached it; the Node's status.volumesAttached does not list it: the attach/detach controller in kube-controller-manager has not recorded it (the kubelet waits for the Node to list it: check kube-controller-manager and its logs)".to_string(),
        Verdict::NotRead(since) => format!(
            "the CSI attacher attached it and the Node's status.volumesAttached lists it since {}, yet the kubelet said unattached after: the kubelet has not read the Node's status (restart the kubelet if it lasts)",
            rfc3339(*since)
        ),
        Verdict::AttachFailed => format!(
            "no disagreement: the attach of {} to node {} failed (the attachError above), the kubelet rightly waits for it; fix the attach (the CSI driver's controller, its external-attacher's logs)",
            s.va.name,
            printable(s.node_name)
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn va(attached: bool, since: Option<SystemTime>, error: Option<&str>) -> AttachmentSeen {
        AttachmentSeen {
            name: attachment_name("h1", "d.example.com", "n1"),
            node_name: "n1".into(),
            attached,
            attach_error: error.map(str::to_string),
            detach_error: None,
            attached_since: since,
        }
    }

    const UNIQUE: &str = "kubernetes.io/csi/d.example.com^h1";

    fn node(listed: &[(&str, SystemTime)], read_at: SystemTime) -> NodeAttached {
        NodeAttached {
            listed: listed.iter().map(|(n, t)| (n.to_string(), *t)).collect(),
            read_at,
        }
    }

    /// Attached, not listed by a Node read [`AFTER_MOUNT`] after: not
    /// recorded; listed, and the kubelet said unattached after: not read;
    /// an attachError: the attach failed; otherwise nothing.
    #[test]
    fn judges_the_two_sides() {
        let a = va(true, Some(at(0)), None);
        let empty = node(&[], at(10));
        let j = |a: &AttachmentSeen, n: Option<&NodeAttached>, said| {
            judge(a, Some(UNIQUE), n, "n1", said)
        };
        assert_eq!(j(&a, Some(&empty), at(1)), Some(Verdict::NotRecorded));
        assert_eq!(j(&a, Some(&node(&[], at(2))), at(1)), None, "too early");
        assert_eq!(j(&a, None, at(1)), None, "the Node not read");
        let listed = node(&[(UNIQUE, at(20))], at(30));
        assert_eq!(j(&a, Some(&listed), at(21)), None, "said before");
        assert_eq!(j(&a, Some(&listed), at(40)), Some(Verdict::NotRead(at(20))));
        let waiting = va(false, None, None);
        assert_eq!(j(&waiting, Some(&empty), at(1)), None, "not attached");
        let failed = va(false, None, Some("rpc error: code = Internal"));
        assert_eq!(j(&failed, None, at(1)), Some(Verdict::AttachFailed));
        let mut other = va(true, Some(at(0)), None);
        other.node_name = "n2".into();
        assert_eq!(j(&other, Some(&empty), at(1)), None, "another node");
    }

    #[test]
    fn reads_the_attachment_a_failed_volume_waits_for() {
        let name = attachment_name("h1", "d.example.com", "n1");
        let error = format!("VolumeAttachment {name} (driver d.example.com, volume h1, node n1) failed to attach: boom");
        assert_eq!(attachment_named_in(&error), Some(name));
        assert_eq!(
            attachment_named_in("VolumeAttachment csi-12ab failed"),
            None
        );
        assert_eq!(attachment_named_in("no attachment"), None);
    }

    fn event(message: &str, last: SystemTime) -> RecentEvent {
        RecentEvent {
            type_: "Warning".into(),
            reason: "FailedMount".into(),
            message: message.into(),
            count: 2,
            last_time: rfc3339(last),
            source: "kubelet".into(),
            host: String::new(),
        }
    }

    #[test]
    fn only_recent_unattached_events_count() {
        let m = "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[data], failed to process volumes=[]: timed out waiting for the condition";
        let mounted_only = "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[], failed to process volumes=[]: x";
        let events = [event(mounted_only, at(50)), event(m, at(30))];
        let (e, t) = said_unattached(&events, "data", at(60)).unwrap();
        assert_eq!((e.message.as_str(), t), (m, at(30)));
        assert!(
            said_unattached(&events, "data", at(30) + RECENT + Duration::from_secs(1)).is_none()
        );
        assert!(said_unattached(&events, "conf", at(60)).is_none());
    }

    /// The evidence side by side, the errors escaped and bounded, the
    /// conclusion in words.
    #[test]
    fn the_finding_shows_both_sides() {
        let e = event("unattached volumes=[data]", at(40));
        let a = va(true, Some(at(0)), None);
        let n = node(&[("kubernetes.io/csi/other^x", at(0))], at(10));
        let s = Seen {
            event: &e,
            va: &a,
            unique: Some(UNIQUE),
            node: Some(&n),
            node_name: "n1",
        };
        let f = attach_finding(PathBuf::from("/p"), "data", &Verdict::NotRecorded, &s);
        assert!(f.summary.contains("does not list it"), "{}", f.summary);
        let ev = f.evidence.join("\n");
        assert!(
            ev.contains(&format!(
                "the VolumeAttachment: {} spec.nodeName n1: attached=true",
                a.name
            )),
            "{ev}"
        );
        assert!(ev.contains("attachError none, detachError none"), "{ev}");
        assert!(
            ev.contains(&format!(
                "the Node n1: status.volumesAttached does not list it (1 volumes listed): {UNIQUE}"
            )),
            "{ev}"
        );
        assert!(
            ev.contains(
                "the attach/detach controller in kube-controller-manager has not recorded it"
            ),
            "{ev}"
        );
        let bad = va(
            false,
            None,
            Some(&format!("\u{1b}[31m{}", "x".repeat(5000))),
        );
        let s = Seen {
            va: &bad,
            node: None,
            ..s
        };
        let f = attach_finding(PathBuf::from("/p"), "data", &Verdict::AttachFailed, &s);
        let ev = f.evidence.join("\n");
        assert!(!ev.contains('\u{1b}') && ev.len() < 4000, "{ev}");
        assert!(f.summary.contains("and it is not"), "{}", f.summary);
        assert!(
            ev.contains("conclusion: no disagreement: the attach of"),
            "{ev}"
        );
    }
}
