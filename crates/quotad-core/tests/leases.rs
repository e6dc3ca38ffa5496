//! Leases in the memory store: charged when granted, spent by their holders
//! locally, returned, ended; and the bound they must keep, checked by
//! replaying every admission at its real time against the algorithm.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use quotad_core::{
    Algorithm, CheckItem, FakeClock, Grant, LeaseAnswer, LeaseAsk, LeaseError, LeaseTerms,
    MAX_GRANTS_PER_KEY, MemoryStore, OnFull, Policy, Settle, Settled, SnapshotReader, State,
    StoreConfig, decide,
};

fn store(clock: &Arc<FakeClock>) -> MemoryStore {
    let config = StoreConfig::try_new(10_000, 16, OnFull::Deny).expect("valid config");
    MemoryStore::new(config, clock.clone())
}

fn policy(algorithm: Algorithm, limit: u64, window: Duration) -> Policy {
    Policy::try_new(algorithm, limit, window, None).expect("valid policy")
}

fn terms(max: u64, min: u64, ttl: Duration) -> LeaseTerms {
    LeaseTerms::try_new(max, min, ttl).expect("valid terms")
}

fn ask(want: u64, new_id: u64) -> LeaseAsk {
    LeaseAsk {
        settle: None,
        want,
        new_id,
    }
}

fn settle(grant: &Grant, spent: u64) -> Settle {
    Settle {
        id: grant.id,
        ends_at: grant.ends_at,
        spent,
    }
}

