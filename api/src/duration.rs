//! Durations in configuration: `500ms`, `20s`, `90m`, `24h`, `7d`, or a combination
//! (`1h30m`); and Gateway API's stricter format ([`parse_gateway_duration`]), which
//! routes and the retry/timeout annotations use.

use std::time::Duration;

/// Parses a duration; the error says what is accepted. A total over `u64::MAX`
/// milliseconds (some 584 million years) is refused rather than rounded: saturated, it
/// would be finer than a millisecond and print as text this function does not read, and
/// `Instant::now()` plus it would overflow.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "{s:?} is not a duration; use a number with a unit: ms, s, m, h or d (e.g. 24h, 90s)"
        )
    };
    let too_long = || format!("{s:?} is too long a duration (at most {} ms)", u64::MAX);
    let s = s.trim();
    if s.is_empty() {
        return Err(bad());
    }
    let mut total_ms: u64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit_ms: u64 = match &rest[..unit] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad()),
        };
        total_ms = n
            .checked_mul(unit_ms)
            .and_then(|part| total_ms.checked_add(part))
            .ok_or_else(too_long)?;
        rest = &rest[unit..];
    }
    Ok(Duration::from_millis(total_ms))
}

/// Formats a duration the way [`parse_duration`] reads it.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0s".into(),
        _ if ms.is_multiple_of(86_400_000) => format!("{}d", ms / 86_400_000),
        _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1000) => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    }
}

/// The longest Gateway API duration: 4 parts of 99999 hours.
const GATEWAY_MAX_PARTS: usize = 4;
const GATEWAY_MAX_DIGITS: usize = 5;

/// Parses a duration in Gateway API's format (GEP-2257): `^([0-9]{1,5}(h|m|s|ms)){1,4}$`,
/// e.g. `1h30m`, `500ms`, `0s` — one to four parts, each one to five digits and a unit, no
/// sign, no space, no fraction. Units may repeat (`1s1s` is 2 s), as the pattern allows.
/// The error says what is accepted.
pub fn parse_gateway_duration(s: &str) -> Result<Duration, String> {
    let bad = |why: &str| {
        format!(
            "{s:?} is not a Gateway API duration ({why}); use 1 to 4 parts of up to 5 digits \
             and a unit h, m, s or ms, e.g. 500ms, 10s, 1h30m"
        )
    };
    if s.is_empty() {
        return Err(bad("empty"));
    }
    let mut total = Duration::ZERO;
    let mut rest = s.as_bytes();
    let mut parts = 0;
    while !rest.is_empty() {
        parts += 1;
        if parts > GATEWAY_MAX_PARTS {
            return Err(bad("more than 4 parts"));
        }
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 {
            return Err(bad("a part must start with a number"));
        }
        if digits > GATEWAY_MAX_DIGITS {
            return Err(bad("more than 5 digits in a part"));
        }
        // At most 5 ASCII digits: fits any integer type; the fold cannot overflow.
        let n = rest[..digits]
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
        rest = &rest[digits..];
        let (unit, len) = match rest {
            [b'm', b's', ..] => (Duration::from_millis(1), 2),
            [b'h', ..] => (Duration::from_secs(3600), 1),
            [b'm', ..] => (Duration::from_secs(60), 1),
            [b's', ..] => (Duration::from_secs(1), 1),
            [] => return Err(bad("a number without a unit")),
            _ => return Err(bad("unknown unit")),
        };
        // 4 × 99999 h is far below Duration's range; saturate all the same.
        total = total.saturating_add(unit.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX)));
        rest = &rest[len..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_combinations() {
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86400)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(format_duration(Duration::from_secs(5400)), "90m");
    }

    #[test]
    fn a_duration_past_u64_milliseconds_is_refused_not_saturated() {
        // Found by the `duration` fuzz target: saturating to Duration::MAX gave a value
        // finer than a millisecond, which format_duration printed as text that does not
        // parse (and Instant::now() + it would overflow).
        let max = "18446744073709551615ms";
        let d = parse_duration(max).unwrap();
        assert_eq!(d, Duration::from_millis(u64::MAX));
        assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        let near = parse_duration("18446744073709551s").unwrap();
        assert_eq!(parse_duration(&format_duration(near)), Ok(near));
        for over in [
            "18446744073709552s",
            "18446744073709551615ms1ms",
            "99999999999999999h",
            "60h52h525525225525252552h5h2h525252552h5h2h",
        ] {
            let err = parse_duration(over).unwrap_err();
            assert!(err.contains("too long"), "{over}: {err}");
        }
    }

    #[test]
    fn rejects_what_it_cannot_read() {
        for bad in ["", "24", "h", "10 s", "1.5h", "-1s", "3w"] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.contains("use a number with a unit"), "{bad}: {err}");
        }
    }

    #[test]
    fn gateway_durations_as_gep_2257_writes_them() {
        let ok = |s: &str| parse_gateway_duration(s).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ok("0s"), Duration::ZERO);
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("1h30m"), Duration::from_secs(5400));
        assert_eq!(ok("1h1m1s1ms"), Duration::from_millis(3_661_001));
        assert_eq!(ok("99999h"), Duration::from_secs(99_999 * 3600));
        assert_eq!(
            ok("1s1s"),
            Duration::from_secs(2),
            "the pattern allows a unit twice"
        );
        assert_eq!(
            ok("00010s"),
            Duration::from_secs(10),
            "leading zeros are digits"
        );
        assert_eq!(ok("1m1ms"), Duration::from_millis(60_001), "m then ms");
    }

    #[test]
    fn gateway_durations_refuse_what_the_pattern_refuses() {
        for bad in [
            "",
            "10",
            "s",
            "1d",
            "100000s",
            "1h1m1s1ms1h",
            "1.5s",
            "-1s",
            "+1s",
            " 1s",
            "1s ",
            "1 s",
            "1S",
            "1us",
            "1msx",
            "1µs",
            "1h_30m",
            "1sm",
        ] {
            let err = parse_gateway_duration(bad).expect_err(bad);
            assert!(err.contains("Gateway API duration"), "{bad}: {err}");
        }
    }

    #[test]
    fn gateway_durations_never_panic_on_any_short_input() {
        // Every string of up to 4 characters over the alphabet the parser cares about.
        let alphabet = ['0', '9', 'h', 'm', 's', 'x', '\u{e9}'];
        let mut words = vec![String::new()];
        for _ in 0..4 {
            let next: Vec<String> = words
                .iter()
                .flat_map(|w| alphabet.iter().map(move |c| format!("{w}{c}")))
                .collect();
            for w in &next {
                let _ = parse_gateway_duration(w);
            }
            words = next;
        }
    }
}
