//! Operation latencies in `hdrhistogram` histograms, rendered as Prometheus
//! text with the kubelet's metric names so existing dashboards keep working.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;

pub mod kubelet;

use crate::util::fast_map::FastMap;
use crate::util::prometheus::{Exposition, MetricType};
use crate::util::sync::MutexExt;

/// The kubelet's buckets for `storage_operation_duration_seconds`.
pub const OPERATION_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

/// Latency of one kind of operation, in microseconds.
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    hist: Option<Histogram<u64>>,
    sum_us: u128,
}

/// Highest value tracked: one hour, in microseconds.
const MAX_US: u64 = 3_600_000_000;

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram spanning 1 µs to one hour at 3 significant digits.
    pub fn new() -> Self {
        // The bounds are constants `new_with_bounds` accepts; `None` is never
        // taken but keeps this free of panics.
        let hist = Histogram::new_with_bounds(1, MAX_US, 3).ok();
        Self { hist, sum_us: 0 }
    }

    /// Records one duration (saturating at the top bound).
    pub fn record(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
        if let Some(h) = self.hist.as_mut() {
            h.saturating_record(us);
        }
        self.sum_us += u128::from(us);
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.hist.as_ref().map_or(0, Histogram::len)
    }

    /// The value at quantile `q` (0..=1), in seconds.
    pub fn quantile_seconds(&self, q: f64) -> f64 {
        self.hist.as_ref().map_or(0, |h| h.value_at_quantile(q)) as f64 / 1e6
    }

    /// Largest sample, in seconds.
    pub fn max_seconds(&self) -> f64 {
        self.hist.as_ref().map_or(0, Histogram::max) as f64 / 1e6
    }

    /// Sum of samples, in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_us as f64 / 1e6
    }

    /// Number of samples at or below `seconds`.
    pub fn count_at_or_below(&self, seconds: f64) -> u64 {
        let us = (seconds * 1e6) as u64;
        self.hist.as_ref().map_or(0, |h| h.count_between(0, us))
    }

    /// Writes this histogram as the series of `name` with `labels`, over the
    /// kubelet's [`OPERATION_BUCKETS`].
    pub fn write_prometheus(&self, w: &mut Exposition, name: &str, labels: &[(&str, &str)]) {
        let buckets = OPERATION_BUCKETS.map(|b| (b, self.count_at_or_below(b)));
        w.histogram(name, labels, buckets, self.count(), self.sum_seconds());
    }
}

/// The `volume_plugin` label of a volume's operations
/// (`kubernetes.io/empty-dir`, `kubernetes.io/csi:<driver>`), and whether
/// CSI migration translated the volume from an in-tree plugin (the
/// kubelet's `migrated` label of `storage_operation_duration_seconds`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PluginLabel {
    /// The plugin's (or the CSI driver's) name.
    pub name: Arc<str>,
    /// A CSI-migrated volume.
    pub migrated: bool,
}

impl From<Arc<str>> for PluginLabel {
    fn from(name: Arc<str>) -> Self {
        Self {
            name,
            migrated: false,
        }
    }
}

impl From<&str> for PluginLabel {
    fn from(name: &str) -> Self {
        Arc::<str>::from(name).into()
    }
}

/// Key of an operation histogram.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OperationLabels {
    /// `volume_mount`, `volume_unmount`, ...
    pub operation_name: &'static str,
    /// `kubernetes.io/empty-dir`, ...
    pub volume_plugin: PluginLabel,
    /// `success` or `fail-unknown`.
    pub status: &'static str,
}

/// Summary of one histogram, for status.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LatencySummary {
    /// Operation name.
    pub operation: String,
    /// Plugin.
    pub plugin: String,
    /// Outcome.
    pub status: String,
    /// Samples.
    pub count: u64,
    /// Median, seconds.
    pub p50_seconds: f64,
    /// 99th percentile, seconds.
    pub p99_seconds: f64,
    /// Max, seconds.
    pub max_seconds: f64,
    /// Operations on volumes CSI migration translated from an in-tree
    /// plugin (`migrated="true"` in the metrics).
    #[serde(default)]
    pub migrated: bool,
}

/// All metrics of a manager.
#[derive(Debug, Default)]
pub struct Metrics {
    operations: Mutex<FastMap<OperationLabels, LatencyHistogram>>,
    /// The kubelet's other volume metrics (rendered by the manager, after
    /// [`Metrics::render`]'s).
    pub kubelet: kubelet::KubeletMetrics,
}

impl Metrics {
    /// Records an operation's duration.
    pub fn record_operation(&self, labels: OperationLabels, d: Duration) {
        let mut ops = self.operations.locked();
        ops.entry(labels).or_default().record(d);
    }

