//! A read-only view of the operations on volumes, for the observers below
//! the operation executor (the tracer's check): whether an operation on a
//! pod's volume (or on a volume's device) is in flight, and whether one started or finished between two
//! looks. The executor implements it; nothing here can start an operation.

use crate::volume::{PodUid, UniqueVolumeName};

/// What identifies the last operation on a (volume, pod): any operation
/// starting or finishing changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OperationStamp {
    /// The operation (its metric name, e.g. `volume_mount`).
    pub kind: &'static str,
    /// Attempts of this operation so far.
    pub attempts: u32,
    /// Consecutive failures.
    pub failures: u32,
    /// Whether it is running now.
    pub running: bool,
}

/// Reads the operations on pods' volumes.
pub trait OperationsView: Send + Sync {
    /// The stamp of the last operation on `pod`'s mount of `volume`, or
    /// with no pod on the volume's device (its mount or unmount), if any.
    fn stamp(&self, volume: &UniqueVolumeName, pod: Option<&PodUid>) -> Option<OperationStamp>;
}
