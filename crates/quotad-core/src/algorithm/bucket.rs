//! Token bucket and leaky bucket, in units of `1 / window_ms` of a token so
//! that refill and drain are exact integers: `limit` units per millisecond.
//!
//! The two are duals: `tokens = capacity - level`. They are written out
//! separately, each in its own terms, and a property test holds them equal.
//!
//! A lease takes its units out of the bucket when it is granted, and while
//! it is live the bucket refills only up to `capacity - outstanding` (a
//! leaky bucket drains only down to `outstanding`): without that cap, a
//! full bucket leased out, refilled, and then spent by both the holder and
//! direct checks would admit twice the burst. So a key with live leases
//! refills in segments, the cap rising at each lease's end.

use super::{Meter, State, div_ceil, narrow};
use crate::grant::Grant;
use crate::policy::Policy;

/// How much `limit` units per millisecond add up to over `from..to`.
fn flow(limit: u64, from: u64, to: u64) -> u128 {
    u128::from(limit) * u128::from(to.saturating_sub(from))
}

/// The leases a bucket holds back: `(ends_at, units)` of every live one,
/// soonest end first.
#[derive(Default)]
struct Held {
    ends: Vec<(u64, u64)>,
}

impl Held {
    /// The grants of `grants` live after `from`.
    fn after(grants: &[Grant], from: u64) -> Self {
        let mut ends: Vec<(u64, u64)> = grants
            .iter()
            .filter(|g| g.ends_at > from)
            .map(|g| (g.ends_at, g.units))
            .collect();
        ends.sort_unstable();
        Held { ends }
    }

    /// Units outstanding, scaled by `unit`.
    fn scaled(&self, unit: u64) -> u128 {
        self.ends
            .iter()
            .map(|&(_, units)| u128::from(units) * u128::from(unit))
            .sum()
    }

    /// The segments from `from` on: `(end of segment, scaled units held
    /// during it)`, the last one open-ended (`u64::MAX`, nothing held).
    fn segments(&self, from: u64, unit: u64) -> impl Iterator<Item = (u64, u128)> + '_ {
        let mut held = self.scaled(unit);
        self.ends
            .iter()
            .filter(move |&&(end, _)| end > from)
            .map(move |&(end, units)| {
                let during = held;
                held -= u128::from(units) * u128::from(unit);
                (end, during)
            })
            .chain(std::iter::once((u64::MAX, 0)))
    }

    /// Drops the leases that have ended by `at`.
    fn pass(&mut self, at: u64) {
        self.ends.retain(|&(end, _)| end > at);
    }

    fn add(&mut self, ends_at: u64, units: u64) {
        let i = self.ends.partition_point(|&e| e <= (ends_at, units));
        self.ends.insert(i, (ends_at, units));
    }

    fn remove(&mut self, ends_at: u64, units: u64) {
        if let Some(i) = self.ends.iter().position(|&e| e == (ends_at, units)) {
            self.ends.remove(i);
        }
    }
}

/// Tokens at `to`, refilled from `tokens` at `from` at `rate` under the
/// cap `capacity - held` of each segment.
fn refill(
    tokens: u64,
    from: u64,
    to: u64,
    rate: u64,
    capacity: u64,
    unit: u64,
    held: &Held,
) -> u64 {
    let mut tokens = u128::from(tokens);
    let mut t = from;
    for (end, during) in held.segments(from, unit) {
        let cap = u128::from(capacity).saturating_sub(during);
        let until = end.min(to);
        tokens = (tokens + flow(rate, t, until)).min(cap);
        t = until;
        if end >= to {
            break;
        }
    }
    narrow(tokens)
}

/// The wait from `at` until `tokens` refilled under the segments' caps
/// reach `need` (at most `capacity`).
fn wait_for(
    need: u64,
    tokens: u64,
    at: u64,
    rate: u64,
    capacity: u64,
    unit: u64,
    held: &Held,
) -> u64 {
    let (need, mut tokens) = (u128::from(need), u128::from(tokens));
    let mut t = at;
    for (end, during) in held.segments(at, unit) {
        let cap = u128::from(capacity).saturating_sub(during);
        if cap >= need {
            let reached = t.saturating_add(div_ceil(need.saturating_sub(tokens), u128::from(rate)));
            if reached <= end {
                return reached - at;
            }
        }
        tokens = (tokens + flow(rate, t, end)).min(cap);
        t = end;
    }
    u64::MAX
}

pub(super) struct TokenBucket {
    rate: u64,
    unit: u64,
    capacity: u64,
    at: u64,
    tokens: u64,
    held: Held,
}

