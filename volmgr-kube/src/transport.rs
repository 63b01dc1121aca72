//! The agent's HTTP stack to the API server, bounded whatever the server
//! does:
//!
//! - **one connection**: HTTP/2 (ALPN `h2`, falling back to HTTP/1.1)
//!   multiplexes every list and watch over one connection, as the
//!   kubelet's client-go does; at most [`MAX_CONNECTIONS`] are open at
//!   once (a server without HTTP/2 gets that many, never one per watch);
//! - **deadlines**: a connection (TCP and TLS) within [`CONNECT_TIMEOUT`],
//!   an answer's headers within [`ANSWER_DEADLINE`], the whole body of a
//!   list or get within [`BODY_DEADLINE`], a watch line (event or
//!   bookmark) within the watch's own `timeoutSeconds` and
//!   [`WATCH_IDLE_MARGIN`] ([`watch_idle`]); an HTTP/2 ping every
//!   [`PING_INTERVAL`] answered within [`PING_TIMEOUT`] (client-go's
//!   values) finds a dead connection under quiet watches;
//! - **watches that live as long as the server lets them**, as client-go's
//!   reflector asks for them ([`watcher_config`]): each watcher's watches
//!   ask for a server-side `timeoutSeconds` between [`MIN_WATCH_TIMEOUT`]
//!   and twice it, chosen at random, and for bookmarks. A real API server
//!   sends nothing on a quiet watch (no bookmark while nothing changes):
//!   the watch is silent until the server ends it, and is then resumed
//!   from its resource version (no relist); its liveness meanwhile comes
//!   from the HTTP/2 pings;
//! - **sizes**: one watch event at most [`MAX_WATCH_EVENT`] bytes, one list
//!   page (or any other answer) at most [`MAX_LIST_PAGE`], and everything
//!   being received at once at most [`MAX_IN_FLIGHT`]; lists are paged by
//!   [`PAGE_SIZE`] objects (`limit`/`continue`, as client-go's reflector).
//!
//! Over a bound the answer fails with a [`TransportError`] (its stream or
//! connection is dropped), the watcher backs off and retries, and the
//! cause shows in status (see [`super::problems`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body::Frame;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ConfigExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{BoxError, ServiceBuilder};

/// Connections to the API server open at once, at most.
pub const MAX_CONNECTIONS: usize = 16;
/// Time to open a connection (TCP connect and TLS handshake).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Time for an answer's status and headers to arrive.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(30);
/// Time for the whole body of an answer that is not a watch (a list page,
/// a get) to arrive after its headers.
pub const BODY_DEADLINE: Duration = Duration::from_secs(30);
/// The shortest server-side watch timeout a watcher asks for; each asks
/// for between this and twice it, at random (client-go's reflector:
/// `minWatchTimeout` 5 min, `timeoutSeconds = minWatchTimeout * (1 +
/// rand)`), so that the watches of many agents do not all end at once.
pub const MIN_WATCH_TIMEOUT: Duration = Duration::from_secs(300);
/// How much longer than its `timeoutSeconds` a watch may stay silent
/// before it is cut: the server ends a healthy watch at its timeout, and
/// a quiet resource gets no bookmark before then.
pub const WATCH_IDLE_MARGIN: Duration = Duration::from_secs(60);
/// Longest silence within a watch that asked for no `timeoutSeconds`:
/// the API server then ends it within twice its `--min-request-timeout`
/// (1800 s by default), plus [`WATCH_IDLE_MARGIN`].
pub const WATCH_IDLE_WITHOUT_TIMEOUT: Duration = Duration::from_secs(3600 + 60);
/// Longest silence within any watch, whatever its `timeoutSeconds`.
pub const MAX_WATCH_IDLE: Duration = Duration::from_secs(24 * 3600);
/// HTTP/2 ping period on a connection that received nothing.
pub const PING_INTERVAL: Duration = Duration::from_secs(30);
/// Time a ping has to be answered before the connection is dropped.
pub const PING_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest watch event line. The API server refuses objects over about
/// 3 MiB (its request limit; etcd keeps 1.5 MiB); their JSON stays well
/// under this.
pub const MAX_WATCH_EVENT: usize = 8 << 20;
/// Largest list page or other answer body.
pub const MAX_LIST_PAGE: usize = 32 << 20;
/// Bytes of unfinished watch lines and answer bodies held at once, over
/// every request.
pub const MAX_IN_FLIGHT: usize = 64 << 20;
/// Objects per list page (`limit`).
pub const PAGE_SIZE: u32 = 100;

