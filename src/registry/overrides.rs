//! Overrides: for a named policy, an exact key or a key prefix that gets
//! its own limit, window and burst, optionally until an expiry.
//!
//! An override changes the numbers a key is counted by, never where its
//! state lives: the key keeps the policy's state namespace, so changing,
//! adding or removing an override keeps the key's count exactly as a hot
//! reload of the policy does (see [the registry](super)): a changed limit
//! or burst applies to the counts already there, a changed window starts
//! the key fresh.
//!
//! Precedence, for a key under a policy: the exact key's override, then
//! the longest prefix's, then the policy. An expired override is not in
//! force (the next one in that order applies). Overrides come from two
//! sources, the config file (`[[overrides]]`) and the admin API; for the
//! same policy and key (or prefix) the admin API's wins, so a change made
//! at run time is never silently undone by a file that still holds the
//! old value.
//!
//! The lookup is bounded whatever admins write: an exact key is one hash
//! lookup, and the longest prefix is one pass over the key's bytes down a
//! trie of the policy's prefixes (O(L) in the key's length, whatever the
//! number or lengths of the prefixes).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use quotad_core::{Clock, Policy, SystemClock};

pub(crate) use crate::config::overrides::{InvalidOverride, Override, Scope, Source};

/// An override and the policy it gives its keys.
#[derive(Clone, Debug)]
pub(crate) struct Active {
    pub(crate) entry: Arc<Override>,
    pub(crate) policy: Policy,
}

/// The overrides of one policy.
#[derive(Clone, Debug, Default)]
struct PolicyOverrides {
    exact: HashMap<String, Active>,
    prefixes: PrefixTrie,
}

impl PolicyOverrides {
    fn find(&self, key: &str, now_ms: u64) -> Option<&Active> {
        if let Some(a) = self.exact.get(key).filter(|a| a.entry.live_at(now_ms)) {
            return Some(a);
        }
        self.prefixes.longest(key, now_ms)
    }
}

/// The prefix overrides of one policy as a byte trie: the longest prefix
/// of a key in force is found in one pass over the key's bytes, O(L) in
/// the key's length whatever the prefixes (a lookup per prefix length
/// would hash up to L prefixes of up to L bytes each, O(L²)).
#[derive(Clone, Debug, Default)]
struct PrefixTrie {
    /// The root first; a node's children sorted by byte.
    nodes: Vec<TrieNode>,
}

#[derive(Clone, Debug, Default)]
struct TrieNode {
    children: Vec<(u8, usize)>,
    /// The override of the prefix that ends here.
    active: Option<Active>,
}

impl PrefixTrie {
    fn child(&self, at: usize, byte: u8) -> Option<usize> {
        let children = &self.nodes[at].children;
        children
            .binary_search_by_key(&byte, |&(b, _)| b)
            .ok()
            .map(|i| children[i].1)
    }

    fn insert(&mut self, prefix: &str, active: Active) {
        if self.nodes.is_empty() {
            self.nodes.push(TrieNode::default());
        }
        let mut at = 0;
        for &byte in prefix.as_bytes() {
            at = match self.child(at, byte) {
                Some(next) => next,
                None => {
                    let next = self.nodes.len();
                    self.nodes.push(TrieNode::default());
                    let children = &mut self.nodes[at].children;
                    let i = children.partition_point(|&(b, _)| b < byte);
                    children.insert(i, (byte, next));
                    next
                }
            };
        }
        self.nodes[at].active = Some(active);
    }

    /// The override of the longest prefix of `key` in force at `now_ms`.
    /// A prefix is whole UTF-8, so one that matches ends on a character
    /// boundary of the key.
    fn longest(&self, key: &str, now_ms: u64) -> Option<&Active> {
        if self.nodes.is_empty() {
            return None;
        }
        let mut at = 0;
        let mut best = None;
        for &byte in key.as_bytes() {
            let Some(next) = self.child(at, byte) else {
                break;
            };
            at = next;
            if let Some(a) = self.nodes[at]
                .active
                .as_ref()
                .filter(|a| a.entry.live_at(now_ms))
            {
                best = Some(a);
            }
        }
        best
    }
}

/// Every override in force, by policy: immutable, built whole and swapped
/// with the policies (see [`super::PolicySet`]).
#[derive(Clone, Debug)]
pub(crate) struct OverrideTable {
    by_policy: HashMap<Arc<str>, PolicyOverrides>,
    /// Every entry, file and runtime merged (runtime winning), sorted.
    all: BTreeMap<(String, Scope), Active>,
    /// When overrides expire: the server's clock (a test's fake one).
    clock: Arc<dyn Clock>,
}

