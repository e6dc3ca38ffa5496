//! Invariants of every algorithm, over random policies and traffic.

use std::num::NonZeroU64;
use std::time::Duration;

use proptest::prelude::*;
use quotad_core::{
    Algorithm, Decision, Policy, Reason, SLIDING_LOG_MAX_LIMIT, State, decide, peek,
};

/// Far from the epoch, as real time is, with room for any step.
const START: u64 = 1_767_268_800_000;

#[derive(Clone, Debug)]
struct Request {
    /// Milliseconds since the previous request.
    step: u64,
    cost: u64,
}

fn policy_strategy(algorithm: Algorithm) -> impl Strategy<Value = Policy> {
    let burst = if algorithm.is_bucket() {
        prop::option::of(1u64..=30).boxed()
    } else {
        Just(None).boxed()
    };
    // Small even windows make exact halves (the estimate's rounding) common.
    let window = prop_oneof![prop::sample::select(vec![2u64, 4, 10]), 1u64..=5_000];
    (1u64..=20, window, burst).prop_map(move |(limit, window, burst)| {
        Policy::try_new(algorithm, limit, Duration::from_millis(window), burst)
            .expect("generated within the rules")
    })
}

/// Traffic whose steps are often zero (bursts) and sometimes a window long.
fn traffic(policy: &Policy) -> impl Strategy<Value = Vec<Request>> + use<> {
    let window = policy.window_ms();
    let capacity = policy.capacity();
    let step = prop_oneof![
        3 => Just(0u64),
        4 => 0..=window / 4 + 1,
        1 => Just(window / 2),
        1 => 0..=window * 2,
    ];
    let cost = prop_oneof![4 => Just(1u64), 2 => 1..=capacity, 1 => 1..=capacity + 2];
    prop::collection::vec(
        (step, cost).prop_map(|(step, cost)| Request { step, cost }),
        1..120,
    )
}

fn cost(n: u64) -> NonZeroU64 {
    NonZeroU64::new(n).expect("costs are generated >= 1")
}

/// One decided request: when, how much, and the state it was decided on.
struct Step {
    at: u64,
    cost: u64,
    before: Option<State>,
    decision: Decision,
}

fn run(policy: &Policy, requests: &[Request]) -> Vec<Step> {
    let mut now = START;
    let mut state = None;
    let mut steps = Vec::with_capacity(requests.len());
    for r in requests {
        now += r.step;
        let before = state.clone();
        let (next, decision) = decide(policy, state, now, cost(r.cost));
        state = next;
        steps.push(Step {
            at: now,
            cost: r.cost,
            before,
            decision,
        });
    }
    steps
}

fn admitted(steps: &[Step]) -> Vec<(u64, u64)> {
    steps
        .iter()
        .filter(|s| s.decision.allowed)
        .map(|s| (s.at, s.cost))
        .collect()
}

/// Units admitted within `[from, from + len)`.
fn admitted_within(admitted: &[(u64, u64)], from: u64, len: u64) -> u64 {
    admitted
        .iter()
        .filter(|&&(at, _)| at >= from && at < from + len)
        .map(|&(_, c)| c)
        .sum()
}

/// The most admitted in any interval of `len` ms: an interval holding the
/// most always starts at an admission.
fn busiest_interval(admitted: &[(u64, u64)], len: u64) -> u64 {
    admitted
        .iter()
        .map(|&(at, _)| admitted_within(admitted, at, len))
        .max()
        .unwrap_or(0)
}

fn policy_and_traffic(algorithm: Algorithm) -> impl Strategy<Value = (Policy, Vec<Request>)> {
    policy_strategy(algorithm).prop_flat_map(|p| (Just(p), traffic(&p)))
}

