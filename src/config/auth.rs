//! `[auth]`, validated: which client identities may call which method.

use std::fmt;

use super::policies::Invalid;
use super::settings::AuthSection;

/// `[auth]`: an allowlist per method group; a group without one is open to
/// every client that passed mTLS. Allowlists need mTLS
/// (`server.tls.client_ca`), since identities come from client
/// certificates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuthSettings {
    /// `auth.check`: `Check` and `CheckBatch`.
    pub check: Option<Vec<IdentityPattern>>,
    /// `auth.peek`: `Peek`.
    pub peek: Option<Vec<IdentityPattern>>,
    /// `auth.reset`: `Reset`.
    pub reset: Option<Vec<IdentityPattern>>,
    /// `auth.should_rate_limit`: Envoy's `ShouldRateLimit`.
    pub should_rate_limit: Option<Vec<IdentityPattern>>,
}

/// A client identity to allow: matched exactly, or, when it ends in `*`,
/// as a prefix (`spiffe://ops/*`; `*` alone matches every identity).
#[derive(Clone, PartialEq, Eq)]
pub struct IdentityPattern {
    text: String,
}

impl IdentityPattern {
    /// A pattern, checked: not empty, and `*` only as its last character.
    ///
    /// # Errors
    ///
    /// A message saying what is wrong.
    pub fn try_new(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Err("an identity pattern must not be empty".to_owned());
        }
        if text.strip_suffix('*').unwrap_or(text).contains('*') {
            return Err(format!(
                "{text:?}: `*` may only end a pattern (a prefix match), not appear inside it"
            ));
        }
        Ok(IdentityPattern {
            text: text.to_owned(),
        })
    }

    /// Whether `identity` matches.
    pub fn matches(&self, identity: &str) -> bool {
        match self.text.strip_suffix('*') {
            Some(prefix) => identity.starts_with(prefix),
            None => identity == self.text,
        }
    }
}

impl fmt::Debug for IdentityPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

impl fmt::Display for IdentityPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl AuthSettings {
    /// Whether any method has an allowlist.
    pub fn is_enabled(&self) -> bool {
        self.groups().any(|(_, list)| list.is_some())
    }

    /// Each method group's setting name and allowlist.
    pub(crate) fn groups(
        &self,
    ) -> impl Iterator<Item = (&'static str, Option<&[IdentityPattern]>)> {
        [
            ("check", self.check.as_deref()),
            ("peek", self.peek.as_deref()),
            ("reset", self.reset.as_deref()),
            ("should_rate_limit", self.should_rate_limit.as_deref()),
        ]
        .into_iter()
    }

    /// Validates `[auth]`; `mtls` is whether `server.tls.client_ca` is set.
    pub(super) fn validate(section: AuthSection, mtls: bool) -> Result<Self, Invalid> {
        let list = |field: &'static str, raw: Option<Vec<String>>| {
            raw.map(|patterns| {
                if !mtls {
                    return Err((
                        vec!["auth".to_owned(), field.to_owned()],
                        "allowlists need mTLS: set server.tls.client_ca, so clients present the certificates their identities come from".to_owned(),
                    ));
                }
                patterns
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        IdentityPattern::try_new(p).map_err(|m| {
                            (
                                vec!["auth".to_owned(), field.to_owned()],
                                format!("entry {i}: {m}"),
                            )
                        })
                    })
                    .collect()
            })
            .transpose()
        };
        Ok(AuthSettings {
            check: list("check", section.check)?,
            peek: list("peek", section.peek)?,
            reset: list("reset", section.reset)?,
            should_rate_limit: list("should_rate_limit", section.should_rate_limit)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    #[test]
    fn patterns_match_exactly_or_by_a_trailing_wildcard() {
        let exact = IdentityPattern::try_new("spiffe://ops/alice").expect("valid");
        assert!(exact.matches("spiffe://ops/alice"));
        assert!(!exact.matches("spiffe://ops/alice2"));
        assert!(!exact.matches("spiffe://ops"));
        let prefix = IdentityPattern::try_new("spiffe://ops/*").expect("valid");
        assert!(prefix.matches("spiffe://ops/alice"));
        assert!(prefix.matches("spiffe://ops/"));
        assert!(!prefix.matches("spiffe://opsx/alice"));
        assert!(!prefix.matches("spiffe://app/ops/"));
        let any = IdentityPattern::try_new("*").expect("valid");
        assert!(any.matches("anything"));
        for bad in ["", "spiffe://*/alice", "*.internal", "a**", "é*é"] {
            assert!(IdentityPattern::try_new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn allowlists_without_mtls_are_a_config_error_naming_the_field() {
        let error = Config::from_toml("[auth]\nreset = [\"spiffe://ops/*\"]\n")
            .expect_err("no mTLS")
            .to_string();
        assert!(
            error.starts_with("auth.reset: allowlists need mTLS: set server.tls.client_ca"),
            "{error}"
        );
        assert!(!Config::default().auth().is_enabled());
    }
}