impl Default for OverrideTable {
    /// No overrides, on the system clock.
    fn default() -> Self {
        OverrideTable {
            by_policy: HashMap::new(),
            all: BTreeMap::new(),
            clock: Arc::new(SystemClock),
        }
    }
}

/// What building a table dropped: an override whose policy is gone or no
/// longer accepts its numbers (after a reload), with why.
pub(crate) type Dropped = Vec<(Arc<Override>, String)>;

impl OverrideTable {
    /// The table of `entries` (file and runtime; runtime wins for the same
    /// policy and scope) against the named policies `base`.
    pub(crate) fn build<'a>(
        entries: impl IntoIterator<Item = &'a Arc<Override>>,
        base: impl Fn(&str) -> Option<Policy>,
        clock: Arc<dyn Clock>,
    ) -> (OverrideTable, Dropped) {
        let mut chosen: BTreeMap<(String, Scope), &Arc<Override>> = BTreeMap::new();
        for entry in entries {
            let slot = (entry.policy.clone(), entry.scope.clone());
            match chosen.get(&slot) {
                Some(kept) if kept.source == Source::Runtime && entry.source == Source::File => {}
                _ => {
                    chosen.insert(slot, entry);
                }
            }
        }
        let mut table = OverrideTable {
            clock,
            ..OverrideTable::default()
        };
        let mut dropped = Vec::new();
        for (slot, entry) in chosen {
            let Some(policy) = base(&entry.policy) else {
                dropped.push((Arc::clone(entry), "its policy is not configured".to_owned()));
                continue;
            };
            let policy = match entry.effective(&policy) {
                Ok(p) => p,
                Err(e) => {
                    dropped.push((Arc::clone(entry), e.to_string()));
                    continue;
                }
            };
            let active = Active {
                entry: Arc::clone(entry),
                policy,
            };
            let of_policy = table
                .by_policy
                .entry(Arc::from(entry.policy.as_str()))
                .or_default();
            match &entry.scope {
                Scope::Key(k) => of_policy.exact.insert(k.clone(), active.clone()),
                Scope::Prefix(p) => {
                    of_policy.prefixes.insert(p, active.clone());
                    None
                }
            };
            table.all.insert(slot, active);
        }
        (table, dropped)
    }

    /// The override in force for `key` under `policy` at `now_ms`, if any:
    /// the exact key's, else the longest prefix's.
    pub(crate) fn find(&self, policy: &str, key: &str, now_ms: u64) -> Option<&Active> {
        self.by_policy.get(policy)?.find(key, now_ms)
    }

    /// Now, by the clock overrides expire by.
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Whether `policy` has any override.
    pub(crate) fn has(&self, policy: &str) -> bool {
        self.by_policy.contains_key(policy)
    }

    /// Every override, sorted by policy and scope.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Active> {
        self.all.values()
    }

    /// How many overrides are in force at `now_ms`, by policy and source.
    pub(crate) fn counts(&self, now_ms: u64) -> BTreeMap<(String, Source), u64> {
        let mut counts = BTreeMap::new();
        for a in self.all.values().filter(|a| a.entry.live_at(now_ms)) {
            *counts
                .entry((a.entry.policy.clone(), a.entry.source))
                .or_default() += 1;
        }
        counts
    }
}

/// The prefix lookup alone, for the criterion bench (`benches/overrides.rs`):
/// a policy's table of prefix overrides and its `find`. Not an API.
#[doc(hidden)]
#[derive(Debug)]
pub struct PrefixLookup(OverrideTable);

impl PrefixLookup {
    /// A table of one token-bucket policy `api` with a prefix override for
    /// each of `prefixes`.
    ///
    /// # Panics
    ///
    /// If a prefix is empty (not an override).
    #[must_use]
    pub fn new(prefixes: &[String]) -> Self {
        let base = Policy::try_new(
            quotad_core::Algorithm::TokenBucket,
            10,
            std::time::Duration::from_secs(1),
            None,
        )
        .expect("a valid policy");
        let entries: Vec<Arc<Override>> = prefixes
            .iter()
            .map(|p| {
                Arc::new(Override {
                    policy: "api".to_owned(),
                    scope: Scope::Prefix(p.clone()),
                    limit: 20,
                    window_ms: None,
                    burst: None,
                    expires_at_ms: None,
                    source: Source::Runtime,
                    set_by: "bench".to_owned(),
                    set_at_ms: 0,
                })
            })
            .collect();
        let (table, dropped) =
            OverrideTable::build(&entries, |_| Some(base), Arc::new(SystemClock));
        assert!(dropped.is_empty(), "{dropped:?}");
        PrefixLookup(table)
    }

    /// The limit of the override `key` finds, if any.
    #[must_use]
    pub fn find(&self, key: &str) -> Option<u64> {
        self.0.find("api", key, 0).map(|a| a.policy.limit())
    }
}

