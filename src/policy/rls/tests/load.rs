//! Loading: the reference's files load unchanged; what the reference
//! refuses is refused, naming the file, field path, line and column.

use std::path::Path;
use std::time::Duration;

use quotad_core::Algorithm;

use super::{load_error, rules};
use crate::policy::rls::{Limit, LoadOptions, MAX_FILE_BYTES, RlsRules, Unit};

#[test]
fn loads_nested_descriptors_with_every_field_of_the_format() {
    // Also a seed of the rules fuzz target (quotad-fuzz examples/seeds.rs).
    let rules = rules(include_str!("every_field.yaml"));
    let found = rules.rules("messaging");
    let namespaces: Vec<&str> = found.iter().map(|r| r.namespace()).collect();
    assert_eq!(
        namespaces,
        [
            "rls:messaging/ldap",
            "rls:messaging/message_type=marketing/to_number",
            "rls:messaging/path=%2Fapi%2F*",
            "rls:messaging/to_number",
        ]
    );

    let [ldap, marketing, path, per_number] = found[..] else {
        panic!("four rules");
    };
    assert_eq!(ldap.limit(), None);
    let limit = marketing.limit().expect("limited");
    assert_eq!((limit.requests_per_unit(), limit.unit()), (5, Unit::Day));
    let policy = limit.policy().expect("counted");
    assert_eq!(policy.algorithm(), Algorithm::FixedWindow);
    assert_eq!((policy.limit(), policy.window_ms()), (5, 86_400_000));
    assert!(!marketing.shadow_mode());

    assert_eq!(per_number.name(), "per_number");
    assert!(per_number.shadow_mode() && per_number.quota_mode() && per_number.detailed_metric());
    assert!(!per_number.value_to_metric());
    assert_eq!(per_number.line(), 11);
    assert_eq!(per_number.file(), Path::new("rules.yaml"));

    assert_eq!(path.replaces(), ["per_number"]);
    assert_eq!(path.limit().map(|l| l.unit()), Some(Unit::Minute));
}

#[test]
fn scalars_are_read_as_the_reference_reads_them() {
    let rules = rules(
        "domain: 42\ndescriptors:\n  - key: 10.0.0.1\n    value: 007\n    rate_limit: {unit: second, requests_per_unit: 1_000}\n",
    );
    let found = rules.rules("42");
    assert_eq!(found[0].namespace(), "rls:42/10.0.0.1=007");
    assert_eq!(found[0].limit().map(|l| l.requests_per_unit()), Some(1_000));
}

#[test]
fn a_limit_of_zero_denies_everything_and_a_missing_one_is_zero() {
    let rules = rules(
        r#"
domain: edge
descriptors:
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: remote_address
    rate_limit: {unit: second}
"#,
    );
    for rule in rules.rules("edge") {
        let limit = rule.limit().expect("limited");
        assert_eq!(limit.requests_per_unit(), 0);
        assert_eq!(limit.policy(), None, "{}", rule.namespace());
    }
}

#[test]
fn a_descriptor_without_rate_limit_or_children_is_allowed() {
    let rules = rules("domain: d\ndescriptors:\n  - key: a\n  - key: b\n    rate_limit:\n");
    assert!(rules.rules("d").is_empty());
    assert!(!rules.is_empty());
    assert_eq!(rules.domains().collect::<Vec<_>>(), ["d"]);
}

#[test]
fn the_extension_picks_the_algorithm_and_burst() {
    let rules = rules(
        r#"
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 60}
    metadata:
      other: kept for the reference
      quotad:
        algorithm: token_bucket
        burst: 20
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1000}
    metadata: {quotad: {algorithm: SLIDING_WINDOW}}
"#,
    );
    let policies: Vec<_> = rules
        .rules("api")
        .iter()
        .map(|r| *r.limit().and_then(|l| l.policy()).expect("a policy"))
        .collect();
    assert_eq!(policies[0].algorithm(), Algorithm::SlidingWindow);
    assert_eq!(
        (policies[0].limit(), policies[0].window_ms()),
        (1000, 3_600_000)
    );
    assert_eq!(policies[1].algorithm(), Algorithm::TokenBucket);
    assert_eq!((policies[1].limit(), policies[1].burst()), (60, 20));
    assert_eq!(
        policies[1].window_ms(),
        Duration::from_secs(60).as_millis() as u64
    );
}

