//! Reads of collections: list, and watch with its feed of changes.

use super::*;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

impl Server {
    pub(super) fn list(&self, t: &Target, selector: &str) -> Response<Body> {
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

    pub(super) fn watch(
        &self,
        t: Target,
        selector: String,
        q: &BTreeMap<String, String>,
    ) -> Response<Body> {
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
pub(super) struct Feed {
    pub(super) state: Arc<Mutex<State>>,
    pub(super) changed: watch::Receiver<u64>,
    pub(super) cut: watch::Receiver<u64>,
    pub(super) tx: mpsc::Sender<Bytes>,
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
