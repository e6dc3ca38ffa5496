//! Calendar periods: exact bounds across clock changes, month lengths,
//! leap days and year ends, and fixed windows counted per local period.
//!
//! Expected instants are written as UTC civil times with the zone's offset
//! worked out by hand, so they do not come from the code under test.

use std::num::NonZeroU64;
use std::sync::Arc;

use jiff::civil::{Date, Weekday, date};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan, Zoned};
use proptest::prelude::*;
use quotad_core::calendar::{Calendar, CalendarError, Period, Zone, tzdb_version};
use quotad_core::{
    Algorithm, CheckItem, FakeClock, MemoryStore, OnFull, Policy, PolicyError, Reason,
    SNAPSHOT_VERSION, SnapshotReader, StoreConfig, decide, peek,
};

const HOUR: u64 = 3_600_000;
const MINUTE: u64 = 60_000;
const DAY: u64 = 24 * HOUR;

/// The instant `y-m-d h:mi` UTC, in ms.
fn utc(y: i16, m: i8, d: i8, h: i8, mi: i8) -> u64 {
    let ts = date(y, m, d)
        .at(h, mi, 0, 0)
        .to_zoned(TimeZone::UTC)
        .expect("a valid UTC time")
        .timestamp();
    u64::try_from(ts.as_millisecond()).expect("after the epoch")
}

fn cal(period: Period, zone: &str) -> Calendar {
    Calendar::new(period, Zone::named(zone).expect("a bundled zone"))
}

/// The bounds of the period holding `at`, checked at its first and last
/// millisecond too.
fn bounds_everywhere(c: &Calendar, at: u64) -> (u64, u64) {
    let (start, end) = c.bounds(at);
    assert_eq!(c.bounds(start), (start, end), "{c} at its start");
    assert_eq!(c.bounds(end - 1), (start, end), "{c} at its last ms");
    assert_ne!(c.bounds(end).0, start, "{c} at its end is the next period");
    (start, end)
}

#[test]
fn new_york_has_a_23_hour_day_in_march_and_a_25_hour_day_in_november() {
    let day = cal(Period::Day, "America/New_York");
    // 2024-03-10: midnight is EST (-05:00), the next is EDT (-04:00).
    let (s, e) = bounds_everywhere(&day, utc(2024, 3, 10, 12, 0));
    assert_eq!((s, e), (utc(2024, 3, 10, 5, 0), utc(2024, 3, 11, 4, 0)));
    assert_eq!(e - s, 23 * HOUR);
    // 2024-11-03: EDT midnight, then EST midnight.
    let (s, e) = bounds_everywhere(&day, utc(2024, 11, 3, 12, 0));
    assert_eq!((s, e), (utc(2024, 11, 3, 4, 0), utc(2024, 11, 4, 5, 0)));
    assert_eq!(e - s, 25 * HOUR);
}

#[test]
fn berlin_has_a_23_hour_day_in_march_and_a_25_hour_day_in_october() {
    let day = cal(Period::Day, "Europe/Berlin");
    // 2024-03-31: CET (+01:00) midnight, CEST (+02:00) the next.
    let (s, e) = bounds_everywhere(&day, utc(2024, 3, 31, 10, 0));
    assert_eq!((s, e), (utc(2024, 3, 30, 23, 0), utc(2024, 3, 31, 22, 0)));
    assert_eq!(e - s, 23 * HOUR);
    // 2024-10-27: CEST midnight, CET the next.
    let (s, e) = bounds_everywhere(&day, utc(2024, 10, 27, 10, 0));
    assert_eq!((s, e), (utc(2024, 10, 26, 22, 0), utc(2024, 10, 27, 23, 0)));
    assert_eq!(e - s, 25 * HOUR);
}

#[test]
fn lord_howe_shifts_by_thirty_minutes() {
    let day = cal(Period::Day, "Australia/Lord_Howe");
    // 2024-10-06: +10:30 midnight, +11:00 the next: 23.5 hours.
    let (s, e) = bounds_everywhere(&day, utc(2024, 10, 6, 0, 0));
    assert_eq!((s, e), (utc(2024, 10, 5, 13, 30), utc(2024, 10, 6, 13, 0)));
    assert_eq!(e - s, 23 * HOUR + 30 * MINUTE);
    // 2024-04-07: +11:00 midnight, +10:30 the next: 24.5 hours.
    let (s, e) = bounds_everywhere(&day, utc(2024, 4, 7, 0, 0));
    assert_eq!((s, e), (utc(2024, 4, 6, 13, 0), utc(2024, 4, 7, 13, 30)));
    assert_eq!(e - s, 24 * HOUR + 30 * MINUTE);
}

#[test]
fn kathmandu_days_start_at_a_quarter_past_six_utc() {
    // +05:45 all year.
    let day = cal(Period::Day, "Asia/Kathmandu");
    let (s, e) = bounds_everywhere(&day, utc(2024, 6, 15, 12, 0));
    assert_eq!((s, e), (utc(2024, 6, 14, 18, 15), utc(2024, 6, 15, 18, 15)));
    // 18:14 UTC is still the 15th there; 18:15 is the 16th.
    assert_eq!(day.bounds(utc(2024, 6, 15, 18, 14)).0, s);
    assert_eq!(day.bounds(utc(2024, 6, 15, 18, 15)).0, e);
}

/// The instant `y-m-d h:mi:ss` UTC, in ms.
fn utc_s(y: i16, m: i8, d: i8, h: i8, mi: i8, sec: i8) -> u64 {
    utc(y, m, d, h, mi) + u64::try_from(sec).expect("positive") * 1_000
}