fn any_policy_and_traffic() -> impl Strategy<Value = (Policy, Vec<Request>)> {
    prop::sample::select(Algorithm::RATES.to_vec()).prop_flat_map(policy_and_traffic)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn fixed_window_admits_at_most_limit_per_aligned_window(
        (policy, requests) in policy_and_traffic(Algorithm::FixedWindow)
    ) {
        let admitted = admitted(&run(&policy, &requests));
        let w = policy.window_ms();
        for &(at, _) in &admitted {
            let start = at - at % w;
            prop_assert!(admitted_within(&admitted, start, w) <= policy.limit());
        }
        prop_assert!(busiest_interval(&admitted, w) <= 2 * policy.limit());
    }

    #[test]
    fn sliding_window_admits_at_most_limit_per_window_and_agrees_with_its_estimate(
        (policy, requests) in policy_and_traffic(Algorithm::SlidingWindow)
    ) {
        let steps = run(&policy, &requests);
        let w = policy.window_ms();
        for (i, s) in steps.iter().enumerate() {
            // A reference model from the history: the admissions of this
            // window and of the one before, the previous weighted by how
            // much of it the sliding window still covers.
            let history = admitted(&steps[..i]);
            let start = s.at - s.at % w;
            let current = admitted_within(&history, start, w);
            let previous = admitted_within(&history, start - w, w);
            let elapsed = s.at - start;
            let estimate = (previous * (w - elapsed) + w / 2) / w + current;
            let fits = s.cost <= policy.limit() && estimate + s.cost <= policy.limit();
            prop_assert_eq!(s.decision.allowed, fits, "at {} cost {}", s.at, s.cost);
        }
        let admitted = admitted(&steps);
        for &(at, _) in &admitted {
            let start = at - at % w;
            prop_assert!(admitted_within(&admitted, start, w) <= policy.limit());
        }
    }

    #[test]
    fn token_bucket_never_admits_more_than_burst_plus_refill(
        (policy, requests) in policy_and_traffic(Algorithm::TokenBucket)
    ) {
        let admitted = admitted(&run(&policy, &requests));
        check_bucket_bound(&policy, &admitted)?;
    }

    #[test]
    fn leaky_bucket_never_outpaces_its_drain_beyond_capacity(
        (policy, requests) in policy_and_traffic(Algorithm::LeakyBucket)
    ) {
        let admitted = admitted(&run(&policy, &requests));
        check_bucket_bound(&policy, &admitted)?;
    }

    #[test]
    fn sliding_log_never_exceeds_limit_in_any_window_long_interval(
        (policy, requests) in policy_and_traffic(Algorithm::SlidingLog)
    ) {
        let admitted = admitted(&run(&policy, &requests));
        prop_assert!(busiest_interval(&admitted, policy.window_ms()) <= policy.limit());
    }

    #[test]
    fn sliding_log_admits_exactly_when_a_brute_force_count_of_the_window_allows(
        (policy, requests) in policy_and_traffic(Algorithm::SlidingLog)
    ) {
        let steps = run(&policy, &requests);
        let w = policy.window_ms();
        for (i, s) in steps.iter().enumerate() {
            // Every admission within (at - window, at] still counts.
            let history = admitted(&steps[..i]);
            let from = (s.at + 1).saturating_sub(w);
            let used = admitted_within(&history, from, w);
            let fits = s.cost <= policy.limit() && used + s.cost <= policy.limit();
            prop_assert_eq!(s.decision.allowed, fits, "at {} cost {}", s.at, s.cost);
            prop_assert_eq!(s.decision.remaining, policy.limit().saturating_sub(
                used + if s.decision.allowed { s.cost } else { 0 }
            ));
        }
    }

    #[test]
    fn retry_after_is_exact_on_both_sides((policy, requests) in any_policy_and_traffic()) {
        for s in run(&policy, &requests) {
            if s.decision.reason != Reason::LimitExceeded {
                continue;
            }
            let r = s.decision.retry_after_ms;
            prop_assert!(r >= 1);
            let (_, later) = decide(&policy, s.before.clone(), s.at + r, cost(s.cost));
            prop_assert!(later.allowed, "not allowed at now + retry_after ({r})");
            let (_, sooner) = decide(&policy, s.before.clone(), s.at + r - 1, cost(s.cost));
            prop_assert!(!sooner.allowed, "already allowed at now + retry_after - 1 ({r})");
        }
    }

    #[test]
    fn remaining_is_the_number_of_unit_requests_admitted_at_that_instant(
        (policy, requests) in any_policy_and_traffic()
    ) {
        let mut now = START;
        let mut state = None;
        for r in &requests {
            now += r.step;
            let (next, d) = decide(&policy, state, now, cost(r.cost));
            state = next;
            let mut probe = state.clone();
            let mut units = 0;
            while units <= policy.capacity() {
                let (next, u) = decide(&policy, probe, now, cost(1));
                if !u.allowed {
                    break;
                }
                probe = next;
                units += 1;
            }
            prop_assert_eq!(d.remaining, units);
        }
    }

    #[test]
    fn the_state_is_fresh_after_reset_after((policy, requests) in any_policy_and_traffic()) {
        let mut now = START;
        let mut state = None;
        for r in &requests {
            now += r.step;
            let (next, d) = decide(&policy, state, now, cost(r.cost));
            state = next;
            let then = now + d.reset_after_ms;
            let fresh = peek(&policy, None, then, cost(1));
            prop_assert_eq!(peek(&policy, state.as_ref(), then, cost(1)), fresh);
            prop_assert_eq!(fresh.remaining, policy.capacity());
        }
    }

    #[test]
    fn cost_above_capacity_is_denied_and_consumes_nothing((policy, requests) in any_policy_and_traffic()) {
        for s in run(&policy, &requests) {
            if s.cost > policy.capacity() {
                prop_assert_eq!(s.decision.reason, Reason::CostExceedsCapacity);
                prop_assert!(!s.decision.allowed);
                prop_assert_eq!(s.decision.retry_after_ms, 0);
                let untouched = peek(&policy, s.before.as_ref(), s.at, cost(1));
                prop_assert_eq!(s.decision.remaining, untouched.remaining);
            }
        }
    }

    #[test]
    fn token_and_leaky_buckets_decide_identically(
        (policy, requests) in policy_and_traffic(Algorithm::TokenBucket)
    ) {
        let leaky = Policy::try_new(
            Algorithm::LeakyBucket,
            policy.limit(),
            Duration::from_millis(policy.window_ms()),
            Some(policy.burst()),
        ).expect("same parameters are valid");
        let tokens: Vec<Decision> = run(&policy, &requests).into_iter().map(|s| s.decision).collect();
        let levels: Vec<Decision> = run(&leaky, &requests).into_iter().map(|s| s.decision).collect();
        prop_assert_eq!(tokens, levels);
    }

    #[test]
    fn a_clock_stepping_back_never_refunds(
        (policy, requests) in any_policy_and_traffic(),
        backs in prop::collection::vec(0u64..20_000, 120),
    ) {
        let mut now = START;
        let mut state = None;
        for (r, back) in requests.iter().zip(&backs) {
            now += r.step;
            let (next, _) = decide(&policy, state, now, cost(r.cost));
            state = next;
            let here = peek(&policy, state.as_ref(), now, cost(1));
            let earlier = peek(&policy, state.as_ref(), now - back, cost(1));
            prop_assert!(earlier.remaining <= here.remaining);
        }
    }

    #[test]
    fn a_jumping_clock_never_panics((policy, requests) in any_policy_and_traffic(), jumps in prop::collection::vec(any::<u64>(), 120)) {
        let mut state = None;
        for (r, &at) in requests.iter().zip(&jumps) {
            let (next, d) = decide(&policy, state, at, cost(r.cost));
            prop_assert!(d.remaining <= policy.capacity());
            state = next;
        }
    }
}

