//! Bounds on the agent's local clients (the status socket and the metrics
//! endpoint), so that clients that connect in numbers, never read, or send
//! endless lines cannot take the agent's memory or descriptors, nor keep
//! other clients out:
//!
//! - connections: at most [`ClientLimits::total_max`] over all listeners
//!   (a quarter of `RLIMIT_NOFILE`, keeping descriptors in reserve for
//!   mounts, manifests and CSI), [`ClientLimits::per_listener`] per listener
//!   (three quarters of that, so one listener cannot starve the other) and
//!   [`ClientLimits::per_peer`] per peer and listener (half a listener; a
//!   peer is a uid on the socket, an IP address over TCP);
//! - a new connection over one of these bounds takes the place of an idle
//!   one (connected, no complete request line yet), of the peer that holds
//!   the most connections, oldest first: idle clients cannot keep a client
//!   with a request out. Only when every connection in the way is busy
//!   with a request is the new one answered [`BUSY`] ("too many clients,
//!   retry") and closed, the answer written and its request read first
//!   (so the client sees the answer, not a reset or a broken pipe), by at
//!   most [`REFUSALS`] refusals at once, each within [`REFUSAL_DEADLINE`];
//! - requests: one line of at most [`MAX_REQUEST_LINE`] bytes, received
//!   within [`READ_DEADLINE`] (an idle or slow client is closed);
//! - responses: written within [`WRITE_DEADLINE`] (a client that does not
//!   read is closed), and at most [`RESPONSE_SLOTS`] large responses
//!   (status, metrics) built and in flight at once;
//! - accept errors: `EMFILE`/`ENFILE` and other failures back off
//!   ([`AcceptBackoff`]) instead of spinning.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::future::Future;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use volmgr::util::backoff::{Backoff, Retries};

/// Longest request line.
pub const MAX_REQUEST_LINE: usize = 64 << 10;
/// Time a client has to send a whole request line (from the moment the
/// agent starts waiting for it, so idle connections are closed too).
pub const READ_DEADLINE: Duration = Duration::from_secs(5);
/// Time a client has to take a whole response.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(10);
/// Large responses (status, metrics) built and in flight at once.
pub const RESPONSE_SLOTS: usize = 8;
/// Refusals ("too many clients, retry") in flight at once; above, the
/// answer is written only if it fits the socket buffer at once.
pub const REFUSALS: usize = 16;
/// Time a refusal takes at most (its answer written, the request read).
pub const REFUSAL_DEADLINE: Duration = Duration::from_secs(1);
/// The error of a refused connection.
pub const BUSY: &str = "too many clients, retry";
/// Connections per listener, at most.
const PER_LISTENER: usize = 64;
/// Fraction of `RLIMIT_NOFILE` client connections may use, at most.
const NOFILE_SHARE: u64 = 4;

/// Who is on the other end of a connection, for its share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A local user (`SO_PEERCRED`).
    Uid(u32),
    /// A TCP client.
    Ip(IpAddr),
    /// Not known.
    Unknown,
}

/// One admitted connection.
#[derive(Debug)]
struct Entry {
    id: u64,
    listener: &'static str,
    peer: Peer,
    idle: bool,
    evict: Arc<Notify>,
}

#[derive(Debug, Default)]
struct Registry {
    next: u64,
    conns: Vec<Entry>,
}

/// Connection and response budgets shared by the agent's listeners.
#[derive(Debug, Clone)]
pub struct ClientLimits {
    registry: Arc<Mutex<Registry>>,
    responses: Arc<Semaphore>,
    refusals: Arc<Semaphore>,
    /// Connections per listener.
    pub per_listener: usize,
    /// Connections per peer and listener.
    pub per_peer: usize,
    /// Connections over all listeners.
    pub total_max: usize,
}

/// A connection's place in the budgets; released on drop.
#[derive(Debug)]
pub struct Admission {
    id: u64,
    registry: Arc<Mutex<Registry>>,
    evict: Arc<Notify>,
}

impl Admission {
    /// Marks the connection idle or not; `false` when a new connection
    /// has taken its place already (the connection is then to be closed).
    fn set_idle(&self, idle: bool) -> bool {
        let mut r = lock(&self.registry);
        let Some(e) = r.conns.iter_mut().find(|e| e.id == self.id) else {
            return false;
        };
        e.idle = idle;
        true
    }

    /// The connection has a complete request: it is not taken over.
    /// `false` when it has been already (close it, unanswered).
    #[must_use]
    pub fn busy(&self) -> bool {
        self.set_idle(false)
    }

    /// The connection waits for its next request line: a new connection
    /// over a bound may take its place.
    pub fn idle(&self) {
        self.set_idle(true);
    }

    /// Completes when a new connection took this one's place.
    pub async fn evicted(&self) {
        self.evict.notified().await;
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        lock(&self.registry).conns.retain(|e| e.id != self.id);
    }
}