#[test]
fn where_the_clocks_change_at_midnight_the_day_starts_at_the_first_instant_after_the_gap() {
    // Each zone springs forward from 00:00 to 01:00 local: that day's first
    // instant is the transition, and the day is 23 hours long.
    // (zone, transition = first instant of the day in UTC, next midnight in UTC)
    let cases = [
        // Santiago, 2024-09-08: -04 -> -03.
        (
            "America/Santiago",
            utc(2024, 9, 8, 4, 0),
            utc(2024, 9, 9, 3, 0),
        ),
        // Havana, 2024-03-10: CST -05 -> CDT -04.
        (
            "America/Havana",
            utc(2024, 3, 10, 5, 0),
            utc(2024, 3, 11, 4, 0),
        ),
        // Beirut, 2024-03-31: EET +02 -> EEST +03.
        (
            "Asia/Beirut",
            utc(2024, 3, 30, 22, 0),
            utc(2024, 3, 31, 21, 0),
        ),
        // Asuncion, 2024-10-06: -04 -> -03.
        (
            "America/Asuncion",
            utc(2024, 10, 6, 4, 0),
            utc(2024, 10, 7, 3, 0),
        ),
    ];
    for (zone, first, next) in cases {
        let day = cal(Period::Day, zone);
        let (s, e) = bounds_everywhere(&day, first + 12 * HOUR);
        assert_eq!((s, e), (first, next), "{zone}");
        assert_eq!(e - s, 23 * HOUR, "{zone}");
        // The day before ends exactly where this one starts.
        assert_eq!(day.bounds(first - 1).1, first, "{zone}");
        assert_eq!(
            day.bounds(first - 1).1 - day.bounds(first - 1).0,
            DAY,
            "{zone}"
        );
    }
}

#[test]
fn where_the_clocks_go_back_at_midnight_the_day_starts_at_the_earlier_midnight() {
    // Havana, 2024-11-03: at 01:00 CDT (-04) back to 00:00 CST (-05), so
    // midnight happens twice; the day starts at the first, 04:00 UTC, and
    // lasts 25 hours, to 2024-11-04 00:00 CST.
    let day = cal(Period::Day, "America/Havana");
    let (s, e) = bounds_everywhere(&day, utc(2024, 11, 3, 4, 30));
    assert_eq!((s, e), (utc(2024, 11, 3, 4, 0), utc(2024, 11, 4, 5, 0)));
    // The second 00:30 is the same day.
    assert_eq!(day.bounds(utc(2024, 11, 3, 5, 30)), (s, e));
    // Santiago, 2024-04-07: at 00:00 -03 back to 23:00 -04 on the 6th, so
    // the 6th is 25 hours long and the 7th starts at its only midnight.
    let day = cal(Period::Day, "America/Santiago");
    let (s, e) = bounds_everywhere(&day, utc(2024, 4, 7, 3, 30));
    assert_eq!((s, e), (utc(2024, 4, 6, 3, 0), utc(2024, 4, 7, 4, 0)));
    assert_eq!(e - s, 25 * HOUR);
    // Beirut, 2024-10-27 and Asuncion, 2024-03-24: the same, at +03 -> +02
    // and -03 -> -04.
    let day = cal(Period::Day, "Asia/Beirut");
    let (s, e) = bounds_everywhere(&day, utc(2024, 10, 26, 12, 0));
    assert_eq!((s, e), (utc(2024, 10, 25, 21, 0), utc(2024, 10, 26, 22, 0)));
    let day = cal(Period::Day, "America/Asuncion");
    let (s, e) = bounds_everywhere(&day, utc(2024, 3, 23, 12, 0));
    assert_eq!((s, e), (utc(2024, 3, 23, 3, 0), utc(2024, 3, 24, 4, 0)));
}

#[test]
fn an_hour_repeated_across_midnight_belongs_to_the_day_that_began_at_the_first_midnight() {
    // Goose Bay, 2010-11-07: midnight ADT (-03) is 03:00 UTC; at 00:01 ADT
    // (03:01 UTC) the clocks go back to 23:01 AST (-04) on the 6th. The 7th
    // has begun, so the wall clock's second 23:01-23:59 of the 6th is the
    // 7th's, which lasts to 2010-11-08 00:00 AST = 04:00 UTC: 25 hours.
    let day = cal(Period::Day, "America/Goose_Bay");
    let seventh = (utc(2010, 11, 7, 3, 0), utc(2010, 11, 8, 4, 0));
    assert_eq!(
        day.bounds(utc(2010, 11, 6, 12, 0)),
        (utc(2010, 11, 6, 3, 0), seventh.0)
    );
    for at in [
        seventh.0,
        utc(2010, 11, 7, 3, 1) - 1,
        utc(2010, 11, 7, 3, 1), // 23:01 AST on the 6th, again
        utc(2010, 11, 7, 3, 30),
        utc(2010, 11, 7, 4, 0) - 1,
        utc(2010, 11, 7, 4, 0), // 00:00 AST: the second midnight
        seventh.1 - 1,
    ] {
        assert_eq!(day.bounds(at), seventh, "at {at}");
    }
    assert_eq!(seventh.1 - seventh.0, 25 * HOUR);
    // The week from Sunday the 7th starts at the same first midnight.
    let week = cal(Period::Week(Weekday::Sunday), "America/Goose_Bay");
    assert_eq!(
        week.bounds(utc(2010, 11, 7, 3, 30)),
        (seventh.0, utc(2010, 11, 14, 4, 0))
    );
    // St. John's, 1987-10-25, half an hour off: 00:01 NDT (-02:30) back to
    // 23:01 NST (-03:30); the 25th runs from 02:30 UTC to 03:30 UTC on the
    // 26th.
    let day = cal(Period::Day, "America/St_Johns");
    let twenty_fifth = (utc(1987, 10, 25, 2, 30), utc(1987, 10, 26, 3, 30));
    assert_eq!(day.bounds(utc_s(1987, 10, 25, 2, 31, 0)), twenty_fifth);
    assert_eq!(day.bounds(utc_s(1987, 10, 25, 3, 29, 59)), twenty_fifth);
}