fn check_bucket_bound(policy: &Policy, admitted: &[(u64, u64)]) -> Result<(), TestCaseError> {
    // Over any interval [a, b] between admissions, admitted units x window
    // <= burst x window + limit x (b - a).
    let w = policy.window_ms();
    for (i, &(a, _)) in admitted.iter().enumerate() {
        let mut total = 0;
        for &(b, c) in &admitted[i..] {
            total += c;
            prop_assert!(
                total * w <= policy.burst() * w + policy.limit() * (b - a),
                "{total} admitted in [{a}, {b}]"
            );
        }
    }
    Ok(())
}

/// `(step ms, cost)` of each admission, then `(ms later, cost)` of each
/// query.
type LogAndQueries = (Vec<(u64, u64)>, Vec<(u64, u64)>);

/// A sliding log at its cap: `limit` 10,000 and up to 10,000 entries.
fn full_log() -> impl Strategy<Value = LogAndQueries> {
    // (step ms, cost) of each admission: costs of 1 mostly, so the log holds
    // close to 10,000 entries.
    let admission = (1u64..=3, prop_oneof![8 => Just(1u64), 1 => 2u64..=4]);
    let queries = prop::collection::vec((0u64..40_000, 1u64..=SLIDING_LOG_MAX_LIMIT), 1..16);
    (prop::collection::vec(admission, 9_000..=10_000), queries)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn retry_after_is_exact_on_a_full_10_000_entry_log((admissions, queries) in full_log()) {
        let limit = SLIDING_LOG_MAX_LIMIT;
        let policy = Policy::try_new(Algorithm::SlidingLog, limit, Duration::from_secs(40), None)
            .expect("valid");
        let mut now = START;
        let mut state = None;
        for &(step, cost) in &admissions {
            now += step;
            state = decide(&policy, state, now, self::cost(cost)).0;
        }
        let Some(State::SlidingLog { log, .. }) = &state else {
            return Err(TestCaseError::fail("the log holds admissions"));
        };
        prop_assert!(log.len() >= 2_000 && log.total() <= limit);
        for &(later, c) in &queries {
            let at = now + later;
            let d = peek(&policy, state.as_ref(), at, self::cost(c));
            if d.allowed {
                continue;
            }
            let r = d.retry_after_ms;
            prop_assert!(r >= 1);
            let then = peek(&policy, state.as_ref(), at + r, self::cost(c));
            prop_assert!(then.allowed, "not allowed at now + retry_after ({r})");
            let sooner = peek(&policy, state.as_ref(), at + r - 1, self::cost(c));
            prop_assert!(!sooner.allowed, "already allowed at now + retry_after - 1 ({r})");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// The sweep drops state that is fresh. A clock stepped back after it
    /// must not make the key younger than it was when judged fresh: a store
    /// swept between requests decides as one never swept whose clock never
    /// goes back before the sweeps that dropped something.
    #[test]
    fn sweeping_changes_no_decision_when_the_clock_steps_back(
        (policy, requests) in any_policy_and_traffic(),
        gaps in prop::collection::vec((0u64..300, 0u64..100), 120),
    ) {
        use quotad_core::{CheckItem, FakeClock, MemoryStore, OnFull, StoreConfig};
        use std::sync::Arc;
        let (clock, floored) = (Arc::new(FakeClock::new(START)), Arc::new(FakeClock::new(START)));
        let config = || StoreConfig::try_new(64, 4, OnFull::Deny).expect("valid config");
        let swept = MemoryStore::new(config(), clock.clone());
        let kept = MemoryStore::new(config(), floored.clone());
        let w = policy.window_ms();
        let (mut now, mut floor) = (START, START);
        for (r, (sweep_pct, back_pct)) in requests.iter().zip(&gaps) {
            clock.set(now);
            floored.set(now.max(floor));
            let item = CheckItem::new("p", policy, "k", r.cost).expect("valid item");
            prop_assert_eq!(swept.check_one(&item), kept.check_one(&item), "at {}", now);
            // Sweep up to three windows later, then step back part of the
            // way before the next request.
            let sweep_at = now + w.saturating_mul(*sweep_pct) / 100;
            clock.set(sweep_at);
            for _ in 0..4 {
                if swept.sweep_step() > 0 {
                    floor = floor.max(sweep_at);
                }
            }
            now = (sweep_at + r.step)
                .saturating_sub(w.saturating_mul(*back_pct) / 100 * 3)
                .max(START);
        }
    }

    /// Whether the sweep came by before a read never changes what the read
    /// decides, even when the policy changed since the state was written
    /// (a lower or higher rate keeps a bucket's state): state is fresh at
    /// the instant the policy that wrote it said, as Redis expires it.
    #[test]
    fn sweeping_changes_no_decision_across_limit_changes(
        (policy, requests) in any_policy_and_traffic(),
        plan in prop::collection::vec((any::<bool>(), 0u64..=100), 120),
    ) {
        use quotad_core::{CheckItem, FakeClock, MemoryStore, OnFull, StoreConfig};
        use std::sync::Arc;
        let other = Policy::try_new(
            policy.algorithm(),
            (policy.limit() / 3).max(1),
            Duration::from_millis(policy.window_ms()),
            policy.algorithm().is_bucket().then_some(policy.burst()),
        )
        .expect("a smaller limit is valid");
        let clock = Arc::new(FakeClock::new(START));
        let config = || StoreConfig::try_new(64, 4, OnFull::Deny).expect("valid config");
        let swept = MemoryStore::new(config(), clock.clone());
        let kept = MemoryStore::new(config(), clock.clone());
        let mut now = START;
        for (r, (use_other, sweep_pct)) in requests.iter().zip(&plan) {
            let p = if *use_other { other } else { policy };
            let item = CheckItem::new("p", p, "k", r.cost).expect("valid item");
            prop_assert_eq!(swept.check_one(&item), kept.check_one(&item), "at {}", now);
            // Sweep somewhere between this request and the next.
            clock.set(now + r.step * sweep_pct / 100);
            for _ in 0..4 {
                swept.sweep_step();
            }
            now += r.step;
            clock.set(now);
        }
    }
}
