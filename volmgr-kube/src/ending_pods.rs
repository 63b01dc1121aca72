//! Pods gone from the API server (or ended, or moved off the node) whose
//! containers may still run: their volumes stay until the container
//! runtime says nothing of the pod runs any more.
//!
//! The kubelet tears a deleted pod's volumes down only once its pod
//! workers have stopped the pod's containers (`findAndRemoveDeletedPods`
//! with `ShouldPodRuntimeBeRemoved`). After `kubectl delete pod --force
//! --grace-period=0` the API object is gone at once while the containers
//! run on for their grace period, writing into the volumes: unpublishing
//! and unstaging then would have them write to a detached device or to the
//! node's disk. So each such pod's runtime is asked over the CRI
//! ([`volmgr::cri::RuntimeClient::pod_runtime`]) every second (with
//! backoff while the runtime does not answer) until it lists no container
//! of the pod that has not exited and no ready sandbox; only then is the
//! pod removed from the desired state.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use volmgr::cri::{CriError, PodRuntimeState, RuntimeClient};

/// How often a waiting pod's runtime is asked again while it answers.
const PERIOD: Duration = Duration::from_secs(1);

/// One answer of the runtime about one pod.
pub struct RuntimeAnswer {
    uid: String,
    answer: Result<PodRuntimeState, CriError>,
}

/// What an answer means for the source.
pub enum Outcome<T> {
    /// Nothing of the pod runs: remove it from the desired state now.
    Removed {
        /// The pod's UID.
        uid: String,
        /// `namespace/name`.
        key: String,
        /// What the source kept for it.
        pod: T,
    },
    /// Still waiting; `note` (for status) changed.
    Waiting {
        /// `namespace/name`.
        key: String,
        /// Why the volumes stay.
        note: String,
    },
    /// Nothing new (a late answer, or the same as before).
    Unchanged,
}

/// A pod waiting for its runtime.
struct Ending<T> {
    key: String,
    pod: T,
    task: JoinHandle<()>,
    note: Option<String>,
}

/// The pods waiting for the runtime (see the module documentation).
pub struct EndingPods<T> {
    runtime: RuntimeClient,
    pods: HashMap<String, Ending<T>>,
    tx: mpsc::Sender<RuntimeAnswer>,
    rx: mpsc::Receiver<RuntimeAnswer>,
}

impl<T> EndingPods<T> {
    /// Waits on `runtime`.
    pub fn new(runtime: RuntimeClient) -> Self {
        let (tx, rx) = mpsc::channel(256);
        Self {
            runtime,
            pods: HashMap::new(),
            tx,
            rx,
        }
    }

    /// Starts waiting for pod `uid`'s runtime to be gone.
    pub fn start(&mut self, uid: &str, key: String, pod: T) {
        let runtime = self.runtime.clone();
        let tx = self.tx.clone();
        let id = uid.to_string();
        let task = tokio::spawn(async move {
            let mut backoff = crate::backoff::retries();
            loop {
                let answer = runtime.pod_runtime(&id).await;
                let delay = match &answer {
                    Ok(s) if s.removed() => None,
                    Ok(_) => {
                        backoff.reset();
                        Some(PERIOD)
                    }
                    Err(_) => Some(backoff.next_delay()),
                };
                let msg = RuntimeAnswer {
                    uid: id.clone(),
                    answer,
                };
                if tx.send(msg).await.is_err() {
                    return;
                }
                match delay {
                    Some(d) => tokio::time::sleep(d).await,
                    None => return,
                }
            }
        });
        if let Some(old) = self.pods.insert(
            uid.to_string(),
            Ending {
                key,
                pod,
                task,
                note: None,
            },
        ) {
            old.task.abort();
        }
    }

    /// Stops waiting for `uid` (the pod is back): what was kept for it.
    pub fn take(&mut self, uid: &str) -> Option<(String, T)> {
        let e = self.pods.remove(uid)?;
        e.task.abort();
        Some((e.key, e.pod))
    }

    /// Whether any pod waits.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// The next answer (pending forever while no pod waits).
    pub async fn next(&mut self) -> RuntimeAnswer {
        match self.rx.recv().await {
            Some(a) => a,
            // `self.tx` lives as long as `self`: never closed.
            None => std::future::pending().await,
        }
    }

    /// Applies one answer.
    pub fn on_answer(&mut self, a: RuntimeAnswer) -> Outcome<T> {
        let Some(e) = self.pods.get_mut(&a.uid) else {
            return Outcome::Unchanged;
        };
        let note = match a.answer {
            Ok(s) if s.removed() => {
                let Some(e) = self.pods.remove(&a.uid) else {
                    return Outcome::Unchanged;
                };
                return Outcome::Removed {
                    uid: a.uid,
                    key: e.key,
                    pod: e.pod,
                };
            }
            Ok(s) => format!(
                "pod gone from the API; its volumes stay until its containers stop \
                 (container runtime {}: {s})",
                self.runtime.endpoint()
            ),
            Err(err) => format!(
                "pod gone from the API; its volumes stay until the container runtime \
                 says its containers stopped: {err}"
            ),
        };
        if e.note.as_deref() == Some(note.as_str()) {
            return Outcome::Unchanged;
        }
        e.note = Some(note.clone());
        Outcome::Waiting {
            key: e.key.clone(),
            note,
        }
    }
}

impl<T> Drop for EndingPods<T> {
    fn drop(&mut self) {
        for e in self.pods.values() {
            e.task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use volmgr::cri::RuntimeEndpoint;

    /// A runtime that is not there: the pod waits, status says so once per
    /// change, and a pod taken back stops waiting.
    #[tokio::test]
    async fn a_runtime_not_answering_keeps_the_pod_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("none.sock");
        let runtime = RuntimeClient::new(RuntimeEndpoint::parse(socket.to_str().unwrap()).unwrap());
        let mut ending = EndingPods::new(runtime);
        ending.start("u1", "ns/p".into(), 7);
        let answer = ending.next().await;
        let Outcome::Waiting { key, note } = ending.on_answer(answer) else {
            panic!("a runtime that does not answer removed the pod");
        };
        assert_eq!(key, "ns/p");
        assert!(note.contains("ListContainers"), "{note}");
        // The same answer again (after a backoff delay): nothing new.
        let answer = ending.next().await;
        assert!(matches!(ending.on_answer(answer), Outcome::Unchanged));
        assert_eq!(ending.take("u1"), Some(("ns/p".to_string(), 7)));
        assert!(ending.is_empty());
    }
}
