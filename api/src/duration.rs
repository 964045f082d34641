//! Durations in configuration: `500ms`, `20s`, `90m`, `24h`, `7d`, or a combination
//! (`1h30m`).

use std::time::Duration;

/// Parses a duration; the error says what is accepted.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "{s:?} is not a duration; use a number with a unit: ms, s, m, h or d (e.g. 24h, 90s)"
        )
    };
    let s = s.trim();
    if s.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
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
        let part = match &rest[..unit] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.saturating_mul(60)),
            "h" => Duration::from_secs(n.saturating_mul(3600)),
            "d" => Duration::from_secs(n.saturating_mul(86400)),
            _ => return Err(bad()),
        };
        total = total.saturating_add(part);
        rest = &rest[unit..];
    }
    Ok(total)
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
    fn rejects_what_it_cannot_read() {
        for bad in ["", "24", "h", "10 s", "1.5h", "-1s", "3w"] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.contains("use a number with a unit"), "{bad}: {err}");
        }
    }
}
