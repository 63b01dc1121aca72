//! Which pods read which objects, both ways: a change to an object
//! re-resolves exactly the pods that depend on it.

use std::collections::{BTreeSet, HashMap};

use super::kinds::ObjectRef;
use crate::volume::PodUid;

/// Which pods depend on which objects (both directions).
#[derive(Debug, Default)]
pub struct Dependents {
    by_object: HashMap<ObjectRef, BTreeSet<PodUid>>,
    by_pod: HashMap<PodUid, BTreeSet<ObjectRef>>,
}

impl Dependents {
    /// Replaces the dependencies of `pod`.
    pub fn set(&mut self, pod: &PodUid, deps: BTreeSet<ObjectRef>) {
        self.remove(pod);
        if deps.is_empty() {
            return;
        }
        for d in &deps {
            self.by_object
                .entry(d.clone())
                .or_default()
                .insert(pod.clone());
        }
        self.by_pod.insert(pod.clone(), deps);
    }

    /// Forgets `pod`.
    pub fn remove(&mut self, pod: &PodUid) {
        let Some(old) = self.by_pod.remove(pod) else {
            return;
        };
        for d in old {
            if let Some(set) = self.by_object.get_mut(&d) {
                set.remove(pod);
                if set.is_empty() {
                    self.by_object.remove(&d);
                }
            }
        }
    }

    /// Every object some pod read (an empty name: any object of the kind).
    pub fn objects(&self) -> BTreeSet<ObjectRef> {
        self.by_object.keys().cloned().collect()
    }

    /// The pods that depend on any of `changed` (a changed object also
    /// reaches the pods that depend on any object of its kind).
    pub fn pods_affected_by<'a>(
        &self,
        changed: impl IntoIterator<Item = &'a ObjectRef>,
    ) -> BTreeSet<PodUid> {
        let mut out = BTreeSet::new();
        let mut kinds = BTreeSet::new();
        for r in changed {
            kinds.insert(r.kind);
            if let Some(p) = self.by_object.get(r) {
                out.extend(p.iter().cloned());
            }
        }
        for kind in kinds {
            if let Some(p) = self.by_object.get(&ObjectRef::any(kind)) {
                out.extend(p.iter().cloned());
            }
        }
        out
    }
}
