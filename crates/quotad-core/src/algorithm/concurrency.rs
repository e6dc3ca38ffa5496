//! Concurrency: at most `limit` units held at once. Its meter holds no
//! state of its own: what is held is the key's live slots, grants in its
//! ledger, each ending at its own `ends_at` unless renewed or released.

use super::{Meter, State};
use crate::grant::Grant;
use crate::policy::Policy;

pub(super) struct Concurrency {
    limit: u64,
    at: u64,
    /// Units held by live slots, and what is admitted on top of them by
    /// this transition.
    held: u64,
    /// The live slots' ends and units, soonest end first.
    ends: Vec<(u64, u64)>,
}

impl Meter for Concurrency {
    fn advance(policy: &Policy, _state: Option<State>, grants: &[Grant], at: u64) -> Self {
        let mut ends: Vec<(u64, u64)> = grants
            .iter()
            .filter(|g| g.ends_at > at)
            .map(|g| (g.ends_at, g.units))
            .collect();
        ends.sort_unstable();
        Self {
            limit: policy.limit(),
            at,
            held: ends.iter().map(|&(_, units)| units).sum(),
            ends,
        }
    }

    fn fits(&self, cost: u64) -> bool {
        self.held <= self.limit - cost
    }

    fn consume(&mut self, cost: u64) {
        // The slot itself is written to the ledger by the store.
        self.held += cost;
    }

    fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.held)
    }

    fn retry_after(&self, cost: u64) -> u64 {
        // The earliest end after which enough is free, with no release and
        // no renewal: slots end soonest first.
        let mut held = self.held;
        for &(ends_at, units) in &self.ends {
            held -= units;
            if held <= self.limit - cost {
                return ends_at - self.at;
            }
        }
        // Units admitted by this transition have no slot in `ends` yet;
        // only an all-or-nothing batch that denied holds none.
        0
    }

    fn reset_after(&self) -> u64 {
        self.ends
            .last()
            .map_or(0, |&(ends_at, _)| ends_at - self.at)
    }

    fn lease_end(&self) -> u64 {
        // No leases: a lease asked of a concurrency limit is direct.
        self.at
    }

    fn refund(&mut self, grant: &Grant, _unused: u64) -> Option<Grant> {
        // A slot is not a lease: settling one keeps it.
        Some(*grant)
    }

    fn into_state(self) -> Option<State> {
        None
    }
}
