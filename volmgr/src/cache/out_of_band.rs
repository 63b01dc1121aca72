//! The record of out-of-band changes: every time a managed volume is found
//! unmounted behind the manager's back, or with something foreign mounted on
//! its path, this log keeps what happened, who did it (when the eBPF tracer
//! saw the syscall), and how long the repair took. `volmgr status` shows a
//! per-volume count with the time of the last change, and the most recent
//! changes as a list — what a storage engineer debugging "my pod's data
//! vanished" wants first.
//!
//! Losses are counted from the actual state's own `LostOutOfBand` events, so
//! losses found by the periodic resync count too (with `detected_by:
//! resync`); the tracers only add what they know about the cause beforehand.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use crate::cache::world::{VolumeEvent, VolumeEventKind};
use crate::status::OutOfBandEvent;
use crate::util::sync::MutexExt;
use crate::volume::{PodUid, UniqueVolumeName};

/// How many recent changes are kept.
pub const RECENT: usize = 64;

/// What found an out-of-band change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DetectedBy {
    /// A syscall event from the eBPF tracer, confirmed against mountinfo.
    Ebpf,
    /// A change of `/proc/self/mountinfo` seen by the poller.
    Mountinfo,
    /// The periodic resync.
    Resync,
}

impl DetectedBy {
    /// The name shown in status.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ebpf => "ebpf",
            Self::Mountinfo => "mountinfo",
            Self::Resync => "resync",
        }
    }
}

/// How a change was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detection {
    /// The tracer that found it.
    pub by: DetectedBy,
    /// The syscall and process behind it, when known.
    pub cause: Option<String>,
    /// From the syscall to the confirming check, in microseconds, when known.
    pub detected_after_us: Option<u64>,
}

/// The kinds of change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// The volume was unmounted (or its path no longer holds it).
    Lost,
    /// Something was mounted on the volume's path.
    ForeignMount,
}

impl ChangeKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Lost => "lost",
            Self::ForeignMount => "foreign_mount",
        }
    }
}

type Key = (UniqueVolumeName, PodUid);

struct Entry {
    seq: u64,
    key: Key,
    kind: ChangeKind,
    detected: Instant,
    event: OutOfBandEvent,
}

#[derive(Default)]
struct Inner {
    seq: u64,
    /// Totals per (kind, detected by), for Prometheus.
    totals: std::collections::BTreeMap<(&'static str, &'static str), u64>,
    per_volume: HashMap<Key, (u32, String)>,
    recent: VecDeque<Entry>,
    pending: HashMap<Key, Detection>,
}

/// The log (shared by the manager, its event listener and the tracers).
#[derive(Default)]
pub struct OutOfBandLog {
    inner: Mutex<Inner>,
}

