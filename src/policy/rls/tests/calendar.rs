//! The quotad extension's calendar periods and windows of any length:
//! `metadata.quotad.{period, time_zone, week_start}` and
//! `metadata.quotad.window`, and what is refused, naming the field.

use quotad_core::calendar::{Calendar, Period, Weekday, Zone};
use quotad_core::{Algorithm, Policy};

use super::{load_error, rules};
use crate::policy::rls::Unit;

fn policies(text: &str) -> Vec<(Unit, Policy)> {
    rules(text)
        .rules("api")
        .iter()
        .map(|r| {
            let limit = r.limit().expect("limited");
            (limit.unit(), *limit.policy().expect("a policy"))
        })
        .collect()
}

#[test]
fn a_rule_counts_per_local_day_week_or_month_in_its_zone() {
    let found = policies(
        r#"
domain: api
descriptors:
  - key: a_day
    rate_limit: {unit: day, requests_per_unit: 1000}
    metadata: {quotad: {period: day, time_zone: America/New_York}}
  - key: b_week
    rate_limit: {unit: week, requests_per_unit: 5000}
    metadata: {quotad: {period: week, week_start: sunday, time_zone: Europe/Berlin}}
  - key: c_month
    rate_limit: {unit: month, requests_per_unit: 100000}
    metadata: {quotad: {period: month}}
"#,
    );
    let calendar = |period, zone| Some(Calendar::new(period, Zone::named(zone).expect("zone")));
    assert_eq!(found[0].0, Unit::Day);
    assert_eq!(
        found[0].1.calendar_period(),
        calendar(Period::Day, "America/New_York")
    );
    assert_eq!(found[0].1.limit(), 1000);
    assert_eq!(
        found[1].1.calendar_period(),
        calendar(Period::Week(Weekday::Sunday), "Europe/Berlin")
    );
    // No zone: UTC's calendar month, not the reference's 30 days.
    assert_eq!(found[2].1.calendar_period(), calendar(Period::Month, "UTC"));
    assert_eq!(found[2].1.algorithm(), Algorithm::FixedWindow);
}

#[test]
fn a_rule_counts_over_a_window_the_units_cannot_say() {
    let found = policies(
        r#"
domain: api
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 10}
    metadata: {quotad: {window: 30s}}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 100}
    metadata: {quotad: {window: 5m, algorithm: sliding_window}}
  - key: c
    rate_limit: {unit: hour, requests_per_unit: 7}
    metadata: {quotad: {window: 2h}}
"#,
    );
    let windows: Vec<(Unit, u64, Option<Calendar>)> = found
        .iter()
        .map(|(u, p)| (*u, p.window_ms(), p.calendar_period()))
        .collect();
    assert_eq!(
        windows,
        [
            (Unit::Second, 30_000, None),
            (Unit::Minute, 300_000, None),
            (Unit::Hour, 7_200_000, None)
        ]
    );
    assert_eq!(found[1].1.algorithm(), Algorithm::SlidingWindow);
}

#[test]
fn calendar_extension_errors_name_the_field_and_the_line() {
    let day = "rate_limit: {unit: day, requests_per_unit: 1}";
    let cases = [
        (
            format!("metadata: {{quotad: {{period: day, time_zone: Mars/Olympus}}}}\n    {day}"),
            "descriptors[0].metadata.quotad.time_zone: unknown time zone \"Mars/Olympus\"",
        ),
        (
            format!("metadata: {{quotad: {{period: fortnight}}}}\n    {day}"),
            "descriptors[0].metadata.quotad.period: unknown period \"fortnight\"",
        ),
        (
            format!("metadata: {{quotad: {{period: month}}}}\n    {day}"),
            "descriptors[0].metadata.quotad.period: must be the rule's unit (day)",
        ),
        (
            format!("metadata: {{quotad: {{time_zone: UTC}}}}\n    {day}"),
            "descriptors[0].metadata.quotad.time_zone: applies only with a period",
        ),
        (
            format!("metadata: {{quotad: {{period: day, week_start: monday}}}}\n    {day}"),
            "descriptors[0].metadata.quotad.week_start: applies only with period: week",
        ),
        (
            format!("metadata: {{quotad: {{period: day, window: 1d}}}}\n    {day}"),
            "descriptors[0].metadata.quotad.window: give either window",
        ),
        (
            format!("metadata: {{quotad: {{period: day, algorithm: sliding_window}}}}\n    {day}"),
            "descriptors[0].metadata.quotad.period: period applies only to fixed_window, not sliding_window",
        ),
        (
            format!("metadata: {{quotad: {{window: soon}}}}\n    {day}"),
            "descriptors[0].metadata.quotad.window: invalid window \"soon\"",
        ),
        (
            format!("metadata: {{quotad: {{window: 0s}}}}\n    {day}"),
            "descriptors[0].metadata.quotad.window: window must be at least 1 ms",
        ),
    ];
    for (descriptor, expected) in cases {
        let text = format!("domain: d\ndescriptors:\n  - key: k\n    {descriptor}\n");
        let error = load_error(&text);
        assert!(
            error.starts_with(&format!("rules.yaml: {expected}")),
            "{error}\n{text}"
        );
        assert!(error.contains("(line 4, column"), "{error}");
    }
}
