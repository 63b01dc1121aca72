//! An in-process fake of the Kubernetes API server, speaking the REST
//! subset the agent uses: over HTTPS for driving the real agent (through
//! kube-rs) end to end ([`FakeApiServer::start`]), or in memory for unit
//! tests ([`FakeApiServer::in_memory`] and [`FakeApiServer::client`]: the
//! same answers, through a `tower` service, no socket):
//!
//! - list and watch of a collection with `resourceVersion`, bookmarks,
//!   `timeoutSeconds`, `fieldSelector` (`metadata.name`, `metadata.namespace`,
//!   `spec.nodeName`, any dotted field); a watch from a compacted version
//!   gets `410 Gone` (an `ERROR` event, as the real server sends it);
//! - events of both APIs as one object, as the API server keeps them: a
//!   list of core/v1 events (`/api/v1/.../events`, e.g. with
//!   `fieldSelector=involvedObject.uid=UID`) shows an event written through
//!   events.k8s.io/v1 in the core/v1 form (`regarding` as
//!   `involvedObject`, `note` as `message`, ...);
//! - get, create (POST; `409 AlreadyExists` if it exists), replace (PUT;
//!   `404` if missing, `409 Conflict` on a stale `resourceVersion`), merge
//!   patch (PATCH, `/status` too; `409` on a stale `resourceVersion` if it
//!   names one) and delete of single objects (events, Node status, CSINode);
//! - the node authorizer's rule for node credentials: a list or watch of
//!   pods without `spec.nodeName=`, or of secrets, configmaps, claims,
//!   volumes or service accounts without `metadata.name=`, is `403`;
//! - TokenRequest (`POST .../serviceaccounts/NAME/token`): `404` without
//!   the ServiceAccount, else a token naming the account's UID and a
//!   counter;
//! - an outage switch (every request `503`, open watches cut), a switch
//!   refusing (`403`) every read of one resource (the node authorizer of
//!   older clusters for serviceaccounts), and every request recorded (with
//!   its content type, JSON body and answer's status: the patches sent), and
//!   [`FakeApiServer::fail_next`]: the next request of a method answered
//!   with a status code (`409`, `503`, ...).
//!
//! TLS with a self-signed certificate for 127.0.0.1 (rcgen); the test
//! writes a kubeconfig that trusts it ([`FakeApiServer::write_kubeconfig`]). HTTP/2 (ALPN `h2`, as the real API
//! server) or HTTP/1.1; [`FakeApiServer::open_connections`] counts the
//! connections open now.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

/// The body of the fake's answers.
pub type Body = BoxBody<Bytes, Infallible>;

/// One request the fake answered.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// `GET`, `PATCH`, ...
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query string (empty if none).
    pub query: String,
    /// The status code answered.
    pub status: u16,
    /// The `Content-Type` header (empty if none).
    pub content_type: String,
    /// The body as JSON (`Null` if none or not JSON).
    pub body: Value,
}

#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    resource: String,
    namespace: String,
    kind: &'static str,
    object: Value,
}

#[derive(Default)]
struct State {
    rv: u64,
    /// (resource, namespace, name) → object.
    objects: BTreeMap<(String, String, String), Value>,
    log: Vec<Change>,
    /// Watches from a version below this get 410.
    compacted: u64,
    unavailable: bool,
    /// Resources whose reads are refused (403).
    refused: Vec<String>,
    /// Tokens issued so far.
    tokens: u64,
    requests: Vec<Recorded>,
    /// The next request of a method fails with a code.
    failures: Vec<(Method, u16)>,
    /// Connections open now.
    connections: u64,
}

/// The fake server (stops with its runtime when dropped).
pub struct FakeApiServer {
    /// Where it listens (`127.0.0.1:0` in memory).
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    /// Bumped on every change; a second channel cuts open watches.
    changed: watch::Sender<u64>,
    cut: watch::Sender<u64>,
    ca_pem: String,
    /// `None` in memory: requests run on the caller's runtime.
    _runtime: Option<tokio::runtime::Runtime>,
}

impl Default for FakeApiServer {
    fn default() -> Self {
        Self::in_memory()
    }
}

/// The collection a kind lives in.
pub fn resource_of(kind: &str) -> String {
    match kind {
        "Pod" => "pods".into(),
        "PersistentVolume" => "persistentvolumes".into(),
        "PersistentVolumeClaim" => "persistentvolumeclaims".into(),
        "Secret" => "secrets".into(),
        "ConfigMap" => "configmaps".into(),
        "Node" => "nodes".into(),
        "ServiceAccount" => "serviceaccounts".into(),
        "CSINode" => "csinodes".into(),
        "Event" => "events".into(),
        other => format!("{}s", other.to_lowercase()),
    }
}

