//! The numbers `quota.lua` and quotad exchange: the script's own code
//! table, mapped explicitly to and from quotad-core's types. The script
//! declares the same numbers (`local WITHIN, ...`, `FIXED_ID`, `alg ==
//! '1'`, `BUILD[1]`); a test reads them from its text. They are the
//! script's protocol, not the API's: a change to quotad.v1's enums leaves
//! them as they are.

use quotad_core::{Algorithm, Reason, Settled};

/// The code of each algorithm the script is sent (`ARGV[4]`, then every
/// fifth argument).
pub(super) fn algorithm(algorithm: Algorithm) -> u64 {
    match algorithm {
        Algorithm::FixedWindow => 1,
        Algorithm::SlidingWindow => 2,
        Algorithm::TokenBucket => 3,
        Algorithm::LeakyBucket => 4,
        Algorithm::SlidingLog => 5,
        Algorithm::Concurrency => 6,
    }
}

/// The code the script answers for an item whose key holds state it
/// cannot read: no decision.
pub(super) const UNREADABLE: i64 = 0;

/// The reason codes the script answers, and the reasons they stand for:
/// `WITHIN, EXCEEDED, TOO_BIG, CAPACITY, BATCH_REJECTED` in the script
/// (`CAPACITY`: an acquire in a batch whose slot id is held already, as the
/// memory store answers it).
pub(super) const REASONS: [(i64, Reason); 5] = [
    (1, Reason::WithinLimit),
    (2, Reason::LimitExceeded),
    (3, Reason::CostExceedsCapacity),
    (4, Reason::Capacity),
    (5, Reason::BatchRejected),
];

/// The reason of the script's code `code`; `None` for a code the script
/// never answers for a decision (including [`UNREADABLE`]).
pub(super) fn reason(code: i64) -> Option<Reason> {
    REASONS
        .iter()
        .find_map(|&(c, reason)| (c == code).then_some(reason))
}

/// The first number after `TIME` in an acquire reply (`concurrency.lua`):
/// admitted.
pub(super) const WITHIN_CODE: i64 = 1;
/// Denied: the live slots leave too little.
pub(super) const EXCEEDED_CODE: i64 = 2;
/// The slot id asked for is held already.
pub(super) const ID_IN_USE: i64 = 6;

/// The first number after `TIME` in a lease reply: `LEASED, UNKNOWN_LEASE,
/// OVERSPENT` in the script.
pub(super) const LEASED: i64 = 1;
/// The lease to settle is neither held nor ended.
pub(super) const UNKNOWN_LEASE: i64 = 2;
/// The holder reports spending more than its lease granted.
pub(super) const OVERSPENT: i64 = 3;

/// What became of the lease a request named, as the script answers it:
/// 0 none was named, 1 returned, 2 ended.
pub(super) fn settled(code: i64, returned: u64) -> Option<Option<Settled>> {
    match code {
        0 => Some(None),
        1 => Some(Some(Settled::Returned { returned })),
        2 => Some(Some(Settled::Ended)),
        _ => None,
    }
}

/// The script's answer codes: 0 no lease asked for, 1 granted, 2 direct.
pub(super) const NOT_ASKED: i64 = 0;
/// A lease was granted.
pub(super) const GRANTED: i64 = 1;
/// No lease: check directly.
pub(super) const DIRECT: i64 = 2;

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers a `local A, B = 1, 2` line of the script declares.
    fn declared(names: &str) -> Vec<i64> {
        let script = super::super::SCRIPT;
        let line = script
            .lines()
            .find(|l| l.starts_with(&format!("local {names} = ")))
            .unwrap_or_else(|| panic!("the script declares {names}"));
        line.split(" = ")
            .nth(1)
            .expect("values")
            .split(", ")
            .map(|v| v.trim().parse().expect("a number"))
            .collect()
    }

    #[test]
    fn the_script_declares_the_same_codes_as_the_table() {
        assert_eq!(
            declared("WITHIN, EXCEEDED, TOO_BIG, CAPACITY, BATCH_REJECTED"),
            REASONS.map(|(code, _)| code)
        );
        assert_eq!(declared("UNREADABLE"), [UNREADABLE]);
        assert_eq!(
            declared("FIXED_ID, LOG_ID"),
            [Algorithm::FixedWindow, Algorithm::SlidingLog].map(|a| algorithm(a) as i64)
        );
        assert_eq!(
            declared("SLOTS_ID"),
            [algorithm(Algorithm::Concurrency) as i64]
        );
        let script = super::super::SCRIPT;
        for a in Algorithm::RATES {
            let code = algorithm(a);
            assert!(
                script.contains(&format!("BUILD[{code}] = function()")),
                "{a}"
            );
            assert!(script.contains(&format!("alg == '{code}'")), "{a}");
        }
    }

    #[test]
    fn the_script_declares_the_same_lease_codes() {
        assert_eq!(
            declared("LEASED, UNKNOWN_LEASE, OVERSPENT"),
            [LEASED, UNKNOWN_LEASE, OVERSPENT]
        );
        assert_eq!([NOT_ASKED, GRANTED, DIRECT], [0, 1, 2]);
        assert_eq!(settled(0, 0), Some(None));
        assert_eq!(settled(2, 0), Some(Some(Settled::Ended)));
        assert_eq!(settled(3, 0), None);
    }

    #[test]
    fn codes_map_both_ways_and_no_other_code_is_a_reason() {
        for (code, r) in REASONS {
            assert_eq!(reason(code), Some(r));
        }
        for code in [UNREADABLE, 6, 7, 8, 99, -1] {
            assert_eq!(reason(code), None, "{code}");
        }
        let mut codes: Vec<u64> = Algorithm::ALL.into_iter().map(algorithm).collect();
        codes.dedup();
        assert_eq!(codes, [1, 2, 3, 4, 5, 6]);
    }
}
