//! From a `ShouldRateLimit` request to what applies to each descriptor.

use std::borrow::Cow;
use std::collections::HashSet;

use compact_str::CompactString;
use quotad_core::{Algorithm, CheckItem, MAX_EXACT};
use smallvec::SmallVec;
use thiserror::Error;

use super::Unit;
use super::rules::{Limit, RlsRules, Rule, policy_message};
use super::state::{descriptor_key, digest_key, override_namespace};

/// A request's descriptors: one is held without a heap allocation.
pub type Descriptors<'a> = SmallVec<[Descriptor<'a>; 1]>;

/// A descriptor's entries: two are held without a heap allocation.
pub type Entries<'a> = SmallVec<[Entry<'a>; 2]>;

/// What applies to each descriptor of a request, in order: one is held
/// without a heap allocation.
pub type Resolutions<'r> = SmallVec<[Resolution<'r>; 1]>;

/// A `ShouldRateLimit` request, borrowing the strings of the message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request<'a> {
    /// `domain`: which configuration applies.
    pub domain: &'a str,
    /// `descriptors`, each matched on its own.
    pub descriptors: Descriptors<'a>,
    /// `hits_addend`: hits per descriptor; 0 (unset) means 1.
    pub hits_addend: u32,
}

/// One `RateLimitDescriptor`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Descriptor<'a> {
    /// `entries`, from the outermost level in.
    pub entries: Entries<'a>,
    /// `limit`: counted with these numbers instead of a configured rule.
    pub limit: Option<LimitOverride>,
    /// `hits_addend`: when set (0 included), replaces the request's.
    pub hits_addend: Option<u64>,
}

/// One `RateLimitDescriptor.Entry`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    /// `key`.
    pub key: &'a str,
    /// `value`.
    pub value: &'a str,
}

/// A descriptor's `limit`, as sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitOverride {
    /// `requests_per_unit`; 0 denies every hit.
    pub requests_per_unit: u32,
    /// `unit`, Envoy's number for it (see [`Unit::from_number`]).
    pub unit: i32,
}

/// A request quotad cannot answer; nothing is counted for it.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("{field}: {message}")]
pub struct RequestError {
    /// The field at fault: `domain`, `descriptors[2].limit.unit`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

/// What applies to one descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution<'r> {
    /// Nothing applies: `OK`, no `current_limit`, nothing counted.
    NoLimit(NoLimit<'r>),
    /// An `unlimited: true` rule: `OK` with `limit_remaining` of
    /// `u32::MAX`, nothing counted.
    Unlimited(&'r Rule),
    /// A limit to check and count.
    Limited(Applied<'r>),
}

/// Why no limit applies to a descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoLimit<'r> {
    /// No file names the request's domain.
    UnknownDomain,
    /// The domain has no rule for the descriptor (or the descriptor has no
    /// entries).
    NoMatch,
    /// The rule that matched is named in the `replaces` of another rule
    /// matched by the same request.
    Replaced(&'r Rule),
}

/// A limit that applies to a descriptor, ready for the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied<'r> {
    rule: Option<&'r Rule>,
    limit: Limit,
    namespace: Cow<'r, str>,
    /// Inline up to 24 bytes, which most descriptor keys fit in.
    key: CompactString,
    charge: Charge,
}

/// What a descriptor asks of its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Charge {
    /// Count this many hits (at least 1). `hits_addend`s above 2^53 are
    /// cut to 2^53, which changes no answer: every quotad policy of an RLS
    /// unit holds less than that, so either way the hits can never fit and
    /// are refused (`COST_EXCEEDS_CAPACITY`) without being counted.
    Hits(u64),
    /// `hits_addend: 0`: look without counting. The reference answers
    /// `OVER_LIMIT` when the count has already passed the limit; quotad
    /// answers whether one more hit would pass now, by peeking (cost 1,
    /// nothing consumed or created). The two differ only when the count is
    /// exactly at the limit, where quotad says `OVER_LIMIT`.
    Probe,
}

impl Charge {
    /// The cost to ask the store for: the hits, or 1 for a probe.
    pub fn cost(self) -> u64 {
        match self {
            Charge::Hits(hits) => hits,
            Charge::Probe => 1,
        }
    }