#[test]
fn a_decision_in_the_repeated_hour_resets_at_the_next_first_midnight_exactly() {
    let policy = Policy::calendar(
        Algorithm::FixedWindow,
        2,
        cal(Period::Day, "America/Goose_Bay"),
    )
    .expect("valid");
    let first = utc(2010, 11, 7, 3, 0) + 17;
    let (state, d) = decide(&policy, None, first, one());
    assert!(d.allowed);
    assert_eq!(d.reset_after_ms, utc(2010, 11, 8, 4, 0) - first);
    // Thirty minutes later the wall clock reads the 6th again: the same
    // count, the same reset.
    let later = utc(2010, 11, 7, 3, 30);
    let (state, d) = decide(&policy, state, later, one());
    assert!(d.allowed);
    assert_eq!(d.remaining, 0);
    assert_eq!(d.reset_after_ms, utc(2010, 11, 8, 4, 0) - later);
    let (_, denied) = decide(&policy, state, later + 1, one());
    assert!(!denied.allowed);
    assert_eq!(denied.retry_after_ms, utc(2010, 11, 8, 4, 0) - later - 1);
}

#[test]
fn months_last_28_29_30_and_31_days() {
    // Asia/Kolkata: +05:30 all year, so months are whole days long.
    let month = cal(Period::Month, "Asia/Kolkata");
    for (y, m, days) in [
        (2023, 2, 28),
        (2024, 2, 29),
        (2024, 4, 30),
        (2024, 1, 31),
        (2024, 12, 31),
    ] {
        let (s, e) = bounds_everywhere(&month, utc(y, m, 10, 0, 0));
        let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
        // Local midnight of the 1st is 18:30 UTC the day before.
        let first = utc(y, m, 1, 0, 0) - 5 * HOUR - 30 * MINUTE;
        let next = utc(ny, nm, 1, 0, 0) - 5 * HOUR - 30 * MINUTE;
        assert_eq!((s, e), (first, next), "{y}-{m}");
        assert_eq!(e - s, days * DAY, "{y}-{m}");
    }
    // A month with a clock change is an hour short: March in New York.
    let month = cal(Period::Month, "America/New_York");
    let (s, e) = bounds_everywhere(&month, utc(2024, 3, 15, 0, 0));
    assert_eq!((s, e), (utc(2024, 3, 1, 5, 0), utc(2024, 4, 1, 4, 0)));
    assert_eq!(e - s, 31 * DAY - HOUR);
}

#[test]
fn february_29th_is_a_day_of_its_own() {
    let day = cal(Period::Day, "UTC");
    let (s, e) = bounds_everywhere(&day, utc(2024, 2, 29, 12, 0));
    assert_eq!((s, e), (utc(2024, 2, 29, 0, 0), utc(2024, 3, 1, 0, 0)));
    assert_eq!(day.bounds(s - 1), (utc(2024, 2, 28, 0, 0), s));
}

#[test]
fn december_31st_turns_into_january_1st_at_local_midnight() {
    let ny = "America/New_York";
    let last_ms = utc(2025, 1, 1, 5, 0) - 1; // 2024-12-31 23:59:59.999 EST
    let year = cal(Period::Year, ny);
    assert_eq!(
        year.bounds(last_ms),
        (utc(2024, 1, 1, 5, 0), utc(2025, 1, 1, 5, 0))
    );
    assert_eq!(
        year.bounds(last_ms + 1),
        (utc(2025, 1, 1, 5, 0), utc(2026, 1, 1, 5, 0))
    );
    // 2024 is a leap year: 366 days; 2025 is 365.
    let (s, e) = year.bounds(last_ms);
    assert_eq!(e - s, 366 * DAY);
    let day = cal(Period::Day, ny);
    assert_eq!(
        day.bounds(last_ms),
        (utc(2024, 12, 31, 5, 0), utc(2025, 1, 1, 5, 0))
    );
    let month = cal(Period::Month, ny);
    assert_eq!(month.bounds(last_ms + 1).0, utc(2025, 1, 1, 5, 0));
}

#[test]
fn weeks_start_on_the_configured_day() {
    let ny = "America/New_York";
    // Wednesday 2024-03-13; the Sunday before is the 23-hour day.
    let at = utc(2024, 3, 13, 12, 0);
    let sunday = cal(Period::Week(Weekday::Sunday), ny);
    assert_eq!(
        bounds_everywhere(&sunday, at),
        (utc(2024, 3, 10, 5, 0), utc(2024, 3, 17, 4, 0))
    );
    let monday = cal(Period::Week(Weekday::Monday), ny);
    assert_eq!(
        bounds_everywhere(&monday, at),
        (utc(2024, 3, 11, 4, 0), utc(2024, 3, 18, 4, 0))
    );
    // A week starting today starts at this midnight.
    let wednesday = cal(Period::Week(Weekday::Wednesday), ny);
    assert_eq!(wednesday.bounds(at).0, utc(2024, 3, 13, 4, 0));
}

