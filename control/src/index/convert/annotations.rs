//! The retry, timeout and failure-accrual annotations (Linkerd's `retry.linkerd.io/*`,
//! `timeout.linkerd.io/*` and `balancer.linkerd.io/failure-accrual*`, under our names), on
//! Services and routes, each value refused by object and field.

use super::{err, ConvertError};
use crate::index::route::{
    FailureAccrual, RetryAnnotations, RouteAnnotations, RouteKind, TimeoutAnnotations,
};
use ambit_api::duration::parse_gateway_duration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;
use std::time::Duration;

/// HTTP statuses to retry: `504`, `500-504`, `5xx`, `gateway-error`, comma-separated.
pub const RETRY_HTTP: &str = "retry.ambit.dev/http";
/// gRPC codes to retry: `cancelled`, `deadline-exceeded`, `internal`,
/// `resource-exhausted`, `unavailable`, comma-separated.
pub const RETRY_GRPC: &str = "retry.ambit.dev/grpc";
/// Retries after the first try (default 1).
pub const RETRY_LIMIT: &str = "retry.ambit.dev/limit";
/// Each try's timeout.
pub const RETRY_TIMEOUT: &str = "retry.ambit.dev/timeout";
/// The whole request's timeout.
pub const TIMEOUT_REQUEST: &str = "timeout.ambit.dev/request";
/// Time to the response's headers.
pub const TIMEOUT_RESPONSE: &str = "timeout.ambit.dev/response";
/// A stream idle this long is ended.
pub const TIMEOUT_IDLE: &str = "timeout.ambit.dev/idle";
/// `consecutive` or `disabled`.
pub const FAILURE_ACCRUAL: &str = "balancer.ambit.dev/failure-accrual";
/// Failures in a row that eject an endpoint (default 7).
pub const FA_MAX_FAILURES: &str = "balancer.ambit.dev/failure-accrual-consecutive-max-failures";
/// First ejection (default 1s).
pub const FA_MIN_PENALTY: &str = "balancer.ambit.dev/failure-accrual-consecutive-min-penalty";
/// Longest ejection (default 1m).
pub const FA_MAX_PENALTY: &str = "balancer.ambit.dev/failure-accrual-consecutive-max-penalty";
/// Jitter as a ratio of the penalty, 0 to 1 (default 0.5).
pub const FA_JITTER_RATIO: &str = "balancer.ambit.dev/failure-accrual-consecutive-jitter-ratio";

const RETRY_KEYS: [&str; 4] = [RETRY_HTTP, RETRY_GRPC, RETRY_LIMIT, RETRY_TIMEOUT];
const TIMEOUT_KEYS: [&str; 3] = [TIMEOUT_REQUEST, TIMEOUT_RESPONSE, TIMEOUT_IDLE];
const FA_KEYS: [&str; 5] = [
    FAILURE_ACCRUAL,
    FA_MAX_FAILURES,
    FA_MIN_PENALTY,
    FA_MAX_PENALTY,
    FA_JITTER_RATIO,
];

/// The gRPC codes `retry.ambit.dev/grpc` names, with their numbers.
pub const GRPC_CODES: [(&str, u32); 5] = [
    ("cancelled", 1),
    ("deadline-exceeded", 4),
    ("resource-exhausted", 8),
    ("internal", 13),
    ("unavailable", 14),
];

/// Failure accrual's defaults, as Linkerd's.
pub const FA_DEFAULT_MAX_FAILURES: u32 = 7;
/// First ejection by default.
pub const FA_DEFAULT_MIN_PENALTY: Duration = Duration::from_secs(1);
/// Longest ejection by default.
pub const FA_DEFAULT_MAX_PENALTY: Duration = Duration::from_secs(60);
/// Jitter by default.
pub const FA_DEFAULT_JITTER: f64 = 0.5;

/// Where the annotations are: a Service, or a route of a kind.
#[derive(Clone, Copy, Debug)]
pub(crate) enum On {
    Service,
    Route(RouteKind),
}