    /// Whether hits are counted; a probe is a peek.
    pub fn counts(self) -> bool {
        matches!(self, Charge::Hits(_))
    }

    /// The charge of a descriptor: its own `hits_addend` when set (0
    /// included), else the request's, where 0 (unset) means 1.
    pub fn of(request_hits_addend: u32, descriptor_hits_addend: Option<u64>) -> Charge {
        let hits = descriptor_hits_addend.unwrap_or(u64::from(request_hits_addend.max(1)));
        if hits == 0 {
            Charge::Probe
        } else {
            Charge::Hits(hits.min(MAX_EXACT))
        }
    }
}

impl<'r> Applied<'r> {
    /// The configured rule; `None` for a request's `limit` override.
    pub fn rule(&self) -> Option<&'r Rule> {
        self.rule
    }

    /// The limit's numbers, for the response's `current_limit`, and its
    /// quotad policy.
    pub fn limit(&self) -> &Limit {
        &self.limit
    }

    /// The name for `current_limit.name`: the rule's `rate_limit.name`,
    /// empty for an override.
    pub fn name(&self) -> &str {
        self.rule.map_or("", Rule::name)
    }

    /// The state namespace (the store's policy name), also the label for
    /// metrics: bounded by the configuration, never a request's values.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The state key within the namespace.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Replaces a key longer than `max_bytes` by its SHA-256 digest
    /// (`sha256:` and 64 hex digits), so that a long descriptor value (a
    /// URL path) is counted, under a key of bounded size, instead of
    /// refused. Distinct keys keep distinct digests (SHA-256 is collision
    /// resistant), and a digest never equals a key kept as written.
    pub fn bound_key(&mut self, max_bytes: usize) {
        if self.key.len() > max_bytes {
            self.key = digest_key(&self.key).into();
        }
    }

    /// What the descriptor asks.
    pub fn charge(&self) -> Charge {
        self.charge
    }

    /// Whether an over-limit answer is turned into `OK` (the rule's
    /// `shadow_mode`; never for an override).
    pub fn shadow_mode(&self) -> bool {
        self.rule.is_some_and(Rule::shadow_mode)
    }

    /// Whether the rule is a soft, quota-mode limit.
    pub fn quota_mode(&self) -> bool {
        self.rule.is_some_and(Rule::quota_mode)
    }

    /// The store item: checked and counted for [`Charge::Hits`], peeked for
    /// [`Charge::Probe`]. `None` when the limit is 0: every hit is over it
    /// and nothing is stored.
    pub fn check_item(&self) -> Option<CheckItem<'_>> {
        let policy = *self.limit.policy()?;
        let item = CheckItem::new(&self.namespace, policy, &self.key, self.charge.cost()).expect(
            "the cost is 1..=2^53, the key names at least one entry and neither string holds NUL",
        );
        Some(item)
    }
}