#[test]
fn unknown_names_are_refused_and_known_ones_kept_as_the_database_spells_them() {
    assert_eq!(
        Zone::named("Mars/Olympus_Mons"),
        Err(CalendarError::UnknownZone("Mars/Olympus_Mons".into()))
    );
    assert_eq!(
        Zone::named("america/new_york").map(Zone::name),
        Ok("America/New_York")
    );
    assert!("fortnight".parse::<Period>().is_err());
    for spec in ["day@UTC", "week:sunday@Asia/Kolkata", "month@Europe/Berlin"] {
        let c = Calendar::from_spec(spec).expect("a spec");
        assert_eq!(c.spec(), spec);
    }
    assert!(!tzdb_version().is_empty());
}

#[test]
fn only_a_fixed_window_takes_a_period() {
    let day = cal(Period::Day, "UTC");
    for algorithm in Algorithm::ALL {
        let made = Policy::calendar(algorithm, 10, day);
        if algorithm == Algorithm::FixedWindow {
            assert_eq!(made.map(|p| p.calendar_period()), Ok(Some(day)));
        } else {
            assert_eq!(made, Err(PolicyError::PeriodNotApplicable(algorithm)));
        }
    }
    assert_eq!(
        Policy::calendar(Algorithm::FixedWindow, 0, day),
        Err(PolicyError::LimitZero)
    );
}

fn one() -> NonZeroU64 {
    NonZeroU64::MIN
}

#[test]
fn a_daily_quota_resets_exactly_at_local_midnight_across_the_23_hour_day() {
    let policy = Policy::calendar(
        Algorithm::FixedWindow,
        2,
        cal(Period::Day, "America/New_York"),
    )
    .expect("valid");
    let midnight = utc(2024, 3, 11, 4, 0);
    let now = utc(2024, 3, 10, 5, 0) + HOUR; // 01:00 EST, the day's first hour
    let (state, first) = decide(&policy, None, now, one());
    assert!(first.allowed);
    assert_eq!(first.reset_after_ms, midnight - now);
    let (state, _) = decide(&policy, state, now + 1, one());
    let (state, denied) = decide(&policy, state, now + 2, one());
    assert_eq!(denied.reason, Reason::LimitExceeded);
    assert_eq!(denied.retry_after_ms, midnight - (now + 2));
    assert_eq!(denied.retry_after_ms, 22 * HOUR - 2);
    // Denied at the last ms of the day, admitted at the first of the next.
    assert!(!peek(&policy, state.as_ref(), midnight - 1, one()).allowed);
    let (_, next) = decide(&policy, state, midnight, one());
    assert!(next.allowed);
    assert_eq!(next.remaining, 1);
    assert_eq!(next.reset_after_ms, 24 * HOUR);
}

#[test]
fn a_count_never_leaks_into_the_next_month() {
    let policy = Policy::calendar(
        Algorithm::FixedWindow,
        5,
        cal(Period::Month, "Europe/Berlin"),
    )
    .expect("valid");
    let march_end = utc(2024, 3, 31, 22, 0); // 2024-04-01 00:00 CEST
    let (state, d) = decide(&policy, None, march_end - 1, NonZeroU64::new(5).expect("5"));
    assert!(d.allowed && d.remaining == 0);
    assert_eq!(d.reset_after_ms, 1);
    let (_, april) = decide(&policy, state, march_end, one());
    assert_eq!(april.remaining, 4);
    assert_eq!(april.reset_after_ms, 30 * DAY);
}

#[test]
fn a_count_begun_in_one_zone_is_honoured_in_another_until_its_period_ends() {
    let berlin = Policy::calendar(Algorithm::FixedWindow, 2, cal(Period::Day, "Europe/Berlin"))
        .expect("valid");
    let tokyo =
        Policy::calendar(Algorithm::FixedWindow, 2, cal(Period::Day, "Asia/Tokyo")).expect("valid");
    // 2024-06-01 12:00 UTC: 14:00 in Berlin (CEST), 21:00 in Tokyo.
    let now = utc(2024, 6, 1, 12, 0);
    let berlin_midnight = utc(2024, 6, 1, 22, 0);
    let (state, _) = decide(&berlin, None, now, one());
    let (state, _) = decide(&berlin, state, now, one());
    // Tokyo's day began at 15:00 UTC yesterday, but the count is Berlin's
    // day's, which runs to Berlin's midnight: Tokyo honours it.
    let denied = peek(&tokyo, state.as_ref(), now, one());
    assert!(!denied.allowed);
    assert_eq!(denied.retry_after_ms, berlin_midnight - now);
    assert!(!peek(&tokyo, state.as_ref(), berlin_midnight - 1, one()).allowed);
    // Once Berlin's day is over, Tokyo counts its own day, to 15:00 UTC.
    let (state, d) = decide(&tokyo, state, berlin_midnight, one());
    assert!(d.allowed);
    assert_eq!(d.remaining, 1);
    assert_eq!(d.reset_after_ms, utc(2024, 6, 2, 15, 0) - berlin_midnight);
    // And Berlin, in its next day, honours Tokyo's count.
    let d = peek(&berlin, state.as_ref(), berlin_midnight + HOUR, one());
    assert_eq!(
        (d.remaining, d.reset_after_ms),
        (1, utc(2024, 6, 2, 15, 0) - berlin_midnight - HOUR)
    );
}

