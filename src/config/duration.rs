//! Durations on the command line (`500ms`, `30s`, `10m`, `24h`, `7d`) and printed back for
//! humans (`1h2m3s`). Owns parsing and formatting only.

use std::time::Duration;

const UNITS: &[(&str, u64)] = &[
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

/// Parses one whole number followed by a unit: `ms`, `s`, `m`, `h` or `d`.
/// [`parse_duration`], refusing zero (for intervals and timeouts).
pub fn parse_nonzero_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        Duration::ZERO => Err("must not be zero".to_owned()),
        duration => Ok(duration),
    }
}

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let hint =
        "expected a whole number followed by a unit (ms, s, m, h, d), e.g. 500ms, 30s, 10m, 24h";
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(format!("invalid duration {text:?}: {hint}"));
    }
    let Some(&(_, millis_per_unit)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(if unit.is_empty() {
            format!("invalid duration {text:?}: the unit is missing; {hint}")
        } else {
            format!("invalid duration {text:?}: unknown unit {unit:?}; {hint}")
        });
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(millis_per_unit))
        .map(Duration::from_millis)
        .ok_or_else(|| format!("invalid duration {text:?}: too large"))
}

/// A compact human form: `850ms`, `42s`, `12m5s`, `3h0m12s`, `2d4h`.
pub fn format_duration(duration: Duration) -> String {
    let secs = duration.as_secs();
    if secs == 0 {
        return format!("{}ms", duration.as_millis());
    }
    let (days, hours, minutes, seconds) =
        (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60, secs % 60);
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{seconds}s"),
        (0, 0, _) => format!("{minutes}m{seconds}s"),
        (0, _, _) => format!("{hours}h{minutes}m{seconds}s"),
        _ => format!("{days}d{hours}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_is_understood() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration(" 5m "), Ok(Duration::from_secs(300)));
    }

    #[test]
    fn bad_durations_are_refused_with_a_hint() {
        for bad in [
            "", "m", "10", "10 m", "1.5h", "-5s", "10min", "10M", "h10", "1h30m",
        ] {
            let error = parse_duration(bad).expect_err(bad);
            assert!(
                error.contains("e.g. 500ms, 30s, 10m, 24h"),
                "{bad}: {error}"
            );
        }
        assert!(parse_duration("10")
            .unwrap_err()
            .contains("unit is missing"));
        assert!(parse_duration("10min")
            .unwrap_err()
            .contains("unknown unit \"min\""));
    }

    #[test]
    fn overflowing_durations_are_refused() {
        let error = parse_duration("99999999999999999999d").unwrap_err();
        assert!(error.contains("too large"), "{error}");
        assert!(parse_duration(&format!("{}d", u64::MAX / 1000))
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn durations_are_printed_compactly() {
        assert_eq!(format_duration(Duration::from_millis(850)), "850ms");
        assert_eq!(format_duration(Duration::from_secs(42)), "42s");
        assert_eq!(format_duration(Duration::from_secs(12 * 60 + 5)), "12m5s");
        assert_eq!(
            format_duration(Duration::from_secs(3 * 3600 + 12)),
            "3h0m12s"
        );
        assert_eq!(
            format_duration(Duration::from_secs(2 * 86_400 + 4 * 3600 + 59)),
            "2d4h"
        );
    }
}
