//! The named-policy registry: an atomically swapped, immutable map.
//!
//! Requests take a snapshot (an `Arc` clone, no lock) and resolve every
//! name against it, so a batch sees one consistent set of policies even if
//! a reload lands mid-request.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use super::overrides::{
    Active, InvalidOverride, Override, OverrideTable, Scope, Source, Version, newer,
};
use crate::config::{LimitSettings, PolicySettings};
use crate::metrics::{DecisionCounters, LeaseCounters, Metrics};
use arc_swap::ArcSwap;
use quotad_core::Clock;

/// A configured policy with its decision counters, and its lease counters
/// when it has lease settings.
#[derive(Clone, Debug)]
pub(crate) struct NamedPolicy {
    pub(crate) settings: PolicySettings,
    pub(crate) decisions: Arc<DecisionCounters>,
    pub(crate) leases: Option<Arc<LeaseCounters>>,
}

/// One immutable set of named policies, with the `[limits]` that reload
/// with them.
#[derive(Debug)]
pub(crate) struct PolicySet {
    by_name: HashMap<Arc<str>, NamedPolicy>,
    limits: LimitSettings,
    /// The overrides in force with these policies (file and runtime).
    overrides: Arc<OverrideTable>,
}

impl PolicySet {
    pub(crate) fn new(
        policies: &BTreeMap<String, PolicySettings>,
        limits: &LimitSettings,
        metrics: &Metrics,
    ) -> Self {
        let by_name = policies
            .iter()
            .map(|(name, settings)| {
                let decisions = metrics.named_policy(name, settings.policy.algorithm());
                let leases = settings.lease.map(|_| metrics.named_leases(name));
                (
                    Arc::from(name.as_str()),
                    NamedPolicy {
                        settings: *settings,
                        decisions,
                        leases,
                    },
                )
            })
            .collect();
        PolicySet {
            by_name,
            limits: limits.clone(),
            overrides: Arc::default(),
        }
    }

    /// The same policies with `overrides` in force.
    fn with_overrides(&self, overrides: OverrideTable) -> PolicySet {
        PolicySet {
            by_name: self.by_name.clone(),
            limits: self.limits.clone(),
            overrides: Arc::new(overrides),
        }
    }

    /// The overrides of `entries` against these policies; what they drop
    /// (a policy gone, numbers it no longer accepts) is logged.
    fn table<'a>(
        &self,
        entries: impl IntoIterator<Item = &'a Arc<Override>>,
        clock: &Arc<dyn Clock>,
    ) -> OverrideTable {
        let (table, dropped) = OverrideTable::build(
            entries,
            |name| self.by_name.get(name).map(|p| p.settings.policy),
            Arc::clone(clock),
        );
        for (entry, why) in dropped {
            tracing::warn!(
                policy = %entry.policy,
                scope = %entry.scope.describe(),
                source = entry.source.as_str(),
                %why,
                "override not in force"
            );
        }
        table
    }

    /// The policy named `name` as it applies to `key` at `now_ms`: the
    /// name as stored (the state namespace: an override never moves a
    /// key's state), the named policy, and the override in force, if any.
    pub(crate) fn get_for_at(
        &self,
        name: &str,
        key: &str,
        now_ms: u64,
    ) -> Option<(&str, &NamedPolicy, Option<&Active>)> {
        let (stored, named) = self.get(name)?;
        Some((stored, named, self.overrides.find(name, key, now_ms)))
    }

    /// [`PolicySet::get_for_at`] now (the clock is read only when the
    /// policy has overrides).
    pub(crate) fn get_for(
        &self,
        name: &str,
        key: &str,
    ) -> Option<(&str, &NamedPolicy, Option<&Active>)> {
        let now = if self.overrides.has(name) {
            self.overrides.now_ms()
        } else {
            0
        };
        self.get_for_at(name, key, now)
    }

    /// Whether the policy named `name` has overrides (so that its keys may
    /// not all count alike).
    pub(crate) fn has_overrides(&self, name: &str) -> bool {
        self.overrides.has(name)
    }

    /// The overrides in force with this set.
    pub(crate) fn overrides(&self) -> &OverrideTable {
        &self.overrides
    }

    /// `[limits]`, as of this set.
    pub(crate) fn limits(&self) -> &LimitSettings {
        &self.limits
    }

    /// The policy named `name`, with the name as stored (the state
    /// namespace).
    pub(crate) fn get(&self, name: &str) -> Option<(&str, &NamedPolicy)> {
        self.by_name.get_key_value(name).map(|(k, v)| (&**k, v))
    }

    /// Every policy, sorted by name.
    pub(crate) fn sorted(&self) -> BTreeMap<&str, PolicySettings> {
        self.by_name
            .iter()
            .map(|(k, v)| (&**k, v.settings))
            .collect()
    }

    /// The policies as a plain map, for comparing sets.
    pub(crate) fn policies(&self) -> BTreeMap<String, PolicySettings> {
        self.by_name
            .iter()
            .map(|(k, v)| (k.to_string(), v.settings))
            .collect()
    }
}

