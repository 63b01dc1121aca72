//! The node authorizer's rule for node credentials, as the fake plays it.

use super::*;
use hyper::Response;

/// The node authorizer's answer to a list or watch, if it refuses it.
pub(super) fn node_authorizer(resource: &str, selector: &str) -> Option<Response<Body>> {
    let needs = if resource == "pods" {
        "spec.nodeName="
    } else if BY_NAME_ONLY.contains(&resource) {
        "metadata.name="
    } else {
        return None;
    };
    if selector.contains(needs) {
        return None;
    }
    Some(status_response(
        403,
        "Forbidden",
        &format!("{resource} is forbidden: a node may only list or watch them with {needs}NAME"),
    ))
}
