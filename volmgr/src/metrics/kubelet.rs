//! The kubelet's volume manager metrics beyond the operation histograms,
//! with its names, labels and buckets, counted where volmgr does the
//! corresponding thing:
//!
//! - `reconstruct_volume_operations_total` / `_errors_total`
//!   (`pkg/kubelet/volumemanager/metrics`): every volume directory
//!   reconstruction tries at start-up, and those it could not read;
//! - `volume_operation_total_seconds{plugin_name, operation_name}`
//!   (`pkg/volume/util/metrics.go`): `overall_volume_mount`, from the first
//!   attempt to set a pod's volume up to its first success (the kubelet
//!   measures from the volume's entry in its desired state; volmgr's first
//!   attempt follows that entry at once, or once the volume is attached);
//! - `kubelet_volume_metric_collection_duration_seconds{metric_source}`
//!   (`pkg/kubelet/server/metrics`): each volume stats call, by source
//!   (`statfs`, or the CSI driver's name, as the kubelet labels them).
//!
//! `force_cleaned_failed_volume_operations_total` and
//! `force_cleaned_failed_volume_operation_errors_total` are not exposed:
//! the kubelet counts its `cleanupMounts` of volumes whose reconstruction
//! failed, and volmgr has no such clean-up (a volume it cannot reconstruct
//! is left as found and reported in status). `volume_manager_selinux_*` are
//! the desired state's (`cache::selinux`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::LatencyHistogram;
use crate::util::prometheus::{Exposition, MetricType};
use crate::util::sync::MutexExt;

/// Prometheus' default buckets (`metrics.DefBuckets`), which the kubelet's
/// `volume_metric_collection_duration_seconds` uses.
pub const DEF_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The kubelet's counters and histograms that [`super::Metrics`] carries
/// beside its operation histograms.
#[derive(Debug, Default)]
pub struct KubeletMetrics {
    reconstruct_total: AtomicU64,
    reconstruct_errors: AtomicU64,
    /// `(plugin_name, operation_name)` → end-to-end durations.
    total_seconds: Mutex<BTreeMap<(Arc<str>, &'static str), LatencyHistogram>>,
    /// `metric_source` → stats call durations.
    collection: Mutex<BTreeMap<String, LatencyHistogram>>,
}

impl KubeletMetrics {
    /// Counts volumes reconstruction tried (`tried`), `failed` of them.
    pub fn add_reconstructed(&self, tried: u64, failed: u64) {
        self.reconstruct_total.fetch_add(tried, Ordering::Relaxed);
        self.reconstruct_errors.fetch_add(failed, Ordering::Relaxed);
    }

    /// Records an end-to-end duration of `operation` (`overall_volume_mount`)
    /// of a volume of `plugin` (over the kubelet's buckets for it,
    /// [`super::OPERATION_BUCKETS`]).
    pub fn record_total(&self, plugin: Arc<str>, operation: &'static str, d: Duration) {
        let mut all = self.total_seconds.locked();
        all.entry((plugin, operation)).or_default().record(d);
    }

    /// Records how long one volume stats call of `source` took.
    pub fn record_collection(&self, source: &str, d: Duration) {
        let mut all = self.collection.locked();
        match all.get_mut(source) {
            Some(h) => h.record(d),
            None => {
                let mut h = LatencyHistogram::new();
                h.record(d);
                all.insert(source.to_string(), h);
            }
        }
    }

    /// The Prometheus text of these metrics.
    pub fn prometheus_text(&self) -> String {
        let mut w = Exposition::new();
        for (name, help, n) in [
            (
                "reconstruct_volume_operations_total",
                "The number of volumes that were attempted to be reconstructed from the operating system during kubelet startup. This includes both successful and failed reconstruction.",
                &self.reconstruct_total,
            ),
            (
                "reconstruct_volume_operations_errors_total",
                "The number of volumes that failed reconstruction from the operating system during kubelet startup.",
                &self.reconstruct_errors,
            ),
        ] {
            w.family(name, help, MetricType::Counter);
            w.sample(name, &[], n.load(Ordering::Relaxed));
        }
        let name = "volume_operation_total_seconds";
        w.family(
            name,
            "Storage operation end to end duration in seconds",
            MetricType::Histogram,
        );
        for ((plugin, op), h) in self.total_seconds.locked().iter() {
            h.write_prometheus(
                &mut w,
                name,
                &[("plugin_name", plugin), ("operation_name", op)],
            );
        }
        let name = "kubelet_volume_metric_collection_duration_seconds";
        w.family(
            name,
            "Duration in seconds to calculate volume stats",
            MetricType::Histogram,
        );
        for (source, h) in self.collection.locked().iter() {
            let buckets = DEF_BUCKETS.map(|b| (b, h.count_at_or_below(b)));
            w.histogram(
                name,
                &[("metric_source", source)],
                buckets,
                h.count(),
                h.sum_seconds(),
            );
        }
        w.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names, labels and buckets as the kubelet's.
    #[test]
    fn exposition_has_the_kubelets_names_labels_and_buckets() {
        let m = KubeletMetrics::default();
        m.add_reconstructed(3, 1);
        m.record_total(
            "kubernetes.io/empty-dir".into(),
            "overall_volume_mount",
            Duration::from_millis(300),
        );
        m.record_collection("statfs", Duration::from_millis(7));
        let text = m.prometheus_text();
        for line in [
            "# TYPE reconstruct_volume_operations_total counter",
            "reconstruct_volume_operations_total 3",
            "reconstruct_volume_operations_errors_total 1",
            "# TYPE volume_operation_total_seconds histogram",
            "volume_operation_total_seconds_bucket{plugin_name=\"kubernetes.io/empty-dir\",operation_name=\"overall_volume_mount\",le=\"0.25\"} 0",
            "volume_operation_total_seconds_bucket{plugin_name=\"kubernetes.io/empty-dir\",operation_name=\"overall_volume_mount\",le=\"600\"} 1",
            "volume_operation_total_seconds_count{plugin_name=\"kubernetes.io/empty-dir\",operation_name=\"overall_volume_mount\"} 1",
            "kubelet_volume_metric_collection_duration_seconds_bucket{metric_source=\"statfs\",le=\"0.005\"} 0",
            "kubelet_volume_metric_collection_duration_seconds_bucket{metric_source=\"statfs\",le=\"0.01\"} 1",
            "kubelet_volume_metric_collection_duration_seconds_bucket{metric_source=\"statfs\",le=\"10\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in:\n{text}");
        }
    }
}
