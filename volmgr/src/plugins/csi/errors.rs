//! What a failed CSI call means for the operation that made it, per the CSI
//! spec's error tables and the kubelet's uncertain-state handling:
//!
//! - `CANCELLED`, `DEADLINE_EXCEEDED`, `UNAVAILABLE`, `RESOURCE_EXHAUSTED`,
//!   `ABORTED`, and a broken transport (the driver crashed mid-call): the
//!   call may or may not have taken effect → *uncertain*; it is called again
//!   (publish/stage when the volume is still wanted, unpublish/unstage when
//!   not), never assumed done or undone.
//! - `UNIMPLEMENTED`: never retried → a final error until the spec changes.
//! - `INVALID_ARGUMENT`, `ALREADY_EXISTS` (staged/published with an
//!   incompatible capability): the caller must fix the request → final.
//! - `FAILED_PRECONDITION`: on publish it means "not staged" → stage again;
//!   on expand it must not be retried → final; otherwise retried.
//! - `NOT_FOUND` on unpublish/unstage: nothing left to undo → success.
//! - Anything else: a certain failure, retried with the executor's backoff.
//! - A driver that is not registered: the operation waits for it.

use tonic::Code;

use crate::csi::client::CsiCallError;
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
        (_, Code::Unimplemented) | (_, Code::InvalidArgument) => Err(VolumeError::Final(msg)),
        (CsiOp::Stage | CsiOp::Publish, Code::AlreadyExists) => Err(VolumeError::Final(msg)),
        (CsiOp::Publish, Code::FailedPrecondition) => Err(VolumeError::NeedsDeviceMount(msg)),
        (CsiOp::Expand, Code::FailedPrecondition | Code::OutOfRange) => {
            Err(VolumeError::Final(msg))
        }
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

    #[test]
    fn the_spec_error_table() {
        for c in [
            Code::Cancelled,
            Code::DeadlineExceeded,
            Code::Unavailable,
            Code::ResourceExhausted,
            Code::Aborted,
        ] {
            for op in [
                CsiOp::Stage,
                CsiOp::Publish,
                CsiOp::Unpublish,
                CsiOp::Unstage,
            ] {
                assert!(
                    classify(op, rpc(c, false)).unwrap_err().is_uncertain(),
                    "{c:?}"
                );
            }
        }
        // A crash mid-call shows as a transport error with any code.
        assert!(classify(CsiOp::Publish, rpc(Code::Unknown, true))
            .unwrap_err()
            .is_uncertain());
        assert!(classify(CsiOp::Stage, rpc(Code::Unimplemented, false))
            .unwrap_err()
            .is_final());
        assert!(classify(CsiOp::Publish, rpc(Code::InvalidArgument, false))
            .unwrap_err()
            .is_final());
        assert!(classify(CsiOp::Publish, rpc(Code::AlreadyExists, false))
            .unwrap_err()
            .is_final());
        assert!(matches!(
            classify(CsiOp::Publish, rpc(Code::FailedPrecondition, false)),
            Err(VolumeError::NeedsDeviceMount(_))
        ));
        assert!(
            classify(CsiOp::Expand, rpc(Code::FailedPrecondition, false))
                .unwrap_err()
                .is_final()
        );
        assert!(classify(CsiOp::Unpublish, rpc(Code::NotFound, false)).is_ok());
        assert!(classify(CsiOp::Unstage, rpc(Code::NotFound, false)).is_ok());
        let e = classify(CsiOp::Publish, rpc(Code::Internal, false)).unwrap_err();
        assert!(!e.is_uncertain() && !e.is_final() && !e.is_waiting());
        let e = classify(CsiOp::Stage, CsiCallError::NotRegistered("d".into())).unwrap_err();
        assert!(e.is_waiting());
        assert_eq!(e.to_string(), "waiting for CSI driver d to register");
    }
}
