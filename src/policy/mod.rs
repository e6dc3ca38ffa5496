//! Named policies: the rules for their names, the registry the hot path
//! reads, and hot reload; [`rls`]: Envoy RLS rules from envoyproxy/ratelimit's
//! YAML.
//!
//! # What a reload does to existing state
//!
//! State is kept per (policy name, key) and survives a reload. One rule,
//! kept alike by the memory store and by Redis, reconciles it with the new
//! parameters on the key's next request: **state is read only under the
//! algorithm and the window that wrote it.**
//!
//! - a changed **algorithm** or **window** starts every key fresh (Redis
//!   names its keys by both; quotad-core keeps the window in each state and
//!   reads a state of another algorithm or window as fresh);
//! - a changed **limit** or **burst** keeps the counts, and the new limit
//!   applies immediately: a key that spent 8 of 10 in a window has 2 left,
//!   12 if the limit becomes 20, or none if it becomes 5; a token bucket
//!   keeps its tokens capped at the new burst, a leaky bucket its level;
//! - a policy **changed back** finds what each store kept: the memory
//!   store holds one state per key (the old one was replaced), Redis the
//!   old key until its TTL;
//! - a **removed** policy's state stays until it is fresh and swept; if
//!   the name comes back before that, the keys carry on from it.
//!
//! Inline policies are not affected: their state is namespaced by all of
//! their parameters, so a changed inline policy is a different state.

pub mod rls;

mod registry;
mod reload;

pub(crate) use registry::{PolicyRegistry, PolicySet};
pub(crate) use reload::Reloader;

use quotad_core::PolicyError;

/// The longest policy name.
pub const MAX_POLICY_NAME_LEN: usize = 64;

/// Checks a policy name: 1 to 64 characters from `A-Z a-z 0-9 _ . -`.
///
/// The alphabet excludes `:`, which keeps named state apart from inline
/// state (namespaced `inline:...`), and NUL, the store's key separator.
/// A configured policy may not be named [`INLINE_POLICY_LABEL`] either
/// (see `config::policies`).
///
/// # Errors
///
/// A message saying what a valid name is.
pub fn validate_policy_name(name: &str) -> Result<(), String> {
    let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if (1..=MAX_POLICY_NAME_LEN).contains(&name.len()) && name.chars().all(valid_char) {
        Ok(())
    } else {
        Err(format!(
            "must be 1 to {MAX_POLICY_NAME_LEN} characters from A-Z, a-z, 0-9, '_', '.' and '-'"
        ))
    }
}

/// The policy parameter a [`PolicyError`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PolicyField {
    Algorithm,
    Limit,
    Window,
    Burst,
    /// A concurrency policy's slot TTL (the protobuf `Policy`'s
    /// `window_ms`).
    SlotTtl,
}

impl PolicyField {
    /// The key in a `[policies.NAME]` table.
    pub(crate) fn config_name(self) -> &'static str {
        match self {
            PolicyField::Algorithm => "algorithm",
            PolicyField::Limit => "limit",
            PolicyField::Window => "window",
            PolicyField::Burst => "burst",
            PolicyField::SlotTtl => "slot_ttl",
        }
    }

    /// The field of the protobuf `Policy` message.
    pub(crate) fn proto_name(self) -> &'static str {
        match self {
            PolicyField::Window | PolicyField::SlotTtl => "window_ms",
            other => other.config_name(),
        }
    }
}

/// Which parameter broke the rule, so that config and API errors name it.
pub(crate) fn policy_error_field(error: &PolicyError) -> PolicyField {
    match error {
        PolicyError::LimitZero
        | PolicyError::LimitWindowTooLarge { .. }
        | PolicyError::SlidingLogLimitTooLarge(_)
        | PolicyError::ConcurrencyLimitTooLarge(_) => PolicyField::Limit,
        PolicyError::SlotTtl(_) => PolicyField::SlotTtl,
        PolicyError::WindowTooShort | PolicyError::WindowNotWholeMillis(_) => PolicyField::Window,
        PolicyError::BurstZero
        | PolicyError::BurstNotApplicable(_)
        | PolicyError::BurstWindowTooLarge { .. } => PolicyField::Burst,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_names_of_the_allowed_alphabet() {
        for name in ["a", "login", "api.v1", "per-second", "A_9", &"x".repeat(64)] {
            assert_eq!(validate_policy_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn rejects_empty_long_and_foreign_names() {
        for name in [
            "",
            "a:b",
            "inline:fixed_window:1:1:1",
            "a b",
            "a\0b",
            "é",
            &"x".repeat(65),
        ] {
            assert!(validate_policy_name(name).is_err(), "{name:?}");
        }
    }
}
