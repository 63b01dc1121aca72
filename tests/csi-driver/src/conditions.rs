//! Volume health from `STATE_DIR/conditions.json`, re-read on every
//! NodeGetVolumeStats (the driver advertises VOLUME_CONDITION): a JSON
//! object from volume ID (or `"*"` for every volume) to a condition,
//!
//! ```json
//! {"vol-1": {"abnormal": true, "message": "disk on fire"}}
//! ```
//!
//! A volume without an entry (or no file) is healthy: `abnormal: false`,
//! message `"volume is healthy"`. Write the file atomically (temporary file,
//! rename): one that does not parse fails the call with INTERNAL.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use tonic::Status;

use crate::proto::csi;

/// One entry of conditions.json.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// Whether the volume is abnormal.
    #[serde(default)]
    pub abnormal: bool,
    /// The message to report.
    #[serde(default)]
    pub message: Option<String>,
}

/// The condition of `volume_id` according to `state_dir/conditions.json`.
pub fn condition_of(state_dir: &Path, volume_id: &str) -> Result<csi::VolumeCondition, Status> {
    let path = state_dir.join("conditions.json");
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(Status::internal(format!("conditions.json: {e}"))),
    };
    let all: BTreeMap<String, Condition> = if bytes.iter().all(u8::is_ascii_whitespace) {
        BTreeMap::new()
    } else {
        serde_json::from_slice(&bytes)
            .map_err(|e| Status::internal(format!("conditions.json: {e}")))?
    };
    let c = all
        .get(volume_id)
        .or_else(|| all.get("*"))
        .cloned()
        .unwrap_or_default();
    let message = c.message.unwrap_or_else(|| {
        if c.abnormal {
            "volume is abnormal".to_string()
        } else {
            "volume is healthy".to_string()
        }
    });
    Ok(csi::VolumeCondition {
        abnormal: c.abnormal,
        message,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn per_volume_then_wildcard_then_healthy() {
        let dir = tempfile::tempdir().unwrap();
        let healthy = condition_of(dir.path(), "v").unwrap();
        assert!(!healthy.abnormal && healthy.message == "volume is healthy");
        std::fs::write(
            dir.path().join("conditions.json"),
            r#"{"v": {"abnormal": true, "message": "disk on fire"}, "*": {"abnormal": true}}"#,
        )
        .unwrap();
        let v = condition_of(dir.path(), "v").unwrap();
        assert!(v.abnormal && v.message == "disk on fire");
        let w = condition_of(dir.path(), "w").unwrap();
        assert!(w.abnormal && w.message == "volume is abnormal");
        std::fs::write(dir.path().join("conditions.json"), r#"{"v": {"typo": 1}}"#).unwrap();
        assert_eq!(
            condition_of(dir.path(), "v").unwrap_err().code(),
            tonic::Code::Internal
        );
    }
}
