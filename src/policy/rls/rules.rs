//! The rules of the loaded files: one tree of descriptors per domain, its
//! rules and limits, and the queries the matcher and the registry ask of
//! it. The loader (`load.rs`) builds it from the files.

use std::path::Path;
use std::sync::Arc;

use foldhash::HashMap;
use quotad_core::{Algorithm, MAX_EXACT, Policy, PolicyError};

use super::Unit;

/// The RLS rules of every loaded file, by domain.
///
/// Its maps hash with foldhash, seeded per map: their keys come from the
/// files, and a request's strings only look them up.
#[derive(Debug, Default)]
pub struct RlsRules {
    pub(super) domains: HashMap<String, Domain>,
    /// How many rules the domains hold; [`Rule::index`] is below it.
    rule_count: usize,
}

/// One domain's descriptor tree and the file that named it first.
#[derive(Debug)]
pub(super) struct Domain {
    pub(super) root: Level,
    pub(super) file: Arc<Path>,
}

/// The descriptors of one level, by key.
#[derive(Debug, Default)]
pub(super) struct Level {
    keys: HashMap<String, Branch>,
}

/// The descriptors of one level that share a key.
#[derive(Debug, Default)]
struct Branch {
    values: HashMap<String, TreeNode>,
    wildcards: Vec<(Wildcard, TreeNode)>,
    any: Option<Box<TreeNode>>,
}

/// One configured descriptor.
#[derive(Debug)]
pub(super) struct TreeNode {
    pub(super) rule: Option<Rule>,
    pub(super) share_threshold: bool,
    pub(super) children: Level,
}

/// A configured value with `*`s, each matching any run of characters.
#[derive(Debug)]
struct Wildcard {
    text: String,
}

impl Wildcard {
    /// Whether `value` matches: the parts between the `*`s appear in
    /// order, the first at the start and the last at the end, without
    /// overlapping.
    fn matches(&self, value: &str) -> bool {
        let mut parts = self.text.split('*');
        let first = parts.next().unwrap_or_default();
        let Some(rest) = value.strip_prefix(first) else {
            return false;
        };
        let mut middle: Vec<&str> = parts.collect();
        let last = middle.pop().unwrap_or_default();
        let Some(mut rest) = rest.strip_suffix(last) else {
            return false;
        };
        for part in middle {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

/// A descriptor with a `rate_limit`: what the reference calls a limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub(super) index: usize,
    pub(super) namespace: String,
    pub(super) file: Arc<Path>,
    pub(super) line: usize,
    pub(super) name: String,
    pub(super) replaces: Vec<String>,
    pub(super) limit: Option<Limit>,
    pub(super) shadow_mode: bool,
    pub(super) quota_mode: bool,
    pub(super) detailed_metric: bool,
    pub(super) value_to_metric: bool,
}

impl Rule {
    /// The rule's number within its [`RlsRules`], from 0 to
    /// [`RlsRules::rule_count`], for per-rule tables kept beside the rules.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The state namespace the rule counts under (also its name in metrics
    /// and logs): `rls:<domain>/<key>[=<value>]/...`.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The file that defines the rule.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The 1-based line of the rule's `rate_limit`.
    pub fn line(&self) -> usize {
        self.line
    }

    /// `rate_limit.name`, empty when not given: the name other rules'
    /// `replaces` refer to, and the name in the response's `current_limit`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The names of the rules this one replaces when both match a request.
    pub fn replaces(&self) -> &[String] {
        &self.replaces
    }

    /// The limit; `None` for `unlimited: true`.
    pub fn limit(&self) -> Option<&Limit> {
        self.limit.as_ref()
    }

    /// `shadow_mode`: counted as usual, but never over the limit in the
    /// answer.
    pub fn shadow_mode(&self) -> bool {
        self.shadow_mode
    }

    /// `quota_mode`: over the limit fails the request only when every
    /// quota-mode descriptor of it is over (the reference's soft limits).
    pub fn quota_mode(&self) -> bool {
        self.quota_mode
    }

    /// `detailed_metric`: the reference names the rule's statistics by the
    /// request's values. Read and kept; quotad's metric labels stay the
    /// configured namespace, which bounds their number.
    pub fn detailed_metric(&self) -> bool {
        self.detailed_metric
    }

    /// `value_to_metric`: like [`Rule::detailed_metric`], per entry.
    pub fn value_to_metric(&self) -> bool {
        self.value_to_metric
    }
}

/// What a limit's windows are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counting {
    /// One `unit`, aligned to the Unix epoch: the reference's windows.
    Unit,
    /// A window of this length, aligned to the Unix epoch (`30s`, `5m`,
    /// `2h`: lengths the reference's units cannot say).
    Window(std::time::Duration),
    /// The local periods of a calendar: the unit's day, week, month or
    /// year in a time zone, from local midnight.
    Calendar(quotad_core::Calendar),
}

/// A limit's numbers and how quotad counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    requests_per_unit: u32,
    unit: Unit,
    policy: Option<Policy>,
}

