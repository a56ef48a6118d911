//! The search of a STAC input, as flags give it.

/// Checks `--datetime`: an RFC 3339 instant, or an interval `A/B` whose
/// open ends are `..` (or empty), with A <= B.
pub fn check_datetime(s: &str) -> Result<(), String> {
    datetime_range(s).map(|_| ())
}

/// `--datetime` as an inclusive range of microseconds since the epoch, UTC;
/// `None` for an open end.
pub fn datetime_range(s: &str) -> Result<(Option<i64>, Option<i64>), String> {
    let one = |p: &str| -> Result<Option<i64>, String> {
        let p = p.trim();
        if p.is_empty() || p == ".." {
            return Ok(None);
        }
        let t = time::OffsetDateTime::parse(p, &time::format_description::well_known::Rfc3339)
            .map_err(|e| format!("--datetime `{s}`: `{p}` is not an RFC 3339 time ({e})"))?;
        Ok(Some((t.unix_timestamp_nanos() / 1000) as i64))
    };
    match s.split_once('/') {
        None => {
            let t = one(s)?;
            if t.is_none() {
                return Err(format!(
                    "--datetime `{s}`: an RFC 3339 time or an interval A/B"
                ));
            }
            Ok((t, t))
        }
        Some((a, b)) => {
            let (a, b) = (one(a)?, one(b)?);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetimes_are_instants_or_intervals() {
        assert!(check_datetime("2024-06-01T00:00:00Z").is_ok());
        assert!(check_datetime("2024-06-01T00:00:00Z/2024-08-31T23:59:59Z").is_ok());
        assert!(check_datetime("../2024-08-31T23:59:59Z").is_ok());
        assert!(check_datetime("2024-06-01T00:00:00+02:00/..").is_ok());
        assert!(check_datetime("2024-06-01").is_err());
        assert!(check_datetime("../..").is_err());
        assert!(check_datetime("2024-09-01T00:00:00Z/2024-08-01T00:00:00Z").is_err());
        let (a, b) = datetime_range("2024-01-01T00:00:00Z/..").unwrap();
        assert_eq!((a, b), (Some(1_704_067_200_000_000), None));
    }
}
