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
    Algorithm, CheckItem, FakeClock, MemoryStore, OnFull, Policy, PolicyError, Reason, StoreConfig,
    decide, peek,
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
fn state_counted_in_another_zone_or_period_is_fresh() {
    let berlin = Policy::calendar(Algorithm::FixedWindow, 1, cal(Period::Day, "Europe/Berlin"))
        .expect("valid");
    let paris = Policy::calendar(Algorithm::FixedWindow, 1, cal(Period::Day, "Europe/Paris"))
        .expect("valid");
    let now = utc(2024, 6, 1, 12, 0);
    let (state, _) = decide(&berlin, None, now, one());
    assert!(!peek(&berlin, state.as_ref(), now, one()).allowed);
    assert!(peek(&paris, state.as_ref(), now, one()).allowed);
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

// An independent account of "the local period": the period's key from
// the local date alone, and the bounds are where the key changes.

const ZONES: [&str; 8] = [
    "America/New_York",
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

/// The local date that names `ms`'s period.
fn key(period: Period, ms: u64, zone: &str) -> Date {
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn the_bounds_are_where_the_local_period_begins_and_ends(
        at in 63_158_400_000u64..4_102_444_800_000, // 1972-01-02 to 2100-01-01
        z in 0..ZONES.len(),
        p in 0usize..10,
    ) {
        let zone = ZONES[z];
        let period = period_of(p);
        let c = cal(period, zone);
        let (start, end) = c.bounds(at);
        prop_assert!(start <= at && at < end);
        let here = key(period, at, zone);
        prop_assert_eq!(key(period, start, zone), here);
        prop_assert_ne!(key(period, start - 1, zone), here);
        prop_assert_eq!(key(period, end - 1, zone), here);
        prop_assert_ne!(key(period, end, zone), here);
        // And jiff's own arithmetic on a zoned time agrees.
        let z_at = zoned(at, zone);
        let first = match period {
            Period::Day => z_at.start_of_day(),
            Period::Month => z_at.first_of_month().and_then(|m| m.start_of_day()),
            Period::Year => z_at.first_of_year().and_then(|y| y.start_of_day()),
            Period::Week(start) => {
                let back = z_at.weekday().since(start);
                z_at.checked_sub(i64::from(back).days()).and_then(|d| d.start_of_day())
            }
        }
        .expect("in range");
        prop_assert_eq!(
            u64::try_from(first.timestamp().as_millisecond()).expect("after the epoch"),
            start
        );
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
}
