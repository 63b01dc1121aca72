//! Backoff for requests to the API server that fail or are refused, as
//! client-go's reflector backs off (`tools/cache/reflector.go`,
//! `NewReflectorWithOptions`:
//! `wait.NewExponentialBackoffManager(800*time.Millisecond, 30*time.Second,
//! 2*time.Minute, 2.0, 1.0, clock)`): the first delay
//! [`INITIAL`], doubled ([`FACTOR`]) after each failure up to [`MAX`], each
//! with a jitter of up to one more delay (jitter factor 1.0: a delay of
//! `d` waits between `d` and `2 d`, so at the cap between 30 and 60 s, the
//! reflector's "about 0.22 requests per second"); back to [`INITIAL`] once
//! the stream has worked for [`RESET_AFTER`].
//!
//! - [`watch_backoff`] for a kube-runtime watcher:
//!   `watcher(api, config).backoff(watch_backoff())`. Unlike
//!   kube-runtime's `default_backoff()`, whose delay starts over on every
//!   item that is not an error (a refused list is `Init`, then the error:
//!   retried about once a second forever), it starts over only once the
//!   watcher has gone [`RESET_AFTER`] without a failure.
//! - [`retries`] for plain async code (a GET polled until it works):
//!   [`Retries::next_delay`] after each failure, [`Retries::reset`] after
//!   a success.
//!
//! The policy is volmgr's one [`Backoff`] (`volmgr::util::backoff`).

use std::time::Duration;

use tokio::time::Instant;
use volmgr::util::backoff::{Backoff, Retries};

/// The first delay (client-go's reflector: 800 ms).
pub const INITIAL: Duration = Duration::from_millis(800);
/// The longest delay before jitter (client-go's reflector: 30 s).
pub const MAX: Duration = Duration::from_secs(30);
/// The factor between two delays (client-go's reflector: 2.0).
pub const FACTOR: u32 = 2;
/// How long a watcher must go without a failure, having delivered items,
/// for its delay to start over (client-go's reflector: 2 min).
pub const RESET_AFTER: Duration = Duration::from_secs(120);

/// client-go's reflector policy: [`INITIAL`] doubling to [`MAX`], jittered.
pub const REFLECTOR: Backoff = Backoff::new(INITIAL, FACTOR, MAX).with_jitter();

/// A retry loop with client-go's reflector policy, for plain async code
/// (a GET polled until it works): [`Retries::next_delay`] after each
/// failure, [`Retries::reset`] after a success.
pub fn retries() -> Retries {
    REFLECTOR.retries()
}

/// The backoff of one watcher stream: [`REFLECTOR`], started over only once
/// the stream has gone [`RESET_AFTER`] without a failure (see
/// [`watch_backoff`]).
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    backoff: Retries,
    /// When the stream first delivered an item after its last failure.
    working_since: Option<Instant>,
    /// [`RESET_AFTER`].
    reset_after: Duration,
}

/// The backoff for a kube-runtime watcher:
/// `watcher(api, config).backoff(watch_backoff())`.
///
/// `StreamBackoff` calls `reset` on every item that is not an error,
/// `Init` included, which starts every (re)list: here that only notes
/// when the stream came back. The delay starts over at the first failure
/// after the stream has worked (delivered items without a failure) for
/// [`RESET_AFTER`]; a list or watch refused every time (401, 403, 404) is
/// retried ever more slowly, up to one request every 30 to 60 s.
pub fn watch_backoff() -> WatchBackoff {
    WatchBackoff::with(retries(), RESET_AFTER)
}

impl WatchBackoff {
    fn with(backoff: Retries, reset_after: Duration) -> Self {
        Self {
            backoff,
            working_since: None,
            reset_after,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self
            .working_since
            .take()
            .is_some_and(|since| since.elapsed() >= self.reset_after)
        {
            self.backoff.reset();
        }
        Some(self.backoff.next_delay())
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.working_since.get_or_insert_with(Instant::now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use kube::runtime::utils::Backoff as _;

    /// `reset` (every item that is not an error, `Init` included) does not
    /// start the delay over: only working for [`RESET_AFTER`] does (here
    /// scaled down: delays of 10 ms to 300 ms, a reset after 400 ms).
    #[tokio::test]
    async fn starts_over_only_after_working_for_a_while() {
        let ms = Duration::from_millis;
        let mut b = WatchBackoff::with(
            Backoff::new(ms(10), FACTOR, ms(300))
                .with_jitter()
                .retries(),
            ms(400),
        );
        for base in [10, 20, 40, 80, 160, 300, 300] {
            // An `Init` before each failure, as a refused list gives.
            b.reset();
            let d = b.next().unwrap();
            assert!(
                d >= ms(base) && d < 2 * ms(base),
                "{d:?} for base {base} ms"
            );
        }
        // Worked, but not long enough.
        b.reset();
        tokio::time::sleep(ms(150)).await;
        assert!(b.next().unwrap() >= ms(300));
        // Worked long enough: from the start again.
        b.reset();
        tokio::time::sleep(ms(450)).await;
        let d = b.next().unwrap();
        assert!(d < ms(20), "{d:?}");
        // Failing again with nothing delivered in between never resets.
        tokio::time::sleep(ms(450)).await;
        let d = b.next().unwrap();
        assert!(d >= ms(20), "{d:?}");
    }

    /// A list the API server refuses every time, as a kube-runtime watcher
    /// sees it (`Init`, then the error), through `StreamBackoff`: the
    /// retries slow down as client-go's do, where `default_backoff()`
    /// retries about once a second forever. Scaled down: delays from 10 ms.
    #[tokio::test]
    async fn a_refused_list_is_retried_ever_more_slowly() {
        use k8s_openapi::api::core::v1::Pod;
        use kube::runtime::{watcher, WatchStreamExt};

        let fake = crate::testing::FakeApiServer::in_memory();
        fake.refuse_reads_of("pods");
        let api: kube::Api<Pod> = kube::Api::all(fake.client());
        let config = crate::transport::watcher_config().fields("spec.nodeName=n1");
        let ms = Duration::from_millis;
        let backoff = WatchBackoff::with(
            Backoff::new(ms(10), FACTOR, ms(300))
                .with_jitter()
                .retries(),
            RESET_AFTER,
        );
        let mut events = watcher::watcher(api, config).backoff(backoff).boxed();
        let mut failed_at = Vec::new();
        while failed_at.len() < 6 {
            if events.next().await.unwrap().is_err() {
                failed_at.push(Instant::now());
            }
        }
        // Each retry waited longer than the one before: at least 10, 20,
        // 40, 80, 160 ms (a reset on each `Init` would wait under 20 ms
        // each time).
        for (i, pair) in failed_at.windows(2).enumerate() {
            let gap = pair[1] - pair[0];
            assert!(gap >= ms(10 << i), "retry {i} after {gap:?}");
        }
        let lists = fake
            .take_requests()
            .iter()
            .filter(|r| r.path == "/api/v1/pods")
            .count();
        assert_eq!(lists, 6);
    }
}
