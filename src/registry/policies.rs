//! The named-policy registry: an atomically swapped, immutable map.
//!
//! Requests take a snapshot (an `Arc` clone, no lock) and resolve every
//! name against it, so a batch sees one consistent set of policies even if
//! a reload lands mid-request.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use super::overrides::{Active, InvalidOverride, Override, OverrideTable, Scope, Source, Version};
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
    /// How many of this replica's own changes have been applied here: a
    /// read begun before one may answer the store from before it, so a set
    /// read while it moved is not applied (the next poll reads again).
    generation: u64,
    /// Whether the next poll reads the store's whole set whatever its
    /// version: a change of this replica's was answered at a version no
    /// later than the one held (the store went back, or the set held is
    /// already past it), so the version alone cannot tell what holds it.
    reread: bool,
}

/// What a poll of the store's overrides notes before it reads
/// ([`PolicyRegistry::poll_start`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PollStart {
    /// The version held, unless the whole set must be read again.
    pub(crate) known: Option<Version>,
    /// The own-change generation when the read began.
    pub(crate) generation: u64,
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
    /// read by a poll begun at `start`: answers whether it did. Refused
    /// when this replica applied a change of its own since the read began
    /// (the read may answer the store from before it; the next poll reads
    /// again), or when the version is the one held (and no reread is due).
    /// A smaller count in the epoch held is the store gone back (restored
    /// from an older dump, a failover that lost the last writes): it is
    /// applied, as the store's word, with a warning.
    pub(crate) fn set_stored_overrides(
        &self,
        version: Version,
        entries: Vec<Arc<Override>>,
        start: PollStart,
    ) -> bool {
        let mut sources = self.sources();
        if sources.generation != start.generation
            || (!sources.reread && sources.applied == Some(version))
        {
            return false;
        }
        if let Some(held) = sources.applied
            && held.0 == version.0
            && version.1 < held.1
        {
            tracing::warn!(
                epoch = version.0,
                held = held.1,
                read = version.1,
                "the store's runtime overrides went back to an earlier version (restored from an older copy, or a failover lost the last changes); following the store"
            );
        }
        sources.runtime = by_slot(entries);
        sources.applied = Some(version);
        sources.reread = false;
        self.publish(&self.current.load(), &sources);
        true
    }

    /// What a poll notes before it reads the store: the version held (none
    /// when the whole set must be read again) and the own-change
    /// generation, which [`Self::set_stored_overrides`] checks.
    pub(crate) fn poll_start(&self) -> PollStart {
        let sources = self.sources();
        PollStart {
            known: if sources.reread {
                None
            } else {
                sources.applied
            },
            generation: sources.generation,
        }
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
    /// removal of `slot` when `None`), which the store checked.
    ///
    /// A change of another epoch than the set held (but for none, a store
    /// that had no overrides) is left to the poller:
    /// it comes from another history (the store's hash made again, or an
    /// answer from before that), and only a read tells which is the
    /// store's now. A change at a count no later than the one held is not
    /// applied over that set either (a read since holds it, or the store
    /// went back): the next poll reads the whole set, which holds it if
    /// the store does. Otherwise it is applied at once, and a read under
    /// way is not applied after it.
    pub(crate) fn apply_stored_change(
        &self,
        slot: (String, Scope),
        entry: Option<Override>,
        version: Version,
    ) {
        let mut sources = self.sources();
        // Epoch 0 is a store that keeps no overrides yet: no history of
        // its own for a change to be applied over.
        if let Some(held) = sources.applied.filter(|held| held.0 != 0) {
            if held.0 != version.0 {
                tracing::debug!(
                    held = held.0,
                    answered = version.0,
                    "an override change answered in another epoch than the set held; the next poll reads the store"
                );
                return;
            }
            if version.1 <= held.1 {
                let same = match &entry {
                    None => !sources.runtime.contains_key(&slot),
                    Some(e) => sources.runtime.get(&slot).is_some_and(|held| **held == *e),
                };
                // The same version and nothing to change here: a change
                // that changed nothing in the store either (a removal of
                // an override not there).
                if !(version.1 == held.1 && same) {
                    sources.reread = true;
                }
                return;
            }
        }
        match entry {
            Some(entry) => sources.runtime.insert(slot, Arc::new(entry)),
            None => sources.runtime.remove(&slot),
        };
        sources.generation = sources.generation.wrapping_add(1);
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