fn granted(answer: LeaseAnswer) -> Grant {
    match answer {
        LeaseAnswer::Granted(g) => g,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn remaining(store: &MemoryStore, policy: Policy) -> u64 {
    let item = CheckItem::new("api", policy, "k", 1).expect("valid item");
    store.peek(&item).remaining
}

const MINUTE: Duration = Duration::from_secs(60);

#[test]
fn a_lease_is_charged_when_granted_and_ends_with_its_window() {
    let clock = Arc::new(FakeClock::new(120_000 + 50_000));
    let store = store(&clock);
    let p = policy(Algorithm::FixedWindow, 100, MINUTE);
    let t = terms(30, 5, Duration::from_secs(60));
    let out = store.lease("api", "k", &p, &t, &ask(50, 1)).expect("lease");
    let g = granted(out.answer);
    assert_eq!(g.units, 30);
    // The window ends at 180,000: 10 s left, less than the TTL.
    assert_eq!((g.granted_at, g.ends_at), (170_000, 180_000));
    assert_eq!(out.remaining, 70);
    assert_eq!(remaining(&store, p), 70);
}

#[test]
fn unspent_units_go_back_while_the_window_is_current() {
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let clock = Arc::new(FakeClock::new(0));
        let store = store(&clock);
        let p = policy(algorithm, 100, MINUTE);
        let t = terms(40, 1, Duration::from_secs(10));
        let g = granted(
            store
                .lease("api", "k", &p, &t, &ask(40, 1))
                .expect("lease")
                .answer,
        );
        assert_eq!(remaining(&store, p), 60);
        clock.advance(Duration::from_secs(1));
        let back = LeaseAsk {
            settle: Some(settle(&g, 15)),
            want: 0,
            new_id: 2,
        };
        let out = store.lease("api", "k", &p, &t, &back).expect("return");
        assert_eq!(out.settled, Some(Settled::Returned { returned: 25 }));
        assert_eq!(out.answer, LeaseAnswer::None);
        assert_eq!(remaining(&store, p), 85, "{algorithm}");
    }
}

#[test]
fn a_lease_that_ended_settles_as_ended_and_gives_nothing_back() {
    let clock = Arc::new(FakeClock::new(0));
    let store = store(&clock);
    let p = policy(Algorithm::FixedWindow, 100, MINUTE);
    let t = terms(40, 1, Duration::from_secs(10));
    let g = granted(
        store
            .lease("api", "k", &p, &t, &ask(40, 1))
            .expect("lease")
            .answer,
    );
    clock.advance(Duration::from_secs(10));
    let back = LeaseAsk {
        settle: Some(settle(&g, 0)),
        want: 0,
        new_id: 2,
    };
    let out = store.lease("api", "k", &p, &t, &back).expect("settle");
    assert_eq!(out.settled, Some(Settled::Ended));
    // Its units stay spent until the window ends: a crashed holder's
    // units are lost, never admitted twice.
    assert_eq!(remaining(&store, p), 60);
}

#[test]
fn an_unknown_or_overspent_lease_is_refused_and_changes_nothing() {
    let clock = Arc::new(FakeClock::new(0));
    let store = store(&clock);
    let p = policy(Algorithm::FixedWindow, 100, MINUTE);
    let t = terms(40, 1, Duration::from_secs(10));
    let g = granted(
        store
            .lease("api", "k", &p, &t, &ask(40, 1))
            .expect("lease")
            .answer,
    );
    let unknown = LeaseAsk {
        settle: Some(Settle {
            id: 99,
            ends_at: g.ends_at,
            spent: 0,
        }),
        want: 10,
        new_id: 3,
    };
    assert_eq!(
        store.lease("api", "k", &p, &t, &unknown),
        Err(LeaseError::UnknownLease)
    );
    let overspent = LeaseAsk {
        settle: Some(settle(&g, 41)),
        want: 10,
        new_id: 3,
    };
    assert_eq!(
        store.lease("api", "k", &p, &t, &overspent),
        Err(LeaseError::Overspent {
            spent: 41,
            units: 40
        })
    );
    // An unknown lease of a key that has no state creates nothing.
    assert_eq!(
        store.lease("api", "other", &p, &t, &unknown),
        Err(LeaseError::UnknownLease)
    );
    assert_eq!(store.live_keys(), 1);
    assert_eq!(remaining(&store, p), 60);
    // The lease is still held: settling it works.
    let back = LeaseAsk {
        settle: Some(settle(&g, 0)),
        want: 0,
        new_id: 4,
    };
    assert!(store.lease("api", "k", &p, &t, &back).is_ok());
    assert_eq!(remaining(&store, p), 100);
}

#[test]
fn near_the_end_of_the_budget_the_answer_is_direct() {
    let clock = Arc::new(FakeClock::new(0));
    let store = store(&clock);
    let p = policy(Algorithm::FixedWindow, 100, MINUTE);
    let t = terms(40, 10, Duration::from_secs(10));
    let sizes: Vec<LeaseAnswer> = (0..5)
        .map(|i| {
            store
                .lease("api", "k", &p, &t, &ask(40, i))
                .expect("lease")
                .answer
        })
        .collect();
    let units: Vec<Option<u64>> = sizes
        .iter()
        .map(|a| match a {
            LeaseAnswer::Granted(g) => Some(g.units),
            _ => None,
        })
        .collect();
    // Fair shares of what is free among the live holders and the asker:
    // 100/1 -> 40, 60/2 -> 30, 30/3 -> 10, 20/4 = 5 < 10 -> direct.
    assert_eq!(units, [Some(40), Some(30), Some(10), None, None]);
    assert_eq!(remaining(&store, p), 20);
    // Direct checks decide the rest exactly.
    let item = CheckItem::new("api", p, "k", 20).expect("item");
    assert!(store.check_one(&item).allowed);
    assert!(
        !store
            .check_one(&CheckItem::new("api", p, "k", 1).expect("item"))
            .allowed
    );
}

#[test]
fn a_key_holds_a_bounded_number_of_leases() {
    let clock = Arc::new(FakeClock::new(0));
    let store = store(&clock);
    let p = policy(Algorithm::FixedWindow, 1_000_000, MINUTE);
    let t = terms(1, 1, Duration::from_secs(10));
    for i in 0..MAX_GRANTS_PER_KEY as u64 {
        granted(
            store
                .lease("api", "k", &p, &t, &ask(1, i))
                .expect("lease")
                .answer,
        );
    }
    let out = store
        .lease("api", "k", &p, &t, &ask(1, 1_000))
        .expect("lease");
    assert_eq!(out.answer, LeaseAnswer::Direct);
}

#[test]
fn every_algorithm_charges_a_lease_when_granted() {
    for algorithm in Algorithm::RATES {
        let clock = Arc::new(FakeClock::new(0));
        let store = store(&clock);
        let p = policy(algorithm, 100, MINUTE);
        let t = terms(40, 1, Duration::from_secs(10));
        let g = granted(
            store
                .lease("api", "k", &p, &t, &ask(40, 1))
                .expect("lease")
                .answer,
        );
        assert_eq!((g.units, g.ends_at), (40, 10_000), "{algorithm}");
        assert_eq!(remaining(&store, p), 60, "{algorithm}");
    }
}

#[test]
fn a_bucket_does_not_refill_what_a_live_lease_holds() {
    for algorithm in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        let clock = Arc::new(FakeClock::new(0));
        let store = store(&clock);
        // 100 a minute, burst 100: a lease of the whole burst for 30 s.
        let p = policy(algorithm, 100, MINUTE);
        let t = terms(100, 1, Duration::from_secs(30));
        let g = granted(
            store
                .lease("api", "k", &p, &t, &ask(100, 1))
                .expect("lease")
                .answer,
        );
        assert_eq!(g.units, 100);
        // Without the cap, 30 s would refill 50 tokens: the holder could
        // then spend its 100 while direct checks took 50 more.
        clock.advance(Duration::from_secs(30) - Duration::from_millis(1));
        assert_eq!(remaining(&store, p), 0, "{algorithm}");
        let item = CheckItem::new("api", p, "k", 1).expect("item");
        let denied = store.check_one(&item);
        assert!(!denied.allowed, "{algorithm}");
        // The first token comes 600 ms after the lease ends.
        assert_eq!(denied.retry_after_ms, 1 + 600, "{algorithm}");
        clock.advance(Duration::from_millis(1 + 600));
        assert!(store.check_one(&item).allowed, "{algorithm}");
    }
}

