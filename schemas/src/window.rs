//! Time windows (`--windows DURATION` over `--datetime A/B`): the arithmetic.
//!
//! A duration is ISO 8601's calendar part only: years, months, weeks, days
//! (`P16D`, `P1M`, `P3M`, `P1Y`, `P2W`, `P1Y2M10D`). Window k is
//! `[A + k·D, A + (k+1)·D)` in UTC, the last cut at the interval's end. `A +
//! k·D` is computed from A each time, months first (the day clamped to the
//! month's length), then days: Jan 31 + P1M is Feb 28 (29 in a leap year),
//! and + 2·P1M is Mar 31, where adding P1M twice would give Mar 28. The time
//! of day of A is kept.
//!
//! Times are microseconds since the Unix epoch, UTC, as the chip columns
//! hold them.

use serde::{Deserialize, Serialize};
use time::{Date, Month, OffsetDateTime, PrimitiveDateTime};

/// The most windows one interval may be split into: a daily window over
/// 270 years. Past it a job is more likely a typo than a plan.
pub const MAX_WINDOWS: usize = 100_000;

/// Bounds on each part of a duration, so that no arithmetic overflows and
/// no window outlives the calendar.
const MAX_YEARS: u32 = 1_000;
const MAX_MONTHS: u32 = 12 * MAX_YEARS;
const MAX_WEEKS: u32 = 53 * MAX_YEARS;
const MAX_DAYS: u32 = 366 * MAX_YEARS;

/// Why a duration or a split into windows was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// The duration is not `P[nY][nM][nD]` or `PnW`.
    #[error("--windows `{text}`: {reason}")]
    Duration {
        /// As given.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The interval cannot be split.
    #[error("--windows over --datetime: {0}")]
    Interval(String),
}

/// A calendar duration: whole months and days (years are 12 months, weeks
/// 7 days). Never zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CalendarDuration {
    /// Months (12 a year).
    pub months: u32,
    /// Days (7 a week).
    pub days: u32,
}

impl std::str::FromStr for CalendarDuration {
    type Err = WindowError;

    /// `P` then `nY`, `nM`, `nD` in that order (each at most once, at least
    /// one), or `nW` alone; n a whole number. Time parts (`T…`), signs,
    /// fractions and zero are refused.
    fn from_str(text: &str) -> Result<CalendarDuration, WindowError> {
        let bad = |reason: &str| WindowError::Duration {
            text: text.to_owned(),
            reason: reason.to_owned(),
        };
        let s = text.trim();
        if s.starts_with('-') || s.starts_with('+') {
            return Err(bad("a window is a positive duration, without a sign"));
        }
        let Some(body) = s.strip_prefix('P').or_else(|| s.strip_prefix('p')) else {
            return Err(bad(
                "an ISO 8601 duration starts with P (P16D, P1M, P3M, P1Y, P2W, P1Y2M10D)",
            ));
        };
        if body.contains(['T', 't']) {
            return Err(bad(
                "time parts (after T) are not windows: use days, weeks, months or years",
            ));
        }
        if body.is_empty() {
            return Err(bad("P needs at least one part (P16D, P1M, P1Y, P2W)"));
        }
        let (mut years, mut months, mut weeks, mut days) = (None, None, None, None);
        let mut rank = 0;
        let mut rest = body;
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            let (num, tail) = rest.split_at(digits);
            let Some(unit) = tail.chars().next() else {
                return Err(bad("a number needs its unit (Y, M, W or D)"));
            };
            if num.is_empty() {
                return Err(bad(match unit {
                    '-' => "a window is a positive duration, without a sign",
                    '.' | ',' => "parts are whole numbers",
                    _ => "each unit needs a whole number before it",
                }));
            }
            if matches!(unit, '.' | ',') {
                return Err(bad("parts are whole numbers"));
            }
            let n: u32 = num.parse().map_err(|_| bad("a part is too large"))?;
            let (slot, r, max, name) = match unit.to_ascii_uppercase() {
                'Y' => (&mut years, 1, MAX_YEARS, "years"),
                'M' => (&mut months, 2, MAX_MONTHS, "months"),
                'W' => (&mut weeks, 3, MAX_WEEKS, "weeks"),
                'D' => (&mut days, 4, MAX_DAYS, "days"),
                _ => return Err(bad("units are Y, M, W and D")),
            };
            if r <= rank || slot.is_some() {
                return Err(bad("parts go in the order Y, M, D, each at most once"));
            }
            if n > max {
                return Err(WindowError::Duration {
                    text: text.to_owned(),
                    reason: format!("{n} {name} is more than a window can be (at most {max})"),
                });
            }
            *slot = Some(n);
            rank = r;
            rest = &tail[unit.len_utf8()..];
        }
        if weeks.is_some() && (years.is_some() || months.is_some() || days.is_some()) {
            return Err(bad(
                "weeks stand alone (P2W); write P1M14D for a month and two weeks",
            ));
        }
        let months_total = years.unwrap_or(0) * 12 + months.unwrap_or(0);
        let days_total = weeks.unwrap_or(0) * 7 + days.unwrap_or(0);
        if months_total > MAX_MONTHS || days_total > MAX_DAYS {
            return Err(bad("longer than a window can be (1000 years)"));
        }
        if months_total == 0 && days_total == 0 {
            return Err(bad("a window cannot be empty"));
        }
        Ok(CalendarDuration {
            months: months_total,
            days: days_total,
        })
    }
}