#[test]
fn a_week_counted_from_monday_is_honoured_by_a_week_from_sunday() {
    let monday = cal(Period::Week(Weekday::Monday), "UTC");
    let sunday = cal(Period::Week(Weekday::Sunday), "UTC");
    let from_monday = Policy::calendar(Algorithm::FixedWindow, 1, monday).expect("valid");
    let from_sunday = Policy::calendar(Algorithm::FixedWindow, 1, sunday).expect("valid");
    // Wednesday 2024-06-05; the Monday week ends Monday 2024-06-10.
    let now = utc(2024, 6, 5, 12, 0);
    let (state, _) = decide(&from_monday, None, now, one());
    let sunday_9th = utc(2024, 6, 9, 0, 0);
    assert!(!peek(&from_sunday, state.as_ref(), sunday_9th, one()).allowed);
    assert!(peek(&from_sunday, state.as_ref(), utc(2024, 6, 10, 0, 0), one()).allowed);
}

#[test]
fn state_counted_under_another_period_kind_or_a_plain_window_is_fresh() {
    let day = Policy::calendar(Algorithm::FixedWindow, 1, cal(Period::Day, "Europe/Berlin"))
        .expect("valid");
    let month = Policy::calendar(
        Algorithm::FixedWindow,
        1,
        cal(Period::Month, "Europe/Berlin"),
    )
    .expect("valid");
    let now = utc(2024, 6, 1, 12, 0);
    let (state, _) = decide(&day, None, now, one());
    assert!(!peek(&day, state.as_ref(), now, one()).allowed);
    assert!(peek(&month, state.as_ref(), now, one()).allowed);
    // A plain 1-day window does not read a calendar's count either.
    let plain = Policy::try_new(
        Algorithm::FixedWindow,
        1,
        std::time::Duration::from_millis(DAY),
        None,
    )
    .expect("valid");
    assert!(peek(&plain, state.as_ref(), now, one()).allowed);
}

#[test]
fn a_reload_to_another_zone_keeps_the_count_of_the_day_already_begun() {
    let start = utc(2024, 6, 1, 12, 0);
    let clock = Arc::new(FakeClock::new(start));
    let config = StoreConfig::try_new(1_000, 16, OnFull::Deny).expect("valid");
    let store = MemoryStore::new(config, clock.clone());
    let daily = |zone| {
        let policy =
            Policy::calendar(Algorithm::FixedWindow, 3, cal(Period::Day, zone)).expect("valid");
        CheckItem::new("daily", policy, "alice", 1).expect("valid")
    };
    let before = daily("America/New_York");
    for _ in 0..3 {
        assert!(store.check_one(&before).allowed);
    }
    // The policy is reloaded in Tokyo's zone, where a new day began at
    // 15:00 UTC: the count of New York's day (to 04:00 UTC) still holds.
    let after = daily("Asia/Tokyo");
    clock.advance(std::time::Duration::from_millis(4 * HOUR));
    let denied = store.check_one(&after);
    assert!(!denied.allowed);
    assert_eq!(
        denied.retry_after_ms,
        utc(2024, 6, 2, 4, 0) - utc(2024, 6, 1, 16, 0)
    );
    clock.advance(std::time::Duration::from_millis(denied.retry_after_ms));
    let next = store.check_one(&after);
    assert!(next.allowed);
    assert_eq!(next.remaining, 2);
    assert_eq!(
        next.reset_after_ms,
        utc(2024, 6, 2, 15, 0) - utc(2024, 6, 2, 4, 0)
    );
}

#[test]
fn the_memory_store_counts_a_daily_quota_per_local_day() {
    let start = utc(2024, 11, 3, 4, 0); // 2024-11-03 00:00 EDT: a 25-hour day
    let clock = Arc::new(FakeClock::new(start));
    let config = StoreConfig::try_new(1_000, 16, OnFull::Deny).expect("valid");
    let store = MemoryStore::new(config, clock.clone());
    let policy = Policy::calendar(
        Algorithm::FixedWindow,
        3,
        cal(Period::Day, "America/New_York"),
    )
    .expect("valid");
    let item = CheckItem::new("daily", policy, "alice", 1).expect("valid");
    for _ in 0..3 {
        assert!(store.check_one(&item).allowed);
    }
    clock.advance(std::time::Duration::from_millis(24 * HOUR));
    // 24 hours later it is 23:00 EST on the same local day.
    let denied = store.check_one(&item);
    assert!(!denied.allowed);
    assert_eq!(denied.retry_after_ms, HOUR);
    clock.advance(std::time::Duration::from_millis(HOUR));
    let next = store.check_one(&item);
    assert!(next.allowed);
    assert_eq!(next.remaining, 2);
}

#[test]
fn a_calendar_count_keeps_the_end_of_its_period_across_a_snapshot() {
    let at = utc(2024, 6, 1, 12, 0);
    let clock = Arc::new(FakeClock::new(at));
    let config = || StoreConfig::try_new(1_000, 4, OnFull::Deny).expect("valid");
    let store = MemoryStore::new(config(), clock.clone());
    let daily = |zone| {
        let policy =
            Policy::calendar(Algorithm::FixedWindow, 3, cal(Period::Day, zone)).expect("valid");
        CheckItem::new("daily", policy, "alice", 1).expect("valid")
    };
    for _ in 0..3 {
        assert!(store.check_one(&daily("America/New_York")).allowed);
    }
    let mut bytes = Vec::new();
    store.export(&mut bytes, b"").expect("into a Vec");
    assert_eq!(bytes[8..12], SNAPSHOT_VERSION.to_le_bytes());
    let (restored, report) = SnapshotReader::open(&bytes[..])
        .expect("open")
        .load(config(), clock, |_| true)
        .expect("load");
    assert_eq!(report.total().loaded, 1);
    // Restored under Tokyo's day, the count still runs to New York's
    // midnight (04:00 UTC), which only the snapshot can tell.
    let denied = restored.peek(&daily("Asia/Tokyo"));
    assert!(!denied.allowed);
    assert_eq!(denied.retry_after_ms, utc(2024, 6, 2, 4, 0) - at);
}

