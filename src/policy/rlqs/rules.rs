//! The bucket rules: the model, read from TOML, and matching.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use quotad_core::{AssignmentTerms, AssignmentTermsError};
use serde::Deserialize;
use toml::Spanned;

/// The largest rules file read (a file larger than this is refused).
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// What applies to a bucket: count it under a policy, or a blanket answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Counted under the named policy (`[policies.NAME]`), by a lease per
    /// assignment.
    Policy {
        /// The policy's name.
        policy: String,
        /// How the key is made from the bucket's pairs.
        key: KeyTemplate,
        /// How assignments are cut.
        terms: AssignmentTerms,
    },
    /// Every request allowed, counted nowhere.
    AllowAll {
        /// The assignment's TTL, whole seconds.
        ttl_s: u64,
    },
    /// Every request denied.
    DenyAll {
        /// The assignment's TTL, whole seconds.
        ttl_s: u64,
    },
}

/// One `[[bucket]]` rule: a domain and a subset of a `BucketId`'s pairs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketRule {
    /// The domain the reports must name.
    pub domain: String,
    /// Pairs the bucket must hold: a value of `*` takes any value.
    pub pairs: BTreeMap<String, String>,
    /// What applies.
    pub action: Action,
    /// The rule's 1-based line in its file.
    pub line: usize,
}

impl BucketRule {
    fn matches(&self, domain: &str, bucket: &BTreeMap<&str, &str>) -> bool {
        self.domain == domain
            && self.pairs.iter().all(|(k, v)| {
                bucket
                    .get(k.as_str())
                    .is_some_and(|have| v == "*" || have == v)
            })
    }
}

/// A key template: literal text and `{name}` placeholders, each a pair of
/// the rule's `match`; or the default, every pair of the bucket, sorted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyTemplate {
    /// Every pair, sorted by name: `a=1&b=2` (`%`, `&` and `=` escaped),
    /// so the order Envoy sends them in does not matter.
    SortedPairs,
    /// Literal parts and placeholders, in order.
    Parts(Vec<KeyPart>),
}

/// A part of a [`KeyTemplate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyPart {
    /// Text as written.
    Text(String),
    /// The value of the pair of this name.
    Pair(String),
}

impl KeyTemplate {
    /// The key of `bucket` (every placeholder names a pair the rule
    /// matched, so it is there).
    pub fn key(&self, bucket: &BTreeMap<&str, &str>) -> String {
        match self {
            KeyTemplate::SortedPairs => {
                let mut key = String::new();
                for (i, (k, v)) in bucket.iter().enumerate() {
                    if i > 0 {
                        key.push('&');
                    }
                    escape_into(&mut key, k);
                    key.push('=');
                    escape_into(&mut key, v);
                }
                key
            }
            KeyTemplate::Parts(parts) => parts
                .iter()
                .map(|part| match part {
                    KeyPart::Text(text) => text.as_str(),
                    KeyPart::Pair(name) => bucket.get(name.as_str()).copied().unwrap_or(""),
                })
                .collect(),
        }
    }

    fn parse(text: &str, pairs: &BTreeMap<String, String>) -> Result<KeyTemplate, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find(['{', '}']) {
            if rest.as_bytes()[open] == b'}' {
                return Err(format!("{text:?}: '}}' without '{{'"));
            }
            if open > 0 {
                parts.push(KeyPart::Text(rest[..open].to_owned()));
            }
            let after = &rest[open + 1..];
            let close = after
                .find('}')
                .ok_or_else(|| format!("{text:?}: '{{' without '}}'"))?;
            let name = &after[..close];
            if !pairs.contains_key(name) {
                return Err(format!(
                    "{text:?}: {{{name}}} is not a pair of this rule's match (a placeholder names a pair every matched bucket has)"
                ));
            }
            parts.push(KeyPart::Pair(name.to_owned()));
            rest = &after[close + 1..];
        }
        if !rest.is_empty() {
            parts.push(KeyPart::Text(rest.to_owned()));
        }
        if parts.is_empty() {
            return Err("must not be empty (leave it out for the sorted pairs)".to_owned());
        }
        Ok(KeyTemplate::Parts(parts))
    }
}

fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '%' => out.push_str("%25"),
            '&' => out.push_str("%26"),
            '=' => out.push_str("%3D"),
            c => out.push(c),
        }
    }
}

