//! Bounds on the agent's local clients (the status socket and the metrics
//! endpoint), so that clients that connect in numbers, never read, or send
//! endless lines cannot take the agent's memory or descriptors:
//!
//! - connections: at most [`ClientLimits::per_listener`] per listener and
//!   [`ClientLimits::total`] over all (well under `RLIMIT_NOFILE`, keeping
//!   descriptors in reserve for mounts, manifests and CSI); a connection
//!   above either is accepted and closed at once (the kernel's backlog
//!   holds the rest, in the kernel, not in the agent);
//! - requests: one line of at most [`MAX_REQUEST_LINE`] bytes, received
//!   within [`READ_DEADLINE`] (an idle or slow client is closed);
//! - responses: written within [`WRITE_DEADLINE`] (a client that does not
//!   read is closed), and at most [`RESPONSE_SLOTS`] large responses
//!   (status, metrics) built and in flight at once;
//! - accept errors: `EMFILE`/`ENFILE` and other failures back off
//!   ([`AcceptBackoff`]) instead of spinning.

use std::sync::Arc;
use std::time::Duration;

use std::future::Future;

use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

/// Longest request line.
pub const MAX_REQUEST_LINE: usize = 64 << 10;
/// Time a client has to send a whole request line (from the moment the
/// agent starts waiting for it, so idle connections are closed too).
pub const READ_DEADLINE: Duration = Duration::from_secs(30);
/// Time a client has to take a whole response.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(10);
/// Large responses (status, metrics) built and in flight at once.
pub const RESPONSE_SLOTS: usize = 8;
/// Connections per listener, at most.
const PER_LISTENER: usize = 64;
/// Fraction of `RLIMIT_NOFILE` client connections may use, at most.
const NOFILE_SHARE: u64 = 4;

/// Connection and response budgets shared by the agent's listeners.
#[derive(Debug, Clone)]
pub struct ClientLimits {
    total: Arc<Semaphore>,
    responses: Arc<Semaphore>,
    /// Connections per listener.
    pub per_listener: usize,
    /// Connections over all listeners.
    pub total_max: usize,
}

/// A connection's place in the budgets; released on drop.
#[derive(Debug)]
pub struct Admission {
    _total: OwnedSemaphorePermit,
    _listener: OwnedSemaphorePermit,
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
        Self::new(total.min(PER_LISTENER), total)
    }

    /// Explicit budgets.
    pub fn new(per_listener: usize, total: usize) -> Self {
        Self {
            total: Arc::new(Semaphore::new(total)),
            responses: Arc::new(Semaphore::new(RESPONSE_SLOTS)),
            per_listener,
            total_max: total,
        }
    }

    /// A per-listener budget.
    pub fn listener(&self) -> Arc<Semaphore> {
        Arc::new(Semaphore::new(self.per_listener))
    }

    /// Admits a connection on `listener`, or `None` when a budget is spent.
    pub fn admit(&self, listener: &Arc<Semaphore>) -> Option<Admission> {
        let l = Arc::clone(listener).try_acquire_owned().ok()?;
        let t = Arc::clone(&self.total).try_acquire_owned().ok()?;
        Some(Admission {
            _total: t,
            _listener: l,
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

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, as Go's runtime
/// does at start (the kubelet runs with it): the usual soft limit of 1024
/// is a default for `select(2)` users, not a budget. Returns the soft
/// limit in force. Descriptors stay in reserve for mounts, state files
/// and the local API: the API server's traffic takes at most
/// `apiserver::transport::MAX_CONNECTIONS`, local clients a quarter of the
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
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    delay: Option<Duration>,
}

impl AcceptBackoff {
    /// A successful accept.
    pub fn reset(&mut self) {
        self.delay = None;
    }

    /// Sleeps after a failed accept.
    pub async fn failed(&mut self, e: &std::io::Error, what: &str) {
        let d = self.delay.map_or(Duration::from_millis(10), |d| {
            (d * 2).min(Duration::from_secs(1))
        });
        self.delay = Some(d);
        tracing::warn!(error = %e, listener = what, backoff_ms = d.as_millis() as u64, "accept failed");
        tokio::time::sleep(d).await;
    }
}

/// The accept loop of a local listener, within `limits`, until `shutdown`:
/// `accept` yields the next connection; one over budget gets `refuse` (a
/// short answer that must not block) and is closed; an admitted one is
/// served by the future `serve` returns, on a task of its own that holds
/// the admission. Accept errors (EMFILE, ...) back off instead of spinning.
pub async fn serve_bounded<S, A, AF, R, H, HF>(
    limits: &ClientLimits,
    what: &'static str,
    mut accept: A,
    refuse: R,
    serve: H,
    mut shutdown: watch::Receiver<bool>,
) where
    A: FnMut() -> AF,
    AF: Future<Output = std::io::Result<S>>,
    R: Fn(&S),
    H: Fn(S) -> HF,
    HF: Future<Output = ()> + Send + 'static,
{
    let mine = limits.listener();
    let mut backoff = AcceptBackoff::default();
    loop {
        tokio::select! {
            () = volmgr::util::shutdown::requested(&mut shutdown) => return,
            conn = accept() => match conn {
                Ok(stream) => {
                    backoff.reset();
                    let Some(admission) = limits.admit(&mine) else {
                        refuse(&stream);
                        tracing::debug!(listener = what, "connection refused: too many connections");
                        continue;
                    };
                    let served = serve(stream);
                    tokio::spawn(async move {
                        let _admission = admission;
                        served.await;
                    });
                }
                Err(e) => backoff.failed(&e, what).await,
            }
        }
    }
}