/// The routing annotations of an object, checked.
pub(crate) fn routing_annotations(
    meta: &ObjectMeta,
    object: &str,
    on: On,
) -> Result<RouteAnnotations, ConvertError> {
    let Some(a) = meta.annotations.as_ref() else {
        return Ok(RouteAnnotations::default());
    };
    let at = |key: &str| format!("metadata.annotations[\"{key}\"]");
    check_keys(a, object, on)?;
    let get = |key: &str| a.get(key).map(|v| (v.trim(), at(key)));
    let duration = |key: &str| -> Result<Option<Duration>, ConvertError> {
        get(key)
            .map(|(v, field)| parse_gateway_duration(v).map_err(|e| err(object, &field, e)))
            .transpose()
    };
    let retry = if RETRY_KEYS.iter().any(|k| a.contains_key(*k)) {
        Some(RetryAnnotations {
            http: get(RETRY_HTTP)
                .map(|(v, f)| http_statuses(v).map_err(|e| err(object, &f, e)))
                .transpose()?,
            grpc: get(RETRY_GRPC)
                .map(|(v, f)| grpc_codes(v).map_err(|e| err(object, &f, e)))
                .transpose()?,
            limit: get(RETRY_LIMIT)
                .map(|(v, f)| {
                    v.parse::<u32>().map_err(|_| {
                        err(
                            object,
                            &f,
                            format!("{v:?} is not a number of retries (0 or more)"),
                        )
                    })
                })
                .transpose()?,
            timeout: duration(RETRY_TIMEOUT)?,
        })
    } else {
        None
    };
    let timeouts = if TIMEOUT_KEYS.iter().any(|k| a.contains_key(*k)) {
        Some(TimeoutAnnotations {
            request: duration(TIMEOUT_REQUEST)?,
            response: duration(TIMEOUT_RESPONSE)?,
            idle: duration(TIMEOUT_IDLE)?,
        })
    } else {
        None
    };
    let failure_accrual = failure_accrual(a, object)?;
    Ok(RouteAnnotations {
        retry,
        timeouts,
        failure_accrual,
    })
}

/// Refuses keys of our prefixes that are misspelt or do not belong on this object.
fn check_keys(a: &BTreeMap<String, String>, object: &str, on: On) -> Result<(), ConvertError> {
    let known: Vec<&str> = RETRY_KEYS
        .iter()
        .chain(&TIMEOUT_KEYS)
        .chain(&FA_KEYS)
        .copied()
        .collect();
    for key in a.keys() {
        let ours = [
            "retry.ambit.dev/",
            "timeout.ambit.dev/",
            "balancer.ambit.dev/",
        ]
        .iter()
        .any(|p| key.starts_with(p));
        if !ours {
            continue;
        }
        let field = format!("metadata.annotations[\"{key}\"]");
        if !known.contains(&key.as_str()) {
            return Err(err(
                object,
                &field,
                format!("not an Ambit annotation; use one of {}", known.join(", ")),
            ));
        }
        let wrong = match on {
            On::Service => None,
            On::Route(_) if FA_KEYS.contains(&key.as_str()) => {
                Some("failure accrual is per Service; annotate the Service".to_string())
            }
            On::Route(RouteKind::Grpc) if key == RETRY_HTTP => {
                Some(format!("not valid on a GRPCRoute; use {RETRY_GRPC}"))
            }
            On::Route(RouteKind::Http) if key == RETRY_GRPC => Some(format!(
                "not valid on an HTTPRoute; use {RETRY_HTTP}, or a GRPCRoute"
            )),
            On::Route(_) => None,
        };
        if let Some(message) = wrong {
            return Err(err(object, &field, message));
        }
    }
    Ok(())
}