/// Where the overrides of a [`PolicyRegistry`] come from: the file's and
/// the admin API's, kept apart so that a reload replaces only the file's.
#[derive(Debug, Default)]
struct Sources {
    file: Vec<Arc<Override>>,
    runtime: BTreeMap<(String, Scope), Arc<Override>>,
    /// The store's version of `runtime`, once read from it.
    applied: Option<Version>,
    /// The version of this replica's own last change in the store: a set
    /// read from the store older than it lacks that change, and is not
    /// applied (the poller never goes back).
    floor: Option<Version>,
}

/// What writing a runtime override found.
#[derive(Debug)]
pub(crate) enum PutError {
    /// The policy is not configured.
    UnknownPolicy,
    /// A field is wrong.
    Invalid(InvalidOverride),
    /// The policy has `limits.max_overrides` overrides already.
    TooMany(u64),
}

/// The runtime overrides keyed by what identifies them.
fn by_slot(entries: Vec<Arc<Override>>) -> BTreeMap<(String, Scope), Arc<Override>> {
    entries
        .into_iter()
        .map(|e| ((e.policy.clone(), e.scope.clone()), e))
        .collect()
}

/// The current set of named policies, replaced whole on reload, and the
/// overrides in force with it.
#[derive(Debug)]
pub(crate) struct PolicyRegistry {
    current: ArcSwap<PolicySet>,
    /// Held while a new set is built, so that writers do not lose each
    /// other's changes.
    sources: Mutex<Sources>,
    /// Whether the last read of the store's overrides succeeded.
    in_sync: std::sync::atomic::AtomicBool,
    /// The server's clock, by which overrides expire.
    clock: Arc<dyn Clock>,
}

impl PolicyRegistry {
    #[cfg(test)]
    pub(crate) fn new(set: PolicySet) -> Self {
        PolicyRegistry::with_clock(set, Arc::new(quotad_core::SystemClock))
    }

    /// A registry whose overrides expire by `clock`.
    pub(crate) fn with_clock(set: PolicySet, clock: Arc<dyn Clock>) -> Self {
        PolicyRegistry {
            current: ArcSwap::from_pointee(set),
            sources: Mutex::default(),
            in_sync: std::sync::atomic::AtomicBool::new(true),
            clock,
        }
    }