impl std::fmt::Display for CalendarDuration {
    /// The canonical form: `P1Y2M10D`, parts that are zero left out (weeks
    /// as days).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (y, m) = (self.months / 12, self.months % 12);
        f.write_str("P")?;
        if y > 0 {
            write!(f, "{y}Y")?;
        }
        if m > 0 {
            write!(f, "{m}M")?;
        }
        if self.days > 0 {
            write!(f, "{}D", self.days)?;
        }
        Ok(())
    }
}

fn to_datetime(us: i64) -> Option<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(us) * 1000).ok()
}

fn to_us(t: OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1000) as i64
}

fn days_in_month(year: i32, month: Month) -> u8 {
    month.length(year)
}

impl CalendarDuration {
    /// `start + k·self`, computed from `start`: the months first, the day of
    /// the month clamped to the month's length, then the days; the time of
    /// day kept. `None` past the calendar's range (year 9999).
    pub fn add_times(&self, start: OffsetDateTime, k: u64) -> Option<OffsetDateTime> {
        let start = start.to_offset(time::UtcOffset::UTC);
        let months = i64::from(self.months).checked_mul(i64::try_from(k).ok()?)?;
        let days = i64::from(self.days).checked_mul(i64::try_from(k).ok()?)?;
        let index = i64::from(start.year()) * 12 + i64::from(u8::from(start.month())) - 1;
        let index = index.checked_add(months)?;
        let year = i32::try_from(index.div_euclid(12)).ok()?;
        let month = Month::try_from(u8::try_from(index.rem_euclid(12) + 1).ok()?).ok()?;
        let day = start.day().min(days_in_month(year, month));
        let date = Date::from_calendar_date(year, month, day).ok()?;
        let date = date.checked_add(time::Duration::days(days))?;
        Some(PrimitiveDateTime::new(date, start.time()).assume_utc())
    }
}

/// One window: `[start, end)`, microseconds since the epoch, UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimeWindow {
    /// The first microsecond in the window.
    pub start: i64,
    /// The first microsecond after it.
    pub end: i64,
}

/// An interval split into consecutive windows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Windows {
    /// The duration of each window but (maybe) the last.
    pub duration: CalendarDuration,
    /// `start` of every window, then the end of the last: strictly increasing.
    bounds: Vec<i64>,
}

impl TimeWindow {
    /// `start/end` as RFC 3339 UTC, as `plan` and the summary name a window.
    pub fn label(&self) -> String {
        let f = |us: i64| {
            to_datetime(us)
                .and_then(|t| {
                    t.format(&time::format_description::well_known::Rfc3339)
                        .ok()
                })
                .unwrap_or_else(|| us.to_string())
        };
        format!("{}/{}", f(self.start), f(self.end))
    }
}

impl Windows {
    /// `[start, end)` split into windows of `duration`, the last cut at
    /// `end`. At most [`MAX_WINDOWS`]; `start` must be before `end`.
    pub fn split(start: i64, end: i64, duration: CalendarDuration) -> Result<Windows, WindowError> {
        if start >= end {
            return Err(WindowError::Interval(
                "the interval's start must be before its end".into(),
            ));
        }
        let a = to_datetime(start)
            .ok_or_else(|| WindowError::Interval("the start is out of range".into()))?;
        let mut bounds = vec![start];
        for k in 1.. {
            let next = duration
                .add_times(a, k)
                .map(to_us)
                .ok_or_else(|| WindowError::Interval("a window ends past the year 9999".into()))?;
            if next >= end {
                bounds.push(end);
                break;
            }
            if bounds.len() >= MAX_WINDOWS {
                return Err(WindowError::Interval(format!(
                    "more than {MAX_WINDOWS} windows of {duration}: choose a longer duration \
                     or a shorter interval"
                )));
            }
            bounds.push(next);
        }
        Ok(Windows { duration, bounds })
    }