impl Meter for TokenBucket {
    fn advance(policy: &Policy, state: Option<State>, grants: &[Grant], at: u64) -> Self {
        let unit = policy.window_ms();
        let capacity = policy.burst() * unit;
        let (rate, mut held) = (policy.limit(), Held::default());
        let tokens = match state {
            // Capped at the capacity: a lowered burst holds fewer tokens.
            Some(State::TokenBucket { tokens, at_ms, .. }) if grants.is_empty() => {
                narrow((u128::from(tokens) + flow(rate, at_ms, at)).min(u128::from(capacity)))
            }
            Some(State::TokenBucket { tokens, at_ms, .. }) => {
                held = Held::after(grants, at_ms);
                let tokens = refill(tokens, at_ms, at, rate, capacity, unit, &held);
                held.pass(at);
                tokens
            }
            _ => capacity,
        };
        Self {
            rate,
            unit,
            capacity,
            at,
            tokens,
            held,
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
        if !self.held.ends.is_empty() {
            return self.wait_for(cost * self.unit);
        }
        let missing = cost * self.unit - self.tokens;
        div_ceil(u128::from(missing), u128::from(self.rate))
    }

    fn reset_after(&self) -> u64 {
        if !self.held.ends.is_empty() {
            return self.wait_for(self.capacity);
        }
        div_ceil(
            u128::from(self.capacity - self.tokens),
            u128::from(self.rate),
        )
    }

    fn lease_end(&self) -> u64 {
        u64::MAX
    }

    fn grant(&mut self, units: u64, ends_at: u64) {
        self.consume(units);
        self.held.add(ends_at, units);
    }

    fn refund(&mut self, grant: &Grant, unused: u64) -> Option<Grant> {
        self.held.remove(grant.ends_at, grant.units);
        let cap = u128::from(self.capacity).saturating_sub(self.held.scaled(self.unit));
        let back = u128::from(unused) * u128::from(self.unit);
        self.tokens = narrow((u128::from(self.tokens) + back).min(cap));
        None
    }

    fn into_state(self) -> Option<State> {
        (self.tokens < self.capacity).then_some(State::TokenBucket {
            tokens: self.tokens,
            at_ms: self.at,
            window_ms: self.unit,
        })
    }
}

impl TokenBucket {
    fn wait_for(&self, need: u64) -> u64 {
        let (tokens, at, rate, unit) = (self.tokens, self.at, self.rate, self.unit);
        wait_for(need, tokens, at, rate, self.capacity, unit, &self.held)
    }
}

pub(super) struct LeakyBucket {
    rate: u64,
    unit: u64,
    capacity: u64,
    at: u64,
    level: u64,
    held: Held,
}

/// Level at `to`, drained from `level` at `from` at `rate` down to the floor
/// `held` of each segment: the dual of [`refill`].
fn drain(level: u64, from: u64, to: u64, rate: u64, unit: u64, held: &Held) -> u64 {
    let mut level = u128::from(level);
    let mut t = from;
    for (end, during) in held.segments(from, unit) {
        let until = end.min(to);
        level = level
            .saturating_sub(flow(rate, t, until))
            .max(during.min(level));
        t = until;
        if end >= to {
            break;
        }
    }
    narrow(level)
}

impl Meter for LeakyBucket {
    fn advance(policy: &Policy, state: Option<State>, grants: &[Grant], at: u64) -> Self {
        let unit = policy.window_ms();
        let (rate, mut held) = (policy.limit(), Held::default());
        let level = match state {
            Some(State::LeakyBucket { level, at_ms, .. }) if grants.is_empty() => {
                narrow(u128::from(level).saturating_sub(flow(rate, at_ms, at)))
            }
            Some(State::LeakyBucket { level, at_ms, .. }) => {
                held = Held::after(grants, at_ms);
                let level = drain(level, at_ms, at, rate, unit, &held);
                held.pass(at);
                level
            }
            _ => 0,
        };
        Self {
            rate,
            unit,
            capacity: policy.burst() * unit,
            at,
            level,
            held,
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
        let target = self.capacity - cost * self.unit;
        if !self.held.ends.is_empty() {
            return self.wait_for(target);
        }
        let overflow = self.level - target;
        div_ceil(u128::from(overflow), u128::from(self.rate))
    }

    fn reset_after(&self) -> u64 {
        if !self.held.ends.is_empty() {
            return self.wait_for(0);
        }
        div_ceil(u128::from(self.level), u128::from(self.rate))
    }

    fn lease_end(&self) -> u64 {
        u64::MAX
    }

    fn grant(&mut self, units: u64, ends_at: u64) {
        self.consume(units);
        self.held.add(ends_at, units);
    }

    fn refund(&mut self, grant: &Grant, unused: u64) -> Option<Grant> {
        self.held.remove(grant.ends_at, grant.units);
        let floor = self.held.scaled(self.unit);
        let back = u128::from(unused) * u128::from(self.unit);
        let level = u128::from(self.level);
        self.level = narrow(level.saturating_sub(back).max(floor.min(level)));
        None
    }

    fn into_state(self) -> Option<State> {
        (self.level > 0).then_some(State::LeakyBucket {
            level: self.level,
            at_ms: self.at,
            window_ms: self.unit,
        })
    }
}

impl LeakyBucket {
    /// The wait from now until the level, drained down to the segments'
    /// floors, is at most `target`.
    fn wait_for(&self, target: u64) -> u64 {
        let (target, mut level) = (u128::from(target), u128::from(self.level));
        let mut t = self.at;
        for (end, during) in self.held.segments(self.at, self.unit) {
            if during <= target {
                let over = level.saturating_sub(target);
                let reached = t.saturating_add(div_ceil(over, u128::from(self.rate)));
                if reached <= end {
                    return reached - self.at;
                }
            }
            level = level
                .saturating_sub(flow(self.rate, t, end))
                .max(during.min(level));
            t = end;
        }
        u64::MAX
    }
}
