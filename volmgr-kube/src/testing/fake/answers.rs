//! The bodies the fake answers with: JSON, `Status` objects, the events of
//! both APIs as one, and merge patches applied.

use super::*;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

pub(super) fn not_found(t: &Target, name: &str) -> Response<Body> {
    status_response(
        404,
        "NotFound",
        &format!("{} \"{name}\" not found", t.resource),
    )
}

pub(super) fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .unwrap()
}

pub(super) fn status_response(code: u16, reason: &str, message: &str) -> Response<Body> {
    json_response(
        StatusCode::from_u16(code).unwrap(),
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code}),
    )
}

pub(super) fn gone() -> Value {
    json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": "too old resource version", "reason": "Expired", "code": 410}})
}

/// An event as a core/v1 list shows it: one written through
/// events.k8s.io/v1 (`regarding`, `note`, `deprecated*`) in the core/v1
/// form, as the API server converts it; a core/v1 one as it is.
pub(super) fn core_event(o: &Value) -> Value {
    if o.get("regarding").is_none() || o.get("involvedObject").is_some() {
        return o.clone();
    }
    let mut e = json!({"apiVersion": "v1", "kind": "Event", "metadata": o["metadata"],
        "involvedObject": o["regarding"], "related": o["related"], "reason": o["reason"],
        "message": o["note"], "type": o["type"], "action": o["action"],
        "eventTime": o["eventTime"], "reportingComponent": o["reportingController"],
        "reportingInstance": o["reportingInstance"], "count": o["deprecatedCount"],
        "firstTimestamp": o["deprecatedFirstTimestamp"],
        "lastTimestamp": o["deprecatedLastTimestamp"], "source": o["deprecatedSource"]});
    if o["series"].is_object() {
        e["series"] = json!({"count": o["series"]["count"],
                             "lastObservedTime": o["series"]["lastObservedTime"]});
    }
    if let Some(m) = e.as_object_mut() {
        m.retain(|_, v| !v.is_null());
    }
    e
}

/// JSON merge patch (RFC 7386); strategic merge patches are applied the same way.
pub(super) fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}
