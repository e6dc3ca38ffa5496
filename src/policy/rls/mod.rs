//! Envoy RLS rules: envoyproxy/ratelimit's YAML configuration, read
//! unchanged, and the matcher that turns a `ShouldRateLimit` request into
//! quotad checks.
//!
//! - [`RlsRules::load`] reads every `*.yaml` / `*.yml` file of a directory
//!   (or one file): each names a `domain` and its nested `descriptors`, in
//!   the reference's format, plus quotad's extension under a descriptor's
//!   `metadata.quotad` (see [below](#the-quotad-extension)).
//! - [`RlsRules::resolve`] matches each descriptor of a [`Request`] and
//!   says, per descriptor, what applies ([`Resolution`]): no limit, an
//!   unlimited rule, or a limit ([`Applied`]) with its quotad [`Policy`],
//!   the state namespace and key it counts under and the [`Charge`].
//!
//! Loading and matching are pure: no I/O but reading the files, no store,
//! no clock. The gRPC edge converts Envoy's messages into a [`Request`]
//! (borrowing their strings), sends the [`Applied`] items to the store and
//! writes the statuses. Beside them, the server keeps the rules in force in
//! a registry swapped whole on reload (the files polled and SIGHUP, as
//! named policies), each rule with its metric counters.
//!
//! ```
//! use std::path::Path;
//! use quotad::policy::rls::{Descriptor, Entry, LoadOptions, Request, Resolution, RlsRules};
//!
//! let yaml = r#"
//! domain: edge
//! descriptors:
//!   - key: remote_address
//!     rate_limit:
//!       unit: second
//!       requests_per_unit: 10
//! "#;
//! let rules = RlsRules::from_sources([(Path::new("edge.yaml"), yaml)], LoadOptions::default())?;
//! let request = Request {
//!     domain: "edge",
//!     descriptors: [Descriptor {
//!         entries: [Entry { key: "remote_address", value: "10.0.0.1" }].into_iter().collect(),
//!         ..Descriptor::default()
//!     }].into(),
//!     hits_addend: 0, // unset: one hit
//! };
//! let resolved = rules.resolve(&request)?;
//! let Resolution::Limited(applied) = &resolved[0] else { panic!("a limit applies") };
//! let item = applied.check_item().expect("a limit above zero is counted");
//! assert_eq!(item.name(), "rls:edge/remote_address");
//! assert_eq!(item.key(), "remote_address=10.0.0.1");
//! assert_eq!((item.policy().limit(), item.policy().window_ms(), item.cost().get()), (10, 1_000, 1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Layout
//!
//! - `rules.rs`: the model, one descriptor tree per domain with its
//!   [`Rule`]s and [`Limit`]s, and the lookups matching makes in it.
//! - `load.rs`: the loader, from files to that model; what is an error
//!   and where. `yaml.rs` reads the YAML as the reference does; `unit.rs`
//!   holds the time units.
//! - `matcher.rs`: a [`Request`] resolved against the rules; `state.rs`:
//!   the namespace and key each hit counts under.
//! - `registry.rs`, `reload.rs`: the rules in force and their hot reload.
//!
//! # Matching (as the reference)
//!
//! A descriptor's entries are matched level by level from the domain's
//! descriptor list: at each level the entry's key must match a configured
//! `key`, and among those the configured `value` equal to the entry's value
//! wins, then the first wildcard value (`*` matches any run of characters,
//! anywhere in the value) in file order, then the configured descriptor
//! with the key and no value. The rule is the `rate_limit` of the node the
//! *last* entry matched: a request with fewer or more entries than the
//! configured path matches nothing. A request `limit` on the descriptor
//! replaces matching (when the domain is known). Unknown domains and
//! unmatched descriptors have no limit. A matched rule whose
//! `rate_limit.name` is listed in the `replaces` of any rule matched by the
//! same request is dropped, uncounted.
//!
//! # The quotad extension
//!
//! The reference refuses any key it does not know, anywhere in a file,
//! except inside a descriptor's `metadata` (arbitrary data it passes on as
//! response metadata when asked to). quotad's settings live there, so one
//! file serves both servers:
//!
//! ```yaml
//! domain: api
//! descriptors:
//!   - key: user
//!     rate_limit:
//!       unit: minute
//!       requests_per_unit: 60
//!     metadata:
//!       quotad:
//!         algorithm: token_bucket   # or fixed_window (the default),
//!                                   # sliding_window, leaky_bucket, sliding_log
//!         burst: 20                 # buckets only; defaults to requests_per_unit
//! ```
//!
//! `requests_per_unit` per `unit` is the limit per window (the refill or
//! drain rate of a bucket). Unknown keys under `metadata.quotad` are
//! errors; other `metadata` keys are left alone.
//!
//! [`Policy`]: quotad_core::Policy

mod load;
mod matcher;
mod rules;
mod state;
mod unit;
mod yaml;

use std::fmt;
use std::path::{Path, PathBuf};

pub use load::{LoadOptions, MAX_FILE_BYTES};
pub use matcher::{
    Applied, Charge, Descriptor, Descriptors, Entries, Entry, LimitOverride, NoLimit, Request,
    RequestError, Resolution, Resolutions,
};
pub use rules::{Counting, Limit, RlsRules, Rule};
pub use state::NAMESPACE_PREFIX;
pub(crate) use state::override_namespace;
pub use unit::Unit;

/// A rules file that cannot be used, with where: the file, the field path
/// (`descriptors[0].rate_limit.unit`) and the line and column.
///
/// Displayed as `rules/api.yaml: descriptors[0].rate_limit.unit: invalid
/// rate limit unit "fortnight" (...) (line 7, column 13)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RlsConfigError {
    file: PathBuf,
    field: String,
    message: String,
    position: Option<(usize, usize)>,
}

impl RlsConfigError {
    pub(crate) fn new(file: &Path, field: &str, message: impl Into<String>) -> Self {
        RlsConfigError {
            file: file.to_owned(),
            field: field.to_owned(),
            message: message.into(),
            position: None,
        }
    }

    pub(crate) fn at(mut self, line: usize, column: usize) -> Self {
        self.position = Some((line, column));
        self
    }

    /// The file (or directory) at fault.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The field path within the file; empty when the fault is the file's.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The 1-based line of the fault, when known.
    pub fn line(&self) -> Option<usize> {
        self.position.map(|(line, _)| line)
    }

    /// The 1-based column of the fault, when known.
    pub fn column(&self) -> Option<usize> {
        self.position.map(|(_, column)| column)
    }
}

impl fmt::Display for RlsConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.file.display())?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)?;
        if let Some((line, column)) = self.position {
            write!(f, " (line {line}, column {column})")?;
        }
        Ok(())
    }
}

impl std::error::Error for RlsConfigError {}

#[cfg(test)]
mod tests;
