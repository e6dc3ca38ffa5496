//! Matching: which rule applies to a descriptor, where it counts, and what
//! it asks (the reference's matching order, `replaces`, `unlimited`,
//! `share_threshold`, `limit` overrides and `hits_addend`).

use std::collections::HashSet;

use quotad_core::{Algorithm, MAX_EXACT};

use super::rules;
use crate::policy::rls::{
    Applied, Charge, Descriptor, Entry, LimitOverride, NoLimit, Request, RequestError, Resolution,
    Resolutions, RlsRules, Unit,
};

/// A descriptor from `key=value` pairs.
fn descriptor<'a>(entries: &[(&'a str, &'a str)]) -> Descriptor<'a> {
    Descriptor {
        entries: entries
            .iter()
            .map(|&(key, value)| Entry { key, value })
            .collect(),
        ..Descriptor::default()
    }
}

fn request<'a>(domain: &'a str, descriptors: Vec<Descriptor<'a>>) -> Request<'a> {
    Request {
        domain,
        descriptors: descriptors.into(),
        hits_addend: 0,
    }
}

/// What one descriptor resolves to.
fn resolve_one<'r>(rules: &'r RlsRules, domain: &str, entries: &[(&str, &str)]) -> Resolution<'r> {
    let mut resolved = rules
        .resolve(&request(domain, vec![descriptor(entries)]))
        .expect("a valid request");
    resolved.remove(0)
}

/// The namespace and key one descriptor counts under, or why none.
fn counted(
    rules: &RlsRules,
    domain: &str,
    entries: &[(&str, &str)],
) -> Result<(String, String), String> {
    match resolve_one(rules, domain, entries) {
        Resolution::Limited(applied) => {
            Ok((applied.namespace().to_owned(), applied.key().to_owned()))
        }
        other => Err(format!("{other:?}")),
    }
}