#[test]
fn a_version_4_snapshot_still_loads_and_keeps_its_calendar_count_to_the_period_end() {
    // Written by the build before calendar counts carried their period's
    // end (format version 4), at 2024-06-01 12:00 UTC: "minute" (10 per
    // minute) and "daily" (10 a day in New York), 3 units of each by alice.
    let bytes = include_bytes!("fixtures/snapshot-v4-calendar.bin");
    assert_eq!(bytes[8..12], 4u32.to_le_bytes());
    let at = utc(2024, 6, 1, 12, 0);
    let clock = Arc::new(FakeClock::new(at));
    let config = StoreConfig::try_new(1_000, 4, OnFull::Deny).expect("valid");
    let (restored, report) = SnapshotReader::open(&bytes[..])
        .expect("a version 4 snapshot opens")
        .load(config, clock, |_| true)
        .expect("and loads");
    assert_eq!(report.total().loaded, 2);
    let minute = Policy::try_new(
        Algorithm::FixedWindow,
        10,
        std::time::Duration::from_secs(60),
        None,
    )
    .expect("valid");
    let plain = CheckItem::new("minute", minute, "alice", 1).expect("valid");
    assert_eq!(restored.peek(&plain).remaining, 7);
    // The calendar count was bound to its zone as well as its period, and
    // had no end: it is read as the day's count, to New York's midnight.
    let daily = |zone| {
        let policy =
            Policy::calendar(Algorithm::FixedWindow, 10, cal(Period::Day, zone)).expect("valid");
        CheckItem::new("daily", policy, "alice", 1).expect("valid")
    };
    let d = restored.peek(&daily("America/New_York"));
    assert_eq!(
        (d.remaining, d.reset_after_ms),
        (7, utc(2024, 6, 2, 4, 0) - at)
    );
    assert_eq!(restored.peek(&daily("Asia/Tokyo")).remaining, 7);
}

// An independent account of "the local period": the period's key from
// the local date alone, and the bounds are where the key changes.

const ZONES: [&str; 16] = [
    "America/New_York",
    // Clocks that change at local midnight.
    "America/Santiago",
    "America/Havana",
    "Asia/Beirut",
    "America/Asuncion",
    // Clocks that go back from 00:01 to 23:01: an hour of the previous
    // date after midnight (until 2010 and 2011).
    "America/Goose_Bay",
    "America/St_Johns",
    "America/Moncton",
    // A whole day skipped (2011-12-30).
    "Pacific/Apia",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
    "Asia/Kolkata",
    "America/Sao_Paulo",
    "Pacific/Chatham",
    "UTC",
];

fn period_of(i: usize) -> Period {
    match i {
        0 => Period::Day,
        1 => Period::Month,
        2 => Period::Year,
        n => Period::Week(match n % 7 {
            0 => Weekday::Monday,
            1 => Weekday::Tuesday,
            2 => Weekday::Wednesday,
            3 => Weekday::Thursday,
            4 => Weekday::Friday,
            5 => Weekday::Saturday,
            _ => Weekday::Sunday,
        }),
    }
}

fn zoned(ms: u64, zone: &str) -> Zoned {
    let tz = TimeZone::get(zone).expect("a zone");
    Timestamp::from_millisecond(i64::try_from(ms).expect("small"))
        .expect("in range")
        .to_zoned(tz)
}

/// The local date that names `ms`'s period: the local date's period, or
/// when the clocks went back across midnight (the wall clock reads the
/// previous date again), the later one that had already begun.
fn key(period: Period, ms: u64, zone: &str) -> Date {
    let wall = wall_key(period, ms, zone);
    let tz = TimeZone::get(zone).expect("a zone");
    let at = Timestamp::from_millisecond(i64::try_from(ms).expect("small")).expect("in range");
    let Some(last) = tz.preceding(at).next() else {
        return wall;
    };
    let before = u64::try_from(last.timestamp().as_millisecond()).unwrap_or(0);
    if before == 0 || ms.saturating_sub(before) > DAY {
        return wall;
    }
    wall.max(wall_key(period, before - 1, zone))
}

/// The period of the local date of `ms`, as the wall clock reads it.
fn wall_key(period: Period, ms: u64, zone: &str) -> Date {
    let mut d = zoned(ms, zone).date();
    match period {
        Period::Day => d,
        Period::Month => date(d.year(), d.month(), 1),
        Period::Year => date(d.year(), 1, 1),
        Period::Week(start) => {
            while d.weekday() != start {
                d = d.yesterday().expect("in range");
            }
            d
        }
    }
}

