//! Retries of a route's requests: which responses are retried and the backoff between
//! tries; the request body kept to send again (`replay.rs`) and the budget that keeps
//! retries from multiplying an outage (`budget.rs`).

mod budget;
mod replay;

#[cfg(test)]
use budget::Budget;
pub use budget::Budgets;
pub use replay::{NotReplayable, Replay};

use super::classify::GrpcCode;
use crate::policy::routes::Retry;
use http::{HeaderMap, StatusCode};
use std::time::Duration;

/// The longest pause between tries.
pub const MAX_BACKOFF: Duration = Duration::from_millis(250);

/// Whether a try's outcome — its response's status and, for a trailers-only gRPC
/// response, its gRPC status — is one `retry` retries.
pub fn retryable(retry: &Retry, status: StatusCode, headers: &HeaderMap) -> bool {
    let code = status.as_u16();
    if retry
        .http_statuses
        .iter()
        .any(|(min, max)| (*min..=*max).contains(&code))
    {
        return true;
    }
    matches!(GrpcCode::of(headers), Some(GrpcCode::Code(c)) if retry.grpc_codes.contains(&c))
}

/// The pause before retry number `n` (1 for the first): `base` doubled each time up to
/// [`MAX_BACKOFF`], of which a random half (`jitter` in 0..1) is taken off, so that
/// clients retrying together spread out.
pub fn backoff(base: Duration, n: u32, jitter: f64) -> Duration {
    let exp = base.saturating_mul(1u32 << n.saturating_sub(1).min(16));
    let d = exp.min(MAX_BACKOFF);
    d.mul_f64(1.0 - 0.5 * jitter.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests;
