//! The sliding window counter against the boundary attack.

use std::sync::Arc;
use std::time::Duration;

use quotad_core::{Algorithm, CheckItem, FakeClock, MemoryStore, OnFull, Policy, StoreConfig};

fn admitted_in_boundary_attack(algorithm: Algorithm) -> u32 {
    // Limit 5 per 3 s: five requests at 2.9 s, five more at 3.0 s.
    let clock = Arc::new(FakeClock::new(2_900));
    let config = StoreConfig::try_new(100, 1, OnFull::Deny).expect("valid config");
    let store = MemoryStore::new(config, clock.clone());
    let policy = Policy::try_new(algorithm, 5, Duration::from_secs(3), None).expect("valid");
    let unit = CheckItem::new("api", policy, "attacker", 1).expect("valid");
    let mut allowed = 0;
    for _ in 0..5 {
        allowed += u32::from(store.check_one(&unit).allowed);
    }
    clock.set(3_000);
    for _ in 0..5 {
        allowed += u32::from(store.check_one(&unit).allowed);
    }
    allowed
}

#[test]
fn the_sliding_window_throttles_the_boundary_attack() {
    assert_eq!(admitted_in_boundary_attack(Algorithm::SlidingWindow), 5);
}

#[test]
fn the_fixed_window_lets_the_boundary_attack_through() {
    assert_eq!(admitted_in_boundary_attack(Algorithm::FixedWindow), 10);
}

#[test]
fn the_previous_window_weighs_less_as_the_window_slides() {
    let clock = Arc::new(FakeClock::new(0));
    let config = StoreConfig::try_new(100, 1, OnFull::Deny).expect("valid config");
    let store = MemoryStore::new(config, clock.clone());
    let policy = Policy::try_new(Algorithm::SlidingWindow, 10, Duration::from_secs(10), None)
        .expect("valid");
    let unit = CheckItem::new("api", policy, "k", 1).expect("valid");
    for _ in 0..10 {
        store.check_one(&unit);
    }
    // 4 s into the next window, the previous ten weigh round(10 x 6/10) = 6.
    clock.set(14_000);
    assert_eq!(store.peek(&unit).remaining, 4);
    // 7.5 s in: round(10 x 2.5/10) = round(2.5) = 3 (halves round up).
    clock.set(17_500);
    assert_eq!(store.peek(&unit).remaining, 7);
}
