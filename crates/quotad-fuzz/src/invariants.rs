//! The rules every decision keeps, whichever path made it: checked by the
//! targets on each decision they see.

use quotad_core::{Decision, Reason};

/// Panics unless `decision`, answered for `cost` units under a policy of
/// `capacity`, keeps the decision rules of the API:
///
/// - `limit` is the policy's capacity and `remaining` never exceeds it;
/// - admitted means `WITHIN_LIMIT` (or `FAIL_OPEN`) with no retry time;
/// - a cost above capacity is denied `COST_EXCEEDS_CAPACITY`, with no
///   retry time (waiting cannot help);
/// - a `LIMIT_EXCEEDED` denial has a retry time (0 would mean it fits now);
/// - `CAPACITY` and `BATCH_REJECTED` denials have no retry time.
pub fn check_decision(decision: &Decision, capacity: u64, cost: u64) {
    check(decision, capacity, cost, true);
}

/// [`check_decision`] for instants within a window of `u64::MAX` ms (some
/// 584 million years away), where the end of a window saturates at
/// `u64::MAX`: a `LIMIT_EXCEEDED` denial there may carry no retry time.
pub fn check_decision_saturated(decision: &Decision, capacity: u64, cost: u64) {
    check(decision, capacity, cost, false);
}

fn check(decision: &Decision, capacity: u64, cost: u64, waits_fit: bool) {
    let d = decision;
    assert_eq!(d.limit, capacity, "limit is the capacity: {d:?}");
    assert!(d.remaining <= capacity, "remaining above capacity: {d:?}");
    let admitting = matches!(d.reason, Reason::WithinLimit | Reason::FailOpen);
    // A local fallback decision admits or denies.
    if d.reason != Reason::LocalFallback {
        assert_eq!(d.allowed, admitting, "allowed and reason disagree: {d:?}");
    }
    if d.allowed {
        assert_eq!(d.retry_after_ms, 0, "admitted with a retry time: {d:?}");
    }
    if cost > capacity {
        assert!(
            !d.allowed && d.reason == Reason::CostExceedsCapacity,
            "cost {cost} above capacity {capacity} not refused as such: {d:?}"
        );
    }
    match d.reason {
        Reason::CostExceedsCapacity => {
            assert!(
                cost > capacity,
                "cost {cost} fits capacity {capacity}: {d:?}"
            );
            assert_eq!(d.retry_after_ms, 0, "no wait helps: {d:?}");
        }
        Reason::LimitExceeded => {
            assert!(
                d.retry_after_ms > 0 || !waits_fit,
                "denied with nothing to wait: {d:?}"
            );
        }
        Reason::Capacity | Reason::BatchRejected => {
            assert_eq!(d.retry_after_ms, 0, "{d:?}");
        }
        Reason::WithinLimit
        | Reason::FailOpen
        | Reason::FailClosed
        | Reason::Unavailable
        | Reason::LocalFallback => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(allowed: bool, remaining: u64, retry: u64, reason: Reason) -> Decision {
        Decision {
            allowed,
            limit: 10,
            remaining,
            retry_after_ms: retry,
            reset_after_ms: 0,
            reason,
        }
    }

    #[test]
    fn a_well_formed_admission_and_denial_pass() {
        check_decision(&decision(true, 9, 0, Reason::WithinLimit), 10, 1);
        check_decision(&decision(false, 0, 500, Reason::LimitExceeded), 10, 1);
        check_decision(&decision(false, 3, 0, Reason::CostExceedsCapacity), 10, 11);
    }

    #[test]
    #[should_panic(expected = "admitted with a retry time")]
    fn an_admission_with_a_retry_time_is_caught() {
        check_decision(&decision(true, 9, 5, Reason::WithinLimit), 10, 1);
    }

    #[test]
    #[should_panic(expected = "remaining above capacity")]
    fn remaining_above_capacity_is_caught() {
        check_decision(&decision(true, 11, 0, Reason::WithinLimit), 10, 1);
    }

    #[test]
    #[should_panic(expected = "not refused as such")]
    fn a_cost_above_capacity_that_is_admitted_is_caught() {
        check_decision(&decision(true, 0, 0, Reason::WithinLimit), 10, 11);
    }

    #[test]
    #[should_panic(expected = "denied with nothing to wait")]
    fn a_limit_denial_without_a_wait_is_caught() {
        check_decision(&decision(false, 0, 0, Reason::LimitExceeded), 10, 1);
    }
}