fn lock(r: &Mutex<Registry>) -> std::sync::MutexGuard<'_, Registry> {
    r.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ClientLimits {
    /// Budgets sized from the process's `RLIMIT_NOFILE` (a quarter of the
    /// soft limit over all listeners, between 8 and 128).
    pub fn from_rlimit() -> Self {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one `rlimit` we own.
        let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            lim.rlim_cur
        } else {
            1024
        };
        let total = usize::try_from((soft / NOFILE_SHARE).clamp(8, 128)).unwrap_or(8);
        Self::new((total * 3 / 4).min(PER_LISTENER), total)
    }

    /// Explicit budgets (a peer's share is half a listener's).
    pub fn new(per_listener: usize, total: usize) -> Self {
        Self {
            registry: Arc::default(),
            responses: Arc::new(Semaphore::new(RESPONSE_SLOTS)),
            refusals: Arc::new(Semaphore::new(REFUSALS)),
            per_listener,
            per_peer: (per_listener / 2).max(1),
            total_max: total,
        }
    }

    /// Admits a connection from `peer` on `listener`, in the place of an
    /// idle one if a bound is reached; `None` when no place can be made.
    pub fn admit(&self, listener: &'static str, peer: Peer) -> Option<Admission> {
        let mut r = lock(&self.registry);
        let mine = |e: &Entry| e.listener == listener;
        let theirs = |e: &Entry| mine(e) && e.peer == peer;
        let over_peer = r.conns.iter().filter(|e| theirs(e)).count() >= self.per_peer;
        let over_listener = r.conns.iter().filter(|e| mine(e)).count() >= self.per_listener;
        if over_peer || over_listener || r.conns.len() >= self.total_max {
            let within = |e: &Entry| {
                if over_peer {
                    theirs(e)
                } else {
                    !over_listener || mine(e)
                }
            };
            let victim = take_place(&r.conns, within)?;
            let e = r.conns.remove(victim);
            e.evict.notify_one();
            tracing::debug!(listener = e.listener, peer = ?e.peer, "idle connection closed for a new one");
        }
        r.next += 1;
        let (id, evict) = (r.next, Arc::new(Notify::new()));
        r.conns.push(Entry {
            id,
            listener,
            peer,
            idle: true,
            evict: Arc::clone(&evict),
        });
        Some(Admission {
            id,
            registry: Arc::clone(&self.registry),
            evict,
        })
    }

    /// Waits (up to [`WRITE_DEADLINE`]) for a large-response slot.
    pub async fn response_slot(&self) -> Option<OwnedSemaphorePermit> {
        tokio::time::timeout(WRITE_DEADLINE, Arc::clone(&self.responses).acquire_owned())
            .await
            .ok()?
            .ok()
    }
}

/// The index of the idle connection (among those `within`) whose place a
/// new one takes: of the listener and peer with the most connections,
/// the oldest.
fn take_place(conns: &[Entry], within: impl Fn(&Entry) -> bool) -> Option<usize> {
    let held = |e: &Entry| {
        conns
            .iter()
            .filter(|o| o.listener == e.listener && o.peer == e.peer)
            .count()
    };
    let mut best: Option<(usize, usize)> = None;
    for (i, e) in conns.iter().enumerate() {
        if !e.idle || !within(e) {
            continue;
        }
        let n = held(e);
        // Oldest first: entries are in admission order, so only more wins.
        if best.is_none_or(|(_, m)| n > m) {
            best = Some((i, n));
        }
    }
    best.map(|(i, _)| i)
}

/// Refuses a connection: writes `answer`, then reads (and drops) what the
/// client sends until it closes, so that it gets the answer rather than a
/// reset or a broken pipe; within [`REFUSAL_DEADLINE`], at most
/// [`REFUSALS`] at once (above, the answer only if it fits at once).
fn refuse<S>(limits: &ClientLimits, stream: S, try_write: impl Fn(&S), answer: &'static [u8])
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Ok(permit) = Arc::clone(&limits.refusals).try_acquire_owned() else {
        try_write(&stream);
        return;
    };
    tokio::spawn(async move {
        let _permit = permit;
        let mut stream = stream;
        let exchange = async {
            stream.write_all(answer).await?;
            stream.shutdown().await?;
            let mut buf = [0u8; 4096];
            let mut left = MAX_REQUEST_LINE;
            while left > 0 {
                match stream.read(&mut buf).await? {
                    0 => break,
                    n => left = left.saturating_sub(n),
                }
            }
            Ok::<(), std::io::Error>(())
        };
        let _ = tokio::time::timeout(REFUSAL_DEADLINE, exchange).await;
    });
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, as Go's runtime
/// does at start (the kubelet runs with it): the usual soft limit of 1024
/// is a default for `select(2)` users, not a budget. Returns the soft
/// limit in force. Descriptors stay in reserve for mounts, state files
/// and the local API: the API server's traffic takes at most
/// `volmgr_kube::transport::MAX_CONNECTIONS`, local clients a quarter of the
/// limit ([`ClientLimits::from_rlimit`]).
pub fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    if lim.rlim_cur < lim.rlim_max {
        let before = lim.rlim_cur;
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads one `rlimit` we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            tracing::info!(
                from = before,
                to = raised.rlim_cur,
                "raised the open files limit to the hard limit"
            );
            return raised.rlim_cur;
        }
    }
    lim.rlim_cur
}

