//! The agent's HTTP endpoint (`--metrics-addr`): `GET /metrics` (the
//! Prometheus text of [`VolumeManager::metrics_text`]) and `GET /healthz`,
//! anything else `404`. HTTP/1.1 by hyper, one request per connection
//! (`Connection: close`), its clients bounded like the local API's (see
//! [`crate::limits`]): connections over the bounds get [`BUSY_503`] before
//! any parsing; an admitted connection has [`READ_DEADLINE`] to send its
//! request (and is closed if a new connection takes its place meanwhile),
//! then the answer is written within [`WRITE_DEADLINE`]; at most
//! [`crate::limits::RESPONSE_SLOTS`] metrics bodies are built and written at
//! once.

use std::sync::{Arc, Mutex};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit};

use crate::limits::{serve_bounded, Admission, ClientLimits, Peer, READ_DEADLINE, WRITE_DEADLINE};
use volmgr::volumemanager::VolumeManager;

/// The answer to a connection over the client bounds.
pub const BUSY_503: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 24\r\nRetry-After: 1\r\nConnection: close\r\n\r\ntoo many clients, retry\n";

/// Serves `/metrics` and `/healthz` on `listener` until `shutdown`.
pub async fn serve_metrics(
    listener: TcpListener,
    vm: Arc<VolumeManager>,
    limits: ClientLimits,
    shutdown: watch::Receiver<bool>,
) {
    let accept = || async {
        let (stream, addr) = listener.accept().await?;
        Ok((stream, Peer::Ip(addr.ip())))
    };
    let busy = (BUSY_503, |stream: &TcpStream| {
        let _ = stream.try_write(BUSY_503);
    });
    let serve = |stream, admission| {
        let (vm, limits) = (Arc::clone(&vm), limits.clone());
        async move { serve_connection(stream, vm, limits, admission).await }
    };
    serve_bounded(&limits, "metrics", accept, busy, serve, shutdown).await;
}

/// Why a connection is closed unanswered.
#[derive(Debug, thiserror::Error)]
enum Unanswered {
    /// A new connection took its place before its request was complete.
    #[error("connection taken over")]
    TakenOver,
    /// No response slot came free within [`WRITE_DEADLINE`].
    #[error("no response slot")]
    NoSlot,
}

/// What the one request of a connection shares with its connection task.
struct Exchange {
    vm: Arc<VolumeManager>,
    limits: ClientLimits,
    admission: Admission,
    /// Told when the request is in: the read deadline ends.
    arrived: Notify,
    /// Told when the answer is ready: the write deadline starts.
    answered: Notify,
    /// The metrics response slot, held until the connection ends.
    slot: Mutex<Option<OwnedSemaphorePermit>>,
}

/// One connection: its request within [`READ_DEADLINE`] (or until it is
/// taken over), then its answer written within [`WRITE_DEADLINE`].
async fn serve_connection(
    stream: TcpStream,
    vm: Arc<VolumeManager>,
    limits: ClientLimits,
    admission: Admission,
) {
    let exchange = Arc::new(Exchange {
        vm,
        limits,
        admission,
        arrived: Notify::new(),
        answered: Notify::new(),
        slot: Mutex::new(None),
    });
    let shared = Arc::clone(&exchange);
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let shared = Arc::clone(&shared);
        async move { answer(&shared, &req).await }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .title_case_headers(true)
        .max_buf_size(8192)
        .header_read_timeout(None)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = &mut conn => return,
        () = tokio::time::sleep(READ_DEADLINE) => return,
        () = exchange.admission.evicted() => return,
        () = exchange.arrived.notified() => {}
    }
    // A `/metrics` answer may wait for a slot first (bounded itself).
    tokio::select! {
        _ = &mut conn => return,
        () = exchange.answered.notified() => {}
    }
    let _ = tokio::time::timeout(WRITE_DEADLINE, conn).await;
}

/// The answer to one request, whatever its method.
async fn answer(
    x: &Exchange,
    req: &Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Unanswered> {
    x.arrived.notify_one();
    if !x.admission.busy() {
        return Err(Unanswered::TakenOver);
    }
    let target = req.uri().path_and_query().map_or("", |p| p.as_str());
    let (status, ctype, body) = match target {
        "/metrics" => {
            let slot = x.limits.response_slot().await.ok_or(Unanswered::NoSlot)?;
            *x.slot
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(slot);
            (
                StatusCode::OK,
                "text/plain; version=0.0.4",
                x.vm.metrics_text(),
            )
        }
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_string(),
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(ctype),
    );
    headers.insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("close"),
    );
    x.answered.notify_one();
    Ok(resp)
}
