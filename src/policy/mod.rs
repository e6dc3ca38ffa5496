//! Named policies and the rules that lead to them, as a model: the rules
//! for policy names, and [`rls`]: Envoy RLS rules from envoyproxy/ratelimit's
//! YAML. What is in force at run time, and its hot reload, is
//! `crate::registry`'s; this module reads no configuration.

pub mod rlqs;
pub mod rls;

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
pub enum PolicyField {
    Algorithm,
    Limit,
    Window,
    Burst,
    /// A concurrency policy's slot TTL (the protobuf `Policy`'s
    /// `window_ms`).
    SlotTtl,
    /// A calendar period (`day`, `week`, `month`, `year`).
    Period,
}

impl PolicyField {
    /// The key in a `[policies.NAME]` table.
    pub fn config_name(self) -> &'static str {
        match self {
            PolicyField::Algorithm => "algorithm",
            PolicyField::Limit => "limit",
            PolicyField::Window => "window",
            PolicyField::Burst => "burst",
            PolicyField::SlotTtl => "slot_ttl",
            PolicyField::Period => "period",
        }
    }

    /// The field of the protobuf `Policy` message.
    pub fn proto_name(self) -> &'static str {
        match self {
            PolicyField::Window | PolicyField::SlotTtl => "window_ms",
            other => other.config_name(),
        }
    }
}

/// Which parameter broke the rule, so that config and API errors name it.
pub fn policy_error_field(error: &PolicyError) -> PolicyField {
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
        PolicyError::PeriodNotApplicable(_) => PolicyField::Period,
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