    /// Now, by the server's clock.
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Whether the last read of the store's overrides succeeded (always,
    /// for a store in this process).
    pub(crate) fn in_sync(&self) -> bool {
        self.in_sync.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records whether the last read of the store's overrides succeeded.
    pub(crate) fn set_in_sync(&self, in_sync: bool) {
        self.in_sync
            .store(in_sync, std::sync::atomic::Ordering::Relaxed);
    }

    fn sources(&self) -> std::sync::MutexGuard<'_, Sources> {
        self.sources.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Swaps in `set` with the overrides of `sources`.
    fn publish(&self, set: &PolicySet, sources: &Sources) {
        let table = set.table(
            sources.file.iter().chain(sources.runtime.values()),
            &self.clock,
        );
        self.current.store(Arc::new(set.with_overrides(table)));
    }

    /// Replaces the set and the config file's overrides in one swap (a
    /// reload, or the start).
    pub(crate) fn replace_with_file(&self, set: PolicySet, file: &[Override]) {
        let mut sources = self.sources();
        sources.file = file.iter().cloned().map(Arc::new).collect();
        self.publish(&set, &sources);
    }

    /// Replaces every runtime override (loaded from a snapshot).
    pub(crate) fn set_runtime_overrides(&self, entries: Vec<Arc<Override>>) {
        let mut sources = self.sources();
        sources.runtime = by_slot(entries);
        self.publish(&self.current.load(), &sources);
    }

    /// Replaces every runtime override with the store's at `version`,
    /// unless that is not [`newer`] than the set held, or older than this
    /// replica's own last change in the same epoch (a read that was under
    /// way while this replica wrote): answers whether it did.
    pub(crate) fn set_stored_overrides(
        &self,
        version: Version,
        entries: Vec<Arc<Override>>,
    ) -> bool {
        let mut sources = self.sources();
        if sources.applied.is_some_and(|held| !newer(version, held))
            || sources
                .floor
                .is_some_and(|own| own.0 == version.0 && version.1 < own.1)
        {
            return false;
        }
        sources.runtime = by_slot(entries);
        sources.applied = Some(version);
        self.publish(&self.current.load(), &sources);
        true
    }

    /// The store's version of the runtime overrides held, once read.
    pub(crate) fn stored_version(&self) -> Option<Version> {
        self.sources().applied
    }

    /// The runtime overrides, sorted by policy and scope.
    pub(crate) fn runtime_overrides(&self) -> Vec<Arc<Override>> {
        self.sources().runtime.values().cloned().collect()
    }

    /// How many of the config file's overrides of `policy` are in force.
    pub(crate) fn file_overrides_of(&self, policy: &str) -> u64 {
        let now = self.now_ms();
        let n = self
            .sources()
            .file
            .iter()
            .filter(|f| f.policy == policy && f.live_at(now))
            .count();
        u64::try_from(n).unwrap_or(u64::MAX)
    }

    /// Checks `entry` against the policies in force, without writing it
    /// (the bound of `limits.max_overrides` is the writer's: the store's,
    /// or [`Self::put_override`]'s).
    ///
    /// # Errors
    ///
    /// What is wrong with it ([`PutError`]).
    pub(crate) fn check_override(&self, entry: &Override) -> Result<(), PutError> {
        let set = self.current.load();
        let (_, named) = set.get(&entry.policy).ok_or(PutError::UnknownPolicy)?;
        entry
            .effective(&named.settings.policy)
            .map_err(PutError::Invalid)?;
        Ok(())
    }

    /// Checks `entry` and the bound of `limits.max_overrides`, counting
    /// only overrides in force (expired runtime ones are purged first).
    fn check_locked(&self, sources: &mut Sources, entry: &Override) -> Result<(), PutError> {
        self.check_override(entry)?;
        let now = self.now_ms();
        sources.runtime.retain(|_, e| e.live_at(now));
        let max = self.current.load().limits.max_overrides;
        let slot = (entry.policy.clone(), entry.scope.clone());
        if !sources.runtime.contains_key(&slot) {
            let of_policy = sources
                .runtime
                .keys()
                .filter(|(p, _)| *p == entry.policy)
                .count()
                + sources
                    .file
                    .iter()
                    .filter(|f| f.policy == entry.policy && f.live_at(now))
                    .count();
            if u64::try_from(of_policy).unwrap_or(u64::MAX) >= max {
                return Err(PutError::TooMany(max));
            }
        }
        Ok(())
    }

    /// Writes a runtime override kept only here (the memory store):
    /// answers the one in force it replaced.
    ///
    /// # Errors
    ///
    /// What is wrong with it ([`PutError`]); nothing is written then.
    pub(crate) fn put_override(&self, entry: Override) -> Result<Option<Arc<Override>>, PutError> {
        debug_assert_eq!(entry.source, Source::Runtime);
        let mut sources = self.sources();
        self.check_locked(&mut sources, &entry)?;
        let slot = (entry.policy.clone(), entry.scope.clone());
        let old = sources.runtime.insert(slot, Arc::new(entry));
        self.publish(&self.current.load(), &sources);
        Ok(old)
    }

    /// Applies a change the store made at `version` (`entry`, or the
    /// removal of `slot` when `None`), which the store checked: no set
    /// older than it is applied after it, and it is not applied over a set
    /// read at it or later.
    pub(crate) fn apply_stored_change(
        &self,
        slot: (String, Scope),
        entry: Option<Override>,
        version: Version,
    ) {
        let mut sources = self.sources();
        if sources.applied.is_some_and(|held| !newer(version, held)) {
            // A set read from the store since holds this change, or a
            // later one: applying it again here would undo that.
            return;
        }
        match entry {
            Some(entry) => sources.runtime.insert(slot, Arc::new(entry)),
            None => sources.runtime.remove(&slot),
        };
        if sources.floor.is_none_or(|own| newer(version, own)) {
            sources.floor = Some(version);
        }
        self.publish(&self.current.load(), &sources);
    }

    /// Removes a runtime override; answers it, if there was one.
    pub(crate) fn remove_override(&self, policy: &str, scope: &Scope) -> Option<Arc<Override>> {
        let mut sources = self.sources();
        let old = sources
            .runtime
            .remove(&(policy.to_owned(), scope.clone()))?;
        self.publish(&self.current.load(), &sources);
        Some(old)
    }

    /// The set in force now; keep it for the whole request.
    pub(crate) fn snapshot(&self) -> Arc<PolicySet> {
        self.current.load_full()
    }
}