impl Limit {
    /// A limit counted with `algorithm` (fixed window for the reference's
    /// numbers) and an optional bucket `burst`; a window of one `unit`.
    ///
    /// # Errors
    ///
    /// The [`PolicyError`] of a limit quotad cannot count: above
    /// [`Limit::max_requests_per_unit`], a burst on a non-bucket algorithm,
    /// a sliding log above 10,000.
    pub fn try_new(
        requests_per_unit: u32,
        unit: Unit,
        algorithm: Algorithm,
        burst: Option<u64>,
    ) -> Result<Limit, PolicyError> {
        Self::counted(requests_per_unit, unit, algorithm, burst, Counting::Unit)
    }

    /// [`Limit::try_new`], counted over `counting`'s windows instead of one
    /// `unit` (which the answers still report, as Envoy's protos have no
    /// other): a window of any length (`metadata.quotad.window`), or the
    /// unit's calendar period in a time zone (`metadata.quotad.time_zone`).
    ///
    /// # Errors
    ///
    /// As [`Limit::try_new`], and
    /// [`PolicyError::PeriodNotApplicable`] for a calendar period counted by
    /// another algorithm than a fixed window.
    pub fn counted(
        requests_per_unit: u32,
        unit: Unit,
        algorithm: Algorithm,
        burst: Option<u64>,
        counting: Counting,
    ) -> Result<Limit, PolicyError> {
        // A limit of 0 denies every hit and counts nothing, so it needs no
        // policy; the extension's settings are still checked.
        let limit = u64::from(requests_per_unit.max(1));
        let policy = match counting {
            Counting::Unit => Policy::try_new(algorithm, limit, unit.window(), burst)?,
            Counting::Window(window) => Policy::try_new(algorithm, limit, window, burst)?,
            Counting::Calendar(_) if burst.is_some() && algorithm == Algorithm::FixedWindow => {
                return Err(PolicyError::BurstNotApplicable(algorithm));
            }
            Counting::Calendar(calendar) => Policy::calendar(algorithm, limit, calendar)?,
        };
        Ok(Limit {
            requests_per_unit,
            unit,
            policy: (requests_per_unit > 0).then_some(policy),
        })
    }

    /// The most requests per unit quotad counts exactly with `algorithm`:
    /// any 32-bit number for a fixed window (the reference's counting, and
    /// the default), which only adds; for the others, which multiply the
    /// limit by the time, `limit x window_ms <= 2^53`: 285,616 a year,
    /// 3,474,999 a month, 14,892,855 a week, 104,249,991 a day,
    /// 2,501,999,792 an hour, and any 32-bit number a minute or a second.
    pub fn max_requests_per_unit(unit: Unit, algorithm: Algorithm) -> u64 {
        let most = if algorithm == Algorithm::FixedWindow {
            MAX_EXACT
        } else {
            MAX_EXACT / unit.window_ms()
        };
        most.min(u64::from(u32::MAX))
    }

    /// `requests_per_unit`.
    pub fn requests_per_unit(&self) -> u32 {
        self.requests_per_unit
    }

    /// The unit, which is the window.
    pub fn unit(&self) -> Unit {
        self.unit
    }