#[test]
fn a_returned_bucket_lease_refills_from_its_return() {
    for algorithm in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        let clock = Arc::new(FakeClock::new(0));
        let store = store(&clock);
        let p = policy(algorithm, 100, MINUTE);
        let t = terms(100, 1, Duration::from_secs(30));
        let g = granted(
            store
                .lease("api", "k", &p, &t, &ask(100, 1))
                .expect("lease")
                .answer,
        );
        clock.advance(Duration::from_secs(6));
        let back = LeaseAsk {
            settle: Some(settle(&g, 40)),
            want: 0,
            new_id: 2,
        };
        let out = store.lease("api", "k", &p, &t, &back).expect("return");
        assert_eq!(out.settled, Some(Settled::Returned { returned: 60 }));
        // 60 back; the 10 tokens of the 6 s were capped while all 100 were
        // out.
        assert_eq!(remaining(&store, p), 60, "{algorithm}");
    }
}

#[test]
fn a_sliding_log_counts_a_lease_for_a_window_after_it_ends() {
    let clock = Arc::new(FakeClock::new(0));
    let store = store(&clock);
    let p = policy(Algorithm::SlidingLog, 100, MINUTE);
    let t = terms(40, 1, Duration::from_secs(10));
    let g = granted(
        store
            .lease("api", "k", &p, &t, &ask(40, 1))
            .expect("lease")
            .answer,
    );
    assert_eq!(g.ends_at, 10_000);
    // Spent up to its end, its units count until 70 s.
    clock.advance(Duration::from_secs(70) - Duration::from_millis(1));
    assert_eq!(remaining(&store, p), 60);
    clock.advance(Duration::from_millis(1));
    assert_eq!(remaining(&store, p), 100);
    // Returned early with 15 spent, 15 count for a window from the return.
    let g = granted(
        store
            .lease("api", "k", &p, &t, &ask(40, 2))
            .expect("lease")
            .answer,
    );
    clock.advance(Duration::from_secs(1));
    let back = LeaseAsk {
        settle: Some(settle(&g, 15)),
        want: 0,
        new_id: 3,
    };
    store.lease("api", "k", &p, &t, &back).expect("return");
    assert_eq!(remaining(&store, p), 85);
    let item = CheckItem::new("api", p, "k", 86).expect("item");
    assert_eq!(store.check_one(&item).retry_after_ms, 60_000);
}

#[test]
fn reset_clears_the_leases_of_a_key() {
    let clock = Arc::new(FakeClock::new(0));
    let store = store(&clock);
    let p = policy(Algorithm::FixedWindow, 100, MINUTE);
    let t = terms(40, 1, Duration::from_secs(10));
    let g = granted(
        store
            .lease("api", "k", &p, &t, &ask(40, 1))
            .expect("lease")
            .answer,
    );
    assert!(store.reset("api", "k"));
    assert_eq!(remaining(&store, p), 100);
    let back = LeaseAsk {
        settle: Some(settle(&g, 0)),
        want: 0,
        new_id: 2,
    };
    assert_eq!(
        store.lease("api", "k", &p, &t, &back),
        Err(LeaseError::UnknownLease)
    );
}

