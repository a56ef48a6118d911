//! `--datetime`: an RFC 3339 instant, a date, or an interval `A/B` of
//! those whose open ends are `..` (or empty), as the STAC search sends it
//! and as a search of an index filters its chips by; and the time now, as
//! records carry it.

/// The current time as RFC 3339 UTC, as job state, `job.json` and the
/// manifest record it.
pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .expect("formatting the current time cannot fail")
}

/// µs since the epoch as RFC 3339, UTC (`2024-07-01T10:30:00Z`), as the
/// chip files' timestamps print; `None` for a time out of range.
pub fn micros_rfc3339(us: i64) -> Option<String> {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(us) * 1000)
        .ok()?
        .format(&time::format_description::well_known::Rfc3339)
        .ok()
}

/// `YYYY-MM-DD` (RFC 3339's full-date) as a date.
pub fn date_only(p: &str) -> Option<time::Date> {
    let b = p.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    if b.len() != 10
        || b[4] != b'-'
        || b[7] != b'-'
        || !digits(0..4)
        || !digits(5..7)
        || !digits(8..10)
    {
        return None;
    }
    let month = time::Month::try_from(p[5..7].parse::<u8>().ok()?).ok()?;
    time::Date::from_calendar_date(p[..4].parse().ok()?, month, p[8..].parse().ok()?).ok()
}

/// `--datetime` as an inclusive range of microseconds since the epoch, UTC;
/// `None` for an open end. A date is a whole day (UTC): its first
/// microsecond as a start, its last as an end.
pub fn range(s: &str) -> Result<(Option<i64>, Option<i64>), String> {
    const DAY_US: i64 = 86_400_000_000;
    let one = |p: &str, end: bool| -> Result<Option<i64>, String> {
        let p = p.trim();
        if p.is_empty() || p == ".." {
            return Ok(None);
        }
        if let Some(d) = date_only(p) {
            let t = d.midnight().assume_utc().unix_timestamp() * 1_000_000;
            return Ok(Some(if end { t + DAY_US - 1 } else { t }));
        }
        let t = time::OffsetDateTime::parse(p, &time::format_description::well_known::Rfc3339)
            .map_err(|e| {
                format!(
                    "--datetime `{s}`: `{p}` is not an RFC 3339 time or a date YYYY-MM-DD ({e})"
                )
            })?;
        Ok(Some((t.unix_timestamp_nanos() / 1000) as i64))
    };
    match s.split_once('/') {
        None => {
            let (a, b) = (one(s, false)?, one(s, true)?);
            if a.is_none() {
                return Err(format!(
                    "--datetime `{s}`: an RFC 3339 time, a date, or an interval A/B"
                ));
            }
            Ok((a, b))
        }
        Some((a, b)) => {
            let (a, b) = (one(a, false)?, one(b, true)?);
            if a.is_none() && b.is_none() {
                return Err(format!(
                    "--datetime `{s}`: an interval needs one closed end"
                ));
            }
            if let (Some(a), Some(b)) = (a, b) {
                if a > b {
                    return Err(format!("--datetime `{s}`: the start is after the end"));
                }
            }
            Ok((a, b))
        }
    }
}