/// The version of the runtime overrides a store keeps: its epoch and its
/// count of changes in that epoch (the backend's `OverridesVersion`).
pub(crate) type Version = (u64, u64);

/// What the store field of every override of `policy` starts with (see
/// [`store_field`]).
pub(crate) fn store_fields_of(policy: &str) -> String {
    format!(
        "[{},",
        serde_json::to_string(policy).expect("strings serialize")
    )
}

/// The field of an override in the store's hash of overrides: its policy
/// and scope, which identify it.
pub(crate) fn store_field(policy: &str, scope: &Scope) -> String {
    serde_json::to_string(&(policy, scope)).expect("strings serialize")
}

/// The value of an override in the store's hash of overrides.
pub(crate) fn store_value(entry: &Override) -> String {
    serde_json::to_string(entry).expect("an override serializes")
}

/// An override read back from the store; `None` (logged) for a value this
/// version cannot read, which is skipped rather than failing the others.
pub(crate) fn from_store(field: &str, value: &str) -> Option<Override> {
    match serde_json::from_str::<Override>(value) {
        Ok(entry) if entry.source == Source::Runtime => Some(entry),
        Ok(_) => None,
        Err(error) => {
            tracing::warn!(%field, %error, "stored override not readable; skipped");
            None
        }
    }
}

