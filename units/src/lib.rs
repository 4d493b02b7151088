//! Durations and byte sizes, read and printed the same way by the operator (the CRD's
//! fields, status columns), the agent (`top`, its flags) and the tools (`leak-sim`, the
//! benchmarks).
//!
//! Hand-made rather than `humantime` or `bytesize`, and kept small, because the syntax is
//! Kubernetes': a `ResourceWatch` carries Go durations (`metav1.Duration`: `90s`, `1h30m`,
//! `1.5h`, `500ms`; humantime accepts other words and rejects fractions) and users read
//! sizes as `kubectl` prints quantities (`512Mi`, `1.5Gi`).

use std::{fmt, time::Duration};

/// A value that is not a duration or a size, with the text it was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnitError {
    Duration(String),
    Bytes(String),
}

impl fmt::Display for UnitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnitError::Duration(s) => write!(
                f,
                "{s:?} is not a duration like 500ms, 30s, 5m or 1h30m (units ns, us, ms, s, m, h)"
            ),
            UnitError::Bytes(s) => write!(
                f,
                "{s:?} is not a size like 128Mi, 10MiB, 100KB or 4096 (a rate may end in /s)"
            ),
        }
    }
}

impl std::error::Error for UnitError {}

/// Parses a Go duration: one or more `<number><unit>`, units ns, us (µs), ms, s, m, h;
/// `0` alone is zero. Negative, non-finite and absurd (over 30 years) values are refused.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let bad = || UnitError::Duration(s.to_string());
    let mut rest = s.trim();
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..end].parse().map_err(|_| bad())?;
        rest = &rest[end..];
        // Longest unit first: "ms" before "m", "ns" before nothing else.
        let (unit, scale) = [
            ("ns", 1e-9),
            ("us", 1e-6),
            ("µs", 1e-6),
            ("ms", 1e-3),
            ("s", 1.0),
            ("m", 60.0),
            ("h", 3600.0),
        ]
        .into_iter()
        .find(|(u, _)| rest.starts_with(u))
        .ok_or_else(bad)?;
        rest = &rest[unit.len()..];
        total += number * scale;
    }
    if !total.is_finite() || total >= 1e9 {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(total))
}

/// Formats a duration the way `kubectl` prints ages: `45s`, `4m30s`, `5m`, `2h5m`, `3h`;
/// under a second, `250ms`.
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 if d.subsec_millis() > 0 => format!("{}ms", d.subsec_millis()),
        0..60 => format!("{s}s"),
        60..3600 if s.is_multiple_of(60) => format!("{}m", s / 60),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        _ if s % 3600 / 60 == 0 => format!("{}h", s / 3600),
        _ => format!("{}h{}m", s / 3600, s % 3600 / 60),
    }
}

/// Formats bytes in binary units as `kubectl` shows quantities: `512`, `64Ki`, `512Mi`,
/// `1.5Gi` (one decimal below 100 of a unit, none when it would be `.0`).
pub fn format_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["", "Ki", "Mi", "Gi", "Ti", "Pi"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 || v >= 100.0 || (v - v.round()).abs() < 0.05 {
        format!("{}{}", v.round(), UNITS[u])
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

/// Parses a size or a rate: `128Mi`, `10MiB`, `100KB/s`, `2.5MB`, `4096`. Binary units
/// (Ki, Mi, Gi, Ti, with or without a B) are powers of 1024; K/KB, M/MB, G/GB, T/TB
/// powers of 1000, as Kubernetes reads them.
pub fn parse_bytes(s: &str) -> Result<u64, UnitError> {
    let bad = || UnitError::Bytes(s.to_string());
    let t = s.trim();
    let t = t.strip_suffix("/s").unwrap_or(t);
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().map_err(|_| bad())?;
    let mult = match unit.trim() {
        "" | "B" => 1.0,
        "K" | "k" | "KB" | "kB" => 1e3,
        "Ki" | "KiB" => 1024.0,
        "M" | "MB" => 1e6,
        "Mi" | "MiB" => 1048576.0,
        "G" | "GB" => 1e9,
        "Gi" | "GiB" => 1073741824.0,
        "T" | "TB" => 1e12,
        "Ti" | "TiB" => 1099511627776.0,
        _ => return Err(bad()),
    };
    let bytes = v * mult;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("2m3s"), Ok(Duration::from_secs(123)));
        assert_eq!(parse_duration(" 10m "), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "5", "5 m", "-5s", "5d", "fast", "1e999h", "s", "5m3"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
        assert!(
            parse_duration("5d")
                .err()
                .is_some_and(|e| e.to_string().contains("1h30m"))
        );
    }

    #[test]
    fn durations_print_like_kubectl() {
        let f = |s: u64| format_duration(Duration::from_secs(s));
        assert_eq!(
            [f(0), f(45), f(60), f(270), f(3600), f(7500)],
            ["0s", "45s", "1m", "4m30s", "1h", "2h5m"]
        );
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        // What is printed reads back.
        for s in [45, 270, 3600, 7500] {
            assert_eq!(
                parse_duration(&f(s)).map(|d| d.as_secs()),
                Ok(s - s % if s >= 3600 { 60 } else { 1 })
            );
        }
    }

    #[test]
    fn sizes_and_rates() {
        assert_eq!(parse_bytes("1MiB/s"), Ok(1 << 20));
        assert_eq!(parse_bytes("128Mi"), Ok(128 << 20));
        assert_eq!(parse_bytes("100KB/s"), Ok(100_000));
        assert_eq!(parse_bytes("10KiB"), Ok(10_240));
        assert_eq!(parse_bytes("2.5MB"), Ok(2_500_000));
        assert_eq!(parse_bytes("1Gi"), Ok(1 << 30));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        for bad in ["fast", "10XB", "", "Mi", "1e30Ti"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn bytes_print_like_kubectl() {
        assert_eq!(
            [
                format_bytes(512),
                format_bytes(64 << 10),
                format_bytes(512 << 20),
                format_bytes(3 << 29),
                format_bytes(150 << 20)
            ],
            ["512", "64Ki", "512Mi", "1.5Gi", "150Mi"]
        );
        assert_eq!(parse_bytes(&format_bytes(512 << 20)), Ok(512 << 20));
    }
}
