use time::macros::datetime;

use super::*;

fn d(s: &str) -> CalendarDuration {
    s.parse().unwrap()
}

fn us(t: OffsetDateTime) -> i64 {
    to_us(t)
}

fn err(s: &str) -> String {
    s.parse::<CalendarDuration>().unwrap_err().to_string()
}

#[test]
fn durations_parse_to_months_and_days() {
    let cases = [
        ("P16D", 0, 16),
        ("P1M", 1, 0),
        ("P3M", 3, 0),
        ("P1Y", 12, 0),
        ("P2W", 0, 14),
        ("P1Y2M10D", 14, 10),
        ("P1Y10D", 12, 10),
        ("p1m", 1, 0),
        (" P6M ", 6, 0),
    ];
    for (s, months, days) in cases {
        assert_eq!(d(s), CalendarDuration { months, days }, "{s}");
    }
    assert_eq!(d("P1Y2M10D").to_string(), "P1Y2M10D");
    assert_eq!(d("P2W").to_string(), "P14D");
    assert_eq!(d("P24M").to_string(), "P2Y");
}

#[test]
fn bad_durations_say_why() {
    let cases = [
        ("PT1H", "time parts"),
        ("P1DT12H", "time parts"),
        ("P0D", "cannot be empty"),
        ("P0Y0M", "cannot be empty"),
        ("-P1D", "positive"),
        ("P-1D", "positive"),
        ("P1.5D", "whole numbers"),
        ("P1,5D", "whole numbers"),
        ("P", "at least one part"),
        ("16D", "starts with P"),
        ("", "starts with P"),
        ("P1", "needs its unit"),
        ("P1X", "units are"),
        ("P1M1Y", "order"),
        ("P1D1D", "order"),
        ("P1W2D", "weeks stand alone"),
        ("P1Y1W", "weeks stand alone"),
        ("P1001Y", "more than a window"),
        ("P99999999999D", "too large"),
        ("P1000Y12M", "longer than"),
    ];
    for (s, why) in cases {
        let e = err(s);
        assert!(e.contains(why), "{s}: {e}");
        assert!(e.starts_with("--windows"), "{s}: {e}");
    }
}

#[test]
fn month_ends_are_clamped_from_the_start_each_time() {
    let m = d("P1M");
    let jan31 = datetime!(2024-01-31 10:30 UTC);
    assert_eq!(m.add_times(jan31, 1), Some(datetime!(2024-02-29 10:30 UTC)));
    assert_eq!(m.add_times(jan31, 2), Some(datetime!(2024-03-31 10:30 UTC)));
    assert_eq!(m.add_times(jan31, 3), Some(datetime!(2024-04-30 10:30 UTC)));
    let jan31_23 = datetime!(2023-01-31 0:00 UTC);
    assert_eq!(
        m.add_times(jan31_23, 1),
        Some(datetime!(2023-02-28 0:00 UTC))
    );
    // Leap day plus a year: Feb 28; plus four: Feb 29 again.
    let leap = datetime!(2024-02-29 0:00 UTC);
    assert_eq!(
        d("P1Y").add_times(leap, 1),
        Some(datetime!(2025-02-28 0:00 UTC))
    );
    assert_eq!(
        d("P1Y").add_times(leap, 4),
        Some(datetime!(2028-02-29 0:00 UTC))
    );
    // Months before days: Jan 31 + P1M1D is Mar 1 (Feb 29, then a day).
    assert_eq!(
        d("P1M1D").add_times(jan31, 1),
        Some(datetime!(2024-03-01 10:30 UTC))
    );
    // Days across a leap day.
    let feb28 = datetime!(2024-02-28 0:00 UTC);
    assert_eq!(
        d("P2D").add_times(feb28, 1),
        Some(datetime!(2024-03-01 0:00 UTC))
    );
    assert_eq!(d("P1D").add_times(feb28, 0), Some(feb28));
    assert_eq!(d("P1Y").add_times(datetime!(9999-01-01 0:00 UTC), 1), None);
}

