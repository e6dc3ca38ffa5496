//! The names of quotad's keys in Redis.
//!
//! `<prefix>:<policy>|{<key>}|<format><algorithm><window_ms>`, e.g.
//! `quotad:per_day|{alice}|2F86400000`:
//!
//! - the braces make the rate-limit key the Redis Cluster hash tag, so one
//!   key under several policies lives in one slot and an all-or-nothing
//!   batch over them is one script (a key starting with `}` is written in
//!   hex, `|h{...}`, so its tag is never empty);
//! - the suffix binds the state to what gives it meaning: the state
//!   format ([`FORMAT`]), the algorithm and the window. Two quotad replicas
//!   that disagree during a rollout (one counts `fixed_window` over a minute,
//!   the other `sliding_window`, or over a second) count in different keys,
//!   so together they admit at most the sum of their limits, never without
//!   limit; a changed limit or burst keeps the key, and its counts. A quotad
//!   of another format version reads and writes its own keys only: a
//!   mixed-version rollout never reads state it cannot decode.
//!
//! A key's leases live next to its state, in the ledger key: the state
//! key's name followed by [`LEDGER_SUFFIX`] (`...|2F86400000|g`). It has the
//! state key's hash tag, so Cluster keeps both in one slot and one script
//! reads and writes them together; and it is bound to the same parameters,
//! so a policy's leases count only under the algorithm and window that
//! granted them, as its counts do. (No state key ends in `|g`: they end in
//! the window's digits.)

use std::fmt::Write as _;

use quotad_core::{Algorithm, Policy};

/// The version of the state format, part of every key. Bump it with any
/// change to what the script stores. (2: fixed windows are hashes.)
pub(super) const FORMAT: u32 = 2;

/// The letter of each algorithm in a key.
fn letter(algorithm: Algorithm) -> char {
    match algorithm {
        Algorithm::FixedWindow => 'F',
        Algorithm::SlidingWindow => 'S',
        Algorithm::TokenBucket => 'T',
        Algorithm::LeakyBucket => 'L',
        Algorithm::SlidingLog => 'G',
        Algorithm::Concurrency => 'C',
    }
}

/// The Redis key of `key`'s state under the policy namespace `name`,
/// counted by `policy`.
pub(super) fn state_key(prefix: &str, name: &str, policy: &Policy, key: &str) -> String {
    let mut k = String::with_capacity(prefix.len() + name.len() + 2 * key.len() + 24);
    k.push_str(prefix);
    k.push(':');
    k.push_str(name);
    if key.starts_with('}') {
        k.push_str("|h{");
        for byte in key.bytes() {
            let _ = write!(k, "{byte:02x}");
        }
    } else {
        k.push_str("|{");
        k.push_str(key);
    }
    let _ = write!(
        k,
        "}}|{FORMAT}{}{}",
        letter(policy.algorithm()),
        // A concurrency key's slots carry their own ends: its name has no
        // slot_ttl (0), so a reload that changes it keeps the slots.
        policy.ledger_window_ms()
    );
    k
}

/// What follows a state key's name in its ledger key's. The script
/// appends the same (`LEDGER`), to read a key's leases on a check.
pub(super) const LEDGER_SUFFIX: &str = "|g";

/// The Redis key of the lease ledger that goes with `state_key`.
pub(super) fn ledger_key(state_key: &str) -> String {
    let mut k = String::with_capacity(state_key.len() + LEDGER_SUFFIX.len());
    k.push_str(state_key);
    k.push_str(LEDGER_SUFFIX);
    k
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn policy(algorithm: Algorithm, limit: u64, window_ms: u64) -> Policy {
        Policy::try_new(algorithm, limit, Duration::from_millis(window_ms), None).expect("valid")
    }

    #[test]
    fn the_key_is_the_cluster_hash_tag_and_names_what_the_state_means() {
        let day = policy(Algorithm::FixedWindow, 10, 86_400_000);
        assert_eq!(
            state_key("quotad", "per_day", &day, "alice"),
            "quotad:per_day|{alice}|2F86400000"
        );
        assert_eq!(
            state_key("q", "per_day", &day, "}x"),
            "q:per_day|h{7d78}|2F86400000"
        );
        assert_ne!(
            state_key("q", "p", &day, "}x"),
            state_key("q", "p", &day, "h{7d78")
        );
        assert_eq!(
            state_key("quotad", "p", &day, "{team}bob"),
            "quotad:p|{{team}bob}|2F86400000"
        );
    }

    #[test]
    fn algorithm_and_window_change_the_key_and_limit_does_not() {
        let base = policy(Algorithm::FixedWindow, 10, 60_000);
        let key = |p: &Policy| state_key("quotad", "p", p, "k");
        assert_eq!(key(&base), key(&policy(Algorithm::FixedWindow, 99, 60_000)));
        assert_ne!(
            key(&base),
            key(&policy(Algorithm::SlidingWindow, 10, 60_000))
        );
        assert_ne!(key(&base), key(&policy(Algorithm::FixedWindow, 10, 1_000)));
        let bucket = |burst| {
            Policy::try_new(
                Algorithm::TokenBucket,
                10,
                Duration::from_secs(1),
                Some(burst),
            )
            .expect("valid")
        };
        assert_eq!(key(&bucket(5)), key(&bucket(50)));
        let letters: std::collections::BTreeSet<_> = Algorithm::ALL.map(letter).into();
        assert_eq!(letters.len(), Algorithm::ALL.len());
    }

    #[test]
    fn a_ledger_shares_its_state_keys_slot_and_the_scripts_suffix() {
        let day = policy(Algorithm::TokenBucket, 10, 86_400_000);
        let state = state_key("quotad", "per_day", &day, "alice");
        let ledger = ledger_key(&state);
        assert_eq!(ledger, "quotad:per_day|{alice}|2T86400000|g");
        assert_eq!(
            super::super::deadline::slot(ledger.as_bytes()),
            super::super::deadline::slot(state.as_bytes())
        );
        assert!(
            super::super::SCRIPT.contains(&format!("local LEDGER = '{LEDGER_SUFFIX}'")),
            "the script appends the same suffix"
        );
    }
}
