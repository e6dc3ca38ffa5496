//! Conversions between the wire types and quotad-core's domain types: the
//! one mapping of algorithms, reasons, decisions and batch modes, shared by
//! the server, the client and the Redis backend.
//!
//! Domain to wire never fails. Wire to domain fails on enum values this
//! version does not know (a newer peer) and on `*_UNSPECIFIED`.

use quotad_core::calendar::{Period, weekday_name};
use quotad_core::{Algorithm, BatchMode, Decision, Policy, Reason};
use thiserror::Error;

use crate::v1 as pb;

/// A wire value with no domain meaning.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum UnknownValue {
    /// The enum value is `*_UNSPECIFIED` (0): not set.
    #[error("not set")]
    Unspecified,
    /// The enum value is not one this version knows.
    #[error("unknown value {0}")]
    Unknown(i32),
}

impl From<Algorithm> for pb::Algorithm {
    fn from(a: Algorithm) -> Self {
        match a {
            Algorithm::FixedWindow => pb::Algorithm::FixedWindow,
            Algorithm::SlidingWindow => pb::Algorithm::SlidingWindow,
            Algorithm::TokenBucket => pb::Algorithm::TokenBucket,
            Algorithm::LeakyBucket => pb::Algorithm::LeakyBucket,
            Algorithm::SlidingLog => pb::Algorithm::SlidingLog,
            Algorithm::Concurrency => pb::Algorithm::Concurrency,
        }
    }
}

/// The algorithm of a wire enum value (`pb::Algorithm as i32`).
///
/// # Errors
///
/// [`UnknownValue`] for `ALGORITHM_UNSPECIFIED` or an unknown number.
pub fn algorithm(value: i32) -> Result<Algorithm, UnknownValue> {
    match pb::Algorithm::try_from(value) {
        Ok(pb::Algorithm::FixedWindow) => Ok(Algorithm::FixedWindow),
        Ok(pb::Algorithm::SlidingWindow) => Ok(Algorithm::SlidingWindow),
        Ok(pb::Algorithm::TokenBucket) => Ok(Algorithm::TokenBucket),
        Ok(pb::Algorithm::LeakyBucket) => Ok(Algorithm::LeakyBucket),
        Ok(pb::Algorithm::SlidingLog) => Ok(Algorithm::SlidingLog),
        Ok(pb::Algorithm::Concurrency) => Ok(Algorithm::Concurrency),
        Ok(pb::Algorithm::Unspecified) => Err(UnknownValue::Unspecified),
        Err(_) => Err(UnknownValue::Unknown(value)),
    }
}

impl From<Reason> for pb::Reason {
    fn from(r: Reason) -> Self {
        match r {
            Reason::WithinLimit => pb::Reason::WithinLimit,
            Reason::LimitExceeded => pb::Reason::LimitExceeded,
            Reason::CostExceedsCapacity => pb::Reason::CostExceedsCapacity,
            Reason::Capacity => pb::Reason::Capacity,
            Reason::BatchRejected => pb::Reason::BatchRejected,
            Reason::FailOpen => pb::Reason::FailOpen,
            Reason::FailClosed => pb::Reason::FailClosed,
            Reason::Unavailable => pb::Reason::Unavailable,
            Reason::LocalFallback => pb::Reason::LocalFallback,
        }
    }
}

/// The reason of a wire enum value (`pb::Reason as i32`).
///
/// # Errors
///
/// [`UnknownValue`] for `REASON_UNSPECIFIED` or an unknown number.
pub fn reason(value: i32) -> Result<Reason, UnknownValue> {
    match pb::Reason::try_from(value) {
        Ok(pb::Reason::WithinLimit) => Ok(Reason::WithinLimit),
        Ok(pb::Reason::LimitExceeded) => Ok(Reason::LimitExceeded),
        Ok(pb::Reason::CostExceedsCapacity) => Ok(Reason::CostExceedsCapacity),
        Ok(pb::Reason::Capacity) => Ok(Reason::Capacity),
        Ok(pb::Reason::BatchRejected) => Ok(Reason::BatchRejected),
        Ok(pb::Reason::FailOpen) => Ok(Reason::FailOpen),
        Ok(pb::Reason::FailClosed) => Ok(Reason::FailClosed),
        Ok(pb::Reason::Unavailable) => Ok(Reason::Unavailable),
        Ok(pb::Reason::LocalFallback) => Ok(Reason::LocalFallback),
        Ok(pb::Reason::Unspecified) => Err(UnknownValue::Unspecified),
        Err(_) => Err(UnknownValue::Unknown(value)),
    }
}

