//! The RLS rules in force: an atomically swapped, immutable set, each rule
//! with its metric counters beside it.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use quotad_core::Algorithm;

use crate::metrics::{Metrics, RlsRuleCounters};
use crate::policy::rls::{Applied, RlsRules, Unit, override_namespace};

/// One immutable set of RLS rules and their counters.
#[derive(Debug)]
pub(crate) struct RlsSet {
    rules: Arc<RlsRules>,
    /// Indexed by [`super::Rule::index`].
    by_rule: Vec<RlsRuleCounters>,
    /// The limits Envoy sends, by override namespace (`rls:<domain>#<unit>`),
    /// for every configured domain.
    overrides: HashMap<String, RlsRuleCounters>,
}

impl RlsSet {
    pub(crate) fn new(rules: Arc<RlsRules>, metrics: &Metrics) -> Self {
        let mut by_rule: Vec<Option<RlsRuleCounters>> =
            (0..rules.rule_count()).map(|_| None).collect();
        let mut overrides = HashMap::new();
        for domain in rules.domains() {
            for rule in rules.rules(domain) {
                let algorithm = rule
                    .limit()
                    .and_then(|l| l.policy())
                    .map_or(Algorithm::FixedWindow, |p| p.algorithm());
                by_rule[rule.index()] = Some(metrics.rls_rule(rule.namespace(), algorithm));
            }
            for unit in Unit::ALL {
                let namespace = override_namespace(domain, unit);
                let counters = metrics.rls_rule(&namespace, Algorithm::FixedWindow);
                overrides.insert(namespace, counters);
            }
        }
        let by_rule = by_rule
            .into_iter()
            .map(|c| c.expect("every rule index below rule_count belongs to one rule"))
            .collect();
        RlsSet {
            rules,
            by_rule,
            overrides,
        }
    }

    /// The rules.
    pub(crate) fn rules(&self) -> &RlsRules {
        &self.rules
    }

    /// The counters of the rule (or override) an applied limit comes from.
    pub(crate) fn counters(&self, applied: &Applied<'_>) -> Option<&RlsRuleCounters> {
        match applied.rule() {
            Some(rule) => self.by_rule.get(rule.index()),
            None => self.overrides.get(applied.namespace()),
        }
    }
}

/// The RLS rules in force, replaced whole on reload.
#[derive(Debug)]
pub(crate) struct RlsRegistry {
    current: ArcSwap<RlsSet>,
}

impl RlsRegistry {
    pub(crate) fn new(set: RlsSet) -> Self {
        RlsRegistry {
            current: ArcSwap::from_pointee(set),
        }
    }

    /// The set in force now; keep it for the whole request.
    pub(crate) fn snapshot(&self) -> Arc<RlsSet> {
        self.current.load_full()
    }

    /// Replaces the set; requests holding a snapshot finish with the old
    /// one.
    pub(crate) fn replace(&self, set: RlsSet) {
        self.current.store(Arc::new(set));
    }
}
