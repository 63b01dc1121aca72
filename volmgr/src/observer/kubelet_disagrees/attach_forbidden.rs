//! The attach side of `kubelet_disagrees`, longhorn/longhorn#4188: the
//! kubelet's `FailedMount` event says `MountVolume.WaitForAttach failed
//! for volume "pvc-..." : volume pvc-... has GET error for volume
//! attachment csi-<64 hex>: volumeattachments.storage.k8s.io "csi-..." is
//! forbidden: User "system:node:<node>" cannot get resource
//! "volumeattachments" ... no relationship found between node '<node>' and
//! this object`.
//!
//! The Node authorizer lets a node's kubelet read a VolumeAttachment only
//! when its `spec.nodeName` is that node: the operator sees an RBAC error
//! while the cause is that the VolumeAttachment the kubelet waits for
//! names another node (the attach/detach controller has not moved the
//! volume to this node: typical after a reboot), or does not exist (it
//! has not created it for this node). Observe mode's RBAC may read any
//! VolumeAttachment: it reads the one named (through the
//! [`AttachmentLog`], in the background) and says which.

use std::time::SystemTime;

use super::attach::{AttachmentLog, AttachmentSeen, Target, Volume, MAX_ERROR};
use super::{kubelet_line, parse_rfc3339, RECENT};
use crate::cache::desired_state_of_world::DesiredStateOfWorld;
use crate::observer::{finding, Snapshot};
use crate::status::{Finding, FindingKind, RecentEvent};
use crate::util::escape::{printable, shortened};

/// What the kubelet's message says before the VolumeAttachment's name.
const KEY: &str = "GET error for volume attachment csi-";

/// Bytes of a message searched for [`KEY`], at most.
const MAX_SCAN: usize = 8192;

/// The VolumeAttachment (`csi-` and 64 lowercase hex digits, exactly) a
/// kubelet's `GET error for volume attachment csi-...` message names,
/// searched in its first [`MAX_SCAN`] bytes.
pub fn forbidden_attachment(message: &str) -> Option<String> {
    let head = &message[..message.floor_char_boundary(MAX_SCAN)];
    let start = head.find(KEY)? + KEY.len();
    let hex = |b: &u8| matches!(b, b'0'..=b'9' | b'a'..=b'f');
    let digits = message.as_bytes().get(start..start + 64)?;
    let after = message.as_bytes().get(start + 64);
    (digits.iter().all(hex) && !after.is_some_and(hex))
        .then(|| format!("csi-{}", &message[start..start + 64]))
}

/// The newest kubelet event within [`RECENT`] of `now` saying it may not
/// read VolumeAttachment `name`.
pub fn said_forbidden<'a>(
    events: &'a [RecentEvent],
    name: &str,
    now: SystemTime,
) -> Option<&'a RecentEvent> {
    events
        .iter()
        .filter_map(|e| {
            let at = parse_rfc3339(&e.last_time)?;
            let recent = now.duration_since(at).map_or(true, |d| d <= RECENT);
            let named = forbidden_attachment(&e.message).is_some_and(|n| n == name);
            (recent && named).then_some((e, at))
        })
        .max_by_key(|(_, at)| *at)
        .map(|(e, _)| e)
}

/// Why the kubelet may not read the VolumeAttachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// It names another node.
    OtherNode(AttachmentSeen),
    /// It does not exist.
    Absent,
}

/// The refusal of VolumeAttachment `name` to node `node`'s kubelet, as
/// `log` read it (`None`: not read yet, or it names this node).
pub fn judge(log: &dyn AttachmentLog, name: &str, node: &str) -> Option<Refusal> {
    match log.attachment(name) {
        Some(va) => (va.node_name != node).then_some(Refusal::OtherNode(va)),
        None => log.absent(name).then_some(Refusal::Absent),
    }
}

/// Where the scan is: the log, this node's name (the detector's, else the
/// log's), the snapshot, the desired state.
pub(in crate::observer) struct Scan<'a> {
    /// The VolumeAttachments as read.
    pub log: &'a dyn AttachmentLog,
    /// This node's name, when the detector knows it.
    pub node: Option<&'a str>,
    /// The snapshot.
    pub snap: &'a Snapshot,
    /// The desired state.
    pub dsw: &'a DesiredStateOfWorld,
}

