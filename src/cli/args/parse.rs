//! Value parsers of the command line's flags: durations, sizes, switches,
//! lease holder names, `ENGINE=DURATION` and chaos faults. Each refusal
//! says what to write instead.

use std::time::Duration;

/// Parses `ENGINE=DURATION` (the engine is checked by the configuration).
pub fn parse_engine_duration(s: &str) -> Result<(String, Duration), String> {
    let (engine, duration) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: use ENGINE=DURATION, e.g. postgres=90s"))?;
    Ok((engine.trim().to_owned(), parse_duration(duration.trim())?))
}

/// Parses `250ms`, `30s`, `3m`, `1h`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "s"), |i| s.split_at(i));
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: use e.g. 250ms, 30s, 3m, 1h"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("invalid duration unit in {s:?}: use ms, s, m or h")),
    };
    Duration::try_from_secs_f64(secs)
        .map_err(|_| format!("duration {s:?} is out of range: use e.g. 250ms, 30s, 3m, 1h"))
}

/// A size such as `2GiB`, `512MiB` or a byte count.
pub(super) fn parse_size(s: &str) -> Result<u64, String> {
    crate::domain::admission::parse_bytes(s).ok_or_else(|| {
        format!("invalid size {s:?}: use a number with B, KiB, MiB, GiB or TiB (e.g. 2GiB)")
    })
}

/// `on` or `off` (also `true`/`false`, `1`/`0`).
pub(super) fn parse_switch(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(format!("{s:?} is neither on nor off")),
    }
}

/// A lease holder name: 1 to 200 printable characters.
pub(super) fn parse_holder(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 200 || s.chars().any(char::is_control) {
        return Err(format!(
            "invalid holder {s:?}: use 1 to 200 printable characters (default: host:pid:random)"
        ));
    }
    Ok(s.to_owned())
}

/// A chaos fault: kill, stop, remove or oom.
pub(super) fn parse_fault(s: &str) -> Result<crate::adapters::chaos::Fault, String> {
    crate::adapters::chaos::Fault::parse(s.trim())
        .ok_or_else(|| format!("unknown fault {s:?}: use kill, stop, remove or oom"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_accept_common_units() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("3m").unwrap(), Duration::from_secs(180));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("3 days").is_err());
        assert!(parse_duration("x").is_err());
    }
    #[test]
    fn durations_out_of_range_are_refused_rather_than_panicking() {
        assert!(parse_duration("99999999999999999999999h").is_err());
        assert!(parse_duration("-5s").is_err());
    }
}
