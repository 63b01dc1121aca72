//! Writes: create, replace and patch, delete, TokenRequest.

use super::*;
use hyper::{Method, Response, StatusCode};
use serde_json::{json, Value};

impl Server {
    /// POST of a collection: `409 AlreadyExists` if the name is taken.
    pub(super) fn create(&self, t: &Target, body: &[u8]) -> Response<Body> {
        let Ok(mut obj) = serde_json::from_slice::<Value>(body) else {
            return status_response(400, "BadRequest", "not JSON");
        };
        if let Some(ns) = &t.namespace {
            obj["metadata"]["namespace"] = json!(ns);
        }
        let mut s = self.state.lock().unwrap();
        if obj["metadata"]["name"].is_null() {
            let prefix = obj["metadata"]["generateName"]
                .as_str()
                .unwrap_or("x")
                .to_string();
            obj["metadata"]["name"] = json!(format!("{prefix}{}", s.rv + 1));
        }
        let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
        if s.objects.contains_key(&t.key(&name)) {
            let msg = format!("{} \"{name}\" already exists", t.resource);
            return status_response(409, "AlreadyExists", &msg);
        }
        let out = store(&mut s, &t.resource, obj);
        drop(s);
        self.changed.send_modify(|v| *v += 1);
        json_response(StatusCode::CREATED, &out)
    }

    /// PUT (replace) or PATCH (JSON merge) of an object or its `/status`:
    /// `404` if missing, `409 Conflict` if the body names another version.
    pub(super) fn update(
        &self,
        method: &Method,
        t: &Target,
        name: &str,
        body: &[u8],
    ) -> Response<Body> {
        let key = t.key(name);
        let Ok(patch) = serde_json::from_slice::<Value>(body) else {
            return status_response(400, "BadRequest", "not JSON");
        };
        let mut s = self.state.lock().unwrap();
        let Some(old) = s.objects.get(&key) else {
            return not_found(t, name);
        };
        let rv = &patch["metadata"]["resourceVersion"];
        if !rv.is_null() && *rv != old["metadata"]["resourceVersion"] {
            let msg = format!("the object {name} has been modified; please apply your changes to the latest version and try again");
            return status_response(409, "Conflict", &msg);
        }
        let obj = if method == Method::PUT {
            patch
        } else {
            let mut o = old.clone();
            merge(&mut o, &patch);
            o
        };
        let out = store_at(&mut s, key, obj);
        drop(s);
        self.changed.send_modify(|v| *v += 1);
        json_response(StatusCode::OK, &out)
    }

    /// DELETE of an object, with a `DELETED` event.
    pub(super) fn delete(&self, t: &Target, name: &str) -> Response<Body> {
        let key = t.key(name);
        let mut s = self.state.lock().unwrap();
        let Some(mut obj) = s.objects.remove(&key) else {
            return not_found(t, name);
        };
        s.rv += 1;
        let rv = s.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        s.log.push(Change {
            rv,
            resource: key.0,
            namespace: key.1,
            kind: "DELETED",
            object: obj.clone(),
        });
        drop(s);
        self.changed.send_modify(|v| *v += 1);
        json_response(StatusCode::OK, &obj)
    }

    /// A TokenRequest: a token `tok-SA-UID-N`, valid for the asked time.
    pub(super) fn token_request(&self, t: &Target, body: &[u8]) -> Response<Body> {
        let Ok(mut req) = serde_json::from_slice::<Value>(body) else {
            return status_response(400, "BadRequest", "not JSON");
        };
        let ns = t.namespace.clone().unwrap_or_default();
        let name = t.name.clone().unwrap_or_default();
        let key = ("serviceaccounts".to_string(), ns, name.clone());
        let mut s = self.state.lock().unwrap();
        let Some(sa) = s.objects.get(&key) else {
            return status_response(
                404,
                "NotFound",
                &format!("serviceaccounts \"{name}\" not found"),
            );
        };
        let uid = sa["metadata"]["uid"].as_str().unwrap_or("").to_string();
        s.tokens += 1;
        let seconds = req["spec"]["expirationSeconds"].as_i64().unwrap_or(3600);
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let expires = k8s_openapi::jiff::Timestamp::from_second(now + seconds).unwrap();
        req["status"] = json!({"token": format!("tok-{name}-{uid}-{}", s.tokens),
                               "expirationTimestamp": expires.to_string()});
        json_response(StatusCode::CREATED, &req)
    }
}
