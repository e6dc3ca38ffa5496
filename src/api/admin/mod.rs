//! The per-tenant operator services of `quotad.v1`, each its own file:
//!
//! - [`overrides`]: `quotad.v1.Overrides` (SetOverride, RemoveOverride,
//!   ListOverrides): runtime overrides of named policies.
//! - [`explain`]: `quotad.v1.Explain` (Explain): a key's state in words.
//!
//! Both only convert and map errors; the overrides themselves are the
//! registry's (`crate::registry::overrides`).

pub(crate) mod explain;
pub(crate) mod overrides;

pub(crate) use explain::ExplainService;
pub(crate) use overrides::OverridesService;

use quotad_proto::v1 as pb;

use crate::registry::overrides::{Override, Scope, Source};

/// The wire form of an override.
pub(crate) fn entry_to_pb(entry: &Override) -> pb::OverrideEntry {
    pb::OverrideEntry {
        policy: entry.policy.clone(),
        scope: Some(scope_to_pb(&entry.scope)),
        limit: entry.limit,
        window_ms: entry.window_ms,
        burst: entry.burst,
        expires_at_ms: entry.expires_at_ms,
        source: match entry.source {
            Source::File => pb::OverrideSource::File,
            Source::Runtime => pb::OverrideSource::Runtime,
        }
        .into(),
        set_by: entry.set_by.clone(),
        set_at_ms: entry.set_at_ms,
    }
}

fn scope_to_pb(scope: &Scope) -> pb::OverrideScope {
    pb::OverrideScope {
        scope: Some(match scope {
            Scope::Key(k) => pb::override_scope::Scope::Key(k.clone()),
            Scope::Prefix(p) => pb::override_scope::Scope::Prefix(p.clone()),
        }),
    }
}