/// The rules of one file, in file order, and the rule for buckets no rule
/// matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketRules {
    rules: Vec<BucketRule>,
    unmatched: Action,
}

impl Default for BucketRules {
    /// No rules: every bucket is denied.
    fn default() -> Self {
        BucketRules {
            rules: Vec::new(),
            unmatched: Action::DenyAll {
                ttl_s: DEFAULT_TTL_S,
            },
        }
    }
}

/// A bucket's rule: the one that matched (its line), or the unmatched rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Matched<'a> {
    /// What applies.
    pub action: &'a Action,
    /// The matching rule's line; `None` for the unmatched rule.
    pub line: Option<usize>,
}

impl BucketRules {
    /// The first rule, in file order, whose domain is `domain` and whose
    /// pairs `bucket` holds; the unmatched rule when there is none.
    pub fn find(&self, domain: &str, bucket: &BTreeMap<&str, &str>) -> Matched<'_> {
        self.rules
            .iter()
            .find(|r| r.matches(domain, bucket))
            .map_or(
                Matched {
                    action: &self.unmatched,
                    line: None,
                },
                |r| Matched {
                    action: &r.action,
                    line: Some(r.line),
                },
            )
    }

    /// The rules, in file order.
    pub fn rules(&self) -> &[BucketRule] {
        &self.rules
    }

    /// The rule for buckets no rule matches.
    pub fn unmatched(&self) -> &Action {
        &self.unmatched
    }

    /// Reads `path` (at most [`MAX_FILE_BYTES`]).
    ///
    /// # Errors
    ///
    /// [`RlqsConfigError`] naming the file when it cannot be read.
    pub fn read(path: &Path) -> Result<String, RlqsConfigError> {
        let unreadable =
            |e: std::io::Error| RlqsConfigError::new(path, "", format!("cannot read: {e}"));
        let size = std::fs::metadata(path).map_err(unreadable)?.len();
        if size > MAX_FILE_BYTES {
            return Err(RlqsConfigError::new(
                path,
                "",
                format!("is {size} bytes, more than the {MAX_FILE_BYTES} a rules file may be"),
            ));
        }
        std::fs::read_to_string(path).map_err(unreadable)
    }

    /// The rules of `text`, read from `file`; `policy_exists` says whether
    /// a named policy is configured.
    ///
    /// # Errors
    ///
    /// The first [`RlqsConfigError`]: the file, the field and the line.
    pub fn parse(
        file: &Path,
        text: &str,
        policy_exists: impl Fn(&str) -> bool,
    ) -> Result<BucketRules, RlqsConfigError> {
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let error = RlqsConfigError::new(file, "", e.message().to_owned());
            match e.span() {
                Some(span) => error.at(line_of(text, span.start)),
                None => error,
            }
        })?;
        let defaults = raw.defaults.unwrap_or_default();
        let base = Terms {
            ttl: defaults.ttl.map_or(Ok(DEFAULT_TTL_S), |t| {
                whole_seconds(&t).map_err(|m| {
                    RlqsConfigError::new(file, "defaults.ttl", m).at(line_of(text, t.span().start))
                })
            })?,
            margin: defaults.margin.map_or(Ok(DEFAULT_MARGIN_MS), |m| {
                millis(&m).map_err(|msg| {
                    RlqsConfigError::new(file, "defaults.margin", msg)
                        .at(line_of(text, m.span().start))
                })
            })?,
            max_tokens: defaults.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        };
        let at = |field: String, span: std::ops::Range<usize>, message: String| {
            RlqsConfigError::new(file, &field, message).at(line_of(text, span.start))
        };
        let mut rules = Vec::new();
        for (i, spanned) in raw.bucket.into_iter().enumerate() {
            let span = spanned.span();
            let rule = spanned.into_inner();
            let field = |name: &str| format!("bucket[{i}].{name}");
            if rule.domain.get_ref().is_empty() {
                return Err(at(
                    field("domain"),
                    rule.domain.span(),
                    "must not be empty".to_owned(),
                ));
            }
            let mut pairs = BTreeMap::new();
            for (k, v) in rule.r#match.unwrap_or_default() {
                if k.is_empty() || v.get_ref().is_empty() {
                    return Err(at(
                        field("match"),
                        v.span(),
                        "names and values must not be empty (a value of \"*\" takes any value)"
                            .to_owned(),
                    ));
                }
                pairs.insert(k, v.into_inner());
            }
            let action = action(
                &base,
                RawAction {
                    policy: rule.policy,
                    key: rule.key,
                    blanket: rule.blanket,
                    ttl: rule.ttl,
                    margin: rule.margin,
                    max_tokens: rule.max_tokens,
                },
                &pairs,
                &policy_exists,
            )
            .map_err(|(name, s, message)| {
                at(field(&name), s.unwrap_or_else(|| span.clone()), message)
            })?;
            rules.push(BucketRule {
                domain: rule.domain.into_inner(),
                pairs,
                action,
                line: line_of(text, span.start),
            });
        }
        let unmatched = match raw.unmatched {
            None => Action::DenyAll { ttl_s: base.ttl },
            Some(spanned) => {
                let span = spanned.span();
                let u = spanned.into_inner();
                action(
                    &base,
                    RawAction {
                        policy: u.policy,
                        key: u.key,
                        blanket: u.blanket,
                        ttl: u.ttl,
                        margin: u.margin,
                        max_tokens: u.max_tokens,
                    },
                    &BTreeMap::new(),
                    &policy_exists,
                )
                .map_err(|(name, s, message)| {
                    at(
                        format!("unmatched.{name}"),
                        s.unwrap_or_else(|| span.clone()),
                        message,
                    )
                })?
            }
        };
        Ok(BucketRules { rules, unmatched })
    }
}

