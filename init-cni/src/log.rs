//! The installer's and the plugin's lines on stderr: `ambit-cni: …` as they always were,
//! or with `AMBIT_LOG_FORMAT=json` (the chart's `logFormat`) one JSON object per line in
//! the shape the node proxy and the control plane write (`timestamp`, `level`, `target`,
//! `fields.message`), for the same log pipeline.

use std::fmt::Display;
use std::time::{SystemTime, UNIX_EPOCH};

/// How serious a line is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// What it did.
    Info,
    /// What went wrong and what it does about it.
    Warn,
    /// Why it stops.
    Error,
}

/// Whether lines are JSON: `AMBIT_LOG_FORMAT=json`.
fn json() -> bool {
    std::env::var("AMBIT_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"))
}

/// Writes one line; `prefix` is what a plain line starts with (`ambit-cni`, or `ambit-cni
/// install`).
pub fn say(level: Level, prefix: &str, msg: impl Display) {
    eprintln!(
        "{}",
        line(json(), level, prefix, &msg.to_string(), SystemTime::now())
    );
}

/// What [`say`] writes.
pub fn line(json: bool, level: Level, prefix: &str, msg: &str, at: SystemTime) -> String {
    if !json {
        return format!("{prefix}: {msg}");
    }
    let level = match level {
        Level::Info => "INFO",
        Level::Warn => "WARN",
        Level::Error => "ERROR",
    };
    serde_json::json!({
        "timestamp": rfc3339(at),
        "level": level,
        "target": prefix.replace(' ', "::").replace('-', "_"),
        "fields": {"message": msg},
    })
    .to_string()
}

/// `at` as RFC 3339 in UTC with microseconds, e.g. `2026-12-07T13:08:08.123456Z`.
fn rfc3339(at: SystemTime) -> String {
    let d = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_micros()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_plain_line_is_as_before_and_a_json_line_is_the_proxys_shape() {
        let at = UNIX_EPOCH + Duration::from_micros(1_796_649_065_049_123);
        assert_eq!(
            line(
                false,
                Level::Info,
                "ambit-cni",
                "installed /opt/cni/bin/ambit-cni",
                at
            ),
            "ambit-cni: installed /opt/cni/bin/ambit-cni"
        );
        let j: serde_json::Value = serde_json::from_str(&line(
            true,
            Level::Warn,
            "ambit-cni install",
            "a \"quoted\" path",
            at,
        ))
        .unwrap();
        assert_eq!(
            j,
            serde_json::json!({
                "timestamp": "2026-12-07T13:11:05.049123Z",
                "level": "WARN",
                "target": "ambit_cni::install",
                "fields": {"message": "a \"quoted\" path"},
            })
        );
    }

    #[test]
    fn dates_convert_across_leap_years_and_centuries() {
        for (secs, want) in [
            (0, "1970-01-01T00:00:00.000000Z"),
            (951_782_400, "2000-02-29T00:00:00.000000Z"),
            (4_107_542_399, "2100-02-28T23:59:59.000000Z"),
        ] {
            assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(secs)), want);
        }
    }
}