fn kind_of(resource: &str) -> &'static str {
    match resource {
        "pods" => "Pod",
        "persistentvolumes" => "PersistentVolume",
        "persistentvolumeclaims" => "PersistentVolumeClaim",
        "secrets" => "Secret",
        "configmaps" => "ConfigMap",
        "nodes" => "Node",
        "serviceaccounts" => "ServiceAccount",
        "csinodes" => "CSINode",
        "events" => "Event",
        _ => "Object",
    }
}

/// Resources a node credential may list or watch only by name.
const BY_NAME_ONLY: [&str; 5] = [
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "persistentvolumes",
    "serviceaccounts",
];

impl FakeApiServer {
    /// Starts the fake on 127.0.0.1 (a free port).
    pub fn start() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (ca_pem, mut tls) = super::self_signed();
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let mut me = Self::in_memory();
        me.addr = addr;
        me.ca_pem = ca_pem;
        let server = me.server();
        runtime.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, server) = (acceptor.clone(), server.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let state = Arc::clone(&server.state);
                    state.lock().unwrap().connections += 1;
                    let service = hyper::service::service_fn(move |req| {
                        let server = server.clone();
                        async move { Ok::<_, Infallible>(server.handle(req).await) }
                    });
                    let mut builder = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    );
                    builder.http2().max_concurrent_streams(4096);
                    let _ = builder
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                    state.lock().unwrap().connections -= 1;
                });
            }
        });
        me._runtime = Some(runtime);
        me
    }

    /// The fake without a socket: [`FakeApiServer::client`] talks to it
    /// on the caller's tokio runtime.
    pub fn in_memory() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            state: Arc::new(Mutex::new(State::default())),
            changed: watch::channel(0u64).0,
            cut: watch::channel(0u64).0,
            ca_pem: String::new(),
            _runtime: None,
        }
    }

    fn server(&self) -> Server {
        Server {
            state: Arc::clone(&self.state),
            changed: self.changed.clone(),
            cut: self.cut.clone(),
        }
    }

    /// A client talking to this fake in memory (a `tower` service, no
    /// socket, no TLS), on the caller's runtime.
    pub fn client(&self) -> kube::Client {
        let server = self.server();
        let svc = tower::service_fn(move |req: Request<kube::client::Body>| {
            let server = server.clone();
            async move {
                let (parts, body) = req.into_parts();
                let body = body.collect_bytes().await.unwrap_or_default();
                Ok::<_, Infallible>(server.answer(&parts, &body))
            }
        });
        kube::Client::new(svc, "default")
    }

    /// Writes a kubeconfig for this server (a bearer token, the fake's CA)
    /// into `dir`; returns its path.
    pub fn write_kubeconfig(&self, dir: &Path) -> PathBuf {
        super::write_kubeconfig(dir, "fake", self.addr, &self.ca_pem)
    }

    /// Stores `object` at `path` (e.g. `/api/v1/nodes/n1`), whatever its
    /// metadata says, with an `ADDED` or `MODIFIED` event.
    pub fn put_at(&self, path: &str, object: Value) {
        let t = parse_path(path).unwrap();
        let key = (
            t.resource,
            t.namespace.unwrap_or_default(),
            t.name.unwrap_or_default(),
        );
        let mut s = self.state.lock().unwrap();
        store_at(&mut s, key, object);
        drop(s);
        self.changed.send_modify(|v| *v += 1);
    }

    /// The object at `path` (`.../status` is the object itself).
    pub fn get_at(&self, path: &str) -> Option<Value> {
        let t = parse_path(path)?;
        let key = (t.resource, t.namespace.unwrap_or_default(), t.name?);
        self.state.lock().unwrap().objects.get(&key).cloned()
    }

    /// The next request with `method` fails with `code` (a `Status` with
    /// the code's reason: `NotFound`, `Conflict`, `ServiceUnavailable`...).
    pub fn fail_next(&self, method: Method, code: u16) {
        self.state.lock().unwrap().failures.push((method, code));
    }

    /// Every request so far, and forgets them.
    pub fn take_requests(&self) -> Vec<Recorded> {
        std::mem::take(&mut self.state.lock().unwrap().requests)
    }

    /// Creates or replaces an object (by its `kind`, namespace and name).
    pub fn apply(&self, object: Value) {
        let resource = resource_of(object["kind"].as_str().unwrap());
        let mut s = self.state.lock().unwrap();
        store(&mut s, &resource, object);
        drop(s);
        self.changed.send_modify(|v| *v += 1);
    }

    /// Deletes an object, with a `DELETED` event (`silently`: without one,
    /// as if the watch missed it).
    pub fn delete(&self, kind: &str, namespace: &str, name: &str, silently: bool) {
        let resource = resource_of(kind);
        let mut s = self.state.lock().unwrap();
        let key = (resource.clone(), namespace.to_string(), name.to_string());
        if let Some(mut obj) = s.objects.remove(&key) {
            s.rv += 1;
            let rv = s.rv;
            obj["metadata"]["resourceVersion"] = json!(rv.to_string());
            if !silently {
                s.log.push(Change {
                    rv,
                    resource,
                    namespace: namespace.to_string(),
                    kind: "DELETED",
                    object: obj,
                });
            }
        }
        drop(s);
        self.changed.send_modify(|v| *v += 1);
    }

    /// Compacts the history: every open watch ends with `410 Gone`, and a
    /// watch from an earlier version gets it too (the client relists).
    pub fn expire_watches(&self) {
        let mut s = self.state.lock().unwrap();
        s.rv += 1;
        s.compacted = s.rv;
        drop(s);
        self.cut.send_modify(|v| *v += 1);
    }

    /// Every read (GET, list and watch) of `resource` answered `403` from
    /// now on, as a node authorizer that does not grant it.
    pub fn refuse_reads_of(&self, resource: &str) {
        self.state
            .lock()
            .unwrap()
            .refused
            .push(resource.to_string());
    }

    /// How many tokens the TokenRequest endpoint issued.
    pub fn tokens_issued(&self) -> u64 {
        self.state.lock().unwrap().tokens
    }

    /// Every request answered `503` while set; open watches are cut.
    pub fn set_unavailable(&self, down: bool) {
        self.state.lock().unwrap().unavailable = down;
        self.cut.send_modify(|v| *v += 1);
    }

    /// The object stored, if any.
    pub fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let key = (resource_of(kind), namespace.to_string(), name.to_string());
        self.state.lock().unwrap().objects.get(&key).cloned()
    }

    /// Every stored object of a kind (e.g. the events the agent created).
    pub fn objects_of(&self, kind: &str) -> Vec<Value> {
        let resource = resource_of(kind);
        let s = self.state.lock().unwrap();
        s.objects
            .iter()
            .filter(|((r, _, _), _)| *r == resource)
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// Connections open now.
    pub fn open_connections(&self) -> u64 {
        self.state.lock().unwrap().connections
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().requests.clone()
    }
}