#[test]
fn extension_errors_name_the_field() {
    let cases = [
        (
            "metadata: {quotad: {algorithm: gcra}}\n    rate_limit: {unit: second, requests_per_unit: 1}",
            "rules.yaml: descriptors[0].metadata.quotad.algorithm: unknown algorithm \"gcra\" (expected fixed_window, sliding_window, token_bucket, leaky_bucket, sliding_log or concurrency) (line 4, column 36)",
        ),
        (
            "metadata: {quotad: {algorithm: concurrency}}\n    rate_limit: {unit: second, requests_per_unit: 1}",
            "rules.yaml: descriptors[0].metadata.quotad.algorithm: concurrency is not a rate: an RLS rule counts requests per unit (line 4, column 36)",
        ),
        (
            "metadata: {quotad: {burst: 5}}\n    rate_limit: {unit: second, requests_per_unit: 1}",
            "rules.yaml: descriptors[0].metadata.quotad.burst: burst applies only to token_bucket and leaky_bucket, not fixed_window (line 4, column 32)",
        ),
        (
            "metadata: {quotad: {algorithm: leaky_bucket, burst: 0}}\n    rate_limit: {unit: second, requests_per_unit: 1}",
            "rules.yaml: descriptors[0].metadata.quotad.burst: burst must be at least 1 (line 4, column 57)",
        ),
        (
            "metadata: {quotad: {algorithm: sliding_log}}\n    rate_limit: {unit: second, requests_per_unit: 10001}",
            "rules.yaml: descriptors[0].rate_limit.requests_per_unit: sliding_log limit must be at most 10000 (got 10001) (line 5, column 51)",
        ),
        (
            "metadata: {quotad: {limit: 5}}\n    rate_limit: {unit: second, requests_per_unit: 1}",
            "rules.yaml: descriptors[0].metadata.quotad.limit: unknown key \"limit\" in metadata.quotad (expected algorithm, burst, window, period, time_zone or week_start) (line 4, column 25)",
        ),
        (
            "metadata: {quotad: {algorithm: token_bucket}}",
            "rules.yaml: descriptors[0].metadata.quotad: applies to a descriptor with a rate_limit (line 4, column 24)",
        ),
        (
            "metadata: {quotad: {algorithm: token_bucket}}\n    rate_limit: {unlimited: true}",
            "rules.yaml: descriptors[0].metadata.quotad: does not apply to an unlimited rate_limit (line 4, column 24)",
        ),
        (
            "metadata: {quotad: token_bucket}\n    rate_limit: {unit: second, requests_per_unit: 1}",
            "rules.yaml: descriptors[0].metadata.quotad: must be a mapping, not a scalar (line 4, column 24)",
        ),
    ];
    for (descriptor, expected) in cases {
        let text = format!("domain: d\ndescriptors:\n  - key: k\n    {descriptor}\n");
        assert_eq!(load_error(&text), expected, "\n{text}");
    }
}