#[test]
fn leases_and_their_charge_survive_a_snapshot() {
    let clock = Arc::new(FakeClock::new(5_000));
    let store = store(&clock);
    let p = policy(Algorithm::SlidingWindow, 100, MINUTE);
    let t = terms(40, 1, Duration::from_secs(30));
    let g = granted(
        store
            .lease("api", "k", &p, &t, &ask(40, 9))
            .expect("lease")
            .answer,
    );
    let mut file = Vec::new();
    store.export(&mut file, b"").expect("export");
    let config = StoreConfig::try_new(10_000, 16, OnFull::Deny).expect("valid config");
    let (restored, report) = SnapshotReader::open(file.as_slice())
        .expect("open")
        .load(config, clock.clone(), |_| true)
        .expect("load");
    assert_eq!(report.namespaces["api"].loaded, 1);
    assert_eq!(remaining(&restored, p), 60);
    let back = LeaseAsk {
        settle: Some(settle(&g, 10)),
        want: 0,
        new_id: 10,
    };
    let out = restored.lease("api", "k", &p, &t, &back).expect("return");
    assert_eq!(out.settled, Some(Settled::Returned { returned: 30 }));
    assert_eq!(remaining(&restored, p), 90);
}

#[test]
fn a_calendar_policys_leases_survive_a_snapshot() {
    use quotad_core::{Calendar, Period, Zone};
    // 2023-11-14 22:13:20 UTC: 17:13 in New York.
    let clock = Arc::new(FakeClock::new(1_700_000_000_000));
    let store = store(&clock);
    let day = Calendar::new(
        Period::Day,
        Zone::named("America/New_York").expect("a zone"),
    );
    let p = Policy::calendar(Algorithm::FixedWindow, 100, day).expect("valid");
    let t = terms(40, 1, Duration::from_secs(30));
    let g = granted(
        store
            .lease("api", "k", &p, &t, &ask(40, 9))
            .expect("lease")
            .answer,
    );
    let mut file = Vec::new();
    store.export(&mut file, b"").expect("export");
    let config = StoreConfig::try_new(10_000, 16, OnFull::Deny).expect("valid config");
    let (restored, report) = SnapshotReader::open(file.as_slice())
        .expect("open")
        .load(config, clock.clone(), |_| true)
        .expect("a snapshot holding a calendar lease loads");
    assert_eq!(report.namespaces["api"].loaded, 1);
    assert_eq!(remaining(&restored, p), 60);
    let back = LeaseAsk {
        settle: Some(settle(&g, 10)),
        want: 0,
        new_id: 10,
    };
    let out = restored.lease("api", "k", &p, &t, &back).expect("return");
    assert_eq!(out.settled, Some(Settled::Returned { returned: 30 }));
    assert_eq!(remaining(&restored, p), 90);
}

#[test]
fn a_version_2_snapshot_still_loads() {
    // Written by the build before grants existed (format version 2): one
    // key per algorithm and two keys each, at 1,000,000 ms, 10 per minute.
    let bytes = include_bytes!("fixtures/snapshot-v2.bin");
    let clock = Arc::new(FakeClock::new(1_000_000));
    let config = StoreConfig::try_new(1_000, 4, OnFull::Deny).expect("valid config");
    let (restored, report) = SnapshotReader::open(&bytes[..])
        .expect("open")
        .load(config, clock, |_| true)
        .expect("load");
    assert_eq!(report.total().loaded, 10);
    for (i, algorithm) in Algorithm::RATES.into_iter().enumerate() {
        let p = policy(algorithm, 10, MINUTE);
        let item = CheckItem::new(algorithm.as_str(), p, "alice", 1).expect("item");
        assert_eq!(
            restored.peek(&item).remaining,
            10 - 3 - i as u64,
            "{algorithm}"
        );
    }
}

// --- The bound, under random interleavings -------------------------------

/// One client's view of its lease: what it may still spend, until when
/// (its own clock), and what it spent.
#[derive(Clone, Debug)]
struct Held {
    grant: Grant,
    left: u64,
    spent: u64,
    /// The client stops spending here: its send time + TTL, less a margin.
    until: u64,
}