#[test]
fn an_interval_splits_into_half_open_windows_cut_at_its_end() {
    let w = Windows::of_interval("2024-01-01/2024-12-31", d("P3M")).unwrap();
    let got: Vec<_> = w.iter().collect();
    let q = [
        datetime!(2024-01-01 0:00 UTC),
        datetime!(2024-04-01 0:00 UTC),
        datetime!(2024-07-01 0:00 UTC),
        datetime!(2024-10-01 0:00 UTC),
        datetime!(2025-01-01 0:00 UTC),
    ];
    assert_eq!(got.len(), 4);
    for (k, win) in got.iter().enumerate() {
        assert_eq!(win.start, us(q[k]), "{k}");
        assert_eq!(win.end, us(q[k + 1]), "{k}");
    }
    // The last window is cut at the end: 16-day windows over January.
    let w = Windows::of_interval("2024-01-01/2024-01-31", d("P16D")).unwrap();
    let got: Vec<_> = w.iter().collect();
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].start, us(datetime!(2024-01-17 0:00 UTC)));
    assert_eq!(got[1].end, us(datetime!(2024-02-01 0:00 UTC)));
    // Windows from a month end stay on month ends.
    let w = Windows::of_interval("2024-01-31T00:00:00Z/2024-05-01T00:00:00Z", d("P1M")).unwrap();
    let starts: Vec<_> = w.iter().map(|w| w.start).collect();
    let want = [
        datetime!(2024-01-31 0:00 UTC),
        datetime!(2024-02-29 0:00 UTC),
        datetime!(2024-03-31 0:00 UTC),
        datetime!(2024-04-30 0:00 UTC),
    ];
    assert_eq!(starts, want.map(us));
    assert_eq!(
        w.get(3).unwrap().end,
        us(datetime!(2024-05-01 0:00 UTC)) + 1
    );
    assert_eq!(w.get(4), None);
    // One window when the duration outlasts the interval.
    let w = Windows::of_interval("2024-03-01/2024-03-10", d("P1Y")).unwrap();
    assert_eq!(w.len(), 1);
    assert_eq!(w.get(0).unwrap().end, us(datetime!(2024-03-11 0:00 UTC)));
}

#[test]
fn a_datetime_falls_in_the_window_that_holds_it() {
    let w = Windows::of_interval("2024-01-01/2024-12-31", d("P3M")).unwrap();
    let apr1 = us(datetime!(2024-04-01 0:00 UTC));
    assert_eq!(w.index_of(apr1), Some(1), "a start belongs to its window");
    assert_eq!(w.index_of(apr1 - 1), Some(0), "an end does not");
    assert_eq!(w.index_of(us(datetime!(2024-01-01 0:00 UTC))), Some(0));
    assert_eq!(
        w.index_of(us(datetime!(2024-12-31 23:59:59.999999 UTC))),
        Some(3)
    );
    assert_eq!(w.index_of(us(datetime!(2025-01-01 0:00 UTC))), None);
    assert_eq!(w.index_of(us(datetime!(2023-12-31 23:59 UTC))), None);
    assert_eq!(w.index_of(us(datetime!(2024-08-15 12:00 UTC))), Some(2));
}

#[test]
fn bad_intervals_and_too_many_windows_are_refused() {
    let e = Windows::of_interval("2024-01-01/..", d("P1M")).unwrap_err();
    assert!(e.to_string().contains("both ends"), "{e}");
    let e = Windows::of_interval("2024-01-01", d("P1M")).unwrap_err();
    assert!(e.to_string().contains("not one time"), "{e}");
    let e = Windows::split(5, 5, d("P1D")).unwrap_err();
    assert!(e.to_string().contains("before its end"), "{e}");
    // 300 years of days: more than MAX_WINDOWS, refused without building them all.
    let e = Windows::of_interval("1800-01-01/2099-12-31", d("P1D")).unwrap_err();
    assert!(e.to_string().contains("more than 100000 windows"), "{e}");
    // 270 years of days is allowed.
    let w = Windows::of_interval("1800-01-01/2069-12-31", d("P1D")).unwrap();
    assert!(w.len() <= MAX_WINDOWS);
    assert_eq!(w.len(), 98_616);
}
