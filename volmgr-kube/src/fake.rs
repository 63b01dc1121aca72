//! A fake API server at the HTTP level for the unit tests of this module:
//! `kube::Client::new` over a `tower::service_fn` that keeps objects by
//! path (GET, POST create, PUT replace with a resourceVersion check, JSON
//! merge PATCH; `.../status` is the object itself), records every request
//! (method, path, query, content type, body) and can be told to fail the
//! next requests of a method with a status code.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{json, Value};

/// One request the fake answered.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// `GET`, `PATCH`, ...
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query string (empty if none).
    pub query: String,
    /// The `Content-Type` header.
    pub content_type: String,
    /// The body as JSON (`Null` if none).
    pub body: Value,
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Value>,
    requests: Vec<Recorded>,
    failures: Vec<(Method, u16)>,
    rv: u64,
}

/// The fake.
#[derive(Default, Clone)]
pub struct FakeApi(Arc<Mutex<State>>);

impl FakeApi {
    /// A client talking to this fake.
    pub fn client(&self) -> kube::Client {
        let me = self.clone();
        let svc = tower::service_fn(move |req: Request<Body>| {
            let me = me.clone();
            async move { Ok::<_, std::convert::Infallible>(me.handle(req).await) }
        });
        kube::Client::new(svc, "default")
    }

    /// Stores `obj` at `path` (e.g. `/api/v1/nodes/n1`).
    pub fn put(&self, path: &str, mut obj: Value) {
        let mut s = self.0.lock().unwrap();
        s.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(s.rv.to_string());
        s.objects.insert(path.to_string(), obj);
    }

    /// The object at `path`.
    pub fn get(&self, path: &str) -> Option<Value> {
        self.0.lock().unwrap().objects.get(path).cloned()
    }

    /// Every request so far, and forgets them.
    pub fn take_requests(&self) -> Vec<Recorded> {
        std::mem::take(&mut self.0.lock().unwrap().requests)
    }

    /// The next request with `method` fails with `code`.
    pub fn fail_next(&self, method: Method, code: u16) {
        self.0.lock().unwrap().failures.push((method, code));
    }

    async fn handle(&self, req: Request<Body>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let path = parts.uri.path().to_string();
        let rec = Recorded {
            method: parts.method.to_string(),
            path: path.clone(),
            query: parts.uri.query().unwrap_or("").to_string(),
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string(),
            body: body.clone(),
        };
        let mut s = self.0.lock().unwrap();
        s.requests.push(rec);
        if let Some(i) = s.failures.iter().position(|(m, _)| *m == parts.method) {
            let (_, code) = s.failures.remove(i);
            let reason = match code {
                404 => "NotFound",
                409 => "Conflict",
                503 => "ServiceUnavailable",
                _ => "InternalError",
            };
            return status(code, reason);
        }
        let key = path.strip_suffix("/status").unwrap_or(&path).to_string();
        match parts.method {
            Method::GET => match s.objects.get(&key) {
                Some(o) => respond(200, o),
                None => status(404, "NotFound"),
            },
            Method::POST => {
                let name = body["metadata"]["name"].as_str().unwrap_or_default();
                let key = format!("{key}/{name}");
                if s.objects.contains_key(&key) {
                    return status(409, "AlreadyExists");
                }
                store(&mut s, key, body, 201)
            }
            Method::PUT => {
                let Some(old) = s.objects.get(&key) else {
                    return status(404, "NotFound");
                };
                if old["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"] {
                    return status(409, "Conflict");
                }
                store(&mut s, key, body, 200)
            }
            Method::PATCH => {
                let Some(mut obj) = s.objects.get(&key).cloned() else {
                    return status(404, "NotFound");
                };
                let rv = &body["metadata"]["resourceVersion"];
                if !rv.is_null() && *rv != obj["metadata"]["resourceVersion"] {
                    return status(409, "Conflict");
                }
                merge(&mut obj, &body);
                store(&mut s, key, obj, 200)
            }
            _ => status(405, "MethodNotAllowed"),
        }
    }
}

fn store(s: &mut State, key: String, mut obj: Value, code: u16) -> Response<Body> {
    s.rv += 1;
    obj["metadata"]["resourceVersion"] = json!(s.rv.to_string());
    let r = respond(code, &obj);
    s.objects.insert(key, obj);
    r
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (k, v) in p {
        if v.is_null() {
            if let Some(t) = target.as_object_mut() {
                t.remove(k);
            }
        } else {
            merge(&mut target[k], v);
        }
    }
}

fn respond(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(v).unwrap()))
        .unwrap()
}

fn status(code: u16, reason: &str) -> Response<Body> {
    respond(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("fake: {reason}"), "reason": reason, "code": code}),
    )
}