    /// p50/p99 per operation, for status.
    pub fn summaries(&self) -> Vec<LatencySummary> {
        let ops = self.operations.locked();
        let sorted: BTreeMap<_, _> = ops.iter().collect();
        sorted
            .into_iter()
            .map(|(k, h)| LatencySummary {
                operation: k.operation_name.to_string(),
                plugin: k.volume_plugin.name.to_string(),
                migrated: k.volume_plugin.migrated,
                status: k.status.to_string(),
                count: h.count(),
                p50_seconds: h.quantile_seconds(0.5),
                p99_seconds: h.quantile_seconds(0.99),
                max_seconds: h.max_seconds(),
            })
            .collect()
    }

    /// Prometheus text exposition of the operation histograms and of the
    /// volume counts given (`(plugin, desired, actual)`).
    pub fn render(&self, volume_counts: &[(String, usize, usize)], extra: &str) -> String {
        let mut w = Exposition::new();
        let name = "storage_operation_duration_seconds";
        w.family(name, "Storage operation duration", MetricType::Histogram);
        {
            let ops = self.operations.locked();
            let sorted: BTreeMap<_, _> = ops.iter().collect();
            for (k, h) in sorted {
                let labels = [
                    ("operation_name", k.operation_name),
                    ("volume_plugin", &*k.volume_plugin.name),
                    ("status", k.status),
                    (
                        "migrated",
                        if k.volume_plugin.migrated {
                            "true"
                        } else {
                            "false"
                        },
                    ),
                ];
                h.write_prometheus(&mut w, name, &labels);
            }
        }
        let name = "volume_manager_total_volumes";
        w.family(
            name,
            "Number of volumes in Volume Manager",
            MetricType::Gauge,
        );
        for (plugin, desired, actual) in volume_counts {
            for (state, n) in [
                ("desired_state_of_world", desired),
                ("actual_state_of_world", actual),
            ] {
                w.sample(name, &[("plugin_name", plugin), ("state", state)], n);
            }
        }
        let mut out = w.finish();
        out.push_str(extra);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Today's exposition for a fixed input, byte for byte: dashboards
    /// depend on every name, label, bound and number format.
    #[test]
    fn render_is_unchanged() {
        let m = Metrics::default();
        let mount = OperationLabels {
            operation_name: "volume_mount",
            volume_plugin: "kubernetes.io/empty-dir".into(),
            status: "success",
        };
        m.record_operation(mount.clone(), Duration::from_micros(50));
        m.record_operation(mount.clone(), Duration::from_millis(300));
        m.record_operation(mount, Duration::from_millis(2500));
        let odd = OperationLabels {
            operation_name: "volume_unmount",
            volume_plugin: "we\"ird\\plug\nin".into(),
            status: "fail-unknown",
        };
        m.record_operation(odd, Duration::from_secs(120));
        let counts = [
            ("kubernetes.io/empty-dir".to_string(), 2, 1),
            ("we\"ird".to_string(), 0, 3),
        ];
        let text = m.render(&counts, "# extra\n");
        let want = concat!(
            "# HELP storage_operation_duration_seconds Storage operation duration\n",
            "# TYPE storage_operation_duration_seconds histogram\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\",le=\"0.1\"} 1\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\",le=\"0.25\"} 1\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\",le=\"0.5\"} 2\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\",le=\"1\"} 2\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\",le=\"2.5\"} 3\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\",le=\"5\"} 3\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\",le=\"10\"} 3\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\",le=\"15\"} 3\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\",le=\"25\"} 3\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\",le=\"50\"} 3\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\",le=\"120\"} 3\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\",le=\"300\"} 3\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\",le=\"600\"} 3\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\",le=\"+Inf\"} 3\n",
            "storage_operation_duration_seconds_sum{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\"} 2.80005\n",
            "storage_operation_duration_seconds_count{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\"} 3\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_unmount\",volume_plugin=\"we\\\"ird\\\\plug\\nin\",status=\"fail-unknown\",migrated=\"false\",le=\"0.1\"} 0\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_unmount\",volume_plugin=\"we\\\"ird\\\\plug\\nin\",status=\"fail-unknown\",migrated=\"false\",le=\"0.25\"} 0\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_unmount\",volume_plugin=\"we\\\"ird\\\\plug\\nin\",status=\"fail-unknown\",migrated=\"false\",le=\"0.5\"} 0\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_unmount\",volume_plugin=\"we\\\"ird\\\\plug\\nin\",status=\"fail-unknown\",migrated=\"false\",le=\"1\"} 0\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_unmount\",volume_plugin=\"we\\\"ird\\\\plug\\nin\",status=\"fail-unknown\",migrated=\"false\",le=\"2.5\"} 0\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_unmount\",volume_plugin=\"we\\\"ird\\\\plug\\nin\",status=\"fail-unknown\",migrated=\"false\",le=\"5\"} 0\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_unmount\",volume_plugin=\"we\\\"ird\\\\plug\\nin\",status=\"fail-unknown\",migrated=\"false\",le=\"10\"} 0\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_unmount\",volume_plugin=\"we\\\"ird\\\\plug\\nin\",status=\"fail-unknown\",migrated=\"false\",le=\"15\"} 0\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_unmount\",volume_plugin=\"we\\\"ird\\\\plug\\nin\",status=\"fail-unknown\",migrated=\"false\",le=\"25\"} 0\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_unmount\",volume_plugin=\"we\\\"ird\\\\plug\\nin\",status=\"fail-unknown\",migrated=\"false\",le=\"50\"} 0\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_unmount\",volume_plugin=\"we\\\"ird\\\\plug\\nin\",status=\"fail-unknown\",migrated=\"false\",le=\"120\"} 1\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_unmount\",volume_plugin=\"we\\\"ird\\\\plug\\nin\",status=\"fail-unknown\",migrated=\"false\",le=\"300\"} 1\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_unmount\",volume_plugin=\"we\\\"ird\\\\plug\\nin\",status=\"fail-unknown\",migrated=\"false\",le=\"600\"} 1\n",
            "storage_operation_duration_seconds_bucket{operation_name=\"volume_unmount\",volume_plugin=\"we\\\"ird\\\\plug\\nin\",status=\"fail-unknown\",migrated=\"false\",le=\"+Inf\"} 1\n",
            "storage_operation_duration_seconds_sum{operation_name=\"volume_unmount\",volume_plugin=\"we\\\"ird\\\\plug\\nin\",status=\"fail-unknown\",migrated=\"false\"} 120\n",
            "storage_operation_duration_seconds_count{operation_name=\"volume_unmount\",volume_plugin=\"we\\\"ird\\\\plug\\nin\",status=\"fail-unknown\",migrated=\"false\"} 1\n",
            "# HELP volume_manager_total_volumes Number of volumes in Volume Manager\n",
            "# TYPE volume_manager_total_volumes gauge\n",
            "volume_manager_total_volumes{plugin_name=\"kubernetes.io/empty-dir\",state=\"desired_state_of_world\"} 2\n",
            "volume_manager_total_volumes{plugin_name=\"kubernetes.io/empty-dir\",state=\"actual_state_of_world\"} 1\n",
            "volume_manager_total_volumes{plugin_name=\"we\\\"ird\",state=\"desired_state_of_world\"} 0\n",
            "volume_manager_total_volumes{plugin_name=\"we\\\"ird\",state=\"actual_state_of_world\"} 3\n",
            "# extra\n",
        );
        assert_eq!(text, want);
    }

    #[test]
    fn renders_kubelet_names() {
        let m = Metrics::default();
        let l = OperationLabels {
            operation_name: "volume_mount",
            volume_plugin: "kubernetes.io/empty-dir".into(),
            status: "success",
        };
        m.record_operation(l.clone(), Duration::from_micros(50));
        m.record_operation(l, Duration::from_millis(300));
        let text = m.render(&[("kubernetes.io/empty-dir".into(), 2, 1)], "");
        assert!(text.contains("storage_operation_duration_seconds_bucket{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\",le=\"0.1\"} 1"));
        assert!(text.contains("le=\"0.5\"} 2"));
        assert!(text.contains("storage_operation_duration_seconds_count{operation_name=\"volume_mount\",volume_plugin=\"kubernetes.io/empty-dir\",status=\"success\",migrated=\"false\"} 2"));
        assert!(text.contains("volume_manager_total_volumes{plugin_name=\"kubernetes.io/empty-dir\",state=\"desired_state_of_world\"} 2"));
        let s = m.summaries();
        assert_eq!(s[0].count, 2);
        assert!(s[0].p99_seconds > 0.29);
    }

    /// A CSI-migrated volume's operations: the driver's label with
    /// `migrated="true"`, apart from the same driver's CSI volumes (before:
    /// always `migrated="false"`).
    #[test]
    fn migrated_volumes_are_labelled_migrated() {
        let m = Metrics::default();
        let plugin = "kubernetes.io/csi:ebs.csi.aws.com";
        for migrated in [true, false] {
            let label = PluginLabel {
                name: plugin.into(),
                migrated,
            };
            let l = OperationLabels {
                operation_name: "volume_mount",
                volume_plugin: label,
                status: "success",
            };
            m.record_operation(l, Duration::from_millis(10));
        }
        let text = m.render(&[], "");
        for migrated in ["true", "false"] {
            let want = format!("storage_operation_duration_seconds_count{{operation_name=\"volume_mount\",volume_plugin=\"{plugin}\",status=\"success\",migrated=\"{migrated}\"}} 1");
            assert!(text.contains(&want), "{text}");
        }
        assert!(!text.contains('\u{0}'));
        let s = m.summaries();
        assert!(s.iter().all(|o| o.plugin == plugin));
        assert_eq!(s.iter().filter(|o| o.migrated).count(), 1);
    }
}