#[derive(Clone, Debug)]
enum Op {
    /// Time passes.
    Advance(u64),
    /// Client `c` asks for a lease (settling the one it holds, if any).
    Lease(usize, u64),
    /// Client `c` admits `n` requests locally, as far as its lease goes.
    Spend(usize, u64),
    /// Client `c` gives its lease back.
    Return(usize),
    /// Client `c` dies: its lease is never spent further nor returned.
    Crash(usize),
    /// A direct check of `cost`.
    Direct(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u64..4_000).prop_map(Op::Advance),
        3 => (0usize..4, 1u64..60).prop_map(|(c, w)| Op::Lease(c, w)),
        6 => (0usize..4, 1u64..20).prop_map(|(c, n)| Op::Spend(c, n)),
        1 => (0usize..4).prop_map(Op::Return),
        1 => (0usize..4).prop_map(Op::Crash),
        2 => (1u64..8).prop_map(Op::Direct),
    ]
}

/// The margin a client keeps before its lease's end.
const MARGIN_MS: u64 = 5;

/// Runs `ops` and returns every admission `(at, units)`, in time order.
fn run(policy: Policy, terms: LeaseTerms, ops: &[Op]) -> Vec<(u64, u64)> {
    let clock = Arc::new(FakeClock::new(1_000_000));
    let store = store(&clock);
    run_on(&store, &clock, policy, terms, ops)
}

/// [`run`] on a given store and clock.
fn run_on(
    store: &MemoryStore,
    clock: &FakeClock,
    policy: Policy,
    terms: LeaseTerms,
    ops: &[Op],
) -> Vec<(u64, u64)> {
    let mut clients: Vec<Option<Held>> = vec![None; 4];
    let mut admitted = Vec::new();
    let mut next_id = 1;
    for op in ops {
        let now = clock.now_ms_value();
        match *op {
            Op::Advance(ms) => clock.advance(Duration::from_millis(ms)),
            Op::Lease(c, want) => {
                let settle = clients[c].take().map(|h| Settle {
                    id: h.grant.id,
                    ends_at: h.grant.ends_at,
                    spent: h.spent,
                });
                next_id += 1;
                let ask = LeaseAsk {
                    settle,
                    want,
                    new_id: next_id,
                };
                let out = store
                    .lease("api", "k", &policy, &terms, &ask)
                    .expect("a held lease");
                if let LeaseAnswer::Granted(g) = out.answer {
                    // The TTL is relative; the client counts it from its
                    // send time (here, the same instant).
                    let ttl = g.ends_at - now;
                    clients[c] = Some(Held {
                        grant: g,
                        left: g.units,
                        spent: 0,
                        until: (now + ttl - ttl / 1_000).saturating_sub(MARGIN_MS),
                    });
                }
            }
            Op::Spend(c, n) => {
                if let Some(h) = clients[c].as_mut()
                    && now < h.until
                {
                    let n = n.min(h.left);
                    if n > 0 {
                        h.left -= n;
                        h.spent += n;
                        admitted.push((now, n));
                    }
                }
            }
            Op::Return(c) => {
                if let Some(h) = clients[c].take() {
                    let ask = LeaseAsk {
                        settle: Some(Settle {
                            id: h.grant.id,
                            ends_at: h.grant.ends_at,
                            spent: h.spent,
                        }),
                        want: 0,
                        new_id: 0,
                    };
                    store
                        .lease("api", "k", &policy, &terms, &ask)
                        .expect("a held lease");
                }
            }
            Op::Crash(c) => clients[c] = None,
            Op::Direct(cost) => {
                let item = CheckItem::new("api", policy, "k", cost).expect("item");
                if store.check_one(&item).allowed {
                    admitted.push((now, cost));
                }
            }
        }
    }
    admitted
}

/// Whether a central store, deciding each admission at its real time,
/// would have admitted every one.
fn replay_admits_all(policy: Policy, admitted: &[(u64, u64)]) -> Result<(), String> {
    let mut state: Option<State> = None;
    for &(at, units) in admitted {
        let cost = NonZeroU64::new(units).expect("admissions are of at least 1");
        let (next, decision) = decide(&policy, state, at, cost);
        if !decision.allowed {
            return Err(format!(
                "{units} admitted at {at} that a central {} would have denied ({} left)",
                policy.algorithm(),
                decision.remaining
            ));
        }
        state = next;
    }
    Ok(())
}