/// Stores `object` under its kind's `resource`, its namespace and name.
fn store(s: &mut State, resource: &str, object: Value) -> Value {
    let ns = object["metadata"]["namespace"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    store_at(s, (resource.to_string(), ns, name), object)
}

/// Stores `object` at `key`, with a new version and a watch event.
fn store_at(s: &mut State, key: (String, String, String), mut object: Value) -> Value {
    s.rv += 1;
    let rv = s.rv;
    let kind = if s.objects.contains_key(&key) {
        "MODIFIED"
    } else {
        "ADDED"
    };
    if object["metadata"]["uid"].is_null() {
        object["metadata"]["uid"] = json!(format!("fake-uid-{rv}"));
    }
    object["metadata"]["resourceVersion"] = json!(rv.to_string());
    let (resource, namespace, _) = key.clone();
    s.objects.insert(key, object.clone());
    s.log.push(Change {
        rv,
        resource,
        namespace,
        kind,
        object: object.clone(),
    });
    object
}

/// What a path names.
#[derive(Debug)]
struct Target {
    resource: String,
    /// `None`: all namespaces (or cluster-scoped).
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
    /// Under `/api/v1` (the core group).
    core: bool,
}

impl Target {
    /// The key of the object `name` in this collection.
    fn key(&self, name: &str) -> (String, String, String) {
        (
            self.resource.clone(),
            self.namespace.clone().unwrap_or_default(),
            name.to_string(),
        )
    }
}

fn not_found(t: &Target, name: &str) -> Response<Body> {
    status_response(
        404,
        "NotFound",
        &format!("{} \"{name}\" not found", t.resource),
    )
}

fn parse_path(path: &str) -> Option<Target> {
    let rest = path.strip_prefix("/api/v1/").or_else(|| {
        let r = path.strip_prefix("/apis/")?;
        let mut it = r.splitn(3, '/');
        it.next()?;
        it.next()?;
        it.next()
    })?;
    let segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let (namespace, segs) = match segs.as_slice() {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some(ns.to_string()), tail.to_vec()),
        _ => (None, segs),
    };
    let seg = |i: usize| segs.get(i).map(|s| s.to_string());
    Some(Target {
        resource: seg(0)?,
        namespace,
        name: seg(1),
        subresource: seg(2),
        core: path.starts_with("/api/v1/"),
    })
}

