//! Durations as written in configuration (`ambit_api::duration::parse_duration`: `500ms`,
//! `1h30m`, `7d`) and in Gateway API objects and the retry/timeout annotations
//! (`parse_gateway_duration`, GEP-2257).
//!
//! Input: the text.
//!
//! Invariants: no panic; what parses prints (`format_duration`) as text that parses
//! back to the same duration; a Gateway API duration is at most 4 × 99999 h, and is read
//! the same by the general parser (its syntax is a subset).
#![no_main]

use ambit_api::duration::{format_duration, parse_duration, parse_gateway_duration};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

/// The longest Gateway API duration.
const GATEWAY_MAX: Duration = Duration::from_secs(4 * 99_999 * 3600);

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(d) = parse_duration(text) {
        assert_eq!(
            d.subsec_nanos() % 1_000_000,
            0,
            "{text:?}: finer than a millisecond"
        );
        let printed = format_duration(d);
        assert_eq!(
            parse_duration(&printed),
            Ok(d),
            "{text:?} is {d:?}, printed as {printed:?}"
        );
    }
    if let Ok(d) = parse_gateway_duration(text) {
        assert!(d <= GATEWAY_MAX, "{text:?} is {d:?}");
        assert_eq!(parse_duration(text), Ok(d), "{text:?}");
    }
});