#[test]
fn errors_name_file_field_line_and_column() {
    let cases = [
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n",
            "rules.yaml: descriptors[0].rate_limit.unit: invalid rate limit unit \"fortnight\" (expected second, minute, hour, day, week, month or year) (line 5, column 13)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 5\n",
            "rules.yaml: descriptors[0].rate_limit.unit: invalid rate limit unit \"\" (expected second, minute, hour, day, week, month or year) (line 5, column 7)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown}\n",
            "rules.yaml: descriptors[0].rate_limit.unit: invalid rate limit unit \"unknown\" (expected second, minute, hour, day, week, month or year) (line 4, column 24)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n",
            "rules.yaml: descriptors[0].rate_limit.unit: an unlimited rate_limit takes no unit (got \"second\") (line 4, column 41)",
        ),
        (
            "domain: d\ndescriptors:\n  - value: v\n",
            "rules.yaml: descriptors[0].key: a descriptor must have a non-empty key (line 3, column 5)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: ''\n",
            "rules.yaml: descriptors[0].key: a descriptor must have a non-empty key (line 3, column 10)",
        ),
        (
            "domain: ''\n",
            "rules.yaml: domain: must not be empty (line 1, column 9)",
        ),
        (
            "descriptors: []\n",
            "rules.yaml: domain: missing: every file names its domain (line 1, column 1)",
        ),
        (
            "",
            "rules.yaml: domain: missing: every file names its domain",
        ),
        (
            "- domain: d\n",
            "rules.yaml: must be a mapping with domain and descriptors, not a list (line 1, column 1)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
            "rules.yaml: descriptors[1]: duplicate descriptor: key \"k\" with value \"v\" is already defined at this level (line 5, column 10)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: x\n      - key: x\n",
            "rules.yaml: descriptors[0].descriptors[1]: duplicate descriptor: key \"x\" without a value is already defined at this level (line 6, column 14)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: a*\n  - key: k\n    value: a*\n",
            "rules.yaml: descriptors[1]: duplicate descriptor: key \"k\" with value \"a*\" is already defined at this level (line 5, column 10)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: a\n      replaces: [{name: a}]\n      unit: second\n",
            "rules.yaml: descriptors[0].rate_limit.replaces[0].name: a rule cannot replace itself (\"a\") (line 6, column 18)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      replaces: [{name: ''}]\n      unit: second\n",
            "rules.yaml: descriptors[0].rate_limit.replaces[0].name: a replaces entry needs a non-empty name (line 5, column 18)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
            "rules.yaml: descriptors[0].share_threshold: share_threshold needs a wildcard value (containing '*'); k's value is \"v\" (line 5, column 22)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    ratelimit: {unit: second}\n",
            "rules.yaml: descriptors[0].ratelimit: unknown key \"ratelimit\" in a descriptor (line 4, column 5)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    unit: second\n    requests_per_unit: 10\n",
            "rules.yaml: descriptors[0].unit: unit is not a field of a descriptor; it belongs in rate_limit (line 4, column 5)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, shadow_mode: true}\n",
            "rules.yaml: descriptors[0].rate_limit.shadow_mode: shadow_mode is not a field of rate_limit; it belongs in a descriptor (line 4, column 54)",
        ),
        (
            "domain: d\nunit: second\n",
            "rules.yaml: unit: unit is not a field of the top of a file; it belongs in rate_limit (line 2, column 1)",
        ),
        (
            "domain: d\ndescriptors:\n  - a\n",
            "rules.yaml: descriptors[0]: a descriptor must be a mapping, not a scalar (line 3, column 5)",
        ),
        (
            "domain: d\ndescriptors: {key: k}\n",
            "rules.yaml: descriptors: must be a list, not a mapping (line 2, column 14)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
            "rules.yaml: descriptors[0].rate_limit.requests_per_unit: must be a whole number from 0 to 4294967295 (got -1) (line 4, column 51)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: '10'}\n",
            "rules.yaml: descriptors[0].rate_limit.requests_per_unit: must be a whole number from 0 to 4294967295 (line 4, column 51)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: 'true'\n",
            "rules.yaml: descriptors[0].shadow_mode: must be true or false (line 4, column 18)",
        ),
        (
            "domain: d\ndescriptors:\n  - [key]: k\n",
            "rules.yaml: descriptors[0]: a key must be a string, not a list (line 3, column 5)",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n    rate_limit: {unit: minute}\n",
            "rules.yaml: invalid YAML: duplicated key in mapping (line 5, column 5)",
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(load_error(text), expected, "\n{text}");
    }
}

#[test]
fn the_most_requests_per_unit_are_2_pow_53_over_the_window_but_for_a_fixed_window() {
    let most = |algorithm| -> Vec<u64> {
        Unit::ALL
            .into_iter()
            .map(|unit| Limit::max_requests_per_unit(unit, algorithm))
            .collect()
    };
    let u32_max = u64::from(u32::MAX);
    assert_eq!(
        most(Algorithm::SlidingWindow),
        [
            u32_max,
            u32_max,
            2_501_999_792,
            104_249_991,
            14_892_855,
            3_474_999,
            285_616
        ]
    );
    assert_eq!(most(Algorithm::FixedWindow), [u32_max; 7]);
}

