//! Fault injection from `STATE_DIR/faults.json`, re-read on every call.
//!
//! The file is a JSON array of rules. A rule applies to a call when `method`
//! is the gRPC method name (e.g. "NodePublishVolume", "*" for any) and, if
//! set, `volume_id` is the call's volume. Every applying rule is used, in
//! file order; a rule with `count` applies to that many more calls and its
//! count is decremented in the file itself (rewritten atomically), a rule
//! whose count reaches 0 is removed: consumed faults stay consumed across a
//! driver restart. A rule without `count` applies until the file changes.
//!
//! Actions (any combination), in this order:
//! - `"delay_ms": N`: sleep N ms (delays of several rules add up);
//! - `"hang": true`: block the call until faults.json changes (by anyone),
//!   then go on normally; if the caller gives up first (deadline, cancel)
//!   the call ends there, does nothing and is journaled CANCELLED;
//! - `"exit": "before_work"`: the process exits (status 70) before doing the
//!   work, without answering;
//! - `"code": "UNAVAILABLE"` (a gRPC code name; optional `"message"`): answer
//!   with that error without doing the work;
//! - `"exit": "after_work"`: do the work, then exit (status 70) without
//!   answering.
//!
//! Write the file atomically (write a temporary file, rename it): a file that
//! does not parse fails every call with INTERNAL.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tonic::{Code, Status};

/// Process exit status of an injected crash.
pub const EXIT_STATUS: i32 = 70;

/// When an `exit` fault ends the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitWhen {
    /// Before the call does anything.
    BeforeWork,
    /// After the call did its work, before it answers.
    AfterWork,
}

/// One rule of faults.json.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// gRPC method name, or "*".
    pub method: String,
    /// Only calls for this volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_id: Option<String>,
    /// Calls left; absent: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// gRPC code name to fail with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Message of the injected error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Added latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Block until faults.json changes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hang: bool,
    /// Crash the process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitWhen>,
}

/// What the rules say to do with one call.
#[derive(Debug, Default)]
pub struct Plan {
    /// Total added delay.
    pub delay: Duration,
    /// Hang until faults.json differs from these bytes.
    pub hang_until_changed_from: Option<Vec<u8>>,
    /// Crash.
    pub exit: Option<ExitWhen>,
    /// Fail with this status.
    pub error: Option<Status>,
}

/// Reads and consumes faults.json.
#[derive(Debug)]
pub struct Faults {
    path: PathBuf,
    lock: std::sync::Mutex<()>,
}

/// Parses a gRPC code name ("UNAVAILABLE", also "Unavailable").
pub fn parse_code(name: &str) -> Option<Code> {
    let n = name.to_ascii_uppercase().replace('-', "_");
    Some(match n.as_str() {
        "OK" => Code::Ok,
        "CANCELLED" => Code::Cancelled,
        "UNKNOWN" => Code::Unknown,
        "INVALID_ARGUMENT" | "INVALIDARGUMENT" => Code::InvalidArgument,
        "DEADLINE_EXCEEDED" | "DEADLINEEXCEEDED" => Code::DeadlineExceeded,
        "NOT_FOUND" | "NOTFOUND" => Code::NotFound,
        "ALREADY_EXISTS" | "ALREADYEXISTS" => Code::AlreadyExists,
        "PERMISSION_DENIED" | "PERMISSIONDENIED" => Code::PermissionDenied,
        "RESOURCE_EXHAUSTED" | "RESOURCEEXHAUSTED" => Code::ResourceExhausted,
        "FAILED_PRECONDITION" | "FAILEDPRECONDITION" => Code::FailedPrecondition,
        "ABORTED" => Code::Aborted,
        "OUT_OF_RANGE" | "OUTOFRANGE" => Code::OutOfRange,
        "UNIMPLEMENTED" => Code::Unimplemented,
        "INTERNAL" => Code::Internal,
        "UNAVAILABLE" => Code::Unavailable,
        "DATA_LOSS" | "DATALOSS" => Code::DataLoss,
        "UNAUTHENTICATED" => Code::Unauthenticated,
        _ => return None,
    })
}

/// The canonical name of a gRPC code ("UNAVAILABLE").
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

