//! `csi_operations_seconds{driver_name,method_name,grpc_status_code,migrated}`:
//! the kubelet's histogram of CSI calls, rendered as Prometheus text.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::metrics::LatencyHistogram;
use crate::util::prometheus::{Exposition, MetricType};
use crate::util::sync::MutexExt;

/// Key: driver, full method name, status code name.
type Key = (String, &'static str, &'static str);

/// The histograms of CSI calls.
#[derive(Debug, Default)]
pub struct CsiMetrics {
    calls: Mutex<BTreeMap<Key, LatencyHistogram>>,
}

impl CsiMetrics {
    /// Records one call.
    pub fn record(&self, driver: &str, method: &'static str, code: &'static str, d: Duration) {
        let mut calls = self.calls.locked();
        calls
            .entry((driver.to_string(), method, code))
            .or_default()
            .record(d);
    }

    /// Number of calls of `method` (e.g. `/csi.v1.Node/NodeStageVolume`) to
    /// `driver` that ended with `code`.
    pub fn count(&self, driver: &str, method: &str, code: &str) -> u64 {
        let calls = self.calls.locked();
        calls
            .iter()
            .filter(|((d, m, c), _)| d == driver && *m == method && *c == code)
            .map(|(_, h)| h.count())
            .sum()
    }