fn applied(resolution: Resolution<'_>) -> Applied<'_> {
    match resolution {
        Resolution::Limited(applied) => applied,
        other => panic!("not limited: {other:?}"),
    }
}

const EDGE: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: remote_address
    value: 10.*
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: remote_address
    value: 10.0.*
    rate_limit: {unit: second, requests_per_unit: 1000}
"#;

#[test]
fn an_exact_value_wins_over_a_wildcard_which_wins_over_the_key_alone() {
    let rules = rules(EDGE);
    let limit_of = |ip| {
        let r = resolve_one(&rules, "edge", &[("remote_address", ip)]);
        applied(r).limit().requests_per_unit()
    };
    assert_eq!(limit_of("50.0.0.5"), 0);
    assert_eq!(limit_of("50.0.0.6"), 10);
    // Wildcards are tried in file order: 10.* comes before 10.0.*.
    assert_eq!(limit_of("10.0.0.1"), 100);
    assert_eq!(limit_of("10.9.9.9"), 100);
}

#[test]
fn a_key_without_a_value_counts_each_value_apart_under_one_rule() {
    let rules = rules(EDGE);
    let a = counted(&rules, "edge", &[("remote_address", "1.1.1.1")]);
    let b = counted(&rules, "edge", &[("remote_address", "2.2.2.2")]);
    assert_eq!(
        a,
        Ok((
            "rls:edge/remote_address".to_owned(),
            "remote_address=1.1.1.1".to_owned()
        ))
    );
    assert_eq!(
        b,
        Ok((
            "rls:edge/remote_address".to_owned(),
            "remote_address=2.2.2.2".to_owned()
        ))
    );
}

#[test]
fn a_zero_limit_blocks_without_touching_the_store() {
    let rules = rules(EDGE);
    let blocked = applied(resolve_one(
        &rules,
        "edge",
        &[("remote_address", "50.0.0.5")],
    ));
    assert_eq!(blocked.limit().policy(), None);
    assert!(blocked.check_item().is_none());
}

#[test]
fn the_request_must_have_as_many_entries_as_the_path_to_the_rule() {
    let rules = rules(
        r#"
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit: {unit: second, requests_per_unit: 300}
  - key: parent
    value: p
    descriptors:
      - key: subkey
        rate_limit: {unit: second, requests_per_unit: 300}
"#,
    );
    let no_match = Err(format!("{:?}", Resolution::NoLimit(NoLimit::NoMatch)));
    // More entries than the configured path.
    assert_eq!(
        counted(
            &rules,
            "example4",
            &[("key", "value"), ("subkey", "subvalue")]
        ),
        no_match
    );
    // Fewer: the parent has no limit of its own.
    assert_eq!(counted(&rules, "example4", &[("parent", "p")]), no_match);
    assert_eq!(counted(&rules, "example4", &[]), no_match);
    assert_eq!(
        counted(&rules, "example4", &[("parent", "p"), ("subkey", "s")]),
        Ok((
            "rls:example4/parent=p/subkey".to_owned(),
            "parent=p|subkey=s".to_owned()
        ))
    );
    assert!(counted(&rules, "example4", &[("key", "value")]).is_ok());
    assert_eq!(counted(&rules, "example4", &[("key", "other")]), no_match);
    assert_eq!(counted(&rules, "example4", &[("unknown", "x")]), no_match);
}

#[test]
fn one_request_applies_every_matching_descriptor_with_its_own_rule() {
    let rules = rules(
        r#"
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
"#,
    );
    let resolved = rules
        .resolve(&request(
            "messaging",
            vec![
                descriptor(&[("message_type", "marketing"), ("to_number", "2061111111")]),
                descriptor(&[("to_number", "2061111111")]),
            ],
        ))
        .expect("valid");
    let limits: Vec<(String, u32)> = resolved
        .into_iter()
        .map(|r| {
            let a = applied(r);
            (a.namespace().to_owned(), a.limit().requests_per_unit())
        })
        .collect();
    assert_eq!(
        limits,
        [
            (
                "rls:messaging/message_type=marketing/to_number".to_owned(),
                5
            ),
            ("rls:messaging/to_number".to_owned(), 100),
        ]
    );
}

#[test]
fn wildcards_match_anywhere_in_the_value() {
    let rules = rules(
        r#"
domain: w
descriptors:
  - key: path
    value: /api/*/action
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: route
    value: /api/*/resource/*/action
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: any
    value: "*"
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: overlap
    value: ab*ba
    rate_limit: {unit: minute, requests_per_unit: 4}
"#,
    );
    let matches = |key, value| counted(&rules, "w", &[(key, value)]).is_ok();
    assert!(matches("path", "/api/123/action"));
    assert!(matches("path", "/api//action"));
    assert!(!matches("path", "/api/123/other"));
    assert!(!matches("path", "/api/123/action/x"));
    assert!(matches("route", "/api/v1/resource/9/action"));
    assert!(!matches("route", "/api/v1/action/resource/"));
    assert!(matches("any", ""));
    assert!(matches("any", "anything"));
    // The prefix and the suffix may not share characters.
    assert!(matches("overlap", "abba"));
    assert!(!matches("overlap", "aba"));
    // The key must match too.
    assert!(!matches("other", "/api/123/action"));
}

#[test]
fn share_threshold_counts_every_value_of_a_wildcard_under_the_pattern() {
    let rules = rules(
        r#"
domain: files
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: route
    value: api/*
    share_threshold: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
"#,
    );
    let key = |entries: &[(&str, &str)]| counted(&rules, "files", entries).map(|(_, key)| key);
    assert_eq!(
        key(&[("files", "files/a.pdf")]),
        Ok("files=files%2F*".to_owned())
    );
    assert_eq!(
        key(&[("files", "files/b.csv")]),
        Ok("files=files%2F*".to_owned())
    );
    assert_eq!(
        key(&[("files_no_share", "files_no_share/a.pdf")]),
        Ok("files_no_share=files_no_share%2Fa.pdf".to_owned())
    );
    // Shared at a parent level, counted per value at the child's.
    assert_eq!(
        key(&[("route", "api/v1"), ("method", "GET")]),
        Ok("route=api%2F*|method=GET".to_owned())
    );
    assert_eq!(
        key(&[("route", "api/v2"), ("method", "GET")]),
        Ok("route=api%2F*|method=GET".to_owned())
    );
}

#[test]
fn distinct_rules_never_share_a_namespace() {
    let rules = rules(
        r#"
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    value: b
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a_b
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a
    value: b*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a/b
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: a=b
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: x
    descriptors:
      - key: a
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: a
        value: b
        rate_limit: {unit: second, requests_per_unit: 1}
"#,
    );
    let found = rules.rules("d");
    let namespaces: HashSet<&str> = found.iter().map(|r| r.namespace()).collect();
    assert_eq!(namespaces.len(), found.len(), "{namespaces:?}");
    assert_eq!(found.len(), 8);
    // Key "a" value "b" and key "a_b" are different descriptors (the
    // reference reads both as "a_b").
    assert_eq!(
        counted(&rules, "d", &[("a", "b")]).map(|(ns, _)| ns),
        Ok("rls:d/a=b".to_owned())
    );
    assert_eq!(
        counted(&rules, "d", &[("a_b", "c")]).map(|(ns, _)| ns),
        Ok("rls:d/a_b".to_owned())
    );
}

#[test]
fn rules_map_to_a_fixed_window_of_one_unit_by_default() {
    let rules = rules(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: week, requests_per_unit: 7}\n",
    );
    let a = applied(resolve_one(&rules, "d", &[("k", "v")]));
    let item = a.check_item().expect("counted");
    assert_eq!(item.policy().algorithm(), Algorithm::FixedWindow);
    assert_eq!(item.policy().limit(), 7);
    assert_eq!(item.policy().window_ms(), Unit::Week.window_ms());
    assert_eq!(
        (item.name(), item.key(), item.cost().get()),
        ("rls:d/k", "k=v", 1)
    );
    assert_eq!(a.name(), "");
}

#[test]
fn unknown_domains_and_unmatched_descriptors_have_no_limit() {
    let rules = rules(EDGE);
    let mut with_override = descriptor(&[("remote_address", "1.1.1.1")]);
    with_override.limit = Some(LimitOverride {
        requests_per_unit: 5,
        unit: Unit::Minute.number(),
    });
    let resolved = rules
        .resolve(&request(
            "nowhere",
            vec![descriptor(&[("a", "b")]), with_override],
        ))
        .expect("valid");
    assert_eq!(
        resolved,
        vec![Resolution::NoLimit(NoLimit::UnknownDomain); 2]
            .into_iter()
            .collect::<Resolutions<'_>>()
    );
    assert_eq!(
        resolve_one(&rules, "edge", &[("user", "x")]),
        Resolution::NoLimit(NoLimit::NoMatch)
    );
}

#[test]
fn a_limit_override_replaces_matching_and_counts_per_domain_and_unit() {
    let rules = rules(EDGE);
    let with = |rpu, unit: Unit| {
        let mut d = descriptor(&[("remote_address", "50.0.0.5"), ("path", "/x")]);
        d.limit = Some(LimitOverride {
            requests_per_unit: rpu,
            unit: unit.number(),
        });
        let resolved = rules.resolve(&request("edge", vec![d])).expect("valid");
        applied(resolved.into_iter().next().expect("one"))
    };
    let a = with(20, Unit::Minute);
    assert_eq!(a.rule(), None);
    assert_eq!(a.namespace(), "rls:edge#minute");
    assert_eq!(a.key(), "remote_address=50.0.0.5|path=%2Fx");
    assert_eq!(
        (a.limit().requests_per_unit(), a.limit().unit()),
        (20, Unit::Minute)
    );
    assert!(!a.shadow_mode());
    let policy = a.limit().policy().expect("counted");
    assert_eq!((policy.limit(), policy.window_ms()), (20, 60_000));
    // Another number for the same descriptor and unit shares the count, as
    // in the reference; another unit does not.
    assert_eq!(with(40, Unit::Minute).namespace(), a.namespace());
    assert_eq!(with(40, Unit::Minute).key(), a.key());
    assert_eq!(with(20, Unit::Week).namespace(), "rls:edge#week");
    assert_eq!(with(0, Unit::Minute).limit().policy(), None);
}

#[test]
fn a_bad_limit_override_is_an_error_naming_the_field() {
    let rules = rules(EDGE);
    let resolve = |rpu, unit, entries: &[(&str, &str)]| {
        let mut bad = descriptor(entries);
        bad.limit = Some(LimitOverride {
            requests_per_unit: rpu,
            unit,
        });
        rules
            .resolve(&request(
                "edge",
                vec![descriptor(&[("remote_address", "1")]), bad],
            ))
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let ip = [("remote_address", "1.1.1.1")];
    assert_eq!(
        resolve(1, 0, &ip),
        Err("descriptors[1].limit.unit: unknown unit 0 (expected 1 second, 2 minute, 3 hour, 4 day, 5 month, 6 year or 7 week)".to_owned())
    );
    assert!(resolve(1, 8, &ip).is_err());
    // Counted with a fixed window, as the reference: any 32-bit limit, in
    // any unit.
    assert_eq!(resolve(u32::MAX, Unit::Year.number(), &ip), Ok(()));
    assert_eq!(
        resolve(1, 1, &[]),
        Err(
            "descriptors[1].entries: a descriptor with a limit needs at least one entry".to_owned()
        )
    );
    assert_eq!(resolve(u32::MAX, Unit::Minute.number(), &ip), Ok(()));
}

#[test]
fn empty_domains_and_descriptor_lists_are_errors() {
    let rules = rules(EDGE);
    assert_eq!(
        rules.resolve(&request("", vec![descriptor(&[("a", "b")])])),
        Err(RequestError {
            field: "domain".to_owned(),
            message: "must not be empty".to_owned()
        })
    );
    assert_eq!(
        rules
            .resolve(&request("edge", vec![]))
            .map_err(|e| e.to_string()),
        Err("descriptors: must hold at least one descriptor".to_owned())
    );
}

const REPLACES: &str = r#"
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
  - key: key_3
    rate_limit:
      unlimited: true
      replaces: [{name: specific_limit}]
"#;

#[test]
fn a_rule_named_in_replaces_is_dropped_when_both_match() {
    let rules = rules(REPLACES);
    let one = descriptor(&[("key_1", "value_1"), ("user", "bkthomps")]);
    let two = descriptor(&[("key_2", "value_2"), ("user", "bkthomps")]);

    let alone = rules
        .resolve(&request("example7", vec![one.clone()]))
        .expect("valid");
    assert_eq!(applied(alone[0].clone()).limit().requests_per_unit(), 5);
    assert_eq!(applied(alone[0].clone()).name(), "specific_limit");

    let both = rules
        .resolve(&request("example7", vec![one.clone(), two]))
        .expect("valid");
    let Resolution::NoLimit(NoLimit::Replaced(rule)) = both[0] else {
        panic!("replaced: {:?}", both[0]);
    };
    assert_eq!(rule.name(), "specific_limit");
    assert_eq!(applied(both[1].clone()).limit().requests_per_unit(), 10);

    // An unlimited rule replaces too.
    let three = descriptor(&[("key_3", "x")]);
    let with_unlimited = rules
        .resolve(&request("example7", vec![one, three]))
        .expect("valid");
    assert!(matches!(
        with_unlimited[0],
        Resolution::NoLimit(NoLimit::Replaced(_))
    ));
    assert!(matches!(with_unlimited[1], Resolution::Unlimited(_)));
}

#[test]
fn unlimited_rules_and_flags_come_through() {
    let rules = rules(
        r#"
domain: internal
descriptors:
  - key: ldap
    rate_limit: {unlimited: true}
  - key: service
    descriptors:
      - key: user
        value: user-a
        shadow_mode: true
        quota_mode: true
        rate_limit: {requests_per_unit: 10, unit: second}
"#,
    );
    let Resolution::Unlimited(rule) = resolve_one(&rules, "internal", &[("ldap", "x")]) else {
        panic!("unlimited");
    };
    assert_eq!(rule.namespace(), "rls:internal/ldap");
    let shadow = applied(resolve_one(
        &rules,
        "internal",
        &[("service", "auth"), ("user", "user-a")],
    ));
    assert!(shadow.shadow_mode() && shadow.quota_mode());
}

#[test]
fn hits_addend_is_one_when_absent_and_a_descriptors_own_wins() {
    assert_eq!(Charge::of(0, None), Charge::Hits(1));
    assert_eq!(Charge::of(5, None), Charge::Hits(5));
    assert_eq!(Charge::of(5, Some(7)), Charge::Hits(7));
    assert_eq!(Charge::of(5, Some(0)), Charge::Probe);
    assert_eq!(Charge::of(0, Some(0)), Charge::Probe);
    assert_eq!(
        Charge::of(u32::MAX, None),
        Charge::Hits(u64::from(u32::MAX))
    );
    assert_eq!(Charge::of(0, Some(u64::MAX)), Charge::Hits(MAX_EXACT));
    assert_eq!(Charge::Probe.cost(), 1);
    assert!(!Charge::Probe.counts() && Charge::Hits(3).counts());
}

#[test]
fn each_descriptor_carries_its_charge_into_the_store_item() {
    let rules = rules(EDGE);
    let mut probe = descriptor(&[("remote_address", "1.1.1.1")]);
    probe.hits_addend = Some(0);
    let mut huge = descriptor(&[("remote_address", "2.2.2.2")]);
    huge.hits_addend = Some(u64::MAX);
    let plain = descriptor(&[("remote_address", "3.3.3.3")]);
    let resolved = rules
        .resolve(&Request {
            domain: "edge",
            descriptors: [probe, huge, plain].into_iter().collect(),
            hits_addend: 4,
        })
        .expect("valid");
    let charges: Vec<(Charge, u64)> = resolved
        .into_iter()
        .map(|r| {
            let a = applied(r);
            let cost = a.check_item().expect("counted").cost().get();
            (a.charge(), cost)
        })
        .collect();
    assert_eq!(
        charges,
        [
            (Charge::Probe, 1),
            (Charge::Hits(MAX_EXACT), MAX_EXACT),
            (Charge::Hits(4), 4)
        ]
    );
}

#[test]
fn any_strings_make_a_valid_store_item() {
    let rules = rules(EDGE);
    for value in ["", "\0", "a|b=c", "{x}", "é ü", "%41"] {
        let a = applied(resolve_one(&rules, "edge", &[("remote_address", value)]));
        let item = a.check_item().expect("a valid item");
        // One entry: no raw separator, brace or NUL reaches the store.
        let key = item.key();
        assert!(key.starts_with("remote_address="), "{key}");
        assert!(!key.contains(['\0', '{', '}', '|']), "{key}");
    }
}