/// The default assignment TTL: Envoy reports every 5 s, and quotad renews
/// each assignment before it ends, so a short TTL costs a message, not a
/// gap.
pub const DEFAULT_TTL_S: u64 = 2;
/// The default margin: how long the store keeps counting a lease past the
/// TTL Envoy was given.
pub const DEFAULT_MARGIN_MS: u64 = 500;
/// The default most units one assignment holds.
pub const DEFAULT_MAX_TOKENS: u64 = 1_000;

struct Terms {
    ttl: u64,
    margin: u64,
    max_tokens: u64,
}

struct RawAction {
    policy: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
    blanket: Option<Spanned<String>>,
    ttl: Option<Spanned<String>>,
    margin: Option<Spanned<String>>,
    max_tokens: Option<Spanned<u64>>,
}

type ActionError = (String, Option<std::ops::Range<usize>>, String);

fn action(
    base: &Terms,
    raw: RawAction,
    pairs: &BTreeMap<String, String>,
    policy_exists: &impl Fn(&str) -> bool,
) -> Result<Action, ActionError> {
    let err = |name: &str, span: std::ops::Range<usize>, message: String| {
        (name.to_owned(), Some(span), message)
    };
    let ttl = match &raw.ttl {
        Some(t) => whole_seconds(t).map_err(|m| err("ttl", t.span(), m))?,
        None => base.ttl,
    };
    let margin = match &raw.margin {
        Some(m) => millis(m).map_err(|msg| err("margin", m.span(), msg))?,
        None => base.margin,
    };
    let max_tokens = raw
        .max_tokens
        .as_ref()
        .map_or(base.max_tokens, |m| *m.get_ref());
    match (raw.policy, raw.blanket) {
        (Some(p), Some(b)) => Err(err(
            "blanket",
            b.span(),
            format!("a rule names a policy ({:?}) or a blanket answer, not both", p.get_ref()),
        )),
        (None, None) => Err((
            "policy".to_owned(),
            None,
            "a rule names a policy (policy = \"NAME\") or a blanket answer (blanket = \"allow_all\" or \"deny_all\")".to_owned(),
        )),
        (None, Some(b)) => {
            if let Some(k) = raw.key {
                return Err(err("key", k.span(), "a blanket rule counts nothing, so it has no key".to_owned()));
            }
            match b.get_ref().as_str() {
                "allow_all" => Ok(Action::AllowAll { ttl_s: ttl }),
                "deny_all" => Ok(Action::DenyAll { ttl_s: ttl }),
                other => Err(err(
                    "blanket",
                    b.span(),
                    format!("{other:?} is not a blanket answer (allow_all or deny_all)"),
                )),
            }
        }
        (Some(p), None) => {
            if !policy_exists(p.get_ref()) {
                return Err(err(
                    "policy",
                    p.span(),
                    format!("no policy is named {:?} ([policies.NAME] in the config file)", p.get_ref()),
                ));
            }
            let key = match raw.key {
                None => KeyTemplate::SortedPairs,
                Some(k) => KeyTemplate::parse(k.get_ref(), pairs).map_err(|m| err("key", k.span(), m))?,
            };
            let terms = AssignmentTerms::try_new(ttl, margin, max_tokens).map_err(|e| {
                let (name, span) = match e {
                    AssignmentTermsError::Ttl => ("ttl", raw.ttl.as_ref().map(Spanned::span)),
                    AssignmentTermsError::Margin => ("margin", raw.margin.as_ref().map(Spanned::span)),
                    AssignmentTermsError::MaxUnits => {
                        ("max_tokens", raw.max_tokens.as_ref().map(Spanned::span))
                    }
                };
                (name.to_owned(), span, e.to_string())
            })?;
            Ok(Action::Policy {
                policy: p.into_inner(),
                key,
                terms,
            })
        }
    }
}

