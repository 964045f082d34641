//! `kind: Status` failures, as the API server words them.

use serde_json::{json, Value};

/// A failed request: what the API server answers with a `kind: Status` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The HTTP status code (also `code` in the body).
    pub code: u16,
    /// The machine-readable reason (`NotFound`, `Expired`, ...).
    pub reason: &'static str,
    /// The human-readable message.
    pub message: String,
}

impl Failure {
    /// 400 `BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 401 `Unauthorized`, as for a request without valid credentials.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403 `Forbidden`, as RBAC refuses a caller `verb` on `resource`.
    pub fn forbidden(verb: &str, resource: &str) -> Self {
        Self::new(
            403,
            "Forbidden",
            format!("{resource} is forbidden: cannot {verb} resource \"{resource}\""),
        )
    }

    /// 404 `NotFound` for an object.
    pub fn not_found(plural: &str, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{plural} \"{name}\" not found"))
    }

    /// 404 `NotFound` for a path that names no resource this server has.
    pub fn no_such_resource() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 405 `MethodNotAllowed`.
    pub fn method_not_allowed(method: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        )
    }

    /// 410 `Expired`: the resourceVersion is older than the oldest one kept.
    pub fn too_old(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// 410 `Expired` for a continue token whose list can no longer be served.
    pub fn continue_expired() -> Self {
        Self::new(
            410,
            "Expired",
            "The provided continue parameter is too old to display a consistent list result. \
             You can start a new list without the continue parameter, or use the continue \
             token in this response to retrieve the remainder of the results. Continuing with \
             the provided token results in an inconsistent list - objects that were created, \
             modified, or deleted between the time the first chunk was returned and now may \
             show up in the list.",
        )
    }

    /// 504 `Timeout`: a resourceVersion newer than any the server has seen.
    pub fn too_large(requested: u64, current: u64) -> Self {
        Self::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        )
    }

    /// 503 `ServiceUnavailable`, as for a pod the API server cannot reach through its
    /// proxy subresource.
    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// 422 `Invalid`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
        }
    }

    /// The `kind: Status` object.
    pub fn to_status(&self) -> Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        })
    }
}