impl From<&Decision> for pb::Decision {
    fn from(d: &Decision) -> Self {
        pb::Decision {
            allowed: d.allowed,
            limit: d.limit,
            remaining: d.remaining,
            retry_after_ms: d.retry_after_ms,
            reset_after_ms: d.reset_after_ms,
            reason: pb::Reason::from(d.reason).into(),
            slot_id: String::new(),
            slot_ttl_ms: 0,
        }
    }
}

impl TryFrom<&pb::Decision> for Decision {
    type Error = UnknownValue;

    fn try_from(d: &pb::Decision) -> Result<Self, Self::Error> {
        Ok(Decision {
            allowed: d.allowed,
            limit: d.limit,
            remaining: d.remaining,
            retry_after_ms: d.retry_after_ms,
            reset_after_ms: d.reset_after_ms,
            reason: reason(d.reason)?,
        })
    }
}

impl From<&Policy> for pb::Policy {
    fn from(p: &Policy) -> Self {
        let calendar = p.calendar_period();
        pb::Policy {
            algorithm: pb::Algorithm::from(p.algorithm()).into(),
            limit: p.limit(),
            // A calendar's windows are its periods.
            window_ms: if calendar.is_some() { 0 } else { p.window_ms() },
            burst: p.algorithm().is_bucket().then_some(p.burst()),
            period: calendar
                .map(|c| c.period().as_str().to_owned())
                .unwrap_or_default(),
            time_zone: calendar
                .map(|c| c.zone().name().to_owned())
                .unwrap_or_default(),
            week_start: match calendar.map(|c| c.period()) {
                Some(Period::Week(start)) => weekday_name(start).to_owned(),
                _ => String::new(),
            },
        }
    }
}

impl From<BatchMode> for pb::BatchMode {
    fn from(m: BatchMode) -> Self {
        match m {
            BatchMode::Independent => pb::BatchMode::Independent,
            BatchMode::AllOrNothing => pb::BatchMode::AllOrNothing,
        }
    }
}

/// The batch mode of a wire enum value (`pb::BatchMode as i32`).
///
/// # Errors
///
/// [`UnknownValue::Unknown`] for an unknown number.
pub fn batch_mode(value: i32) -> Result<BatchMode, UnknownValue> {
    match pb::BatchMode::try_from(value) {
        Ok(pb::BatchMode::Independent) => Ok(BatchMode::Independent),
        Ok(pb::BatchMode::AllOrNothing) => Ok(BatchMode::AllOrNothing),
        Err(_) => Err(UnknownValue::Unknown(value)),
    }
}

/// The canonical name of a gRPC status code (`INVALID_ARGUMENT`), as the
/// gRPC docs, grpcurl and other languages' clients print it.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_round_trips() {
        for a in Algorithm::ALL {
            assert_eq!(algorithm(pb::Algorithm::from(a).into()), Ok(a));
        }
        assert_eq!(algorithm(0), Err(UnknownValue::Unspecified));
        assert_eq!(algorithm(99), Err(UnknownValue::Unknown(99)));
    }

    #[test]
    fn every_reason_round_trips() {
        for r in Reason::ALL {
            assert_eq!(reason(pb::Reason::from(r).into()), Ok(r));
            // The wire numbers follow the declaration order, from 1.
            assert_eq!(i32::from(pb::Reason::from(r)), r as i32 + 1);
        }
        assert_eq!(reason(0), Err(UnknownValue::Unspecified));
    }

    #[test]
    fn a_decision_round_trips() {
        let d = Decision {
            allowed: false,
            limit: 10,
            remaining: 0,
            retry_after_ms: 1_500,
            reset_after_ms: 30_000,
            reason: Reason::LimitExceeded,
        };
        assert_eq!(Decision::try_from(&pb::Decision::from(&d)), Ok(d));
    }

    #[test]
    fn batch_modes_round_trip() {
        for m in [BatchMode::Independent, BatchMode::AllOrNothing] {
            assert_eq!(batch_mode(pb::BatchMode::from(m).into()), Ok(m));
        }
        assert_eq!(batch_mode(7), Err(UnknownValue::Unknown(7)));
    }
}