#[test]
fn limits_beyond_exact_counting_are_refused_with_the_most_per_unit() {
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 285617}\n    metadata: {quotad: {algorithm: sliding_window}}\n";
    assert_eq!(
        load_error(text),
        "rules.yaml: descriptors[0].rate_limit.requests_per_unit: 285617 per year is more than sliding_window counts exactly: at most 285616 per year (requests_per_unit x window in ms <= 2^53; the default fixed_window has no such bound) (line 4, column 49)"
    );
    let at_most = text.replace("285617", "285616");
    assert_eq!(rules(&at_most).rules("d").len(), 1);
    // A fixed window (the default), in any unit, and any algorithm for a
    // second or a minute, hold every 32-bit limit.
    let fixed = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 4294967295}\n";
    assert_eq!(rules(fixed).rules("d").len(), 1);
    for unit in ["second", "minute"] {
        let text = format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: {unit}, requests_per_unit: 4294967295}}\n    metadata: {{quotad: {{algorithm: token_bucket}}}}\n"
        );
        assert_eq!(rules(&text).rules("d").len(), 1, "{unit}");
    }
}

#[test]
fn a_domain_in_two_files_is_an_error_unless_merging() {
    let first = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let second = "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n";
    let files = [(Path::new("a.yaml"), first), (Path::new("b.yaml"), second)];
    let err = RlsRules::from_sources(files, LoadOptions::default()).expect_err("duplicate domain");
    assert_eq!(
        err.to_string(),
        "b.yaml: domain: duplicate domain \"d\", already in a.yaml (merging files of one domain is off) (line 1, column 9)"
    );
    assert_eq!(
        (err.file(), err.field(), err.line(), err.column()),
        (Path::new("b.yaml"), "domain", Some(1), Some(9))
    );

    let merge = LoadOptions {
        merge_domains: true,
    };
    let merged = RlsRules::from_sources(files, merge).expect("merged");
    let namespaces: Vec<&str> = merged.rules("d").iter().map(|r| r.namespace()).collect();
    assert_eq!(namespaces, ["rls:d/a", "rls:d/b"]);
    assert_eq!(merged.rules("d")[1].file(), Path::new("b.yaml"));

    let again = [(Path::new("a.yaml"), first), (Path::new("c.yaml"), first)];
    let err = RlsRules::from_sources(again, merge).expect_err("duplicate key across merged files");
    assert_eq!(
        err.to_string(),
        "c.yaml: descriptors[0]: duplicate descriptor: key \"a\" without a value is already defined at this level (line 3, column 10)"
    );
}

#[test]
fn keys_joined_by_an_underscore_are_not_confused() {
    // The reference files both as "a_b" and refuses the second as a duplicate.
    let rules = rules(
        "domain: d\ndescriptors:\n  - key: a_b\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a\n    value: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n",
    );
    assert_eq!(rules.rules("d").len(), 2);
}

#[test]
fn a_second_document_is_refused() {
    assert_eq!(
        load_error("domain: a\n---\ndomain: b\n"),
        "rules.yaml: a second YAML document; a file holds one domain (start another file) (line 3, column 1)"
    );
}

#[test]
fn loads_the_yaml_files_of_a_directory_in_name_order() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let write =
        |name: &str, text: &str| std::fs::write(dir.path().join(name), text).expect("write");
    let rule = |domain: &str| {
        format!(
            "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        )
    };
    write("b.yml", &rule("beta"));
    write("a.yaml", &rule("alpha"));
    write("c.YAML", &rule("gamma"));
    // Not rule files: other extensions, hidden files, subdirectories.
    write("notes.txt", "not yaml at all: [");
    write(".hidden.yaml", "not yaml at all: [");
    std::fs::create_dir(dir.path().join("..data")).expect("mkdir");
    std::fs::create_dir(dir.path().join("nested")).expect("mkdir");
    std::fs::write(dir.path().join("nested/x.yaml"), "not yaml at all: [").expect("write");

    let loaded = RlsRules::load(dir.path(), LoadOptions::default()).expect("loaded");
    let mut domains: Vec<&str> = loaded.domains().collect();
    domains.sort_unstable();
    assert_eq!(domains, ["alpha", "beta", "gamma"]);

    // Name order decides which file is the duplicate.
    write("z.yaml", &rule("alpha"));
    let err = RlsRules::load(dir.path(), LoadOptions::default()).expect_err("duplicate");
    assert_eq!(err.file(), dir.path().join("z.yaml"));

    // One file can be loaded alone, and a missing path is an error naming it.
    let single =
        RlsRules::load(&dir.path().join("b.yml"), LoadOptions::default()).expect("one file");
    assert_eq!(single.domains().collect::<Vec<_>>(), ["beta"]);
    let missing = dir.path().join("missing.yaml");
    let err = RlsRules::load(&missing, LoadOptions::default()).expect_err("missing");
    assert_eq!(err.file(), missing);
    assert_eq!(err.line(), None);
}

