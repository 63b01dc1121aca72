//! The shutdown signal of long-running tasks: a `watch` channel that turns
//! `true` (or whose sender is dropped) when the task must end.

use tokio::sync::watch;

/// Returns once shutdown is requested: the value is `true`, or the sender is
/// gone. Cancel-safe, so it can be one branch of a `select!` in a loop.
pub async fn requested(rx: &mut watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Whether shutdown was requested already (without waiting).
pub fn is_requested(rx: &watch::Receiver<bool>) -> bool {
    *rx.borrow() || rx.has_changed().is_err()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ends_on_true_or_a_dropped_sender() {
        let (tx, mut rx) = watch::channel(false);
        assert!(!is_requested(&rx));
        let waiter = tokio::spawn(async move { requested(&mut rx).await });
        tx.send(false).unwrap();
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        tx.send(true).unwrap();
        waiter.await.unwrap();

        let (tx, mut rx) = watch::channel(false);
        drop(tx);
        assert!(is_requested(&rx));
        requested(&mut rx).await;
    }
}