/// Exports `quotad_overrides` (in force now, by policy and source) and
/// `quotad_overrides_in_sync` from `registry`.
pub(crate) fn export(registry: &super::PolicyRegistry, metrics: &crate::metrics::Metrics) {
    let set = registry.snapshot();
    let counts = set.overrides().counts(set.overrides().now_ms());
    metrics.overrides_in_force(
        counts
            .into_iter()
            .map(|((policy, source), n)| ((policy, source.as_str()), n)),
    );
    metrics.overrides_in_sync(registry.in_sync());
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use quotad_core::Algorithm;

    use super::*;

    fn base() -> Policy {
        Policy::try_new(Algorithm::TokenBucket, 10, Duration::from_secs(1), None).expect("valid")
    }

    fn entry(scope: Scope, limit: u64, source: Source) -> Arc<Override> {
        Arc::new(Override {
            policy: "api".to_owned(),
            scope,
            limit,
            window_ms: None,
            burst: None,
            expires_at_ms: None,
            source,
            set_by: "test".to_owned(),
            set_at_ms: 0,
        })
    }

    fn table(entries: &[Arc<Override>]) -> OverrideTable {
        let (table, dropped) = OverrideTable::build(
            entries,
            |name| (name == "api").then(base),
            Arc::new(SystemClock),
        );
        assert!(dropped.is_empty(), "{dropped:?}");
        table
    }

    fn limit_of(table: &OverrideTable, key: &str) -> Option<u64> {
        table.find("api", key, 0).map(|a| a.policy.limit())
    }

    #[test]
    fn the_exact_key_wins_then_the_longest_prefix_then_the_policy() {
        let t = table(&[
            entry(Scope::Prefix("tenant:".into()), 20, Source::Runtime),
            entry(Scope::Prefix("tenant:acme".into()), 30, Source::Runtime),
            entry(Scope::Key("tenant:acme:1".into()), 40, Source::Runtime),
        ]);
        assert_eq!(limit_of(&t, "tenant:acme:1"), Some(40));
        assert_eq!(limit_of(&t, "tenant:acme:2"), Some(30));
        assert_eq!(limit_of(&t, "tenant:acmex"), Some(30));
        assert_eq!(limit_of(&t, "tenant:globex"), Some(20));
        assert_eq!(limit_of(&t, "tenant"), None);
        assert_eq!(limit_of(&t, "user:1"), None);
        assert_eq!(
            t.find("other", "tenant:acme:1", 0)
                .map(|a| a.policy.limit()),
            None
        );
        // A burst left out follows the override's limit.
        let found = t.find("api", "tenant:acme:1", 0).expect("an override");
        assert_eq!(found.policy.burst(), 40);
        assert_eq!(found.policy.algorithm(), Algorithm::TokenBucket);
    }

    proptest::proptest! {
        #[test]
        fn the_prefix_found_is_the_longest_in_force_as_a_scan_of_all_finds_it(
            prefixes in proptest::collection::vec(("[ab]{1,6}", proptest::option::of(0u64..4)), 0..12),
            key in "[ab]{0,8}",
            now in 0u64..4,
        ) {
            let entries: Vec<_> = prefixes
                .iter()
                .enumerate()
                .map(|(i, (p, expires))| {
                    let mut e = (*entry(Scope::Prefix(p.clone()), 1 + i as u64, Source::Runtime)).clone();
                    e.expires_at_ms = *expires;
                    Arc::new(e)
                })
                .collect();
            let t = table(&entries);
            // The table keeps the last entry of a prefix written twice.
            let mut last: BTreeMap<&str, &Arc<Override>> = BTreeMap::new();
            for e in &entries {
                if let Scope::Prefix(p) = &e.scope {
                    last.insert(p, e);
                }
            }
            let expected = last
                .iter()
                .filter(|(p, e)| key.starts_with(**p) && e.live_at(now))
                .max_by_key(|(p, _)| p.len())
                .map(|(_, e)| e.limit);
            proptest::prop_assert_eq!(t.find("api", &key, now).map(|a| a.entry.limit), expected);
        }
    }

    #[test]
    fn a_prefix_that_would_split_a_character_matches_nothing() {
        let t = table(&[entry(Scope::Prefix("é".into()), 20, Source::Runtime)]);
        assert_eq!(limit_of(&t, "é1"), Some(20));
        // "e" + combining: one byte of é is never a prefix of another char.
        assert_eq!(limit_of(&t, "x"), None);
        let two = table(&[entry(Scope::Prefix("ab".into()), 20, Source::Runtime)]);
        assert_eq!(limit_of(&two, "aé"), None);
    }

    #[test]
    fn an_expired_override_gives_way_to_the_next_in_precedence() {
        let mut exact = (*entry(Scope::Key("k1".into()), 40, Source::Runtime)).clone();
        exact.expires_at_ms = Some(1_000);
        let t = table(&[
            Arc::new(exact),
            entry(Scope::Prefix("k".into()), 20, Source::Runtime),
        ]);
        assert_eq!(t.find("api", "k1", 999).map(|a| a.policy.limit()), Some(40));
        assert_eq!(
            t.find("api", "k1", 1_000).map(|a| a.policy.limit()),
            Some(20)
        );
        assert_eq!(t.counts(999).values().sum::<u64>(), 2);
        assert_eq!(t.counts(1_000).values().sum::<u64>(), 1);
    }

    #[test]
    fn a_runtime_override_wins_over_the_files_for_the_same_scope() {
        let scope = || Scope::Prefix("t:".into());
        for entries in [
            [
                entry(scope(), 5, Source::File),
                entry(scope(), 50, Source::Runtime),
            ],
            [
                entry(scope(), 50, Source::Runtime),
                entry(scope(), 5, Source::File),
            ],
        ] {
            let t = table(&entries);
            assert_eq!(limit_of(&t, "t:1"), Some(50));
            assert_eq!(t.iter().count(), 1);
        }
    }

    #[test]
    fn bad_numbers_name_their_field() {
        let mut bad = (*entry(Scope::Key("k".into()), 0, Source::Runtime)).clone();
        assert_eq!(bad.effective(&base()).expect_err("zero").field, "limit");
        bad.limit = 10;
        bad.burst = Some(0);
        assert_eq!(bad.effective(&base()).expect_err("zero").field, "burst");
        bad.burst = None;
        bad.window_ms = Some(0);
        assert_eq!(bad.effective(&base()).expect_err("zero").field, "window_ms");
        bad.window_ms = Some(1 << 40);
        bad.limit = 1 << 20;
        assert_eq!(bad.effective(&base()).expect_err("2^53").field, "limit");
        let empty = entry(Scope::Prefix(String::new()), 5, Source::Runtime);
        assert_eq!(empty.effective(&base()).expect_err("empty").field, "prefix");
        let fixed = Policy::try_new(Algorithm::FixedWindow, 10, Duration::from_secs(1), None)
            .expect("valid");
        let mut burst = (*entry(Scope::Key("k".into()), 5, Source::Runtime)).clone();
        burst.burst = Some(5);
        assert_eq!(
            burst.effective(&fixed).expect_err("no burst").field,
            "burst"
        );
    }

    #[test]
    fn overrides_of_a_policy_gone_or_changed_are_dropped_with_why() {
        let entries = [
            entry(Scope::Key("k".into()), 20_000, Source::Runtime),
            Arc::new(Override {
                policy: "gone".into(),
                ..(*entry(Scope::Key("k".into()), 5, Source::Runtime)).clone()
            }),
        ];
        let log = Policy::try_new(Algorithm::SlidingLog, 10, Duration::from_secs(1), None)
            .expect("valid");
        let (t, dropped) = OverrideTable::build(
            &entries,
            |n| (n == "api").then_some(log),
            Arc::new(SystemClock),
        );
        assert_eq!(t.iter().count(), 0);
        assert_eq!(dropped.len(), 2);
        assert!(
            dropped
                .iter()
                .any(|(_, why)| why.contains("not configured"))
        );
        assert!(dropped.iter().any(|(_, why)| why.contains("sliding_log")));
    }
}