    /// Prometheus text.
    pub fn render(&self) -> String {
        let calls = self.calls.locked();
        let mut w = Exposition::new();
        let name = "csi_operations_seconds";
        w.family(
            name,
            "Container Storage Interface operation duration with gRPC error code status total",
            MetricType::Histogram,
        );
        for ((driver, method, code), h) in calls.iter() {
            let labels = [
                ("driver_name", driver.as_str()),
                ("grpc_status_code", code),
                ("method_name", method),
                ("migrated", "false"),
            ];
            h.write_prometheus(&mut w, name, &labels);
        }
        w.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Today's exposition for a fixed input, byte for byte.
    #[test]
    fn render_is_unchanged() {
        let m = CsiMetrics::default();
        let stage = "/csi.v1.Node/NodeStageVolume";
        m.record("d.csi", stage, "OK", Duration::from_millis(30));
        m.record("d.csi", stage, "OK", Duration::from_millis(1500));
        m.record("d.csi", stage, "DeadlineExceeded", Duration::from_secs(601));
        m.record(
            "q\"\\\n.csi",
            "/csi.v1.Node/NodePublishVolume",
            "OK",
            Duration::from_micros(7),
        );
        let text = m.render();
        let want = concat!(
            "# HELP csi_operations_seconds Container Storage Interface operation duration with gRPC error code status total\n",
            "# TYPE csi_operations_seconds histogram\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"DeadlineExceeded\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"0.1\"} 0\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"DeadlineExceeded\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"0.25\"} 0\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"DeadlineExceeded\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"0.5\"} 0\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"DeadlineExceeded\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"1\"} 0\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"DeadlineExceeded\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"2.5\"} 0\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"DeadlineExceeded\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"5\"} 0\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"DeadlineExceeded\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"10\"} 0\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"DeadlineExceeded\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"15\"} 0\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"DeadlineExceeded\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"25\"} 0\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"DeadlineExceeded\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"50\"} 0\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"DeadlineExceeded\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"120\"} 0\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"DeadlineExceeded\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"300\"} 0\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"DeadlineExceeded\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"600\"} 0\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"DeadlineExceeded\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"+Inf\"} 1\n",
            "csi_operations_seconds_sum{driver_name=\"d.csi\",grpc_status_code=\"DeadlineExceeded\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\"} 601\n",
            "csi_operations_seconds_count{driver_name=\"d.csi\",grpc_status_code=\"DeadlineExceeded\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\"} 1\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"0.1\"} 1\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"0.25\"} 1\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"0.5\"} 1\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"1\"} 1\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"2.5\"} 2\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"5\"} 2\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"10\"} 2\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"15\"} 2\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"25\"} 2\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"50\"} 2\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"120\"} 2\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"300\"} 2\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"600\"} 2\n",
            "csi_operations_seconds_bucket{driver_name=\"d.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\",le=\"+Inf\"} 2\n",
            "csi_operations_seconds_sum{driver_name=\"d.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\"} 1.53\n",
            "csi_operations_seconds_count{driver_name=\"d.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\"} 2\n",
            "csi_operations_seconds_bucket{driver_name=\"q\\\"\\\\\\n.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodePublishVolume\",migrated=\"false\",le=\"0.1\"} 1\n",
            "csi_operations_seconds_bucket{driver_name=\"q\\\"\\\\\\n.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodePublishVolume\",migrated=\"false\",le=\"0.25\"} 1\n",
            "csi_operations_seconds_bucket{driver_name=\"q\\\"\\\\\\n.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodePublishVolume\",migrated=\"false\",le=\"0.5\"} 1\n",
            "csi_operations_seconds_bucket{driver_name=\"q\\\"\\\\\\n.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodePublishVolume\",migrated=\"false\",le=\"1\"} 1\n",
            "csi_operations_seconds_bucket{driver_name=\"q\\\"\\\\\\n.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodePublishVolume\",migrated=\"false\",le=\"2.5\"} 1\n",
            "csi_operations_seconds_bucket{driver_name=\"q\\\"\\\\\\n.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodePublishVolume\",migrated=\"false\",le=\"5\"} 1\n",
            "csi_operations_seconds_bucket{driver_name=\"q\\\"\\\\\\n.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodePublishVolume\",migrated=\"false\",le=\"10\"} 1\n",
            "csi_operations_seconds_bucket{driver_name=\"q\\\"\\\\\\n.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodePublishVolume\",migrated=\"false\",le=\"15\"} 1\n",
            "csi_operations_seconds_bucket{driver_name=\"q\\\"\\\\\\n.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodePublishVolume\",migrated=\"false\",le=\"25\"} 1\n",
            "csi_operations_seconds_bucket{driver_name=\"q\\\"\\\\\\n.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodePublishVolume\",migrated=\"false\",le=\"50\"} 1\n",
            "csi_operations_seconds_bucket{driver_name=\"q\\\"\\\\\\n.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodePublishVolume\",migrated=\"false\",le=\"120\"} 1\n",
            "csi_operations_seconds_bucket{driver_name=\"q\\\"\\\\\\n.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodePublishVolume\",migrated=\"false\",le=\"300\"} 1\n",
            "csi_operations_seconds_bucket{driver_name=\"q\\\"\\\\\\n.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodePublishVolume\",migrated=\"false\",le=\"600\"} 1\n",
            "csi_operations_seconds_bucket{driver_name=\"q\\\"\\\\\\n.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodePublishVolume\",migrated=\"false\",le=\"+Inf\"} 1\n",
            "csi_operations_seconds_sum{driver_name=\"q\\\"\\\\\\n.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodePublishVolume\",migrated=\"false\"} 0.000007\n",
            "csi_operations_seconds_count{driver_name=\"q\\\"\\\\\\n.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodePublishVolume\",migrated=\"false\"} 1\n",
        );
        assert_eq!(text, want);
    }

    #[test]
    fn renders_the_kubelet_labels() {
        let m = CsiMetrics::default();
        m.record(
            "d.csi",
            "/csi.v1.Node/NodeStageVolume",
            "OK",
            Duration::from_millis(30),
        );
        m.record(
            "d.csi",
            "/csi.v1.Node/NodeStageVolume",
            "OK",
            Duration::from_millis(300),
        );
        let t = m.render();
        assert!(t.contains("csi_operations_seconds_count{driver_name=\"d.csi\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Node/NodeStageVolume\",migrated=\"false\"} 2"), "{t}");
        assert!(t.contains("le=\"0.1\"} 1"));
        assert_eq!(m.count("d.csi", "/csi.v1.Node/NodeStageVolume", "OK"), 2);
    }
}