/// Why an exchange with the API server was cut by this stack.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// No connection within [`CONNECT_TIMEOUT`].
    #[error("no connection in {} s (TCP connect and TLS handshake)", CONNECT_TIMEOUT.as_secs())]
    ConnectTimeout,
    /// Every connection slot is in use for longer than [`CONNECT_TIMEOUT`].
    #[error(
        "all {MAX_CONNECTIONS} connections to the API server are in use (does it speak HTTP/2?)"
    )]
    NoConnection,
    /// No answer within [`ANSWER_DEADLINE`].
    #[error("no answer in {} s ({what})", ANSWER_DEADLINE.as_secs())]
    NoAnswer {
        /// The request.
        what: String,
    },
    /// A body did not arrive in time.
    #[error("the {what} did not arrive within {} s", .after.as_secs())]
    Slow {
        /// The request.
        what: String,
        /// Its deadline.
        after: Duration,
    },
    /// A watch line or an answer body over its bound.
    #[error("the {what} is over {} MiB", .limit >> 20)]
    TooLarge {
        /// The request.
        what: String,
        /// The bound.
        limit: usize,
    },
    /// Answers being received at once are over [`MAX_IN_FLIGHT`].
    #[error("answers being received hold over {} MiB; the {what} was dropped", MAX_IN_FLIGHT >> 20)]
    Budget {
        /// The request dropped.
        what: String,
    },
}

/// A server-side watch timeout in seconds, at random between
/// [`MIN_WATCH_TIMEOUT`] (included) and twice it (excluded), as client-go's
/// reflector chooses one for each watch.
pub fn random_watch_timeout() -> u32 {
    let min = MIN_WATCH_TIMEOUT.as_secs() as u32;
    let extra = f64::from(min) * volmgr::util::backoff::random_fraction();
    min + (extra as u32).min(min - 1)
}

/// The configuration of every watcher: a server-side `timeoutSeconds`
/// from [`random_watch_timeout`] (one per watcher, for every watch it
/// makes), bookmarks, and lists paged by [`PAGE_SIZE`]. Selectors are
/// added by the caller (`watcher_config().fields("spec.nodeName=n1")`).
pub fn watcher_config() -> kube::runtime::watcher::Config {
    let mut config = kube::runtime::watcher::Config::default()
        .timeout(random_watch_timeout())
        .page_size(PAGE_SIZE);
    config.bookmarks = true;
    config
}

/// The longest silence allowed within the watch `uri` asks for: its
/// `timeoutSeconds` plus [`WATCH_IDLE_MARGIN`] (at most
/// [`MAX_WATCH_IDLE`]); without one (or `0`, the server's default),
/// [`WATCH_IDLE_WITHOUT_TIMEOUT`].
pub fn watch_idle(uri: &Uri) -> Duration {
    let timeout = uri.query().and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("timeoutSeconds="))
            .and_then(|v| v.parse::<u64>().ok())
    });
    match timeout {
        Some(secs) if secs > 0 => Duration::from_secs(secs)
            .saturating_add(WATCH_IDLE_MARGIN)
            .min(MAX_WATCH_IDLE),
        _ => WATCH_IDLE_WITHOUT_TIMEOUT,
    }
}

/// The kube client over the bounded stack for `config`.
pub fn client(config: &kube::Config) -> Result<kube::Client, kube::Error> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    http.set_nodelay(true);
    let mut builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = name
            .clone()
            .try_into()
            .map_err(|e| kube::Error::Service(Box::new(e)))?;
        builder =
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = builder.enable_all_versions().wrap_connector(http);
    let connector = Permitted {
        inner: https,
        permits: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
    };
    let mut b = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true);
    let bounded = Bounded {
        client: b.build(connector),
        budget: Arc::new(AtomicUsize::new(0)),
    };
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .service(bounded);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

/// A connector that holds one of [`MAX_CONNECTIONS`] slots for the life
/// of each connection, and gives up after [`CONNECT_TIMEOUT`].
#[derive(Clone)]
struct Permitted<C> {
    inner: C,
    permits: Arc<Semaphore>,
}

impl<C> tower::Service<Uri> for Permitted<C>
where
    C: tower::Service<Uri> + Clone + Send + 'static,
    C::Response: Connection + hyper::rt::Read + hyper::rt::Write + Unpin + Send,
    C::Future: Send,
    C::Error: Into<BoxError>,
{
    type Response = PermittedStream<C::Response>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let permits = Arc::clone(&self.permits);
        // The clone is not ready; the one polled ready does the call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let slots = Arc::clone(&permits);
            let connect = async move {
                let permit = slots
                    .acquire_owned()
                    .await
                    .map_err(|_| TransportError::NoConnection)?;
                let io = inner.call(uri).await.map_err(Into::into)?;
                Ok::<_, BoxError>(PermittedStream {
                    io,
                    _permit: permit,
                })
            };
            match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
                Ok(r) => r,
                Err(_) if permits.available_permits() == 0 => {
                    Err(TransportError::NoConnection.into())
                }
                Err(_) => Err(TransportError::ConnectTimeout.into()),
            }
        })
    }
}