    /// `--datetime A/B` (RFC 3339 times or dates; both ends closed, B
    /// inclusive as a STAC search takes it) split into windows of
    /// `duration`. The last window ends just after B: at the next day's
    /// midnight when B is a date.
    pub fn of_interval(datetime: &str, duration: CalendarDuration) -> Result<Windows, WindowError> {
        let (a, b) = crate::datetime::range(datetime).map_err(WindowError::Interval)?;
        let (Some(a), Some(b)) = (a, b) else {
            return Err(WindowError::Interval(format!(
                "--datetime `{datetime}` must be an interval A/B with both ends"
            )));
        };
        if !datetime.contains('/') {
            return Err(WindowError::Interval(format!(
                "--datetime `{datetime}` must be an interval A/B, not one time"
            )));
        }
        Windows::split(a, b.saturating_add(1), duration)
    }

    /// How many windows.
    pub fn len(&self) -> usize {
        self.bounds.len() - 1
    }

    /// Whether there is no window (never, once split).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Window `k`.
    pub fn get(&self, k: usize) -> Option<TimeWindow> {
        Some(TimeWindow {
            start: *self.bounds.get(k)?,
            end: *self.bounds.get(k + 1)?,
        })
    }

    /// Every window, in order.
    pub fn iter(&self) -> impl Iterator<Item = TimeWindow> + '_ {
        self.bounds.windows(2).map(|w| TimeWindow {
            start: w[0],
            end: w[1],
        })
    }

    /// The index of the window holding `t` (`start <= t < end`), if any.
    pub fn index_of(&self, t: i64) -> Option<usize> {
        let k = self.bounds.partition_point(|b| *b <= t);
        (k >= 1 && k < self.bounds.len()).then(|| k - 1)
    }
}

/// `--max-scenes` when not given: acquisitions kept per window and block of
/// cells. A Sentinel-2 year has about 140 per tile, a quarter about 35: a
/// quarterly job keeps them all, a yearly one the clearest 64.
pub const DEFAULT_MAX_SCENES: u32 = 64;

/// `--composite`: how one window's acquisitions of a cell become its row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Composite {
    /// The chip of the clearest acquisition: lowest `cloud_fraction`, then
    /// highest `valid_fraction`, then the latest.
    #[default]
    Best,
    /// The per-pixel median of the clear, valid pixels, in physical units.
    Median,
}

impl Composite {
    /// `best` or `median`.
    pub fn as_str(self) -> &'static str {
        match self {
            Composite::Best => "best",
            Composite::Median => "median",
        }
    }
}

impl std::fmt::Display for Composite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Composite {
    type Err = String;

    fn from_str(s: &str) -> Result<Composite, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "best" => Ok(Composite::Best),
            "median" => Ok(Composite::Median),
            _ => Err(format!("--composite is `best` or `median`, not `{s}`")),
        }
    }
}

/// A windowed job's `--windows`, `--composite` and `--max-scenes`, as
/// `job.json` records them (the interval is the search's `--datetime`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowSpec {
    /// `--windows` in its canonical form ([`CalendarDuration`]'s `Display`),
    /// so `P12M` and `P1Y` are one job.
    pub duration: String,
    /// `--composite`.
    pub composite: Composite,
    /// `--max-scenes`: acquisitions kept per window and block of cells.
    pub max_scenes: u32,
    /// Whether a window's tasks are blocks of cells (true for every job this
    /// version starts; not part of the fingerprint: it changes which task
    /// writes a row, not the row). A job an older rsembed started records
    /// nothing and keeps its whole-window tasks when resumed: block tasks
    /// would write a second row for a (window, cell) it has.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cell_blocks: bool,
}

impl WindowSpec {
    /// The duration, parsed.
    pub fn calendar(&self) -> Result<CalendarDuration, WindowError> {
        self.duration.parse()
    }

    /// Adds the spec to a job fingerprint.
    pub(crate) fn hash_into(&self, h: &mut crate::ids::IdHasher) {
        h.str("windows")
            .str(&self.duration)
            .str(self.composite.as_str())
            .i64(self.max_scenes.into());
    }
}

#[cfg(test)]
#[path = "window_tests.rs"]
mod tests;