#[test]
fn an_empty_directory_loads_no_domains() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let loaded = RlsRules::load(dir.path(), LoadOptions::default()).expect("loaded");
    assert!(loaded.is_empty());
}

#[test]
fn a_file_larger_than_the_most_is_refused_naming_it_and_one_at_the_most_loads() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let head = "domain: big\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let most = usize::try_from(MAX_FILE_BYTES).expect("fits");
    // A comment pads the file to exactly the most, then one byte past it.
    let padded = |len: usize| format!("{head}#{}\n", "x".repeat(len - head.len() - 2));
    let file = dir.path().join("big.yaml");
    std::fs::write(&file, padded(most)).expect("write");
    assert!(RlsRules::load(dir.path(), LoadOptions::default()).is_ok());
    std::fs::write(&file, padded(most + 1)).expect("write");
    let err = RlsRules::load(dir.path(), LoadOptions::default()).expect_err("too big");
    assert_eq!(err.file(), file);
    assert!(err.to_string().contains("larger than 4 MiB"), "{err}");
}

#[cfg(unix)]
#[test]
fn a_rules_path_that_is_not_a_regular_file_is_refused_without_waiting() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let fifo = dir.path().join("rules.yaml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    // Named directly: opening a FIFO would wait for a writer forever.
    let err = RlsRules::load(&fifo, LoadOptions::default()).expect_err("a FIFO");
    assert_eq!(err.file(), fifo);
    assert!(err.to_string().contains("not a regular file"), "{err}");
    // In a folder, it is not a rules file.
    assert!(RlsRules::load(dir.path(), LoadOptions::default()).is_ok());
    let err = RlsRules::load(Path::new("/dev/null"), LoadOptions::default()).expect_err("a device");
    assert!(err.to_string().contains("not a regular file"), "{err}");
}

#[test]
fn yaml_merge_keys_share_a_rate_limit_as_in_the_reference() {
    let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &per_second {unit: second, requests_per_unit: 5}\n  - key: b\n    rate_limit:\n      <<: *per_second\n      requests_per_unit: 9\n";
    let loaded = rules(text);
    let limits: Vec<(u32, Unit)> = loaded
        .rules("d")
        .iter()
        .map(|r| {
            let l = r.limit().expect("a limit");
            (l.requests_per_unit(), l.unit())
        })
        .collect();
    assert_eq!(limits, [(5, Unit::Second), (9, Unit::Second)]);
}

/// The rules of docs/envoy.md's quick start load as shown, and the reload
/// error the page shows for a bad unit is the one a user gets, line and
/// column included.
#[test]
fn the_quick_start_rules_in_the_docs_load_and_their_error_reads_as_shown() {
    let page = include_str!("../../../../docs/envoy.md");
    let start = page
        .find("```yaml\n# rules/edge.yaml\n")
        .expect("the quick start's rules")
        + "```yaml\n".len();
    let text = &page[start..][..page[start..].find("```").expect("the block's end")];
    let file = Path::new("rules/edge.yaml");
    let rules = RlsRules::from_sources([(file, text)], LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rules.rules("edge").len(), 2);

    let bad = text.replacen("unit: second", "unit: fortnight", 1);
    assert_ne!(bad, text, "the example has a rule per second");
    let error = RlsRules::from_sources([(file, bad.as_str())], LoadOptions::default())
        .expect_err("a bad unit is refused");
    let line = error.line().expect("a line");
    let shown = format!(
        "file={} field={} line={line} error={error}\n",
        error.file().display(),
        error.field()
    );
    assert!(page.contains(&shown), "docs/envoy.md should show {shown}");
}