/// Judges `vol` (not mounted) against the pod's kubelet `events`: the
/// VolumeAttachment the kubelet may not read into `wanted`; its finding,
/// once read, into `out`.
pub(in crate::observer) fn evaluate(
    scan: &Scan<'_>,
    vol: &Volume<'_>,
    events: &[RecentEvent],
    wanted: &mut Vec<String>,
    out: &mut Vec<Finding>,
) {
    let node = scan.node.map_or_else(|| scan.log.node(), str::to_string);
    let Some(Target { attachment, .. }) = super::attach::target(scan.dsw, vol.uid, vol.v, &node)
    else {
        return;
    };
    let Some(event) = said_forbidden(events, &attachment, SystemTime::now()) else {
        return;
    };
    wanted.push(attachment.clone());
    let Some(refusal) = judge(scan.log, &attachment, &node) else {
        return;
    };
    let name = &vol.v.outer_name;
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return;
    }
    let path = scan
        .snap
        .root
        .join("pods")
        .join(vol.uid.as_str())
        .join("volumes/kubernetes.io~csi")
        .join(name);
    let what = Refused {
        event,
        attachment: &attachment,
        node: &node,
        refusal: &refusal,
    };
    let mut f = refusal_finding(path.display().to_string(), name, &what);
    f.pod_uid = Some(vol.uid.as_str().to_string());
    f.pod = Some(vol.pod.clone());
    out.push(f);
}

/// What the finding shows.
pub struct Refused<'a> {
    /// The kubelet's event.
    pub event: &'a RecentEvent,
    /// The VolumeAttachment's name.
    pub attachment: &'a str,
    /// This node's name.
    pub node: &'a str,
    /// Why the kubelet may not read it.
    pub refusal: &'a Refusal,
}

/// The finding on `volume` at `path`.
pub fn refusal_finding(path: String, volume: &str, r: &Refused<'_>) -> Finding {
    let node = printable(r.node);
    let (summary, line, conclusion) = match r.refusal {
        Refusal::OtherNode(va) => {
            let other = printable(&va.node_name);
            (
                format!(
                    "the kubelet may not read VolumeAttachment {} (volume {volume:?}) because it names node {other}, not {node}: the volume is still attached there (the attach/detach controller has not moved it to this node)",
                    r.attachment
                ),
                attachment_line(va),
                format!(
                    "the Node authorizer lets node {node}'s kubelet read only VolumeAttachments whose spec.nodeName is {node} (hence \"forbidden ... no relationship found\"); this one names node {other}: the attach/detach controller in kube-controller-manager has not detached it from {other} and attached it to {node} (check that node, the pods still using the volume there, and kube-controller-manager's logs)"
                ),
            )
        }
        Refusal::Absent => (
            format!(
                "the kubelet may not read VolumeAttachment {} (volume {volume:?}): no such VolumeAttachment exists (the attach/detach controller has not created it for node {node})",
                r.attachment
            ),
            format!(
                "the VolumeAttachment: {} does not exist (read by observe mode)",
                r.attachment
            ),
            format!(
                "the Node authorizer refuses a VolumeAttachment it knows no relationship of to node {node} (hence \"forbidden ... no relationship found\"), and one that does not exist has none: the attach/detach controller in kube-controller-manager has not created it for {node} (check kube-controller-manager's logs, and whether the volume is still attached elsewhere)"
            ),
        ),
    };
    let mut f = finding(FindingKind::KubeletDisagrees, path, summary);
    f.volume = Some(volume.to_string());
    f.evidence.push(kubelet_line(r.event));
    f.evidence.push(line);
    f.evidence.push(format!("conclusion: {conclusion}"));
    f.events.push(r.event.clone());
    f
}