/// Backoff of an accept loop after an error: 10 ms doubling to 1 s, reset
/// by a successful accept. Running out of descriptors (`EMFILE`,
/// `ENFILE`) then costs a few wake-ups a second, not a core.
#[derive(Debug)]
pub struct AcceptBackoff {
    retries: Retries,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        Self {
            retries: Backoff::new(Duration::from_millis(10), 2, Duration::from_secs(1)).retries(),
        }
    }
}

impl AcceptBackoff {
    /// A successful accept.
    pub fn reset(&mut self) {
        self.retries.reset();
    }

    /// Sleeps after a failed accept.
    pub async fn failed(&mut self, e: &std::io::Error, what: &str) {
        let d = self.retries.next_delay();
        tracing::warn!(error = %e, listener = what, backoff_ms = d.as_millis() as u64, "accept failed");
        tokio::time::sleep(d).await;
    }
}

/// The accept loop of a local listener, within `limits`, until `shutdown`:
/// `accept` yields the next connection and its peer; one that cannot be
/// admitted (see [`ClientLimits::admit`]) is answered `busy` and closed
/// ([`refuse`]; `try_write` writes without blocking); an admitted one is
/// served by the future `serve` returns, on a task of its own that holds
/// the admission. Accept errors (EMFILE, ...) back off instead of spinning.
pub async fn serve_bounded<S, A, AF, W, H, HF>(
    limits: &ClientLimits,
    what: &'static str,
    mut accept: A,
    (busy, try_write): (&'static [u8], W),
    serve: H,
    mut shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    A: FnMut() -> AF,
    AF: Future<Output = std::io::Result<(S, Peer)>>,
    W: Fn(&S),
    H: Fn(S, Admission) -> HF,
    HF: Future<Output = ()> + Send + 'static,
{
    let mut backoff = AcceptBackoff::default();
    loop {
        tokio::select! {
            () = volmgr::util::shutdown::requested(&mut shutdown) => return,
            conn = accept() => match conn {
                Ok((stream, peer)) => {
                    backoff.reset();
                    let Some(admission) = limits.admit(what, peer) else {
                        tracing::debug!(listener = what, ?peer, "connection refused: too many clients");
                        refuse(limits, stream, &try_write, busy);
                        continue;
                    };
                    tokio::spawn(serve(stream, admission));
                }
                Err(e) => backoff.failed(&e, what).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Peer = Peer::Uid(1);
    const B: Peer = Peer::Uid(2);

    fn held(l: &ClientLimits) -> Vec<(&'static str, Peer, bool)> {
        lock(&l.registry)
            .conns
            .iter()
            .map(|e| (e.listener, e.peer, e.idle))
            .collect()
    }

    #[test]
    fn a_new_connection_takes_the_place_of_an_idle_one() {
        let l = ClientLimits::new(4, 8);
        assert_eq!(l.per_peer, 2);
        let first = l.admit("api", A).unwrap();
        let second = l.admit("api", A).unwrap();
        assert!(second.busy());
        // A's share is spent: its idle connection (the first) makes room.
        let third = l.admit("api", A).unwrap();
        assert_eq!(held(&l), [("api", A, false), ("api", A, true)]);
        // Its task sees it and ends: nothing else goes.
        assert!(!first.busy());
        drop(first);
        assert_eq!(held(&l).len(), 2);
        // Both busy: A is refused, B still has its share.
        assert!(third.busy());
        assert!(l.admit("api", A).is_none());
        let _b = l.admit("api", B).unwrap();
        let _b2 = l.admit("api", B).unwrap();
        // The listener is full: B's idle ones (the peer with most, the
        // oldest first) make room for a peer of its own.
        assert!(l.admit("api", Peer::Uid(3)).is_some());
        assert_eq!(held(&l).iter().filter(|e| e.1 == B).count(), 1);
    }

    #[test]
    fn one_listener_does_not_take_the_others_place_while_busy() {
        let l = ClientLimits::new(2, 3);
        let a: Vec<Admission> = (0..2)
            .map(|i| l.admit("api", Peer::Uid(i)).unwrap())
            .collect();
        for c in &a {
            assert!(c.busy());
        }
        let m = l.admit("metrics", A).unwrap();
        // The total is spent and all busy but the metrics one, which a
        // new metrics client replaces.
        let _m2 = l.admit("metrics", B).unwrap();
        drop(m);
        assert_eq!(held(&l).len(), 3);
        assert!(l.admit("api", Peer::Uid(9)).is_none());
    }
}