fn read_bytes(path: &Path) -> std::io::Result<Vec<u8>> {
    match std::fs::read(path) {
        Ok(b) => Ok(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

impl Faults {
    /// Rules from `state_dir/faults.json`.
    pub fn new(state_dir: &Path) -> Self {
        Self {
            path: state_dir.join("faults.json"),
            lock: std::sync::Mutex::new(()),
        }
    }

    /// Decides what to do with a call of `method` for `volume_id`, consuming
    /// counted rules.
    pub fn plan(&self, method: &str, volume_id: Option<&str>) -> Result<Plan, Status> {
        let _guard = self
            .lock
            .lock()
            .map_err(|_| Status::internal("faults lock poisoned"))?;
        let internal = |what: String| Status::internal(format!("faults.json: {what}"));
        let bytes = read_bytes(&self.path).map_err(|e| internal(e.to_string()))?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Plan::default());
        }
        let mut rules: Vec<Rule> =
            serde_json::from_slice(&bytes).map_err(|e| internal(e.to_string()))?;
        let mut plan = Plan::default();
        let mut hang = false;
        let mut changed = false;
        for rule in &mut rules {
            if rule.method != "*" && rule.method != method {
                continue;
            }
            if rule.volume_id.is_some() && rule.volume_id.as_deref() != volume_id {
                continue;
            }
            if let Some(n) = rule.count.as_mut() {
                if *n == 0 {
                    continue;
                }
                *n -= 1;
                changed = true;
            }
            if let Some(ms) = rule.delay_ms {
                plan.delay += Duration::from_millis(ms);
            }
            hang |= rule.hang;
            if plan.exit.is_none() {
                plan.exit = rule.exit;
            }
            if plan.error.is_none() {
                if let Some(name) = &rule.code {
                    let code = parse_code(name)
                        .ok_or_else(|| internal(format!("unknown code {name:?}")))?;
                    let msg = rule
                        .message
                        .clone()
                        .unwrap_or_else(|| format!("injected fault: {name}"));
                    plan.error = Some(Status::new(code, msg));
                }
            }
        }
        let mut current = bytes;
        if changed {
            rules.retain(|r| r.count != Some(0));
            let mut text =
                serde_json::to_vec_pretty(&rules).map_err(|e| internal(e.to_string()))?;
            text.push(b'\n');
            let tmp = self.path.with_extension("json.tmp");
            std::fs::write(&tmp, &text).map_err(|e| internal(e.to_string()))?;
            std::fs::rename(&tmp, &self.path).map_err(|e| internal(e.to_string()))?;
            current = text;
        }
        if hang {
            plan.hang_until_changed_from = Some(current);
        }
        Ok(plan)
    }

    /// Returns once faults.json no longer holds `bytes`.
    pub async fn wait_changed(&self, bytes: &[u8]) {
        loop {
            match read_bytes(&self.path) {
                Ok(now) if now != bytes => return,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn counted_rules_are_consumed_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = Faults::new(dir.path());
        assert!(f
            .plan("NodeStageVolume", Some("v"))
            .unwrap()
            .error
            .is_none());
        std::fs::write(
            dir.path().join("faults.json"),
            r#"[{"method":"NodeStageVolume","volume_id":"v","code":"ABORTED","count":2},
                {"method":"*","delay_ms":5},
                {"method":"NodeStageVolume","exit":"after_work"}]"#,
        )
        .unwrap();
        // Another volume: only the "*" rule and the uncounted exit apply.
        let p = f.plan("NodeStageVolume", Some("w")).unwrap();
        assert!(p.error.is_none());
        assert_eq!(p.delay, Duration::from_millis(5));
        assert_eq!(p.exit, Some(ExitWhen::AfterWork));
        for _ in 0..2 {
            let p = f.plan("NodeStageVolume", Some("v")).unwrap();
            assert_eq!(p.error.unwrap().code(), Code::Aborted);
        }
        assert!(f
            .plan("NodeStageVolume", Some("v"))
            .unwrap()
            .error
            .is_none());
        let left: Vec<Rule> =
            serde_json::from_slice(&std::fs::read(dir.path().join("faults.json")).unwrap())
                .unwrap();
        assert_eq!(left.len(), 2);
        // Bad input: INTERNAL, with the reason.
        std::fs::write(
            dir.path().join("faults.json"),
            r#"[{"method":"X","code":"NOPE"}]"#,
        )
        .unwrap();
        let e = f.plan("X", None).unwrap_err();
        assert_eq!(e.code(), Code::Internal);
        assert!(e.message().contains("NOPE"));
        std::fs::write(
            dir.path().join("faults.json"),
            r#"[{"method":"X","typo":1}]"#,
        )
        .unwrap();
        assert_eq!(f.plan("X", None).unwrap_err().code(), Code::Internal);
    }

    #[test]
    fn code_names_round_trip() {
        for n in 0..=16 {
            let code = Code::from_i32(n);
            assert_eq!(parse_code(code_name(code)), Some(code));
        }
    }
}
