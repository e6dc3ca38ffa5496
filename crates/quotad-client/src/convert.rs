//! Proto <-> domain conversions at the client's edge.

use quotad_core::{Algorithm, Decision, Policy, Reason};
use quotad_proto::v1 as pb;

use crate::Error;

pub(crate) fn algorithm(a: Algorithm) -> pb::Algorithm {
    match a {
        Algorithm::FixedWindow => pb::Algorithm::FixedWindow,
        Algorithm::SlidingWindow => pb::Algorithm::SlidingWindow,
        Algorithm::TokenBucket => pb::Algorithm::TokenBucket,
        Algorithm::LeakyBucket => pb::Algorithm::LeakyBucket,
        Algorithm::SlidingLog => pb::Algorithm::SlidingLog,
    }
}

pub(crate) fn policy(p: &Policy) -> pb::Policy {
    pb::Policy {
        algorithm: algorithm(p.algorithm()).into(),
        limit: p.limit(),
        window_ms: p.window_ms(),
        burst: p.algorithm().is_bucket().then_some(p.burst()),
    }
}

fn reason(r: pb::Reason) -> Option<Reason> {
    Some(match r {
        pb::Reason::Unspecified => return None,
        pb::Reason::WithinLimit => Reason::WithinLimit,
        pb::Reason::LimitExceeded => Reason::LimitExceeded,
        pb::Reason::CostExceedsCapacity => Reason::CostExceedsCapacity,
        pb::Reason::Capacity => Reason::Capacity,
        pb::Reason::BatchRejected => Reason::BatchRejected,
        pb::Reason::FailOpen => Reason::FailOpen,
        pb::Reason::FailClosed => Reason::FailClosed,
    })
}

pub(crate) fn decision(d: Option<pb::Decision>) -> Result<Decision, Error> {
    let d = d.ok_or(Error::BadResponse("decision missing"))?;
    let reason = pb::Reason::try_from(d.reason)
        .ok()
        .and_then(reason)
        .ok_or(Error::BadResponse("unknown reason"))?;
    Ok(Decision {
        allowed: d.allowed,
        limit: d.limit,
        remaining: d.remaining,
        retry_after_ms: d.retry_after_ms,
        reset_after_ms: d.reset_after_ms,
        reason,
    })
}
