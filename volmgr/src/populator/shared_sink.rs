//! One desired state fed by several sources of pods (the manifests
//! directory and the Kubernetes API, like the kubelet's static pods next
//! to its API pods): each source gets its own handle on the populator, and
//! the desired state counts as populated (so volumes of pods no source
//! knows may be torn down) only once every source has delivered its pods.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::cache::world::WakeHold;
use crate::populator::convert::pod::{DesiredPod, PodRejected};
use crate::populator::PodSink;
use crate::volume::PodUid;

/// Splits `sink` into `sources` handles, one per source of pods.
pub fn share_sink(sink: Arc<dyn PodSink>, sources: usize) -> Vec<Arc<dyn PodSink>> {
    let waiting = Arc::new(AtomicUsize::new(sources));
    (0..sources)
        .map(|_| {
            Arc::new(SharedSink {
                inner: Arc::clone(&sink),
                waiting: Arc::clone(&waiting),
                populated: AtomicBool::new(false),
            }) as Arc<dyn PodSink>
        })
        .collect()
}

/// One source's handle (see [`share_sink`]).
struct SharedSink {
    inner: Arc<dyn PodSink>,
    /// Sources that have not delivered their pods yet.
    waiting: Arc<AtomicUsize>,
    /// Whether this source has.
    populated: AtomicBool,
}

impl PodSink for SharedSink {
    fn set_pod(&self, pod: DesiredPod) {
        self.inner.set_pod(pod)
    }

    fn delete_pod(&self, uid: &PodUid) -> bool {
        self.inner.delete_pod(uid)
    }

    fn set_held(&self, uid: &PodUid, held: bool) {
        self.inner.set_held(uid, held)
    }

    fn set_source_problems(&self, source: &str, errors: Vec<String>, rejected: Vec<PodRejected>) {
        self.inner.set_source_problems(source, errors, rejected)
    }

    fn set_populated(&self) {
        if !self.populated.swap(true, Ordering::AcqRel)
            && self.waiting.fetch_sub(1, Ordering::AcqRel) == 1
        {
            self.inner.set_populated();
        }
    }

    fn hold_wakes(&self) -> WakeHold {
        self.inner.hold_wakes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Counting(Mutex<u32>, Arc<crate::cache::world::World>);

    impl PodSink for Counting {
        fn set_pod(&self, _: DesiredPod) {}
        fn delete_pod(&self, _: &PodUid) -> bool {
            false
        }
        fn set_source_problems(&self, _: &str, _: Vec<String>, _: Vec<PodRejected>) {}
        fn set_populated(&self) {
            *self.0.lock().unwrap() += 1;
        }
        fn set_held(&self, _: &PodUid, _: bool) {}
        fn hold_wakes(&self) -> WakeHold {
            self.1.hold_wakes()
        }
    }

    #[test]
    fn populated_once_every_source_is() {
        let inner = Arc::new(Counting::default());
        let sinks = share_sink(Arc::clone(&inner) as Arc<dyn PodSink>, 2);
        sinks[0].set_populated();
        sinks[0].set_populated();
        assert_eq!(
            *inner.0.lock().unwrap(),
            0,
            "one source of two is not enough"
        );
        sinks[1].set_populated();
        sinks[1].set_populated();
        assert_eq!(*inner.0.lock().unwrap(), 1);
    }
}
