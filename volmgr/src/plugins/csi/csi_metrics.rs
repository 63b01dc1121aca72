//! NodeGetVolumeStats (the kubelet's `csi_metrics.go` `metricsCsi` and
//! `csi_client.go` `NodeGetVolumeStats`): a published volume's usage and,
//! with `VOLUME_CONDITION`, its health, asked with the pod's volume path and
//! the staging path.

use std::time::Duration;

use super::layout::{publish_layout, stage_layout};
use super::{source, CsiPlugin};
use crate::pluginmanager::csi_proto::csi;
use crate::plugins::volume_metrics::{StatsError, VolumeCondition, VolumeStats};
use crate::volume::{PodUid, VolumeSpec};

impl CsiPlugin {
    /// The usage of `spec` as published for `pod`, asked of its driver with
    /// deadline `timeout`; `None` when the driver lacks `GET_VOLUME_STATS`.
    pub async fn volume_stats(
        &self,
        pod: &PodUid,
        spec: &VolumeSpec,
        timeout: Duration,
    ) -> Result<Option<VolumeStats>, StatsError> {
        let src = source(spec).map_err(|e| StatsError::Invalid(e.to_string()))?;
        let caps = self.clients.node_capabilities(&src.driver).await?;
        if !caps.volume_stats {
            return Ok(None);
        }
        let volume_path = utf8(self.abs(&publish_layout(pod, spec, src)?.target))?;
        let staging_target_path = if caps.stage_unstage && !src.ephemeral {
            utf8(self.abs(&stage_layout(spec, src)?.target))?
        } else {
            String::new()
        };
        let req = csi::NodeGetVolumeStatsRequest {
            volume_id: src.volume_handle.clone(),
            volume_path,
            staging_target_path,
        };
        let resp = self
            .clients
            .node_get_volume_stats_within(&src.driver, req, timeout)
            .await?;
        Ok(Some(stats_of(&resp, caps.volume_condition)))
    }
}

fn utf8(p: std::path::PathBuf) -> Result<String, StatsError> {
    p.into_os_string()
        .into_string()
        .map_err(|p| StatsError::Invalid(format!("path {p:?} is not UTF-8")))
}

/// The kubelet's reading of an answer: BYTES usage → capacity, available,
/// used; INODES → inodes, free, used; the condition only from a driver that
/// announced `VOLUME_CONDITION`. Negative numbers read as 0.
fn stats_of(resp: &csi::NodeGetVolumeStatsResponse, with_condition: bool) -> VolumeStats {
    use csi::volume_usage::Unit;
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    let mut s = VolumeStats::default();
    for u in &resp.usage {
        match Unit::try_from(u.unit) {
            Ok(Unit::Bytes) => {
                s.capacity_bytes = n(u.total);
                s.available_bytes = n(u.available);
                s.used_bytes = n(u.used);
            }
            Ok(Unit::Inodes) => {
                s.inodes = n(u.total);
                s.inodes_free = n(u.available);
                s.inodes_used = n(u.used);
            }
            _ => {}
        }
    }
    if with_condition {
        s.condition = resp.volume_condition.as_ref().map(|c| VolumeCondition {
            abnormal: c.abnormal,
            message: c.message.clone(),
        });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_bytes_inodes_and_the_condition() {
        use csi::volume_usage::Unit;
        let resp = csi::NodeGetVolumeStatsResponse {
            usage: vec![
                csi::VolumeUsage {
                    total: 100,
                    available: 60,
                    used: 40,
                    unit: Unit::Bytes as i32,
                },
                csi::VolumeUsage {
                    total: 10,
                    available: 7,
                    used: -3,
                    unit: Unit::Inodes as i32,
                },
            ],
            volume_condition: Some(csi::VolumeCondition {
                abnormal: true,
                message: "disk on fire".into(),
            }),
        };
        let s = stats_of(&resp, true);
        assert_eq!(
            (s.capacity_bytes, s.available_bytes, s.used_bytes),
            (100, 60, 40)
        );
        assert_eq!((s.inodes, s.inodes_free, s.inodes_used), (10, 7, 0));
        let c = s.condition.unwrap();
        assert!(c.abnormal && c.message == "disk on fire");
        // Without VOLUME_CONDITION the kubelet ignores the field.
        assert!(stats_of(&resp, false).condition.is_none());
    }
}
