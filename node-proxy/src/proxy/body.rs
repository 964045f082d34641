//! The body type every proxied message is converted to.

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};

/// Any error a body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A boxed body.
pub type Body = BoxBody<Bytes, BoxError>;

/// A streamed body from hyper.
pub fn incoming(b: hyper::body::Incoming) -> Body {
    b.map_err(|e| Box::new(e) as BoxError).boxed()
}

/// An empty body.
pub fn empty() -> Body {
    Empty::new().map_err(|e| match e {}).boxed()
}

/// A body with `text`.
pub fn text(text: String) -> Body {
    Full::new(Bytes::from(text)).map_err(|e| match e {}).boxed()
}
