//! A small map from pod UID to a value, stored as a vector.
//!
//! Most volumes belong to one pod (every emptyDir, hostPath, ephemeral CSI
//! volume), and a shared volume has at most the pods of one node (about a
//! hundred): a linear scan beats hashing there, and a one-element vector
//! costs a fraction of a hash table's memory, which matters at tens of
//! thousands of volumes.

use crate::volume::PodUid;

/// Pod UID → `T`.
#[derive(Debug, Clone)]
pub struct PodMap<T> {
    entries: Vec<(PodUid, T)>,
}

impl<T> Default for PodMap<T> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<T> PodMap<T> {
    /// The value for `pod`.
    pub fn get(&self, pod: &PodUid) -> Option<&T> {
        self.entries.iter().find(|(p, _)| p == pod).map(|(_, v)| v)
    }

    /// The value for the pod whose UID is `uid`.
    pub fn get_str(&self, uid: &str) -> Option<&T> {
        self.entries
            .iter()
            .find(|(p, _)| p.as_str() == uid)
            .map(|(_, v)| v)
    }

    /// The value for `pod`, mutably.
    pub fn get_mut(&mut self, pod: &PodUid) -> Option<&mut T> {
        self.entries
            .iter_mut()
            .find(|(p, _)| p == pod)
            .map(|(_, v)| v)
    }

    /// The value for `pod`, inserted with `f` if missing.
    pub fn get_or_insert_with(&mut self, pod: &PodUid, f: impl FnOnce() -> T) -> &mut T {
        let i = match self.entries.iter().position(|(p, _)| p == pod) {
            Some(i) => i,
            None => {
                self.push(pod.clone(), f());
                self.entries.len() - 1
            }
        };
        &mut self.entries[i].1
    }

    /// Sets the value for `pod`, returning the old one.
    pub fn insert(&mut self, pod: PodUid, value: T) -> Option<T> {
        match self.get_mut(&pod) {
            Some(v) => Some(std::mem::replace(v, value)),
            None => {
                self.push(pod, value);
                None
            }
        }
    }

    /// Appends an entry. The first one is allocated alone: `Vec::push`
    /// would make room for four, and most maps never hold a second (at
    /// 10,000 volumes the spare room was 9 MB of the agent's 27 MB heap).
    fn push(&mut self, pod: PodUid, value: T) {
        if self.entries.capacity() == 0 {
            self.entries.reserve_exact(1);
        }
        self.entries.push((pod, value));
    }

    /// Removes `pod`'s value.
    pub fn remove(&mut self, pod: &PodUid) -> Option<T> {
        let i = self.entries.iter().position(|(p, _)| p == pod)?;
        let (_, v) = self.entries.swap_remove(i);
        if self.entries.is_empty() {
            self.entries = Vec::new();
        }
        Some(v)
    }

    /// Keeps the entries for which `f` is true.
    pub fn retain(&mut self, mut f: impl FnMut(&PodUid, &mut T) -> bool) {
        self.entries.retain_mut(|(p, v)| f(p, v));
    }

    /// Whether `pod` has a value.
    pub fn contains_key(&self, pod: &PodUid) -> bool {
        self.get(pod).is_some()
    }

    /// Number of pods.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries.
    pub fn iter(&self) -> impl Iterator<Item = (&PodUid, &T)> {
        self.entries.iter().map(|(p, v)| (p, v))
    }

    /// The pods.
    pub fn keys(&self) -> impl Iterator<Item = &PodUid> {
        self.entries.iter().map(|(p, _)| p)
    }

    /// The values.
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.entries.iter().map(|(_, v)| v)
    }

    /// The values, mutably.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.entries.iter_mut().map(|(_, v)| v)
    }
}

impl<'a, T> IntoIterator for &'a PodMap<T> {
    type Item = (&'a PodUid, &'a T);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (PodUid, T)>,
        fn(&'a (PodUid, T)) -> (&'a PodUid, &'a T),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|(p, v)| (p, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_entry_takes_room_for_one() {
        let mut m = PodMap::default();
        m.insert(PodUid::new("a").unwrap(), [0u8; 64]);
        assert_eq!(m.entries.capacity(), 1);
        m.get_or_insert_with(&PodUid::new("b").unwrap(), || [1u8; 64]);
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn map_operations() {
        let a = PodUid::new("a").unwrap();
        let b = PodUid::new("b").unwrap();
        let mut m = PodMap::default();
        assert!(m.insert(a.clone(), 1).is_none());
        assert_eq!(m.insert(a.clone(), 2), Some(1));
        *m.get_or_insert_with(&b, || 5) += 1;
        assert_eq!(m.get(&b), Some(&6));
        assert_eq!(m.len(), 2);
        m.retain(|_, v| *v > 2);
        assert!(!m.contains_key(&a));
        assert_eq!(m.remove(&b), Some(6));
        assert!(m.is_empty());
    }
}
