//! What a failed CSI call means for the operation that made it: the one
//! classification table, after the kubelet's `isFinalError`
//! (`pkg/volume/csi/csi_client.go`) and the CSI spec's error tables. It
//! decides whether the volume is left *uncertain* or *not mounted* (not
//! staged, not published) after the failure, never whether the operation is
//! retried: as in the kubelet, every failure is retried with the executor's
//! backoff (500 ms doubling to 2 m 2 s), until it succeeds or the volume is
//! no longer wanted.
//!
//! - `CANCELLED`, `DEADLINE_EXCEEDED`, `UNAVAILABLE`, `RESOURCE_EXHAUSTED`,
//!   `ABORTED`, and a broken transport (the driver crashed mid-call): the
//!   call may or may not have taken effect → *uncertain*; it is called again
//!   (publish/stage when the volume is still wanted, unpublish/unstage when
//!   not), never assumed done or undone.
//! - `FAILED_PRECONDITION` on publish means "not staged" → stage again.
//! - `NOT_FOUND` on unpublish/unstage: nothing left to undo → success.
//! - On expand, `FAILED_PRECONDITION` (the kubelet's in-use expansion
//!   error), `INVALID_ARGUMENT`, `OUT_OF_RANGE` and `NOT_FOUND` (its
//!   infeasible errors): the volume stays mounted and is not grown to that
//!   size again ([`VolumeError::ExpansionInfeasible`]).
//! - Anything else (`INVALID_ARGUMENT`, `UNIMPLEMENTED`, `ALREADY_EXISTS`,
//!   `INTERNAL`, ...): a certain failure → not mounted, retried.
//! - A driver that is not registered: the operation waits for it (retried
//!   with backoff, and at once when it registers).

use tonic::Code;

use crate::pluginmanager::csi_client::CsiCallError;
use crate::plugins::VolumeError;

/// The node operation a call belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CsiOp {
    /// NodeStageVolume.
    Stage,
    /// NodeUnstageVolume.
    Unstage,
    /// NodePublishVolume.
    Publish,
    /// NodeUnpublishVolume.
    Unpublish,
    /// NodeExpandVolume.
    Expand,
    /// Identity/capability queries before the real call.
    Query,
}

/// Whether `code` leaves the outcome of a call unknown.
pub fn is_uncertain_code(code: Code) -> bool {
    matches!(
        code,
        Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Unavailable
            | Code::ResourceExhausted
            | Code::Aborted
    )
}

/// Maps a failed call of `op` to the operation's error; `Ok(())` when the
/// failure means there is nothing left to do.
pub fn classify(op: CsiOp, err: CsiCallError) -> Result<(), VolumeError> {
    let (code, transport) = match &err {
        CsiCallError::NotRegistered(_) => return Err(VolumeError::Waiting(err.to_string())),
        CsiCallError::Rpc {
            code, transport, ..
        } => (*code, *transport),
    };
    let msg = err.to_string();
    if is_uncertain_code(code) || transport {
        // A query that never reached the driver changed nothing.
        return Err(if op == CsiOp::Query {
            VolumeError::Plugin {
                plugin: "kubernetes.io/csi".into(),
                message: msg,
            }
        } else {
            VolumeError::Uncertain(msg)
        });
    }
    match (op, code) {
        (CsiOp::Publish, Code::FailedPrecondition) => Err(VolumeError::NeedsDeviceMount(msg)),
        (
            CsiOp::Expand,
            Code::FailedPrecondition | Code::InvalidArgument | Code::OutOfRange | Code::NotFound,
        ) => Err(VolumeError::ExpansionInfeasible(msg)),
        (CsiOp::Unstage | CsiOp::Unpublish, Code::NotFound) => {
            tracing::info!(error = %msg, "the driver no longer knows the volume; nothing to undo");
            Ok(())
        }
        _ => Err(VolumeError::Plugin {
            plugin: "kubernetes.io/csi".into(),
            message: msg,
        }),
    }
}

/// Every gRPC status code but OK (for the tests that try each).
#[cfg(test)]
pub(crate) const ALL_CODES: [Code; 16] = [
    Code::Cancelled,
    Code::Unknown,
    Code::InvalidArgument,
    Code::DeadlineExceeded,
    Code::NotFound,
    Code::AlreadyExists,
    Code::PermissionDenied,
    Code::ResourceExhausted,
    Code::FailedPrecondition,
    Code::Aborted,
    Code::OutOfRange,
    Code::Unimplemented,
    Code::Internal,
    Code::Unavailable,
    Code::DataLoss,
    Code::Unauthenticated,
];

#[cfg(test)]
mod tests {
    use super::*;

    fn rpc(code: Code, transport: bool) -> CsiCallError {
        CsiCallError::Rpc {
            driver: "d".into(),
            method: "/csi.v1.Node/NodePublishVolume",
            code,
            message: "m".into(),
            transport,
        }
    }

    /// What each gRPC code leaves a publish or unpublish (and stage,
    /// unstage) in: uncertain, not done (a certain failure), or done.
    /// None of them stops the retries: that is the executor's, for every
    /// error alike.
    #[test]
    fn the_spec_error_table() {
        #[derive(Debug, PartialEq)]
        enum Left {
            Uncertain,
            Failed,
            NeedsStage,
            Done,
        }
        let left = |op, code, transport| match classify(op, rpc(code, transport)) {
            Ok(()) => Left::Done,
            Err(e) if e.is_uncertain() => Left::Uncertain,
            Err(VolumeError::NeedsDeviceMount(_)) => Left::NeedsStage,
            Err(e) => {
                assert!(
                    !e.is_waiting() && !e.is_expansion_infeasible(),
                    "{op:?} {code:?}: {e:?}"
                );
                Left::Failed
            }
        };
        let ops = [
            CsiOp::Stage,
            CsiOp::Publish,
            CsiOp::Unpublish,
            CsiOp::Unstage,
        ];
        for code in ALL_CODES {
            for op in ops {
                let want = match (op, code) {
                    (
                        _,
                        Code::Cancelled
                        | Code::DeadlineExceeded
                        | Code::Unavailable
                        | Code::ResourceExhausted
                        | Code::Aborted,
                    ) => Left::Uncertain,
                    (CsiOp::Publish, Code::FailedPrecondition) => Left::NeedsStage,
                    (CsiOp::Unpublish | CsiOp::Unstage, Code::NotFound) => Left::Done,
                    _ => Left::Failed,
                };
                assert_eq!(left(op, code, false), want, "{op:?} {code:?}");
                // A crash mid-call shows as a transport error with any code.
                assert_eq!(left(op, code, true), Left::Uncertain, "{op:?} {code:?}");
            }
        }
        // Expansion: grown later to another size, not to this one again.
        for code in [
            Code::FailedPrecondition,
            Code::InvalidArgument,
            Code::OutOfRange,
            Code::NotFound,
        ] {
            assert!(classify(CsiOp::Expand, rpc(code, false))
                .unwrap_err()
                .is_expansion_infeasible());
        }
        for code in [Code::Internal, Code::Unimplemented, Code::Unknown] {
            let e = classify(CsiOp::Expand, rpc(code, false)).unwrap_err();
            assert!(
                !e.is_expansion_infeasible() && !e.is_uncertain(),
                "{code:?}"
            );
        }
        let e = classify(CsiOp::Stage, CsiCallError::NotRegistered("d".into())).unwrap_err();
        assert!(e.is_waiting());
        assert_eq!(e.to_string(), "waiting for CSI driver d to register");
    }
}