trait NowValue {
    fn now_ms_value(&self) -> u64;
}

impl NowValue for FakeClock {
    fn now_ms_value(&self) -> u64 {
        quotad_core::Clock::now_ms(self)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn leased_and_direct_admissions_are_a_history_the_algorithm_accepts(
        algorithm in proptest::sample::select(Algorithm::RATES.to_vec()),
        limit in 1u64..200,
        burst in proptest::option::of(1u64..300),
        window_s in 1u64..20,
        max_units in 1u64..60,
        min_units in 1u64..10,
        ttl_ms in 10u64..30_000,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let burst = burst.filter(|_| algorithm.is_bucket());
        let p = Policy::try_new(algorithm, limit, Duration::from_secs(window_s), burst)
            .expect("valid policy");
        let t = terms(max_units.max(min_units), min_units, Duration::from_millis(ttl_ms));
        let admitted = run(p, t, &ops);
        prop_assert!(replay_admits_all(p, &admitted).is_ok(), "{:?}", replay_admits_all(p, &admitted));
    }

    #[test]
    fn with_leases_held_a_denial_still_says_the_exact_wait(
        algorithm in proptest::sample::select(Algorithm::RATES.to_vec()),
        limit in 1u64..100,
        window_s in 1u64..20,
        max_units in 1u64..60,
        ttl_ms in 10u64..30_000,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let p = policy(algorithm, limit, Duration::from_secs(window_s));
        let t = terms(max_units, 1, Duration::from_millis(ttl_ms));
        let clock = Arc::new(FakeClock::new(1_000_000));
        let store = store(&clock);
        run_on(&store, &clock, p, t, &ops);
        let now = quotad_core::Clock::now_ms(&*clock);
        for cost in 1..=p.capacity() {
            let item = CheckItem::new("api", p, "k", cost).expect("item");
            let denied = store.peek(&item);
            if denied.allowed || denied.retry_after_ms == 0 {
                continue;
            }
            let wait = denied.retry_after_ms;
            clock.set(now + wait - 1);
            prop_assert!(!store.peek(&item).allowed, "cost {cost}: allowed before its wait of {wait}");
            clock.set(now + wait);
            prop_assert!(store.peek(&item).allowed, "cost {cost}: still denied after its wait of {wait}");
            clock.set(now);
        }
    }
}

#[test]
fn a_lease_reports_the_reset_from_the_clock_as_a_check_does_after_a_step_back() {
    let clock = Arc::new(FakeClock::new(10_000));
    let store = store(&clock);
    let p = policy(Algorithm::SlidingLog, 10, Duration::from_millis(1_000));
    let item = CheckItem::new("api", p, "k", 1).expect("valid item");
    assert!(store.check_one(&item).allowed);
    // The clock steps back 10 ms: the key's instant stays 10_000.
    clock.set(9_990);
    let t = terms(5, 1, Duration::from_millis(100));
    let outcome = store
        .lease("api", "k", &p, &t, &ask(0, 1))
        .expect("no lease named");
    assert_eq!(outcome.reset_after_ms, 1_010);
    assert_eq!(outcome.reset_after_ms, store.peek(&item).reset_after_ms);
    // So the key is not taken as fresh before its admission has left.
    clock.set(10_995);
    assert_eq!(remaining(&store, p), 9);
    clock.set(11_000);
    assert_eq!(remaining(&store, p), 10);
}

// --- Edges found by review ---------------------------------------------------

#[test]
fn a_reload_to_another_window_starts_the_key_fresh_and_credits_no_return() {
    let clock = Arc::new(FakeClock::new(0));
    let store = store(&clock);
    let before = policy(Algorithm::FixedWindow, 100, MINUTE);
    let t = terms(50, 1, Duration::from_secs(10));
    let g = granted(
        store
            .lease("api", "k", &before, &t, &ask(50, 1))
            .expect("lease")
            .answer,
    );
    // Reloaded to a 30 s window: a fresh budget, as for any such change.
    let after = policy(Algorithm::FixedWindow, 100, Duration::from_secs(30));
    let all = CheckItem::new("api", after, "k", 100).expect("item");
    assert!(store.check_one(&all).allowed);
    // The old lease's return is not credited to the new window's count.
    let back = LeaseAsk {
        settle: Some(settle(&g, 0)),
        want: 0,
        new_id: 2,
    };
    let out = store.lease("api", "k", &after, &t, &back).expect("settle");
    assert_eq!(out.settled, Some(Settled::Ended));
    assert_eq!(remaining(&store, after), 0);
}

#[test]
fn a_key_holds_a_bounded_number_of_grants_and_its_snapshot_loads() {
    let clock = Arc::new(FakeClock::new(100_000));
    let store = store(&clock);
    let p = policy(Algorithm::SlidingLog, 1_000, MINUTE);
    let t = terms(1, 1, Duration::from_secs(10));
    // Each returned lease with units spent stays counted for a window: the
    // bound on grants counts those too, so leases stop at the bound.
    let mut granted_count = 0;
    for i in 0..40 {
        let out = store.lease("api", "k", &p, &t, &ask(1, i)).expect("lease");
        if let LeaseAnswer::Granted(g) = out.answer {
            granted_count += 1;
            let back = LeaseAsk {
                settle: Some(settle(&g, 1)),
                want: 0,
                new_id: 0,
            };
            store.lease("api", "k", &p, &t, &back).expect("return");
        }
    }
    assert_eq!(granted_count, MAX_GRANTS_PER_KEY);
    // A return after the clock stepped back keeps its units from the grant.
    let g = granted(
        store
            .lease("api", "other", &p, &t, &ask(1, 99))
            .expect("lease")
            .answer,
    );
    clock.set(95_000);
    let back = LeaseAsk {
        settle: Some(settle(&g, 1)),
        want: 0,
        new_id: 0,
    };
    store.lease("api", "other", &p, &t, &back).expect("return");
    let mut file = Vec::new();
    store.export(&mut file, b"").expect("export");
    let config = StoreConfig::try_new(10_000, 16, OnFull::Deny).expect("valid config");
    let (restored, report) = SnapshotReader::open(file.as_slice())
        .expect("open")
        .load(config, clock.clone(), |_| true)
        .expect("every snapshot the store writes loads");
    assert_eq!(report.namespaces["api"].loaded, 2);
    assert_eq!(remaining(&restored, p), 1_000 - 32);
}

#[test]
fn a_key_holding_leases_is_never_evicted() {
    let clock = Arc::new(FakeClock::new(0));
    let config = StoreConfig::try_new(64, 1, OnFull::Evict).expect("valid config");
    let store = MemoryStore::new(config, clock.clone());
    let p = policy(Algorithm::FixedWindow, 100, MINUTE);
    let t = terms(90, 1, Duration::from_secs(30));
    granted(
        store
            .lease("api", "k", &p, &t, &ask(90, 1))
            .expect("lease")
            .answer,
    );
    for i in 0..500 {
        let other = format!("other-{i}");
        let item = CheckItem::new("api", p, &other, 1).expect("item");
        store.check_one(&item);
    }
    assert!(store.evictions() > 0);
    // The leased 90 still count: direct checks admit the 10 left only.
    assert_eq!(remaining(&store, p), 10);
}

#[test]
fn a_lease_on_a_key_gone_fresh_in_a_full_store_answers_direct() {
    let clock = Arc::new(FakeClock::new(0));
    // One shard of 64 keys and exactly their slots' bytes, deny.
    let config = StoreConfig::try_new(64, 1, OnFull::Deny)
        .and_then(|c| c.with_max_bytes(64 * quotad_core::ENTRY_BYTES))
        .expect("valid config");
    let store = MemoryStore::new(config, clock.clone());
    let short = policy(Algorithm::FixedWindow, 100, Duration::from_secs(1));
    let long = policy(Algorithm::FixedWindow, 100, MINUTE);
    store.check_one(&CheckItem::new("api", short, "k", 1).expect("item"));
    for i in 0..63 {
        let key = format!("other-{i}");
        store.check_one(&CheckItem::new("other", long, &key, 1).expect("item"));
    }
    // "k" is fresh (unswept) a second later; a lease needs a ledger's
    // bytes, more than shrinking the table by one slot frees, and every
    // other key is live.
    clock.advance(Duration::from_secs(1));
    let t = terms(10, 1, Duration::from_millis(500));
    let out = store
        .lease("api", "k", &short, &t, &ask(10, 1))
        .expect("an answer");
    assert_eq!(out.answer, LeaseAnswer::Direct);
    assert_eq!(remaining(&store, short), 100);
}
