//! Envoy RLS rules (envoyproxy/ratelimit's YAML, `quotad::policy::rls`) and
//! `ShouldRateLimit` requests matched against them.
//!
//! An input is YAML text, then optionally a NUL byte and the bytes of an
//! Envoy `RateLimitRequest`. The text is loaded as one rules file with
//! [`RlsRules::from_sources`], and again as two files merged; when it
//! loads and a request follows, the request is decoded with prost (as the
//! server's codec does), its fields copied into the matcher's
//! [`Request`], and resolved: every store item it yields must be valid.
//!
//! The copying is this target's: the gRPC edge that turns the message into
//! a [`Request`] is not public. The matcher, which is where requests and
//! rules meet, is the server's own.

use std::path::Path;

use prost::Message;
use quotad::policy::rls::{
    Descriptor, Entry, LimitOverride, LoadOptions, Request, Resolution, RlsConfigError, RlsRules,
};
use quotad_proto::envoy::service::ratelimit::v3::RateLimitRequest;

use crate::invariants::check_decision;

/// Loads the rules in `data`, resolves the request after its first NUL.
pub fn run(data: &[u8]) {
    let (text, request) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], Some(&data[at + 1..])),
        None => (data, None),
    };
    let text = String::from_utf8_lossy(text);
    let file = Path::new("rules.yaml");
    let rules = match RlsRules::from_sources([(file, text.as_ref())], LoadOptions::default()) {
        Ok(rules) => rules,
        Err(error) => return check_error(&error, file),
    };
    let merge = LoadOptions {
        merge_domains: true,
    };
    let other = Path::new("more.yaml");
    if let Err(error) =
        RlsRules::from_sources([(file, text.as_ref()), (other, text.as_ref())], merge)
    {
        check_error(&error, other);
    }
    for domain in rules.domains() {
        for rule in rules.rules(domain) {
            assert!(rule.namespace().starts_with("rls:"), "{rule:?}");
            assert!(rule.line() >= 1, "{rule:?}");
        }
    }
    if let Some(bytes) = request
        && let Ok(message) = RateLimitRequest::decode(bytes)
    {
        resolve(&rules, &message);
    }
}

/// A load error names the file it is about (one of those given).
fn check_error(error: &RlsConfigError, last: &Path) {
    assert!(!error.message().is_empty(), "{error:?}");
    assert!(
        error.file() == Path::new("rules.yaml") || error.file() == last,
        "{error:?}"
    );
}

/// Matches `message` against `rules`; every limit that applies must make a
/// valid store item.
pub fn resolve(rules: &RlsRules, message: &RateLimitRequest) {
    let request = Request {
        domain: &message.domain,
        descriptors: message
            .descriptors
            .iter()
            .map(|d| Descriptor {
                entries: d
                    .entries
                    .iter()
                    .map(|e| Entry {
                        key: &e.key,
                        value: &e.value,
                    })
                    .collect(),
                limit: d.limit.as_ref().map(|l| LimitOverride {
                    requests_per_unit: l.requests_per_unit,
                    unit: l.unit,
                }),
                hits_addend: d.hits_addend,
            })
            .collect(),
        hits_addend: message.hits_addend,
    };
    let Ok(resolved) = rules.resolve(&request) else {
        return;
    };
    assert_eq!(
        resolved.len(),
        request.descriptors.len(),
        "one per descriptor"
    );
    for resolution in &resolved {
        let Resolution::Limited(applied) = resolution else {
            continue;
        };
        assert!(applied.charge().cost() >= 1, "{applied:?}");
        if let Some(item) = applied.check_item() {
            let policy = *item.policy();
            let decision = quotad_core::peek(&policy, None, 1_767_225_600_000, item.cost());
            check_decision(&decision, policy.capacity(), item.cost().get());
        }
    }
}