/// `5xx`, `gateway-error`, `504`, `500-504`, comma-separated, as inclusive ranges.
pub(crate) fn http_statuses(v: &str) -> Result<Vec<(u16, u16)>, String> {
    let status = |s: &str| -> Result<u16, String> {
        s.trim()
            .parse::<u16>()
            .ok()
            .filter(|n| (100..=599).contains(n))
            .ok_or_else(|| format!("{s:?} is not an HTTP status (100-599)"))
    };
    let mut out = Vec::new();
    for item in v.split(',').map(str::trim) {
        let range = match item {
            "" => {
                return Err(format!(
                    "{v:?}: an empty item; use e.g. \"5xx\" or \"502-504,429\""
                ))
            }
            "5xx" => (500, 599),
            "gateway-error" => (502, 504),
            _ => match item.split_once('-') {
                Some((lo, hi)) => {
                    let (lo, hi) = (status(lo)?, status(hi)?);
                    if lo > hi {
                        return Err(format!("{item:?}: the range is empty ({lo} > {hi})"));
                    }
                    (lo, hi)
                }
                None => {
                    let n = status(item).map_err(|e| {
                        format!("{e}; use statuses, ranges (500-504), 5xx or gateway-error")
                    })?;
                    (n, n)
                }
            },
        };
        out.push(range);
    }
    Ok(out)
}

/// gRPC status names, comma-separated, as their numbers.
pub(crate) fn grpc_codes(v: &str) -> Result<Vec<u32>, String> {
    v.split(',')
        .map(str::trim)
        .map(|item| {
            GRPC_CODES
                .iter()
                .find(|(name, _)| *name == item)
                .map(|(_, code)| *code)
                .ok_or_else(|| {
                    let names: Vec<&str> = GRPC_CODES.iter().map(|(n, _)| *n).collect();
                    format!(
                        "{item:?} is not a retryable gRPC status; use {}",
                        names.join(", ")
                    )
                })
        })
        .collect()
}

fn failure_accrual(
    a: &BTreeMap<String, String>,
    object: &str,
) -> Result<Option<FailureAccrual>, ConvertError> {
    if !FA_KEYS.iter().any(|k| a.contains_key(*k)) {
        return Ok(None);
    }
    let at = |key: &str| format!("metadata.annotations[\"{key}\"]");
    let params = FA_KEYS[1..].iter().find(|k| a.contains_key(**k));
    match a.get(FAILURE_ACCRUAL).map(|v| v.trim()) {
        None | Some("consecutive") => {}
        Some("disabled") => {
            return match params {
                Some(key) => Err(err(
                    object,
                    &at(key),
                    format!("failure accrual is disabled ({FAILURE_ACCRUAL}); remove this or set it to \"consecutive\""),
                )),
                None => Ok(Some(FailureAccrual::Disabled)),
            }
        }
        Some(other) => {
            return Err(err(
                object,
                &at(FAILURE_ACCRUAL),
                format!("{other:?} is not a failure accrual; use \"consecutive\" or \"disabled\""),
            ))
        }
    }
    let duration = |key: &str, default: Duration| -> Result<Duration, ConvertError> {
        a.get(key).map_or(Ok(default), |v| {
            parse_gateway_duration(v.trim()).map_err(|e| err(object, &at(key), e))
        })
    };
    let max_failures = a
        .get(FA_MAX_FAILURES)
        .map_or(Ok(FA_DEFAULT_MAX_FAILURES), |v| {
            v.trim()
                .parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| {
                    err(
                        object,
                        &at(FA_MAX_FAILURES),
                        format!("{v:?} is not a number of failures (1 or more)"),
                    )
                })
        })?;
    let min_penalty = duration(FA_MIN_PENALTY, FA_DEFAULT_MIN_PENALTY)?;
    let max_penalty = duration(FA_MAX_PENALTY, FA_DEFAULT_MAX_PENALTY)?;
    if min_penalty > max_penalty {
        let key = if a.contains_key(FA_MIN_PENALTY) {
            FA_MIN_PENALTY
        } else {
            FA_MAX_PENALTY
        };
        return Err(err(
            object,
            &at(key),
            format!("the min penalty ({min_penalty:?}) is longer than the max penalty ({max_penalty:?})"),
        ));
    }
    let jitter_ratio = a.get(FA_JITTER_RATIO).map_or(Ok(FA_DEFAULT_JITTER), |v| {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
            .ok_or_else(|| {
                err(
                    object,
                    &at(FA_JITTER_RATIO),
                    format!("{v:?} is not a ratio from 0 to 1 (e.g. 0.5)"),
                )
            })
    })?;
    Ok(Some(FailureAccrual::Consecutive {
        max_failures,
        min_penalty,
        max_penalty,
        jitter_ratio,
    }))
}