impl OutOfBandLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.locked()
    }

    /// Says how the loss of `(volume, pod)` that is about to be reported was
    /// found (otherwise it is put down to the resync).
    pub fn expect_loss(&self, volume: &UniqueVolumeName, pod: &PodUid, how: Detection) {
        self.lock()
            .pending
            .insert((volume.clone(), pod.clone()), how);
    }

    /// Records a foreign mount found on a volume's path; returns its sequence
    /// number for [`foreign_mount_handled`](Self::foreign_mount_handled). A
    /// foreign mount of the volume not yet removed is the same change.
    pub fn foreign_mount(
        &self,
        volume: &UniqueVolumeName,
        pod: &PodUid,
        outer: &str,
        path: &std::path::Path,
        how: Detection,
    ) -> u64 {
        let key = (volume.clone(), pod.clone());
        let mut inner = self.lock();
        let open = inner.recent.iter().rev().find(|e| {
            e.key == key
                && e.kind == ChangeKind::ForeignMount
                && e.event.repaired_after_ms.is_none()
        });
        if let Some(e) = open {
            // Still being handled (a retry): the same change.
            return e.seq;
        }
        inner.add(
            key,
            ChangeKind::ForeignMount,
            outer,
            &path.display().to_string(),
            how,
        )
    }

    /// The outcome of removing a foreign mount.
    pub fn foreign_mount_handled(&self, seq: u64, result: Result<(), &dyn std::fmt::Display>) {
        let mut inner = self.lock();
        if let Some(e) = inner.recent.iter_mut().find(|e| e.seq == seq) {
            match result {
                Ok(()) => {
                    e.event.outcome = "repaired".into();
                    e.event.repaired_after_ms = Some(ms_since(e.detected));
                }
                Err(err) => e.event.outcome = format!("failed: {err}"),
            }
        }
    }

    /// The event listener: counts losses and times their repair.
    pub fn on_volume_event(&self, ev: &VolumeEvent) {
        let key = (ev.volume_name.clone(), ev.pod_uid.clone());
        let mut inner = self.lock();
        match ev.kind {
            VolumeEventKind::LostOutOfBand => {
                let how = inner.pending.remove(&key).unwrap_or(Detection {
                    by: DetectedBy::Resync,
                    cause: None,
                    detected_after_us: None,
                });
                let path = ev
                    .path
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default();
                inner.add(key, ChangeKind::Lost, &ev.volume, &path, how);
            }
            VolumeEventKind::Mounted => {
                for e in inner.recent.iter_mut().rev() {
                    if e.key == key
                        && e.kind == ChangeKind::Lost
                        && e.event.repaired_after_ms.is_none()
                    {
                        e.event.outcome = "repaired".into();
                        e.event.repaired_after_ms = Some(ms_since(e.detected));
                    }
                }
            }
            VolumeEventKind::Failed => {
                let err = ev.error.clone().unwrap_or_default();
                for e in inner.recent.iter_mut().rev() {
                    if e.key == key && e.event.repaired_after_ms.is_none() {
                        e.event.outcome = format!("repairing (last error: {err})");
                    }
                }
            }
            // Not a change of the pod's mount.
            VolumeEventKind::Expanded => {}
            VolumeEventKind::Unmounted => {
                // Torn down on purpose: the volume's history ends with it.
                inner.per_volume.remove(&key);
                inner.pending.remove(&key);
            }
        }
    }

    /// How often `(volume, pod)` was changed out of band, and when last.
    pub fn volume(&self, volume: &UniqueVolumeName, pod: &PodUid) -> Option<(u32, String)> {
        self.lock()
            .per_volume
            .get(&(volume.clone(), pod.clone()))
            .cloned()
    }

    /// `volmgr_out_of_band_changes_total{kind,detected_by}` (Prometheus text).
    pub fn prometheus_text(&self) -> String {
        use crate::util::prometheus::{Exposition, MetricType};
        let mut w = Exposition::new();
        let name = "volmgr_out_of_band_changes_total";
        w.family(
            name,
            "Managed volumes found changed behind the manager's back (unmounted, or something mounted on their path).",
            MetricType::Counter,
        );
        for ((kind, by), n) in &self.lock().totals {
            w.sample(name, &[("kind", kind), ("detected_by", by)], n);
        }
        w.finish()
    }

    /// The recent changes, oldest first.
    pub fn recent(&self) -> Vec<OutOfBandEvent> {
        self.lock().recent.iter().map(|e| e.event.clone()).collect()
    }
}

