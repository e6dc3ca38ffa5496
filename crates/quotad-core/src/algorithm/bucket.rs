//! Token bucket and leaky bucket, in units of `1 / window_ms` of a token so
//! that refill and drain are exact integers: `limit` units per millisecond.
//!
//! The two are duals: `tokens = capacity - level`. They are written out
//! separately, each in its own terms, and a property test holds them equal.

use super::{Meter, State, div_ceil, narrow};
use crate::policy::Policy;

/// How much `limit` units per millisecond add up to over `from..to`.
fn flow(limit: u64, from: u64, to: u64) -> u128 {
    u128::from(limit) * u128::from(to.saturating_sub(from))
}

pub(super) struct TokenBucket {
    rate: u64,
    unit: u64,
    capacity: u64,
    at: u64,
    tokens: u64,
}

impl Meter for TokenBucket {
    fn advance(policy: &Policy, state: Option<State>, at: u64) -> Self {
        let unit = policy.window_ms();
        let capacity = policy.burst() * unit;
        let tokens = match state {
            // Capped at the capacity: a lowered burst holds fewer tokens.
            Some(State::TokenBucket { tokens, at_ms, .. }) => narrow(
                (u128::from(tokens) + flow(policy.limit(), at_ms, at)).min(u128::from(capacity)),
            ),
            _ => capacity,
        };
        Self {
            rate: policy.limit(),
            unit,
            capacity,
            at,
            tokens,
        }
    }

    fn fits(&self, cost: u64) -> bool {
        self.tokens >= cost * self.unit
    }

    fn consume(&mut self, cost: u64) {
        self.tokens -= cost * self.unit;
    }

    fn remaining(&self) -> u64 {
        self.tokens / self.unit
    }

    fn retry_after(&self, cost: u64) -> u64 {
        let missing = cost * self.unit - self.tokens;
        div_ceil(u128::from(missing), u128::from(self.rate))
    }

    fn reset_after(&self) -> u64 {
        div_ceil(
            u128::from(self.capacity - self.tokens),
            u128::from(self.rate),
        )
    }

    fn into_state(self) -> Option<State> {
        (self.tokens < self.capacity).then_some(State::TokenBucket {
            tokens: self.tokens,
            at_ms: self.at,
            window_ms: self.unit,
        })
    }
}

pub(super) struct LeakyBucket {
    rate: u64,
    unit: u64,
    capacity: u64,
    at: u64,
    level: u64,
}

impl Meter for LeakyBucket {
    fn advance(policy: &Policy, state: Option<State>, at: u64) -> Self {
        let unit = policy.window_ms();
        let level = match state {
            Some(State::LeakyBucket { level, at_ms, .. }) => {
                narrow(u128::from(level).saturating_sub(flow(policy.limit(), at_ms, at)))
            }
            _ => 0,
        };
        Self {
            rate: policy.limit(),
            unit,
            capacity: policy.burst() * unit,
            at,
            level,
        }
    }

    fn fits(&self, cost: u64) -> bool {
        // A level above capacity (the burst was lowered) fits nothing.
        self.level <= self.capacity - cost * self.unit
    }

    fn consume(&mut self, cost: u64) {
        self.level += cost * self.unit;
    }

    fn remaining(&self) -> u64 {
        self.capacity.saturating_sub(self.level) / self.unit
    }

    fn retry_after(&self, cost: u64) -> u64 {
        let overflow = self.level - (self.capacity - cost * self.unit);
        div_ceil(u128::from(overflow), u128::from(self.rate))
    }

    fn reset_after(&self) -> u64 {
        div_ceil(u128::from(self.level), u128::from(self.rate))
    }

    fn into_state(self) -> Option<State> {
        (self.level > 0).then_some(State::LeakyBucket {
            level: self.level,
            at_ms: self.at,
            window_ms: self.unit,
        })
    }
}