/// A connection holding its slot.
struct PermittedStream<T> {
    io: T,
    _permit: OwnedSemaphorePermit,
}

impl<T: Connection> Connection for PermittedStream<T> {
    fn connected(&self) -> Connected {
        self.io.connected()
    }
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for PermittedStream<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for PermittedStream<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
}

type HyperClient<C> = hyper_util::client::legacy::Client<C, Body>;

/// The deadline on an answer's headers, and bounded bodies.
#[derive(Clone)]
struct Bounded<C> {
    client: HyperClient<C>,
    budget: Arc<AtomicUsize>,
}

impl<C> tower::Service<Request<Body>> for Bounded<C>
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    type Response = Response<BoundedBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let (client, budget) = (self.client.clone(), Arc::clone(&self.budget));
        Box::pin(async move {
            let watch = is_watch(req.uri());
            let what = describe_request(req.uri(), watch);
            let after = if watch {
                watch_idle(req.uri())
            } else {
                BODY_DEADLINE
            };
            let resp = match tokio::time::timeout(ANSWER_DEADLINE, client.request(req)).await {
                Ok(r) => r?,
                Err(_) => return Err(TransportError::NoAnswer { what }.into()),
            };
            Ok(resp.map(|inner| BoundedBody::new(inner, what, watch, after, budget)))
        })
    }
}

/// Whether a request is a watch (`watch=true` or `watch=1`).
fn is_watch(uri: &Uri) -> bool {
    uri.query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"))
}

