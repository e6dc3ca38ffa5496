//! Why a request failed, and the one place that turns it into a gRPC
//! status.

use quotad_core::{InvalidItem, LeaseError};
use thiserror::Error;
use tonic::Status;

use crate::backend::BackendError;

/// A request that could not be answered. Every variant about the request
/// names the field, as a path into the request message (`key`,
/// `inline_policy.limit`, `items[3].policy_name`).
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub(crate) enum ServiceError {
    /// Bad input: INVALID_ARGUMENT.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// A policy name that is not configured: NOT_FOUND.
    #[error("{field}: no policy named {name:?}")]
    UnknownPolicy { field: String, name: String },
    /// A lease id the key does not hold and that has not ended: NOT_FOUND.
    #[error(
        "{field}: names no live lease of this key (it was never granted here, or the key was reset)"
    )]
    UnknownLease { field: String },
    /// An inline policy on a server that does not accept them:
    /// FAILED_PRECONDITION (the server's configuration, not the caller's
    /// identity, forbids it; retrying will not help until it changes).
    #[error(
        "{field}: inline policies are disabled on this server (limits.allow_inline_policies = false): a request may not choose its own limit"
    )]
    InlineDisabled { field: String },
    /// `Reset` on a server that does not serve it: PERMISSION_DENIED.
    #[error("Reset is disabled on this server (limits.allow_reset = \"nobody\")")]
    ResetDisabled,
    /// `Reset` from a caller quotad cannot identify (another host, no
    /// client certificate) while `limits.allow_reset = "local"`:
    /// PERMISSION_DENIED.
    #[error(
        "Reset is allowed only to callers over loopback or the unix socket and to mTLS clients (limits.allow_reset = \"local\"); this call came from {from}: call over loopback, use mTLS, or set limits.allow_reset = \"anyone\""
    )]
    ResetNotLocal { from: String },
    /// A method a `limits.allow_*` setting refuses to this caller:
    /// PERMISSION_DENIED, saying which setting.
    #[error("{0}")]
    Refused(String),
    /// The store could not keep an override: UNAVAILABLE (nothing changed).
    #[error("the store could not keep the change: {0}")]
    NotKept(String),
    /// The store may or may not have kept an override (sent, no answer):
    /// UNAVAILABLE, saying so.
    #[error("{0}")]
    MaybeKept(String),
    /// The backend failed: UNAVAILABLE when it is down or slow (and the
    /// policy's `on_error` is `error`), FAILED_PRECONDITION for a batch
    /// spanning Redis Cluster slots, INTERNAL for an answer it cannot use.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl ServiceError {
    pub(crate) fn invalid(field: &str, message: impl Into<String>) -> Self {
        ServiceError::Invalid {
            field: field.to_owned(),
            message: message.into(),
        }
    }

    /// The same error for item `index` of a batch: its field becomes
    /// `items[index].field`.
    pub(crate) fn at_item(self, index: usize) -> Self {
        let prefix = |field: String| format!("items[{index}].{field}");
        match self {
            ServiceError::Invalid { field, message } => ServiceError::Invalid {
                field: prefix(field),
                message,
            },
            ServiceError::UnknownPolicy { field, name } => ServiceError::UnknownPolicy {
                field: prefix(field),
                name,
            },
            ServiceError::InlineDisabled { field } => ServiceError::InlineDisabled {
                field: prefix(field),
            },
            ServiceError::UnknownLease { field } => ServiceError::UnknownLease {
                field: prefix(field),
            },
            other @ (ServiceError::Backend(_)
            | ServiceError::ResetDisabled
            | ServiceError::ResetNotLocal { .. }
            | ServiceError::Refused(_)
            | ServiceError::NotKept(_)
            | ServiceError::MaybeKept(_)) => other,
        }
    }
}