impl Inner {
    fn add(&mut self, key: Key, kind: ChangeKind, outer: &str, path: &str, how: Detection) -> u64 {
        *self
            .totals
            .entry((kind.as_str(), how.by.as_str()))
            .or_default() += 1;
        let time = rfc3339(SystemTime::now());
        let counter = self
            .per_volume
            .entry(key.clone())
            .or_insert((0, String::new()));
        counter.0 = counter.0.saturating_add(1);
        counter.1 = time.clone();
        self.seq += 1;
        let event = OutOfBandEvent {
            time,
            kind: kind.as_str().into(),
            pod_uid: key.1.to_string(),
            volume: outer.to_string(),
            path: path.to_string(),
            detected_by: how.by.as_str().into(),
            cause: how.cause,
            detected_after_us: how.detected_after_us,
            outcome: "repairing".into(),
            repaired_after_ms: None,
        };
        if self.recent.len() >= RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(Entry {
            seq: self.seq,
            key,
            kind,
            detected: Instant::now(),
            event,
        });
        self.seq
    }
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Formats a time as RFC 3339 in UTC with milliseconds
/// (`2026-11-22T08:30:00.123Z`).
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Today's `prometheus_text` for a fixed input, byte for byte.
    #[test]
    fn prometheus_text_is_unchanged() {
        let log = OutOfBandLog::default();
        assert_eq!(
            log.prometheus_text(),
            "# HELP volmgr_out_of_band_changes_total Managed volumes found changed behind the manager's back (unmounted, or something mounted on their path).\n# TYPE volmgr_out_of_band_changes_total counter\n"
        );
        let e = ev(VolumeEventKind::LostOutOfBand);
        log.on_volume_event(&e);
        log.on_volume_event(&e);
        let how = |by| Detection {
            by,
            cause: None,
            detected_after_us: None,
        };
        log.expect_loss(&e.volume_name, &e.pod_uid, how(DetectedBy::Ebpf));
        log.on_volume_event(&e);
        let path = std::path::Path::new("/r/pods/uid-1/volumes/kubernetes.io~empty-dir/m");
        log.foreign_mount(
            &e.volume_name,
            &e.pod_uid,
            "m",
            path,
            how(DetectedBy::Mountinfo),
        );
        let text = log.prometheus_text();
        let want = concat!(
            "# HELP volmgr_out_of_band_changes_total Managed volumes found changed behind the manager's back (unmounted, or something mounted on their path).\n",
            "# TYPE volmgr_out_of_band_changes_total counter\n",
            "volmgr_out_of_band_changes_total{kind=\"foreign_mount\",detected_by=\"mountinfo\"} 1\n",
            "volmgr_out_of_band_changes_total{kind=\"lost\",detected_by=\"ebpf\"} 1\n",
            "volmgr_out_of_band_changes_total{kind=\"lost\",detected_by=\"resync\"} 2\n",
        );
        assert_eq!(text, want);
    }

    #[test]
    fn formats_rfc3339() {
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_336_200_123);
        assert_eq!(rfc3339(t), "2026-11-22T08:30:00.123Z");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }

    fn ev(kind: VolumeEventKind) -> VolumeEvent {
        VolumeEvent {
            kind,
            pod_uid: PodUid::new("uid-1").unwrap(),
            volume: "m".into(),
            volume_name: UniqueVolumeName::new("kubernetes.io/empty-dir/uid-1-m"),
            path: Some("/r/pods/uid-1/volumes/kubernetes.io~empty-dir/m".into()),
            error: None,
            operation: crate::cache::world::VolumeOperation::SetUp,
            block: false,
        }
    }

    #[test]
    fn counts_losses_with_their_cause_and_times_the_repair() {
        let log = OutOfBandLog::default();
        let e = ev(VolumeEventKind::LostOutOfBand);
        log.on_volume_event(&e);
        log.expect_loss(
            &e.volume_name,
            &e.pod_uid,
            Detection {
                by: DetectedBy::Ebpf,
                cause: Some("umount2 by umount[7]".into()),
                detected_after_us: Some(80),
            },
        );
        log.on_volume_event(&e);
        let (n, _) = log.volume(&e.volume_name, &e.pod_uid).unwrap();
        assert_eq!(n, 2);
        let r = log.recent();
        assert_eq!(r[0].detected_by, "resync");
        assert_eq!(r[1].detected_by, "ebpf");
        assert_eq!(r[1].cause.as_deref(), Some("umount2 by umount[7]"));
        assert!(r.iter().all(|e| e.outcome == "repairing"));
        let text = log.prometheus_text();
        assert!(text
            .contains("volmgr_out_of_band_changes_total{kind=\"lost\",detected_by=\"ebpf\"} 1\n"));
        assert!(text.contains(
            "volmgr_out_of_band_changes_total{kind=\"lost\",detected_by=\"resync\"} 1\n"
        ));
        log.on_volume_event(&ev(VolumeEventKind::Mounted));
        let r = log.recent();
        assert!(r
            .iter()
            .all(|e| e.outcome == "repaired" && e.repaired_after_ms.is_some()));
        // Torn down on purpose: the per-volume count goes, the history stays.
        log.on_volume_event(&ev(VolumeEventKind::Unmounted));
        assert!(log.volume(&e.volume_name, &e.pod_uid).is_none());
        assert_eq!(log.recent().len(), 2);
    }

    #[test]
    fn keeps_only_the_most_recent() {
        let log = OutOfBandLog::default();
        for _ in 0..RECENT + 5 {
            log.on_volume_event(&ev(VolumeEventKind::LostOutOfBand));
        }
        assert_eq!(log.recent().len(), RECENT);
    }
}