/// A request in words: `pods list`, `configmaps watch`, `nodes node-a`.
pub fn describe_request(uri: &Uri, watch: bool) -> String {
    let segs: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segs.as_slice() {
        ["api", _, rest @ ..] | ["apis", _, _, rest @ ..] => rest,
        other => other,
    };
    let rest = match rest {
        ["namespaces", _, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    match (rest, watch) {
        ([resource], true) => format!("{resource} watch"),
        ([resource], false) => format!("{resource} list"),
        ([resource, name, ..], _) => format!("{resource} {name}"),
        _ => uri.path().to_string(),
    }
}

/// An answer body within the size bounds and deadlines (see the module
/// documentation).
pub struct BoundedBody {
    inner: Incoming,
    what: String,
    watch: bool,
    /// The deadline of the whole body, or of each watch line.
    after: Duration,
    /// Bytes of the current line (watch) or of the whole body.
    pending: usize,
    budget: Arc<AtomicUsize>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    failed: bool,
}

impl BoundedBody {
    fn new(
        inner: Incoming,
        what: String,
        watch: bool,
        after: Duration,
        budget: Arc<AtomicUsize>,
    ) -> Self {
        Self {
            inner,
            what,
            watch,
            after,
            pending: 0,
            budget,
            deadline: Box::pin(tokio::time::sleep(after)),
            failed: false,
        }
    }

    /// Sets the bytes held to `n`, checking the bounds.
    fn hold(&mut self, n: usize) -> Result<(), TransportError> {
        let limit = if self.watch {
            MAX_WATCH_EVENT
        } else {
            MAX_LIST_PAGE
        };
        if n > limit {
            return Err(TransportError::TooLarge {
                what: self.noun(),
                limit,
            });
        }
        if n > self.pending {
            let more = n - self.pending;
            let before = self.budget.fetch_add(more, Ordering::AcqRel);
            self.pending = n;
            if before + more > MAX_IN_FLIGHT {
                return Err(TransportError::Budget { what: self.noun() });
            }
        } else {
            self.budget.fetch_sub(self.pending - n, Ordering::AcqRel);
            self.pending = n;
        }
        Ok(())
    }

    /// What one unit of this body is: `pods list` or `pods watch event`.
    fn noun(&self) -> String {
        if self.watch {
            format!("{} event", self.what)
        } else {
            self.what.clone()
        }
    }

    /// Counts `data` in; a watch line ending restarts the idle deadline.
    fn account(&mut self, data: &Bytes) -> Result<(), TransportError> {
        if !self.watch {
            return self.hold(self.pending + data.len());
        }
        let mut parts = data.split(|b| *b == b'\n');
        let first = parts.next().map_or(0, <[u8]>::len);
        let mut line = self.pending + first;
        let mut ended = false;
        for part in parts {
            if line > MAX_WATCH_EVENT {
                break;
            }
            ended = true;
            line = part.len();
        }
        self.hold(line)?;
        if ended {
            let next = tokio::time::Instant::now() + self.after;
            self.deadline.as_mut().reset(next);
        }
        Ok(())
    }

    fn fail(&mut self, e: TransportError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.failed = true;
        let _ = self.hold(0);
        Poll::Ready(Some(Err(e.into())))
    }
}

impl Drop for BoundedBody {
    fn drop(&mut self) {
        self.budget.fetch_sub(self.pending, Ordering::AcqRel);
    }
}

impl http_body::Body for BoundedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            let after = this.after;
            let what = this.noun();
            return this.fail(TransportError::Slow { what, after });
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                let _ = this.hold(0);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                let _ = this.hold(0);
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if let Err(e) = this.account(data) {
                        return this.fail(e);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_in_words() {
        let d = |s: &str, w| describe_request(&s.parse::<Uri>().unwrap(), w);
        assert_eq!(d("/api/v1/pods?fieldSelector=x", false), "pods list");
        assert_eq!(
            d("/api/v1/namespaces/t/configmaps", true),
            "configmaps watch"
        );
        assert_eq!(d("/api/v1/nodes/node-a", false), "nodes node-a");
        assert_eq!(
            d("/apis/storage.k8s.io/v1/csidrivers", false),
            "csidrivers list"
        );
        assert!(is_watch(&"/api/v1/pods?a=b&watch=true".parse().unwrap()));
        assert!(!is_watch(&"/api/v1/pods?watcher=true".parse().unwrap()));
    }

    /// A watch may stay silent for its own `timeoutSeconds` and a margin:
    /// the server ends it then.
    #[test]
    fn a_watch_is_silent_at_most_its_timeout_and_a_margin() {
        let idle = |s: &str| watch_idle(&s.parse::<Uri>().unwrap());
        assert_eq!(
            idle("/api/v1/pods?&watch=true&timeoutSeconds=437&allowWatchBookmarks=true&resourceVersion=12"),
            Duration::from_secs(437 + 60)
        );
        assert_eq!(
            idle("/api/v1/pods?timeoutSeconds=300&watch=true"),
            Duration::from_secs(360)
        );
        for none in [
            "/api/v1/pods?watch=true",
            "/api/v1/pods?watch=true&timeoutSeconds=0",
            "/api/v1/pods?watch=true&timeoutSeconds=x",
            "/api/v1/pods?watch=true&xtimeoutSeconds=30",
            "/api/v1/pods",
        ] {
            assert_eq!(idle(none), WATCH_IDLE_WITHOUT_TIMEOUT, "{none}");
        }
        assert_eq!(
            idle("/api/v1/pods?watch=true&timeoutSeconds=18446744073709551615"),
            MAX_WATCH_IDLE
        );
    }

    /// Every watcher asks for 300 to 599 s (client-go's 5 min × (1 +
    /// rand)), not all the same, and for bookmarks.
    #[test]
    fn watch_timeouts_are_random_between_five_and_ten_minutes() {
        let timeouts: Vec<u32> = (0..500).map(|_| random_watch_timeout()).collect();
        assert!(
            timeouts.iter().all(|t| (300..600).contains(t)),
            "{timeouts:?}"
        );
        let distinct: std::collections::BTreeSet<u32> = timeouts.iter().copied().collect();
        assert!(distinct.len() > 100, "{} distinct", distinct.len());
        assert!(timeouts.iter().any(|t| *t < 350) && timeouts.iter().any(|t| *t >= 550));
        let c = watcher_config();
        assert!(c.bookmarks);
        assert!(c.timeout.is_some_and(|t| (300..600).contains(&t)));
        assert_eq!(c.page_size, Some(PAGE_SIZE));
    }

    /// The request a watcher makes carries the timeout, and the stack
    /// gives its silence the timeout and the margin.
    #[tokio::test]
    async fn a_watchers_request_carries_its_timeout() {
        use futures_util::StreamExt;
        use k8s_openapi::api::core::v1::Pod;
        let fake = crate::testing::FakeApiServer::in_memory();
        let api: kube::Api<Pod> = kube::Api::all(fake.client());
        let config = watcher_config().fields("spec.nodeName=n1");
        let want = config.timeout.unwrap();
        let mut events = kube::runtime::watcher::watcher(api, config).boxed();
        // Init, InitDone, then the watch starts on the next poll.
        for _ in 0..2 {
            events.next().await.unwrap().unwrap();
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), events.next()).await;
        let r = fake.take_requests();
        let watch = r
            .iter()
            .find(|r| r.query.contains("watch=true"))
            .unwrap_or_else(|| panic!("no watch in {r:?}"));
        assert!(
            watch.query.contains("allowWatchBookmarks=true"),
            "{watch:?}"
        );
        let uri: Uri = format!("{}?{}", watch.path, watch.query).parse().unwrap();
        assert_eq!(
            watch_idle(&uri),
            Duration::from_secs(u64::from(want)) + WATCH_IDLE_MARGIN
        );
    }
}
