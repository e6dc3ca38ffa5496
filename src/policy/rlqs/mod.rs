//! Bucket rules for Envoy's Rate Limit Quota Service (RLQS): which quotad
//! policy counts a bucket, under which key.
//!
//! Envoy's `rate_limit_quota` filter names each bucket by a `BucketId`, a
//! map of string pairs, and reports it under a domain. A TOML file
//! (`rlqs.rules`) maps a domain and a subset of those pairs to a named
//! policy and a key template; the first `[[bucket]]` rule in file order
//! whose domain is the report's and whose pairs the bucket holds applies
//! (a `match` value of `"*"` takes any value of that pair), and buckets no
//! rule matches get the `[unmatched]` rule (by default: deny all).
//!
//! ```toml
//! [defaults]
//! ttl = "2s"          # each assignment's TTL at Envoy (whole seconds)
//! margin = "500ms"    # how long past it the store keeps counting it
//! max_tokens = 1000   # the most units one assignment holds
//!
//! [[bucket]]
//! domain = "edge"
//! match = { name = "api", tenant = "*" }
//! policy = "api-per-tenant"   # a [policies.NAME] of the config file
//! key = "tenant:{tenant}"     # default: every pair, sorted (a=1&b=2)
//!
//! [unmatched]
//! blanket = "deny_all"        # or allow_all, or policy = "..."
//! ```
//!
//! Loading and matching are pure: no I/O but reading the file. The rules
//! in force are swapped whole when the file changes (polled every
//! `server.config_poll_interval`) and on SIGHUP; an invalid version keeps
//! the rules in force and is logged with its file, field and line.

mod rules;

use arc_swap::ArcSwap;
use std::sync::Arc;

pub use rules::{
    Action, BucketRule, BucketRules, DEFAULT_MARGIN_MS, DEFAULT_MAX_TOKENS, DEFAULT_TTL_S, KeyPart,
    KeyTemplate, MAX_FILE_BYTES, Matched, RlqsConfigError,
};

/// The bucket rules in force, replaced whole on reload.
#[derive(Debug)]
pub(crate) struct RlqsRegistry {
    current: ArcSwap<BucketRules>,
}

impl RlqsRegistry {
    pub(crate) fn new(rules: BucketRules) -> Self {
        RlqsRegistry {
            current: ArcSwap::from_pointee(rules),
        }
    }

    /// The rules in force now.
    pub(crate) fn snapshot(&self) -> Arc<BucketRules> {
        self.current.load_full()
    }

    /// Replaces the rules; streams holding a snapshot finish their step
    /// with the old one.
    pub(crate) fn replace(&self, rules: BucketRules) {
        self.current.store(Arc::new(rules));
    }
}