impl From<InvalidItem> for ServiceError {
    // The edge validates all of these first; kept so that a rule added to
    // quotad-core still surfaces as the right field.
    fn from(error: InvalidItem) -> Self {
        let field = match error {
            InvalidItem::ZeroCost
            | InvalidItem::CostTooLarge
            | InvalidItem::CostAboveLimit { .. } => "cost",
            InvalidItem::EmptyKey => "key",
            InvalidItem::PolicyName => "policy_name",
            // The policy's algorithm says which call it takes.
            InvalidItem::WrongOperation(_) => "algorithm",
        };
        ServiceError::invalid(field, error.to_string())
    }
}

impl From<LeaseError> for ServiceError {
    // The store's refusal of the lease a request settles: both are about
    // its `settle` message.
    fn from(error: LeaseError) -> Self {
        match error {
            LeaseError::UnknownLease => ServiceError::UnknownLease {
                field: "settle.lease_id".to_owned(),
            },
            LeaseError::Overspent { spent, units } => ServiceError::invalid(
                "settle.spent",
                format!("must be at most the lease's {units} units (got {spent})"),
            ),
        }
    }
}

/// The gRPC status for an error: the only mapping from errors to codes.
pub(crate) fn to_status(error: &ServiceError) -> Status {
    // Every cause, each once: a store error's causes are its sources.
    let message = crate::log::Causes(error).to_string();
    match error {
        ServiceError::Invalid { .. } => Status::invalid_argument(message),
        ServiceError::UnknownPolicy { .. } | ServiceError::UnknownLease { .. } => {
            Status::not_found(message)
        }
        ServiceError::InlineDisabled { .. } => Status::failed_precondition(message),
        ServiceError::ResetDisabled
        | ServiceError::ResetNotLocal { .. }
        | ServiceError::Refused(_) => Status::permission_denied(message),
        ServiceError::NotKept(_) | ServiceError::MaybeKept(_) => Status::unavailable(message),
        ServiceError::Backend(BackendError::Unavailable(_)) => Status::unavailable(message),
        ServiceError::Backend(
            BackendError::CrossSlot | BackendError::TooManyAtomicItems { .. },
        ) => Status::failed_precondition(message),
        ServiceError::Backend(BackendError::Internal(_)) => Status::internal(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn maps_each_error_to_its_code_with_the_field_first() {
        let cases = [
            (
                ServiceError::invalid("key", "must not be empty"),
                Code::InvalidArgument,
                "key: must not be empty",
            ),
            (
                ServiceError::UnknownPolicy {
                    field: "policy_name".into(),
                    name: "nope".into(),
                },
                Code::NotFound,
                "policy_name: no policy named \"nope\"",
            ),
            (
                ServiceError::InlineDisabled {
                    field: "inline_policy".into(),
                },
                Code::FailedPrecondition,
                "inline_policy: inline policies are disabled",
            ),
            (
                ServiceError::from(LeaseError::UnknownLease),
                Code::NotFound,
                "settle.lease_id: names no live lease of this key",
            ),
            (
                ServiceError::from(LeaseError::Overspent {
                    spent: 11,
                    units: 10,
                }),
                Code::InvalidArgument,
                "settle.spent: must be at most the lease's 10 units (got 11)",
            ),
            (
                ServiceError::Backend(crate::backend::NotRun::Reconnecting.into()),
                Code::Unavailable,
                "state store unavailable: redis: reconnecting",
            ),
        ];
        for (error, code, message) in cases {
            let status = to_status(&error);
            assert_eq!(status.code(), code);
            assert!(
                status.message().starts_with(message),
                "{}",
                status.message()
            );
        }
    }

    #[test]
    fn batch_item_errors_name_the_item() {
        let error =
            ServiceError::invalid("inline_policy.limit", "limit must be at least 1").at_item(3);
        assert_eq!(
            error.to_string(),
            "items[3].inline_policy.limit: limit must be at least 1"
        );
        let store = ServiceError::Backend(crate::backend::NotRun::NotConnected.into());
        assert_eq!(store.clone().at_item(1), store);
    }

    #[test]
    fn core_item_errors_name_their_field() {
        assert_eq!(
            ServiceError::from(InvalidItem::ZeroCost).to_string(),
            "cost: cost must be at least 1"
        );
        assert_eq!(
            ServiceError::from(InvalidItem::EmptyKey).to_string(),
            "key: key must not be empty"
        );
    }
}
