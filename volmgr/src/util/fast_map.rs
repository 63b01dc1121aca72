//! The hash map and set of the large per-volume and per-pod tables.

/// The hash map used for the large per-volume and per-pod tables: aHash with
/// random keys (fast on the short string keys here, and still keyed per
/// process, unlike an unkeyed hash).
pub type FastMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;

/// A `HashSet` with the same fast hasher as [`FastMap`].
pub type FastSet<T> = std::collections::HashSet<T, ahash::RandomState>;
