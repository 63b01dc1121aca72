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

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::BodyExt;
use hyper::{Method, Request};
use serde_json::{json, Value};
use tokio::sync::watch;
use volmgr::populator::objects::ObjectKind;

mod answers;
mod authorizer;
mod request;
mod server;
mod watches;
mod writes;

use answers::*;
use authorizer::node_authorizer;
use request::*;
use server::Server;

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

/// The kinds the fake serves, with their collections: those pods' volumes
/// refer to, and the pods, CSINodes and events around them (from
/// k8s-openapi's `Resource`, not written by hand).
fn served_kinds() -> impl Iterator<Item = (&'static str, &'static str)> {
    use k8s_openapi::api::core::v1::{Event, Pod};
    use k8s_openapi::api::storage::v1::CSINode;
    use k8s_openapi::Resource;
    ObjectKind::ALL
        .iter()
        .map(|k| (k.name(), k.url_path_segment()))
        .chain([
            (Pod::KIND, Pod::URL_PATH_SEGMENT),
            (CSINode::KIND, CSINode::URL_PATH_SEGMENT),
            (Event::KIND, Event::URL_PATH_SEGMENT),
        ])
}

/// The collection a kind lives in.
pub fn resource_of(kind: &str) -> String {
    served_kinds()
        .find(|(k, _)| *k == kind)
        .map_or_else(|| format!("{}s", kind.to_lowercase()), |(_, r)| r.into())
}

fn kind_of(resource: &str) -> &'static str {
    served_kinds()
        .find(|(_, r)| *r == resource)
        .map_or("Object", |(k, _)| k)
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