/// `Calendar::bounds` at `at` against the independent account.
fn holds_the_local_period(at: u64, zone: &str, period: Period) -> Result<(), TestCaseError> {
    let c = cal(period, zone);
    let (start, end) = c.bounds(at);
    prop_assert!(start <= at && at < end);
    let here = key(period, at, zone);
    prop_assert_eq!(key(period, start, zone), here);
    prop_assert_ne!(key(period, start - 1, zone), here);
    prop_assert_eq!(key(period, end - 1, zone), here);
    prop_assert_ne!(key(period, end, zone), here);
    // And jiff's own arithmetic on a zoned time agrees, wherever the
    // wall clock names the period (not in an hour repeated across
    // midnight).
    if wall_key(period, at, zone) != here {
        return Ok(());
    }
    let z_at = zoned(at, zone);
    let first = match period {
        Period::Day => z_at.start_of_day(),
        Period::Month => z_at.first_of_month().and_then(|m| m.start_of_day()),
        Period::Year => z_at.first_of_year().and_then(|y| y.start_of_day()),
        Period::Week(start) => {
            let back = z_at.weekday().since(start);
            z_at.checked_sub(i64::from(back).days())
                .and_then(|d| d.start_of_day())
        }
    }
    .expect("in range");
    prop_assert_eq!(
        u64::try_from(first.timestamp().as_millisecond()).expect("after the epoch"),
        start
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn the_bounds_are_where_the_local_period_begins_and_ends(
        at in 63_158_400_000u64..4_102_444_800_000, // 1972-01-02 to 2100-01-01
        z in 0..ZONES.len(),
        p in 0usize..10,
    ) {
        holds_the_local_period(at, ZONES[z], period_of(p))?;
    }

    #[test]
    fn the_bounds_hold_within_hours_of_every_clock_change(
        n in 0usize..120,
        offset_ms in -90 * MINUTE as i64..90 * MINUTE as i64,
        z in 1..10usize,
        p in 0usize..10,
    ) {
        // The zones whose clocks change at or across midnight.
        let zone = ZONES[z];
        let tz = TimeZone::get(zone).expect("a zone");
        let from = Timestamp::from_second(63_158_400).expect("1972");
        // The zone's n-th clock change from 1972 (its last, for a zone with
        // fewer), then up to 90 minutes either side.
        let Some(change) = tz.following(from).take(n + 1).last() else {
            return Ok(());
        };
        let ms = change.timestamp().as_millisecond() + offset_ms;
        let at = u64::try_from(ms).expect("after 1972");
        holds_the_local_period(at, zone, period_of(p))?;
    }

    #[test]
    fn a_calendar_decision_resets_at_the_next_local_period_start(
        at in 63_158_400_000u64..4_102_444_800_000,
        z in 0..ZONES.len(),
        p in 0usize..10,
        limit in 1u64..4,
    ) {
        let c = cal(period_of(p), ZONES[z]);
        let policy = Policy::calendar(Algorithm::FixedWindow, limit, c).expect("valid");
        let (_, end) = c.bounds(at);
        let mut state = None;
        for _ in 0..limit {
            let (s, d) = decide(&policy, state, at, one());
            prop_assert!(d.allowed);
            prop_assert_eq!(d.reset_after_ms, end - at);
            state = s;
        }
        let (state, denied) = decide(&policy, state, at, one());
        prop_assert_eq!(denied.retry_after_ms, end - at);
        prop_assert!(!peek(&policy, state.as_ref(), end - 1, one()).allowed);
        prop_assert!(peek(&policy, state.as_ref(), end, one()).allowed);
    }

    #[test]
    fn two_zones_on_one_key_admit_at_most_a_limit_per_period_begun_within_a_period(
        za in 0..PAIRED.len(),
        zb in 0..PAIRED.len(),
        week in any::<bool>(),
        day_a in 0usize..7,
        day_b in 0usize..7,
        from in 1_704_067_200_000u64..1_735_689_600_000, // 2024
        steps in proptest::collection::vec((any::<bool>(), 0u64..8 * HOUR, 1u64..4), 1..80),
        limit in 1u64..6,
    ) {
        let period = |d: usize| if week { period_of(3 + d) } else { Period::Day };
        let a = cal(period(day_a), PAIRED[za]);
        let b = cal(period(day_b), PAIRED[zb]);
        let pa = Policy::calendar(Algorithm::FixedWindow, limit, a).expect("valid");
        let pb = Policy::calendar(Algorithm::FixedWindow, limit, b).expect("valid");
        let mut state = None;
        let mut at = from;
        let mut admitted = Vec::new();
        for (on_a, step, cost) in steps {
            at += step;
            let policy = if on_a { &pa } else { &pb };
            let cost = NonZeroU64::new(cost).expect("non-zero");
            let (next, d) = decide(policy, state, at, cost);
            state = next;
            if d.allowed {
                admitted.push((at, cost.get()));
            }
        }
        // In every period of either calendar: at most a limit for the
        // period itself and one for each period of the other calendar
        // that begins within it (for two zones' days, at most two limits).
        for (mine, other) in [(a, b), (b, a)] {
            let mut periods = std::collections::BTreeMap::<(u64, u64), u64>::new();
            for &(t, cost) in &admitted {
                *periods.entry(mine.bounds(t)).or_default() += cost;
            }
            for ((start, end), units) in periods {
                let mut begun = 0;
                let mut s = other.bounds(start).1;
                while s < end {
                    begun += 1;
                    s = other.bounds(s).1;
                }
                prop_assert!(
                    units <= limit * (1 + begun),
                    "{units} units in {mine} from {start} to {end}, {begun} of {other} begun in it"
                );
            }
        }
    }
}

/// Zones paired in the two-zone property test: far apart, half-hour and
/// quarter-hour offsets, both hemispheres' clock changes.
const PAIRED: [&str; 8] = [
    "UTC",
    "America/New_York",
    "Europe/Berlin",
    "Asia/Tokyo",
    "Asia/Kathmandu",
    "Australia/Lord_Howe",
    "Pacific/Kiritimati",
    "America/Santiago",
];

/// `value` as a postcard varint.
fn varint(mut value: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// The version 4 fixture with its New York day bound to `spec` instead,
/// checksums made good again.
fn v4_fixture_bound_to(spec: &str) -> Vec<u8> {
    let old = |spec: &str| varint(1 << 60 | u64::from(crc32fast::hash(spec.as_bytes())));
    let (from, to) = (old("day@America/New_York"), old(spec));
    assert_eq!(from.len(), to.len());
    let mut bytes = include_bytes!("fixtures/snapshot-v4-calendar.bin").to_vec();
    let mut at = 12;
    let mut replaced = 0;
    loop {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        if len == 0 {
            break;
        }
        let payload = at + 8..at + 8 + len;
        if let Some(i) = bytes[payload.clone()]
            .windows(from.len())
            .position(|w| w == from)
        {
            let i = payload.start + i;
            bytes[i..i + to.len()].copy_from_slice(&to);
            replaced += 1;
        }
        let crc = crc32fast::hash(&bytes[payload.clone()]);
        bytes[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
        at = payload.end;
    }
    assert_eq!(replaced, 1, "the fixture binds one count to New York's day");
    let end = at + 4 + 8;
    let crc = crc32fast::hash(&bytes[..end]);
    bytes[end..end + 4].copy_from_slice(&crc.to_le_bytes());
    bytes
}

#[test]
fn a_version_4_count_of_an_unknown_zone_is_dropped_and_the_next_snapshot_loads() {
    let bytes = v4_fixture_bound_to("day@Mars/Olympus");
    let at = utc(2024, 6, 1, 12, 0);
    let clock = Arc::new(FakeClock::new(at));
    let config = StoreConfig::try_new(1_000, 4, OnFull::Deny).expect("valid");
    let (restored, report) = SnapshotReader::open(&bytes[..])
        .expect("opens")
        .load(config, clock.clone(), |_| true)
        .expect("loads, dropping the count it cannot honour");
    assert_eq!(report.namespaces["daily"].expired, 1);
    assert_eq!(report.namespaces["minute"].loaded, 1);
    let mut again = Vec::new();
    restored.export(&mut again, b"").expect("into a Vec");
    let (_, report) = SnapshotReader::open(&again[..])
        .expect("opens")
        .load(config, clock, |_| true)
        .expect("the next snapshot loads too");
    assert_eq!(report.total().loaded, 1);
}

#[test]
fn a_version_4_count_exported_again_loads_with_the_old_calendars_end() {
    let bytes = include_bytes!("fixtures/snapshot-v4-calendar.bin");
    let at = utc(2024, 6, 1, 12, 0);
    let clock = Arc::new(FakeClock::new(at));
    let config = StoreConfig::try_new(1_000, 4, OnFull::Deny).expect("valid");
    let (restored, _) = SnapshotReader::open(&bytes[..])
        .expect("opens")
        .load(config, clock.clone(), |_| true)
        .expect("loads");
    let mut again = Vec::new();
    restored.export(&mut again, b"").expect("into a Vec");
    let (reloaded, report) = SnapshotReader::open(&again[..])
        .expect("opens")
        .load(config, clock, |_| true)
        .expect("loads");
    assert_eq!(report.total().loaded, 2);
    let policy = Policy::calendar(Algorithm::FixedWindow, 10, cal(Period::Day, "Asia/Tokyo"))
        .expect("valid");
    let d = reloaded.peek(&CheckItem::new("daily", policy, "alice", 1).expect("valid"));
    // New York's midnight, not Tokyo's: the end the old calendar had.
    assert_eq!(
        (d.remaining, d.reset_after_ms),
        (7, utc(2024, 6, 2, 4, 0) - at)
    );
}

/// Where only one zone changes its clocks, its 25-hour day can hold two of
/// the other zone's midnights: Adelaide's 2024-04-07 (13:30 UTC on the 6th
/// to 14:30 UTC on the 7th) holds Brisbane's of 14:00 UTC on the 6th and
/// the 7th, so three limits are admitted in it, and no more.
#[test]
fn an_adelaide_day_with_two_brisbane_midnights_admits_three_limits_and_no_more() {
    let adelaide = cal(Period::Day, "Australia/Adelaide");
    let brisbane = cal(Period::Day, "Australia/Brisbane");
    let day = adelaide.bounds(utc(2024, 4, 7, 0, 0));
    assert_eq!(day, (utc(2024, 4, 6, 13, 30), utc(2024, 4, 7, 14, 30)));
    let limit = 2;
    let pa = Policy::calendar(Algorithm::FixedWindow, limit, adelaide).expect("valid");
    let pb = Policy::calendar(Algorithm::FixedWindow, limit, brisbane).expect("valid");
    let mut state = None;
    let mut admitted = 0;
    // Brisbane's counts before each of its midnights and after the second;
    // Adelaide's replica asks in between, and is refused.
    let asks = [
        (&pb, utc(2024, 4, 6, 13, 45)),
        (&pa, utc(2024, 4, 6, 13, 50)),
        (&pb, utc(2024, 4, 6, 14, 10)),
        (&pa, utc(2024, 4, 7, 2, 0)),
        (&pb, utc(2024, 4, 7, 14, 10)),
        (&pa, utc(2024, 4, 7, 14, 20)),
        (&pb, utc(2024, 4, 7, 14, 25)),
    ];
    for (policy, at) in asks {
        assert!(day.0 <= at && at < day.1);
        for _ in 0..limit + 1 {
            let (next, d) = decide(policy, state, at, one());
            state = next;
            admitted += u64::from(d.allowed);
        }
    }
    assert_eq!(admitted, 3 * limit);
}