fn whole_seconds(text: &Spanned<String>) -> Result<u64, String> {
    let d = duration(text.get_ref())?;
    if d.subsec_nanos() != 0
        || d.is_zero()
        || d.as_secs() > quotad_core::assignment::MAX_ASSIGNMENT_TTL_S
    {
        return Err(format!(
            "{:?}: must be whole seconds from 1s to 1d (Envoy reads a TTL in whole seconds)",
            text.get_ref()
        ));
    }
    Ok(d.as_secs())
}

fn millis(text: &Spanned<String>) -> Result<u64, String> {
    let d = duration(text.get_ref())?;
    if d.subsec_nanos() % 1_000_000 != 0 || d > Duration::from_secs(60) {
        return Err(format!(
            "{:?}: must be whole milliseconds, at most 1m",
            text.get_ref()
        ));
    }
    Ok(u64::try_from(d.as_millis()).expect("at most a minute"))
}

fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("invalid duration {text:?}: {e} (write e.g. \"2s\", \"500ms\")"))
}

fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    defaults: Option<RawDefaults>,
    #[serde(default)]
    bucket: Vec<Spanned<RawRule>>,
    unmatched: Option<Spanned<RawUnmatched>>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    ttl: Option<Spanned<String>>,
    margin: Option<Spanned<String>>,
    max_tokens: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    domain: Spanned<String>,
    r#match: Option<BTreeMap<String, Spanned<String>>>,
    policy: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
    blanket: Option<Spanned<String>>,
    ttl: Option<Spanned<String>>,
    margin: Option<Spanned<String>>,
    max_tokens: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUnmatched {
    policy: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
    blanket: Option<Spanned<String>>,
    ttl: Option<Spanned<String>>,
    margin: Option<Spanned<String>>,
    max_tokens: Option<Spanned<u64>>,
}

/// A rules file that cannot be used: the file, the field
/// (`bucket[0].policy`) and the line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RlqsConfigError {
    file: PathBuf,
    field: String,
    message: String,
    line: Option<usize>,
}

impl RlqsConfigError {
    pub(crate) fn new(file: &Path, field: &str, message: impl Into<String>) -> Self {
        RlqsConfigError {
            file: file.to_owned(),
            field: field.to_owned(),
            message: message.into(),
            line: None,
        }
    }

    fn at(mut self, line: usize) -> Self {
        self.line = Some(line);
        self
    }

    /// The file at fault.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The field path; empty when the fault is the file's.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The 1-based line of the fault, when known.
    pub fn line(&self) -> Option<usize> {
        self.line
    }
}

impl fmt::Display for RlqsConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.file.display())?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)?;
        if let Some(line) = self.line {
            write!(f, " (line {line})")?;
        }
        Ok(())
    }
}

impl std::error::Error for RlqsConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<BucketRules, RlqsConfigError> {
        BucketRules::parse(Path::new("rlqs.toml"), text, |p| p == "api" || p == "other")
    }

    fn bucket<'a>(pairs: &[(&'a str, &'a str)]) -> BTreeMap<&'a str, &'a str> {
        pairs.iter().copied().collect()
    }

    const RULES: &str = r#"
[defaults]
ttl = "3s"

[[bucket]]
domain = "edge"
match = { name = "api", tenant = "*" }
policy = "api"
key = "tenant:{tenant}"

[[bucket]]
domain = "edge"
match = { name = "api" }
policy = "other"
max_tokens = 50

