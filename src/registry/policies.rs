//! The named-policy registry: an atomically swapped, immutable map.
//!
//! Requests take a snapshot (an `Arc` clone, no lock) and resolve every
//! name against it, so a batch sees one consistent set of policies even if
//! a reload lands mid-request.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::config::{LimitSettings, PolicySettings};
use crate::metrics::{DecisionCounters, LeaseCounters, Metrics};

/// A configured policy with its decision counters, and its lease counters
/// when it has lease settings.
#[derive(Debug)]
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
        }
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

/// The current set of named policies, replaced whole on reload.
#[derive(Debug)]
pub(crate) struct PolicyRegistry {
    current: ArcSwap<PolicySet>,
}

impl PolicyRegistry {
    pub(crate) fn new(set: PolicySet) -> Self {
        PolicyRegistry {
            current: ArcSwap::from_pointee(set),
        }
    }

    /// The set in force now; keep it for the whole request.
    pub(crate) fn snapshot(&self) -> Arc<PolicySet> {
        self.current.load_full()
    }

    /// Replaces the set; requests already holding a snapshot finish with
    /// the old one.
    pub(crate) fn replace(&self, set: PolicySet) {
        self.current.store(Arc::new(set));
    }
}
