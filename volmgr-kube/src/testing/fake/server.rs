//! The requests' way through the fake: the recorded answer, the outage
//! and failure switches, the route to each operation.

use super::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use hyper::{Method, Request, Response, StatusCode};
use serde_json::Value;
use tokio::sync::watch;

#[derive(Clone)]
pub(super) struct Server {
    pub(super) state: Arc<Mutex<State>>,
    pub(super) changed: watch::Sender<u64>,
    pub(super) cut: watch::Sender<u64>,
}

impl Server {
    pub(super) async fn handle(&self, req: Request<hyper::body::Incoming>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        self.answer(&parts, &body)
    }

    /// Answers a request (over HTTPS or in memory) and records it.
    pub(super) fn answer(&self, parts: &http::request::Parts, body: &[u8]) -> Response<Body> {
        let method = parts.method.clone();
        let path = parts.uri.path().to_string();
        let query = parts.uri.query().unwrap_or("").to_string();
        let content_type = parts
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let resp = self.route(&method, &path, &query_map(&query), body);
        self.state.lock().unwrap().requests.push(Recorded {
            method: method.to_string(),
            path,
            query,
            status: resp.status().as_u16(),
            content_type,
            body: serde_json::from_slice(body).unwrap_or(Value::Null),
        });
        resp
    }

    pub(super) fn route(
        &self,
        method: &Method,
        path: &str,
        q: &BTreeMap<String, String>,
        body: &[u8],
    ) -> Response<Body> {
        if let Some(failed) = self.injected_failure(method) {
            return failed;
        }
        let Some(t) = parse_path(path) else {
            return status_response(404, "NotFound", "no such path");
        };
        let selector = q.get("fieldSelector").cloned().unwrap_or_default();
        if method == Method::GET && self.state.lock().unwrap().refused.contains(&t.resource) {
            return status_response(
                403,
                "Forbidden",
                &format!("{} is forbidden for this node", t.resource),
            );
        }
        if method == Method::POST && t.subresource.as_deref() == Some("token") {
            return self.token_request(&t, body);
        }
        match (method, t.name.clone()) {
            (&Method::GET, None) => {
                if let Some(refused) = node_authorizer(&t.resource, &selector) {
                    return refused;
                }
                if matches!(q.get("watch").map(String::as_str), Some("true" | "1")) {
                    self.watch(t, selector, q)
                } else {
                    self.list(&t, &selector)
                }
            }
            (&Method::GET, Some(name)) => {
                match self.state.lock().unwrap().objects.get(&t.key(&name)) {
                    Some(o) => json_response(StatusCode::OK, o),
                    None => not_found(&t, &name),
                }
            }
            (&Method::POST, None) => self.create(&t, body),
            (&Method::PUT | &Method::PATCH, Some(name)) => self.update(method, &t, &name, body),
            (&Method::DELETE, Some(name)) => self.delete(&t, &name),
            _ => status_response(405, "MethodNotAllowed", "not supported by the fake"),
        }
    }

    /// The outage switch and [`FakeApiServer::fail_next`]'s failures.
    pub(super) fn injected_failure(&self, method: &Method) -> Option<Response<Body>> {
        let mut s = self.state.lock().unwrap();
        if s.unavailable {
            return Some(status_response(
                503,
                "ServiceUnavailable",
                "the fake API server is down",
            ));
        }
        let i = s.failures.iter().position(|(m, _)| m == method)?;
        let (_, code) = s.failures.remove(i);
        let reason = match code {
            403 => "Forbidden",
            404 => "NotFound",
            409 => "Conflict",
            410 => "Expired",
            429 => "TooManyRequests",
            503 => "ServiceUnavailable",
            _ => "InternalError",
        };
        Some(status_response(code, reason, &format!("fake: {reason}")))
    }
}
