//! `[auth]`, validated: which client identities may call which method.

use std::fmt;

use super::policies::Invalid;
use super::settings::AuthSection;
use crate::methods::AuthGroup;

/// `[auth]`: an allowlist per method group; a group without one is open to
/// every client that passed mTLS. Allowlists need mTLS
/// (`server.tls.client_ca`), since identities come from client
/// certificates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuthSettings {
    /// By group ([`AuthGroup::index`]): `auth.check`, `auth.peek`, ...
    allowlists: [Option<Vec<IdentityPattern>>; AuthGroup::COUNT],
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
        self.allowlists.iter().any(Option::is_some)
    }

    /// The allowlist of `group`, if it has one.
    pub(crate) fn allowlist(&self, group: AuthGroup) -> Option<&[IdentityPattern]> {
        self.allowlists[group.index()].as_deref()
    }

    /// Validates `[auth]`; `mtls` is whether `server.tls.client_ca` is set.
    pub(super) fn validate(mut section: AuthSection, mtls: bool) -> Result<Self, Invalid> {
        let mut allowlists = <[Option<Vec<IdentityPattern>>; AuthGroup::COUNT]>::default();
        for group in AuthGroup::ALL {
            let field = group.setting();
            let path = || vec!["auth".to_owned(), field.to_owned()];
            let Some(patterns) = written(&mut section, group) else {
                continue;
            };
            if !mtls {
                return Err((
                    path(),
                    "allowlists need mTLS: set server.tls.client_ca, so clients present the certificates their identities come from".to_owned(),
                ));
            }
            let list = patterns
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    IdentityPattern::try_new(p).map_err(|m| (path(), format!("entry {i}: {m}")))
                })
                .collect::<Result<_, _>>()?;
            allowlists[group.index()] = Some(list);
        }
        Ok(AuthSettings { allowlists })
    }
}

/// The allowlist of `group` as written, taken out of `section`: the one
/// place that ties a group to its declared setting (a test checks the
/// names agree).
fn written(section: &mut AuthSection, group: AuthGroup) -> Option<Vec<String>> {
    match group {
        AuthGroup::Check => section.check.take(),
        AuthGroup::Peek => section.peek.take(),
        AuthGroup::Reset => section.reset.take(),
        AuthGroup::Overrides => section.overrides.take(),
        AuthGroup::ShouldRateLimit => section.should_rate_limit.take(),
        AuthGroup::RateLimitQuotas => section.rate_limit_quotas.take(),
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

    #[test]
    fn every_group_is_the_setting_of_its_name() {
        let declared: Vec<_> = crate::config::settings::all()
            .filter_map(|s| s.path.strip_prefix("auth."))
            .collect();
        let groups: Vec<_> = AuthGroup::ALL.iter().map(|g| g.setting()).collect();
        assert_eq!(declared, groups);
        for group in AuthGroup::ALL {
            let text = format!("{} = [\"{}\"]", group.setting(), group.setting());
            let section: AuthSection = toml::from_str(&text).expect("a declared setting");
            let settings = AuthSettings::validate(section, true).expect("valid");
            for other in AuthGroup::ALL {
                let list = settings.allowlist(other).map(|l| l[0].to_string());
                let expected = (other == group).then(|| group.setting().to_owned());
                assert_eq!(list, expected, "{other:?} after setting {group:?}");
            }
        }
    }
}