    /// How quotad counts the limit; `None` when `requests_per_unit` is 0,
    /// which denies every hit and counts none (the reference's way to block
    /// a value).
    pub fn policy(&self) -> Option<&Policy> {
        self.policy.as_ref()
    }
}

impl RlsRules {
    /// How many rules every domain holds together, unlimited ones included.
    pub fn rule_count(&self) -> usize {
        self.rule_count
    }

    /// The domains, in no particular order.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// Whether no file named a domain.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// Every rule of `domain` (none for an unknown domain), sorted by
    /// namespace.
    pub fn rules(&self, domain: &str) -> Vec<&Rule> {
        let mut rules = Vec::new();
        if let Some(d) = self.domains.get(domain) {
            d.root.collect_rules(&mut rules);
        }
        rules.sort_by(|a, b| a.namespace.cmp(&b.namespace));
        rules
    }

    /// Numbers every rule from 0 on and counts them, once the files are in.
    pub(super) fn number_rules(&mut self) {
        let mut count = 0;
        for domain in self.domains.values_mut() {
            domain.root.number_rules(&mut count);
        }
        self.rule_count = count;
    }
}

/// The message for a limit quotad cannot count, in the file's terms.
pub(super) fn policy_message(
    error: &PolicyError,
    requests_per_unit: u32,
    unit: Unit,
    algorithm: Algorithm,
) -> String {
    match error {
        PolicyError::LimitWindowTooLarge { .. } => format!(
            "{requests_per_unit} per {unit} is more than {algorithm} counts exactly: at most {} per {unit} (requests_per_unit x window in ms <= 2^53; the default fixed_window has no such bound)",
            Limit::max_requests_per_unit(unit, algorithm)
        ),
        other => other.to_string(),
    }
}

impl Level {
    /// Adds a descriptor; `Err((key, value))` when the level has it.
    pub(super) fn insert(
        &mut self,
        key: String,
        value: String,
        node: TreeNode,
    ) -> Result<(), (String, String)> {
        let branch = self.keys.entry(key.clone()).or_default();
        if value.is_empty() {
            if branch.any.is_some() {
                return Err((key, value));
            }
            branch.any = Some(Box::new(node));
        } else if value.contains('*') {
            if branch.wildcards.iter().any(|(w, _)| w.text == value) {
                return Err((key, value));
            }
            branch.wildcards.push((Wildcard { text: value }, node));
        } else {
            if branch.values.contains_key(&value) {
                return Err((key, value));
            }
            branch.values.insert(value, node);
        }
        Ok(())
    }

    /// The descriptor an entry matches at this level, and the wildcard
    /// pattern to count it under when it shares one threshold: the exact
    /// value first, then the first matching wildcard, then the key alone.
    pub(super) fn lookup(&self, key: &str, value: &str) -> Option<(&TreeNode, Option<&str>)> {
        let branch = self.keys.get(key)?;
        if let Some(node) = branch.values.get(value) {
            return Some((node, None));
        }
        if let Some((wildcard, node)) = branch.wildcards.iter().find(|(w, _)| w.matches(value)) {
            return Some((node, node.share_threshold.then_some(wildcard.text.as_str())));
        }
        branch.any.as_deref().map(|node| (node, None))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Numbers the rules of this level and below from `next` on.
    fn number_rules(&mut self, next: &mut usize) {
        for branch in self.keys.values_mut() {
            let nodes = branch
                .values
                .values_mut()
                .chain(branch.wildcards.iter_mut().map(|(_, n)| n))
                .chain(branch.any.as_deref_mut());
            for node in nodes {
                if let Some(rule) = &mut node.rule {
                    rule.index = *next;
                    *next += 1;
                }
                node.children.number_rules(next);
            }
        }
    }

    fn collect_rules<'a>(&'a self, out: &mut Vec<&'a Rule>) {
        for branch in self.keys.values() {
            let nodes = branch
                .values
                .values()
                .chain(branch.wildcards.iter().map(|(_, n)| n))
                .chain(branch.any.as_deref());
            for node in nodes {
                out.extend(node.rule.as_ref());
                node.children.collect_rules(out);
            }
        }
    }
}
