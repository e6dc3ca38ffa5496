//! What a caller asks and what can go wrong: a [`Check`], the policy it
//! names, the failure policy, the client's errors, and how a failed call's
//! status is worded.

use std::time::Duration;

use quotad_core::{LeaseTerms, Policy};
use quotad_proto::v1 as pb;
use thiserror::Error;
use tonic::Status;

/// The default deadline for one call, connection included.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(250);

/// What a check answers when quotad cannot be reached within the deadline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FailurePolicy {
    /// Admit the request; the decision's reason is
    /// [`Reason::FailOpen`](crate::Reason::FailOpen).
    FailOpen,
    /// Deny the request; the decision's reason is
    /// [`Reason::FailClosed`](crate::Reason::FailClosed).
    FailClosed,
    /// Return [`Error::Unavailable`] and let the caller decide.
    #[default]
    Error,
}

/// Why a call failed.
#[derive(Debug, Error)]
pub enum Error {
    /// The address is not a valid quotad address (`http://host:port`,
    /// `https://host:port` or `unix:///path/to.sock`), or its TLS settings
    /// do not fit it (the message names the setting, e.g. `tls.ca`).
    #[error("invalid quotad address: {0}")]
    InvalidAddress(String),
    /// quotad could not be reached, or did not answer within the deadline,
    /// and the failure policy is [`FailurePolicy::Error`].
    #[error("quotad is unavailable: {0}")]
    Unavailable(Status),
    /// quotad refused the request (bad input, unknown policy, ...): a bug in
    /// the caller, never subject to the failure policy.
    #[error("quotad rejected the request: {}: {}", .0.code(), .0.message())]
    Rejected(Status),
    /// The answer could not be understood (a server from a newer API).
    #[error("unexpected answer from quotad: {0}")]
    BadResponse(&'static str),
}

/// Which policy a check counts under: quotad-core's, the one the server
/// uses too.
pub use quotad_core::PolicyRef;

/// One request: `cost` units of `key` under a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    key: String,
    cost: u64,
    policy: PolicyRef,
    terms: Option<LeaseTerms>,
}

impl Check {
    /// One unit of `key` under the named policy `policy`.
    pub fn named(policy: impl Into<String>, key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            cost: 1,
            policy: PolicyRef::Named(policy.into()),
            terms: None,
        }
    }

    /// One unit of `key` under an inline policy.
    pub fn inline(policy: Policy, key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            cost: 1,
            policy: PolicyRef::Inline(policy),
            terms: None,
        }
    }

    /// Asks for `cost` units instead of one.
    #[must_use]
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// How quotad may lease budget of an inline policy to a client with
    /// leases on ([`ClientBuilder::leases`](crate::ClientBuilder::leases));
    /// ignored for a named policy, whose lease settings are quotad's. An
    /// inline check without terms is never leased.
    #[must_use]
    pub fn lease_terms(mut self, terms: LeaseTerms) -> Self {
        self.terms = Some(terms);
        self
    }

    /// The lease terms of an inline policy, if given.
    pub fn inline_terms(&self) -> Option<LeaseTerms> {
        match self.policy {
            PolicyRef::Inline(_) => self.terms,
            PolicyRef::Named(_) => None,
        }
    }

    /// The units asked for.
    pub fn cost_units(&self) -> u64 {
        self.cost
    }

    /// The key counted.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The policy referred to.
    pub fn policy(&self) -> &PolicyRef {
        &self.policy
    }

    /// The policy's name, or `inline`: the label of this check's metrics
    /// (never the key).
    pub(crate) fn policy_label(&self) -> String {
        match &self.policy {
            PolicyRef::Named(name) => name.clone(),
            PolicyRef::Inline(_) => "inline".to_owned(),
        }
    }

    pub(crate) fn to_proto(&self) -> pb::CheckRequest {
        pb::CheckRequest {
            key: self.key.clone(),
            cost: Some(self.cost),
            policy: Some(match &self.policy {
                PolicyRef::Named(name) => pb::check_request::Policy::PolicyName(name.clone()),
                PolicyRef::Inline(p) => pb::check_request::Policy::InlinePolicy(p.into()),
            }),
        }
    }
}

/// An error with its causes, which tonic keeps out of `Display`; a cause
/// an outer error already quotes is not repeated.
pub(crate) fn source_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text
}

/// The status of a call that quotad did not answer within its deadline.
pub(crate) fn deadline_exceeded() -> Status {
    Status::deadline_exceeded("no answer from quotad within the deadline")
}
