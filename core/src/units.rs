//! Sizes and durations as users write them in `job.yaml` and on the command line.

use std::time::Duration;

/// A size or a duration that could not be read; the message quotes the text (escaped).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("is empty; write a size like 10GiB or 512MiB")]
    EmptySize,
    #[error("{0:?} is not a size; write a size like 10GiB or 512MiB")]
    NotASize(String),
    #[error("{0:?} must be greater than zero")]
    NotPositive(String),
    #[error("unknown unit {unit:?} in {text:?} (use MiB, GiB or TiB)")]
    UnknownUnit { unit: String, text: String },
    #[error("{0:?} is too large")]
    TooLarge(String),
    #[error("{text:?} is not a duration like 50ms or 10m ({why})")]
    NotADuration { text: String, why: String },
    #[error("{0:?} is neither a latency like 50ms nor a slowdown like 3x")]
    NotAnObjective(String),
}

const MIB_PER_GIB: f64 = 1024.0;
const MIB_PER_TIB: f64 = 1024.0 * 1024.0;

/// Parses a memory size into MiB.
///
/// Accepts a bare number (MiB) or a number with a unit: `MiB`/`M`/`MB`, `GiB`/`G`/`GB`,
/// `TiB`/`T`/`TB`, case-insensitive. As in NVIDIA's MIG profile names (`3g.40gb`), `GB`
/// means GiB. Fractions are allowed (`1.5GiB`); the result is rounded up to whole MiB.
pub fn parse_memory_mib(text: &str) -> Result<u64, UnitError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(UnitError::EmptySize);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| UnitError::NotASize(text.to_owned()))?;
    if !value.is_finite() || value <= 0.0 {
        return Err(UnitError::NotPositive(text.to_owned()));
    }
    let factor = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "m" | "mb" | "mib" => 1.0,
        "g" | "gb" | "gib" => MIB_PER_GIB,
        "t" | "tb" | "tib" => MIB_PER_TIB,
        other => {
            return Err(UnitError::UnknownUnit {
                unit: other.to_owned(),
                text: text.to_owned(),
            });
        }
    };
    let mib = (value * factor).ceil();
    if mib > u64::MAX as f64 / 2.0 {
        return Err(UnitError::TooLarge(text.to_owned()));
    }
    Ok(mib as u64)
}

/// Formats MiB for people: `512MiB`, `10GiB`, `1.5GiB`.
pub fn format_mib(mib: u64) -> String {
    if mib >= 1024 && mib.is_multiple_of(1024) {
        format!("{}GiB", mib / 1024)
    } else if mib >= 1024 {
        format!("{:.1}GiB", mib as f64 / MIB_PER_GIB)
    } else {
        format!("{mib}MiB")
    }
}

/// Parses a duration such as `50ms`, `30s`, `10m` or `1h 30m`.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let d = humantime::parse_duration(text.trim()).map_err(|e| UnitError::NotADuration {
        text: text.to_owned(),
        why: e.to_string(),
    })?;
    if d.is_zero() {
        return Err(UnitError::NotPositive(text.to_owned()));
    }
    Ok(d)
}

/// A latency objective as a user writes it (`slo: 50ms`, `mmkctl run --slo 3x`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Objective {
    /// The p99 of a request, in ms (at least 1).
    LatencyMs(u64),
    /// The p99 as a slowdown against the job running alone, in percent (`3x`: 300).
    SlowdownPct(u32),
}

/// Parses an objective: a duration (`50ms`, `1.5s`) or a slowdown (`3x`, `2.5x`).
pub fn parse_objective(text: &str) -> Result<Objective, UnitError> {
    let t = text.trim();
    if let Some(factor) = t.strip_suffix(['x', 'X']) {
        let f: f64 = factor
            .trim()
            .parse()
            .map_err(|_| UnitError::NotAnObjective(text.to_owned()))?;
        if !f.is_finite() || f <= 0.0 {
            return Err(UnitError::NotPositive(text.to_owned()));
        }
        let pct = (f * 100.0).round();
        if pct > f64::from(u32::MAX) {
            return Err(UnitError::TooLarge(text.to_owned()));
        }
        return Ok(Objective::SlowdownPct(pct as u32));
    }
    let d = parse_duration(t).map_err(|e| match e {
        UnitError::NotADuration { .. } => UnitError::NotAnObjective(text.to_owned()),
        other => other,
    })?;
    Ok(Objective::LatencyMs(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objectives_are_latencies_or_slowdowns() {
        assert_eq!(parse_objective("50ms"), Ok(Objective::LatencyMs(50)));
        assert_eq!(parse_objective(" 1.5s "), Ok(Objective::LatencyMs(1500)));
        assert_eq!(parse_objective("3x"), Ok(Objective::SlowdownPct(300)));
        assert_eq!(parse_objective("2.5X"), Ok(Objective::SlowdownPct(250)));
        assert_eq!(
            parse_objective("fast"),
            Err(UnitError::NotAnObjective("fast".into()))
        );
        assert_eq!(
            parse_objective("-2x"),
            Err(UnitError::NotPositive("-2x".into()))
        );
        assert!(parse_objective("1e12x").is_err());
    }

    #[test]
    fn memory_units() {
        assert_eq!(parse_memory_mib("512"), Ok(512));
        assert_eq!(parse_memory_mib("512MiB"), Ok(512));
        assert_eq!(parse_memory_mib("10GiB"), Ok(10 * 1024));
        assert_eq!(parse_memory_mib("10gb"), Ok(10 * 1024));
        assert_eq!(parse_memory_mib("1.5G"), Ok(1536));
        assert_eq!(parse_memory_mib(" 2 TiB "), Ok(2 * 1024 * 1024));
    }

    #[test]
    fn bad_memory_is_refused_with_the_reason() {
        assert!(
            parse_memory_mib("-5GiB")
                .unwrap_err()
                .to_string()
                .contains("greater than zero")
        );
        assert!(
            parse_memory_mib("0")
                .unwrap_err()
                .to_string()
                .contains("greater than zero")
        );
        assert!(
            parse_memory_mib("ten")
                .unwrap_err()
                .to_string()
                .contains("not a size")
        );
        assert!(
            parse_memory_mib("10PB")
                .unwrap_err()
                .to_string()
                .contains("unknown unit")
        );
        assert!(parse_memory_mib("").is_err());
    }

    #[test]
    fn formats_round_trip_for_whole_units() {
        assert_eq!(format_mib(40 * 1024), "40GiB");
        assert_eq!(format_mib(512), "512MiB");
        assert_eq!(format_mib(1536), "1.5GiB");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("50ms"), Ok(Duration::from_millis(50)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").is_err());
    }
}