[[bucket]]
domain = "edge"
match = { name = "open" }
blanket = "allow_all"

[unmatched]
blanket = "deny_all"
ttl = "1s"
"#;

    #[test]
    fn the_first_rule_in_file_order_whose_pairs_the_bucket_holds_applies() {
        let rules = parse(RULES).expect("valid");
        let b = bucket(&[("tenant", "acme"), ("name", "api"), ("path", "/x")]);
        let m = rules.find("edge", &b);
        assert_eq!(m.line, Some(5));
        let Action::Policy { policy, key, terms } = m.action else {
            panic!("a policy rule")
        };
        assert_eq!((policy.as_str(), terms.ttl_s()), ("api", 3));
        assert_eq!(key.key(&b), "tenant:acme");

        let m = rules.find("edge", &bucket(&[("name", "api")]));
        assert_eq!(m.line, Some(11));
        let Action::Policy { terms, .. } = m.action else {
            panic!("a policy rule")
        };
        assert_eq!(terms.max_units(), 50);

        assert_eq!(
            rules.find("edge", &bucket(&[("name", "open")])).action,
            &Action::AllowAll { ttl_s: 3 }
        );
        // Another domain, another value, a missing pair: the unmatched rule.
        for (domain, b) in [
            ("core", bucket(&[("name", "api")])),
            ("edge", bucket(&[("name", "apis")])),
            ("edge", bucket(&[("tenant", "acme")])),
        ] {
            let m = rules.find(domain, &b);
            assert_eq!((m.action, m.line), (&Action::DenyAll { ttl_s: 1 }, None));
        }
    }

    #[test]
    fn the_default_key_is_the_sorted_pairs_whatever_their_order() {
        let one: BTreeMap<&str, &str> = [("b", "2"), ("a", "1")].into_iter().collect();
        let two: BTreeMap<&str, &str> = [("a", "1"), ("b", "2")].into_iter().collect();
        assert_eq!(KeyTemplate::SortedPairs.key(&one), "a=1&b=2");
        assert_eq!(KeyTemplate::SortedPairs.key(&two), "a=1&b=2");
        // Escaped, so that no two buckets share a key.
        let tricky: BTreeMap<&str, &str> = [("a", "1&b=2")].into_iter().collect();
        assert_eq!(KeyTemplate::SortedPairs.key(&tricky), "a=1%26b%3D2");
    }

    #[test]
    fn errors_name_the_file_the_field_and_the_line() {
        let cases = [
            (
                RULES.replace("policy = \"api\"", "policy = \"nope\""),
                "bucket[0].policy",
                8,
            ),
            (
                RULES.replace("tenant:{tenant}", "tenant:{user}"),
                "bucket[0].key",
                9,
            ),
            (
                RULES.replace("ttl = \"3s\"", "ttl = \"1500ms\""),
                "defaults.ttl",
                3,
            ),
            (
                RULES.replace("max_tokens = 50", "max_tokens = 0"),
                "bucket[1].max_tokens",
                15,
            ),
            (
                RULES.replace("\"allow_all\"", "\"maybe\""),
                "bucket[2].blanket",
                20,
            ),
            (
                RULES.replace("policy = \"other\"\n", ""),
                "bucket[1].policy",
                11,
            ),
            (
                RULES.replace("blanket = \"deny_all\"", "policy = \"nope\""),
                "unmatched.policy",
                23,
            ),
        ];
        for (text, field, line) in cases {
            let error = parse(&text).expect_err(field);
            assert_eq!(error.file(), Path::new("rlqs.toml"));
            assert_eq!(
                (error.field(), error.line()),
                (field, Some(line)),
                "{error}"
            );
        }
        let error =
            parse("[[bucket]]\ndomain = \"x\"\npolicy = \"api\"\nwhat = 1\n").expect_err("unknown");
        assert_eq!(error.line(), Some(4), "{error}");
        let error = parse("[[bucket]]\ndomain = \n").expect_err("syntax");
        assert_eq!(error.line(), Some(2), "{error}");
    }

    #[test]
    fn no_file_denies_every_bucket() {
        let rules = parse("").expect("valid");
        assert_eq!(
            rules.find("any", &bucket(&[("a", "b")])).action,
            &Action::DenyAll {
                ttl_s: DEFAULT_TTL_S
            }
        );
    }
}