/// An event as a core/v1 list shows it: one written through
/// events.k8s.io/v1 (`regarding`, `note`, `deprecated*`) in the core/v1
/// form, as the API server converts it; a core/v1 one as it is.
fn core_event(o: &Value) -> Value {
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

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query_map(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// Whether `obj` matches a field selector (`a.b=v,c.d!=w`).
fn matches(selector: &str, obj: &Value) -> bool {
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        let (field, want, negate) = if let Some((f, v)) = term.split_once("!=") {
            (f, v, true)
        } else if let Some((f, v)) = term.split_once("==") {
            (f, v, false)
        } else if let Some((f, v)) = term.split_once('=') {
            (f, v, false)
        } else {
            return false;
        };
        let mut v = obj;
        for part in field.split('.') {
            v = &v[part];
        }
        let got = v.as_str().unwrap_or("");
        (got == want) != negate
    })
}

fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .unwrap()
}

fn status_response(code: u16, reason: &str, message: &str) -> Response<Body> {
    json_response(
        StatusCode::from_u16(code).unwrap(),
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code}),
    )
}

/// JSON merge patch (RFC 7386); strategic merge patches are applied the same way.
fn merge(target: &mut Value, patch: &Value) {
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

#[derive(Clone)]
struct Server {
    state: Arc<Mutex<State>>,
    changed: watch::Sender<u64>,
    cut: watch::Sender<u64>,
}

impl Server {
    async fn handle(&self, req: Request<hyper::body::Incoming>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        self.answer(&parts, &body)
    }

    /// Answers a request (over HTTPS or in memory) and records it.
    fn answer(&self, parts: &http::request::Parts, body: &[u8]) -> Response<Body> {
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

    fn route(
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
    fn injected_failure(&self, method: &Method) -> Option<Response<Body>> {
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

    /// POST of a collection: `409 AlreadyExists` if the name is taken.
    fn create(&self, t: &Target, body: &[u8]) -> Response<Body> {
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
    fn update(&self, method: &Method, t: &Target, name: &str, body: &[u8]) -> Response<Body> {
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
    fn delete(&self, t: &Target, name: &str) -> Response<Body> {
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
    fn token_request(&self, t: &Target, body: &[u8]) -> Response<Body> {
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

    fn list(&self, t: &Target, selector: &str) -> Response<Body> {
        let s = self.state.lock().unwrap();
        let core_events = t.core && t.resource == "events";
        let items: Vec<Value> = s
            .objects
            .iter()
            .filter(|((r, ns, _), _)| {
                r == &t.resource && t.namespace.as_ref().is_none_or(|want| want == ns)
            })
            .map(|(_, o)| {
                if core_events {
                    core_event(o)
                } else {
                    o.clone()
                }
            })
            .filter(|o| matches(selector, o))
            .collect();
        json_response(
            StatusCode::OK,
            &json!({"apiVersion": "v1", "kind": format!("{}List", kind_of(&t.resource)),
                    "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
        )
    }

    fn watch(&self, t: Target, selector: String, q: &BTreeMap<String, String>) -> Response<Body> {
        let from: u64 = q
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
        let timeout = q
            .get("timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .map_or(Duration::from_secs(300), Duration::from_secs);
        let (tx, rx) = mpsc::channel::<Bytes>(64);
        let (state, changed, mut cut) = (
            Arc::clone(&self.state),
            self.changed.subscribe(),
            self.cut.subscribe(),
        );
        cut.mark_unchanged();
        let deadline = tokio::time::Instant::now() + timeout;
        let feed = Feed {
            state,
            changed,
            cut,
            tx,
        };
        tokio::spawn(feed.run(t, selector, from, bookmarks, deadline));
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
        });
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(BodyExt::boxed(StreamBody::new(stream)))
            .unwrap()
    }
}

/// The events of one watch, sent to its response body.
struct Feed {
    state: Arc<Mutex<State>>,
    changed: watch::Receiver<u64>,
    cut: watch::Receiver<u64>,
    tx: mpsc::Sender<Bytes>,
}

impl Feed {
    /// Sends the changes after `from` that match, then each new one (and
    /// bookmarks if asked), until the deadline, a cut or the client goes.
    async fn run(
        mut self,
        t: Target,
        selector: String,
        from: u64,
        bookmarks: bool,
        deadline: tokio::time::Instant,
    ) {
        let mut cursor = from;
        let line = |v: Value| Bytes::from(format!("{v}\n"));
        if from < self.state.lock().unwrap().compacted {
            let _ = self.tx.send(line(gone())).await;
            return;
        }
        loop {
            self.changed.mark_unchanged();
            let (events, rv) = {
                let s = self.state.lock().unwrap();
                let start = s.log.partition_point(|c| c.rv <= cursor);
                let events: Vec<Change> = s.log[start..]
                    .iter()
                    .filter(|c| {
                        c.resource == t.resource
                            && t.namespace.as_ref().is_none_or(|n| n == &c.namespace)
                            && matches(&selector, &c.object)
                    })
                    .cloned()
                    .collect();
                (events, s.rv)
            };
            for c in events {
                cursor = c.rv;
                if self
                    .tx
                    .send(line(json!({"type": c.kind, "object": c.object})))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            cursor = cursor.max(rv);
            tokio::select! {
                _ = self.changed.changed() => {}
                _ = self.cut.changed() => {
                    // An outage ends the stream; a compaction with 410.
                    let compacted = self.state.lock().unwrap().compacted;
                    if cursor < compacted {
                        let _ = self.tx.send(line(gone())).await;
                    }
                    return;
                }
                _ = tokio::time::sleep(Duration::from_millis(500)), if bookmarks => {
                    let bm = json!({"type": "BOOKMARK", "object": {"kind": kind_of(&t.resource), "apiVersion": "v1",
                                     "metadata": {"resourceVersion": cursor.to_string()}}});
                    if self.tx.send(line(bm)).await.is_err() {
                        return;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => return,
            }
        }
    }
}

fn gone() -> Value {
    json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": "too old resource version", "reason": "Expired", "code": 410}})
}

/// The node authorizer's answer to a list or watch, if it refuses it.
fn node_authorizer(resource: &str, selector: &str) -> Option<Response<Body>> {
    let needs = if resource == "pods" {
        "spec.nodeName="
    } else if BY_NAME_ONLY.contains(&resource) {
        "metadata.name="
    } else {
        return None;
    };
    if selector.contains(needs) {
        return None;
    }
    Some(status_response(
        403,
        "Forbidden",
        &format!("{resource} is forbidden: a node may only list or watch them with {needs}NAME"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, PostParams, WatchEvent, WatchParams};

    fn config_map(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "ns"}, "data": {"k": "v"}})
    }

    /// In memory, the fake answers as over HTTPS and as the API server:
    /// a second create is `409`, a replace with a stale version is `409`,
    /// an injected failure is its code once, a watch from a compacted
    /// version is `410`, and every request is recorded.
    #[tokio::test]
    async fn in_memory_answers_as_the_api_server() {
        let fake = FakeApiServer::in_memory();
        let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
        let cm: ConfigMap = serde_json::from_value(config_map("a")).unwrap();
        let created = api.create(&PostParams::default(), &cm).await.unwrap();
        let again = api.create(&PostParams::default(), &cm).await.unwrap_err();
        assert!(again.to_string().contains("AlreadyExists"), "{again}");
        let mut stale = created.clone();
        stale.metadata.resource_version = Some("0".into());
        let err = api
            .replace("a", &PostParams::default(), &stale)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("Conflict"), "{err}");
        api.replace("a", &PostParams::default(), &created)
            .await
            .unwrap();
        fake.fail_next(Method::GET, 503);
        assert!(api.get("a").await.is_err());
        assert!(api.get("a").await.is_ok());
        assert_eq!(fake.get("ConfigMap", "ns", "a").unwrap()["data"]["k"], "v");
        fake.expire_watches();
        let params = WatchParams::default().fields("metadata.name=a");
        let mut events = api.watch(&params, "1").await.unwrap().boxed();
        match events.next().await {
            Some(Ok(WatchEvent::Error(e))) => assert_eq!(e.code, 410),
            other => panic!("expected 410, got {other:?}"),
        }
        let reqs = fake.take_requests();
        assert_eq!(reqs[0].method, "POST");
        assert_eq!(reqs[1].status, 409);
        assert!(fake.take_requests().is_empty());
    }
}