impl RlsRules {
    /// What applies to each descriptor of `request`, in order.
    ///
    /// # Errors
    ///
    /// [`RequestError`] naming the field: an empty domain or descriptor
    /// list (the reference refuses both), a `limit` override with an
    /// unknown unit or no entries.
    pub fn resolve<'r>(&'r self, request: &Request<'_>) -> Result<Resolutions<'r>, RequestError> {
        if request.domain.is_empty() {
            return Err(error("domain", "must not be empty"));
        }
        if request.descriptors.is_empty() {
            return Err(error("descriptors", "must hold at least one descriptor"));
        }
        // Every limit sent is checked, known domain or not.
        let mut overrides = Vec::new();
        if request.descriptors.iter().any(|d| d.limit.is_some()) {
            overrides = request
                .descriptors
                .iter()
                .enumerate()
                .map(|(i, d)| d.limit.map(|l| override_limit(i, d, l)).transpose())
                .collect::<Result<Vec<_>, _>>()?;
        }
        let Some(domain) = self.domains.get(request.domain) else {
            let unknown = Resolution::NoLimit(NoLimit::UnknownDomain);
            return Ok(SmallVec::from_elem(unknown, request.descriptors.len()));
        };

        let mut resolved: Resolutions<'r> = request
            .descriptors
            .iter()
            .enumerate()
            .map(|(i, descriptor)| {
                let limit = overrides.get(i).copied().flatten();
                let charge = Charge::of(request.hits_addend, descriptor.hits_addend);
                let entries = descriptor.entries.iter().map(|e| (e.key, e.value));
                if let Some(limit) = limit {
                    return Resolution::Limited(Applied {
                        rule: None,
                        namespace: Cow::Owned(override_namespace(request.domain, limit.unit())),
                        key: descriptor_key(entries),
                        limit,
                        charge,
                    });
                }
                match find(&domain.root, &descriptor.entries) {
                    None => Resolution::NoLimit(NoLimit::NoMatch),
                    Some((rule, shared)) => match rule.limit() {
                        None => Resolution::Unlimited(rule),
                        Some(limit) => {
                            let values = shared.iter().zip(&descriptor.entries);
                            let entries =
                                values.map(|(pattern, e)| (e.key, pattern.unwrap_or(e.value)));
                            Resolution::Limited(Applied {
                                rule: Some(rule),
                                limit: *limit,
                                namespace: Cow::Borrowed(rule.namespace()),
                                key: descriptor_key(entries),
                                charge,
                            })
                        }
                    },
                }
            })
            .collect();

        // Replacing is decided over the rules matched, unlimited ones too;
        // a replaced rule is not counted (the reference's constructLimitsToCheck).
        let replaces = |r: &Resolution<'_>| match r {
            Resolution::Unlimited(rule) => !rule.replaces().is_empty(),
            Resolution::Limited(applied) => applied.rule.is_some_and(|r| !r.replaces().is_empty()),
            Resolution::NoLimit(_) => false,
        };
        if !resolved.iter().any(replaces) {
            return Ok(resolved);
        }
        let replaced: HashSet<&str> = resolved
            .iter()
            .filter_map(|r| match r {
                Resolution::Unlimited(rule) => Some(*rule),
                Resolution::Limited(applied) => applied.rule,
                Resolution::NoLimit(_) => None,
            })
            .flat_map(|rule| rule.replaces().iter().map(String::as_str))
            .collect();
        if !replaced.is_empty() {
            for resolution in &mut resolved {
                if let Resolution::Limited(Applied {
                    rule: Some(rule), ..
                }) = resolution
                    && !rule.name().is_empty()
                    && replaced.contains(rule.name())
                {
                    *resolution = Resolution::NoLimit(NoLimit::Replaced(rule));
                }
            }
        }
        Ok(resolved)
    }
}

/// The rule the entries reach, with the wildcard pattern each entry counts
/// under when its level shares one threshold (`None`: its own value).
fn find<'r>(
    root: &'r super::rules::Level,
    entries: &[Entry<'_>],
) -> Option<(&'r Rule, SmallVec<[Option<&'r str>; 2]>)> {
    let mut level = root;
    // Grown as levels match: a descriptor deeper than any rule reserves
    // nothing for the entries past the last match.
    let mut shared = SmallVec::new();
    for (i, entry) in entries.iter().enumerate() {
        let (node, pattern) = level.lookup(entry.key, entry.value)?;
        shared.push(pattern);
        if i + 1 == entries.len() {
            return node.rule.as_ref().map(|rule| (rule, shared));
        }
        if node.children.is_empty() {
            return None;
        }
        level = &node.children;
    }
    None
}

fn override_limit(
    i: usize,
    descriptor: &Descriptor<'_>,
    limit: LimitOverride,
) -> Result<Limit, RequestError> {
    let field = |name: &str| format!("descriptors[{i}].{name}");
    if descriptor.entries.is_empty() {
        return Err(error(
            &field("entries"),
            "a descriptor with a limit needs at least one entry",
        ));
    }
    let unit = Unit::from_number(limit.unit).ok_or_else(|| {
        error(
            &field("limit.unit"),
            &format!(
                "unknown unit {} (expected 1 second, 2 minute, 3 hour, 4 day, 5 month, 6 year or 7 week)",
                limit.unit
            ),
        )
    })?;
    Limit::try_new(limit.requests_per_unit, unit, Algorithm::FixedWindow, None).map_err(|e| {
        error(
            &field("limit.requests_per_unit"),
            &policy_message(&e, limit.requests_per_unit, unit, Algorithm::FixedWindow),
        )
    })
}

fn error(field: &str, message: &str) -> RequestError {
    RequestError {
        field: field.to_owned(),
        message: message.to_owned(),
    }
}