/// The VolumeAttachment as evidence (its errors escaped and bounded).
fn attachment_line(va: &AttachmentSeen) -> String {
    let err = |e: &Option<String>| {
        e.as_deref().map_or("none".to_string(), |m| {
            format!("{:?}", shortened(&printable(m), MAX_ERROR))
        })
    };
    format!(
        "the VolumeAttachment: {} spec.nodeName {}: attached={}, attachError {}, detachError {}",
        va.name,
        printable(&va.node_name),
        va.attached,
        err(&va.attach_error),
        err(&va.detach_error)
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::cache::out_of_band::rfc3339;
    use crate::observer::NodeAttached;
    use crate::populator::convert::csi_driver::attachment_name;
    use std::collections::BTreeMap;
    use std::time::Duration;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    /// A fake log: what was read, and what was read absent.
    #[derive(Default)]
    struct Log {
        read: BTreeMap<String, AttachmentSeen>,
        absent: Vec<String>,
    }

    impl AttachmentLog for Log {
        fn node(&self) -> String {
            "server1".into()
        }
        fn want(&self, _names: Vec<String>) {}
        fn attachment(&self, name: &str) -> Option<AttachmentSeen> {
            self.read.get(name).cloned()
        }
        fn absent(&self, name: &str) -> bool {
            self.absent.iter().any(|n| n == name)
        }
        fn node_attached(&self) -> Option<NodeAttached> {
            None
        }
    }

    fn name() -> String {
        attachment_name("pvc-1", "driver.longhorn.io", "server1")
    }

    fn message(name: &str) -> String {
        format!("MountVolume.WaitForAttach failed for volume \"pvc-1\" : volume pvc-1 has GET error for volume attachment {name}: volumeattachments.storage.k8s.io \"{name}\" is forbidden: User \"system:node:server1\" cannot get resource \"volumeattachments\" in API group \"storage.k8s.io\" at the cluster scope: no relationship found between node 'server1' and this object")
    }

    fn event(message: &str, last: SystemTime) -> RecentEvent {
        RecentEvent {
            type_: "Warning".into(),
            reason: "FailedMount".into(),
            message: message.into(),
            count: 60,
            last_time: rfc3339(last),
            source: "kubelet".into(),
            host: "server1".into(),
        }
    }

    fn seen(node: &str) -> AttachmentSeen {
        AttachmentSeen {
            name: name(),
            node_name: node.into(),
            attached: true,
            attach_error: None,
            detach_error: Some("\u{1b}[31mrpc error".into()),
            attached_since: Some(at(0)),
        }
    }

    #[test]
    fn reads_the_name_in_the_kubelets_message() {
        let n = name();
        assert_eq!(forbidden_attachment(&message(&n)), Some(n.clone()));
        assert_eq!(forbidden_attachment("MountVolume.SetUp failed"), None);
        assert_eq!(forbidden_attachment(&message("csi-12ab")), None);
        assert_eq!(forbidden_attachment(&message(&format!("{n}0"))), None);
        let upper = format!("csi-{}", n[4..].to_uppercase());
        assert_eq!(forbidden_attachment(&message(&upper)), None);
        let late = format!("{}{}", "x".repeat(MAX_SCAN), message(&n));
        assert_eq!(forbidden_attachment(&late), None, "past the bound");
        let cut = format!("{KEY}{}", &n[4..40]);
        assert_eq!(forbidden_attachment(&cut), None);
        assert_eq!(forbidden_attachment(&format!("é{KEY}é")), None);
    }

    /// Another node's VolumeAttachment, or none: a finding naming both
    /// nodes, or saying none exists; this node's, or not read: none.
    #[test]
    fn judges_who_the_attachment_names() {
        let n = name();
        let mut log = Log::default();
        assert_eq!(judge(&log, &n, "server1"), None, "not read");
        log.absent.push(n.clone());
        assert_eq!(judge(&log, &n, "server1"), Some(Refusal::Absent));
        log.read.insert(n.clone(), seen("server1"));
        assert_eq!(judge(&log, &n, "server1"), None, "this node's");
        log.read.insert(n.clone(), seen("server2"));
        assert_eq!(
            judge(&log, &n, "server1"),
            Some(Refusal::OtherNode(seen("server2")))
        );
    }

    #[test]
    fn only_recent_events_naming_it_count() {
        let n = name();
        let events = [
            event(&message(&n), at(30)),
            event("unattached volumes=[data]", at(50)),
            event(&message(&format!("csi-{}", "0".repeat(64))), at(55)),
        ];
        let e = said_forbidden(&events, &n, at(60)).unwrap();
        assert_eq!(e.last_time, rfc3339(at(30)));
        let late = at(30) + RECENT + Duration::from_secs(1);
        assert!(said_forbidden(&events, &n, late).is_none());
        let huge = event(
            &"GET error for volume attachment csi-".repeat(50_000),
            at(59),
        );
        assert!(said_forbidden(&[huge], &n, at(60)).is_none());
    }

    #[test]
    fn the_finding_names_both_nodes_or_the_absence() {
        let n = name();
        let e = event(&message(&n), at(30));
        let other = Refusal::OtherNode(seen("server2"));
        let r = Refused {
            event: &e,
            attachment: &n,
            node: "server1",
            refusal: &other,
        };
        let f = refusal_finding("/p".into(), "data", &r);
        assert_eq!(f.kind, FindingKind::KubeletDisagrees);
        assert!(f
            .summary
            .contains(&format!("may not read VolumeAttachment {n}")));
        assert!(
            f.summary.contains("names node server2, not server1"),
            "{}",
            f.summary
        );
        let ev = f.evidence.join("\n");
        assert!(ev.contains("the kubelet: Warning FailedMount x60"), "{ev}");
        assert!(ev.contains(&format!("the VolumeAttachment: {n} spec.nodeName server2: attached=true, attachError none, detachError")), "{ev}");
        assert!(!ev.contains('\u{1b}'), "{ev}");
        assert!(ev.contains("conclusion: the Node authorizer"), "{ev}");
        let r = Refused {
            refusal: &Refusal::Absent,
            ..r
        };
        let f = refusal_finding("/p".into(), "data", &r);
        assert!(
            f.summary.contains("no such VolumeAttachment exists"),
            "{}",
            f.summary
        );
        assert!(f.evidence.join("\n").contains("does not exist"));
    }
}
