//! Whether a response is a success or a failure: the one classification the golden
//! metrics, retries and failure accrual share, as Linkerd's default classifier — an HTTP
//! 5xx, or a gRPC status other than OK (in the headers of a trailers-only response, or in
//! the trailers), or a body cut short.

use http::{HeaderMap, HeaderValue, StatusCode};

/// How a response went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Success,
    Failure,
}

impl Class {
    /// The `classification` label.
    pub fn label(self) -> &'static str {
        match self {
            Class::Success => "success",
            Class::Failure => "failure",
        }
    }
}

/// A response with `status` and, when it has one, gRPC status `grpc`.
pub fn classify(status: StatusCode, grpc: Option<GrpcCode>) -> Class {
    let failed = status.is_server_error() || grpc.is_some_and(|g| g != GrpcCode::Code(0));
    if failed {
        Class::Failure
    } else {
        Class::Success
    }
}

/// Whether a request or response with these headers is gRPC (its content-type).
pub fn is_grpc(h: &HeaderMap) -> bool {
    h.get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// A `grpc-status` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrpcCode {
    /// One of the 17 codes gRPC defines.
    Code(u8),
    /// Anything else (the value comes from the network: an upstream outside the mesh can
    /// send anything).
    Unknown,
}

impl GrpcCode {
    /// The `grpc-status` header or trailer in `h`, if any.
    pub fn of(h: &HeaderMap) -> Option<Self> {
        h.get("grpc-status").map(Self::parse)
    }

    pub fn parse(v: &HeaderValue) -> Self {
        match v.to_str().ok().and_then(|s| s.parse::<u8>().ok()) {
            Some(code) if code <= 16 => GrpcCode::Code(code),
            _ => GrpcCode::Unknown,
        }
    }

    /// As a label: the code's number, or `unknown` (a label must not take arbitrarily many
    /// values).
    pub fn label(self) -> String {
        match self {
            GrpcCode::Code(c) => c.to_string(),
            GrpcCode::Unknown => "unknown".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_and_grpc_errors_fail_the_rest_succeed() {
        let grpc = |s: &str| Some(GrpcCode::parse(&HeaderValue::from_str(s).unwrap()));
        for (status, g, want) in [
            (200, None, Class::Success),
            (404, None, Class::Success),
            (429, None, Class::Success),
            (500, None, Class::Failure),
            (503, None, Class::Failure),
            (200, grpc("0"), Class::Success),
            (200, grpc("14"), Class::Failure),
            (200, grpc("5"), Class::Failure),
            (200, grpc("banana"), Class::Failure),
            (503, grpc("0"), Class::Failure),
        ] {
            let status = StatusCode::from_u16(status).unwrap();
            assert_eq!(classify(status, g), want, "{status} {g:?}");
        }
    }

    #[test]
    fn grpc_codes_beyond_the_defined_ones_are_unknown() {
        let v = |s: &str| GrpcCode::parse(&HeaderValue::from_str(s).unwrap());
        assert_eq!(v("16"), GrpcCode::Code(16));
        assert_eq!(v("17"), GrpcCode::Unknown);
        assert_eq!(v("-1"), GrpcCode::Unknown);
        assert_eq!(v("17").label(), "unknown");
        assert_eq!(v("7").label(), "7");
    }
}
