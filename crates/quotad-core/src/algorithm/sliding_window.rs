//! Sliding window counter: the previous window's count weighted by how much
//! of it the sliding window still covers, plus the current count.
//!
//! `estimate = round(previous x (window - elapsed) / window) + current`,
//! rounding halves up, in exact integers.

use super::{Meter, State, narrow};
use crate::grant::Grant;
use crate::policy::Policy;

pub(super) struct SlidingWindow {
    limit: u64,
    window: u64,
    start: u64,
    elapsed: u64,
    previous: u64,
    current: u64,
}

/// `round(count x (window - elapsed) / window)`, halves up.
fn weighted(count: u64, elapsed: u64, window: u64) -> u64 {
    let w = u128::from(window);
    narrow((u128::from(count) * u128::from(window - elapsed) + w / 2) / w)
}

/// The smallest `elapsed` in `[0, window)` at which
/// `weighted(count, elapsed, window) <= allowance`, if any.
///
/// `floor((c(W - e) + h) / W) <= a  <=>  c(W - e) <= (a + 1)W - h - 1`
/// with `h = floor(W / 2)`, so `e >= W - floor(((a + 1)W - h - 1) / c)`.
fn first_elapsed_within(count: u64, allowance: u64, window: u64) -> Option<u64> {
    if count == 0 {
        return Some(0);
    }
    let w = u128::from(window);
    let room = (u128::from(allowance) + 1) * w - w / 2 - 1;
    let span = narrow(room / u128::from(count));
    let elapsed = window.saturating_sub(span);
    (elapsed < window).then_some(elapsed)
}

impl SlidingWindow {
    fn estimate(&self) -> u64 {
        weighted(self.previous, self.elapsed, self.window).saturating_add(self.current)
    }
}

impl Meter for SlidingWindow {
    fn advance(policy: &Policy, state: Option<State>, _grants: &[Grant], at: u64) -> Self {
        let window = policy.window_ms();
        let start = at - at % window;
        let (previous, current) = match state {
            Some(State::SlidingWindow {
                start_ms,
                previous,
                current,
                ..
            }) => {
                if start_ms >= start {
                    (previous, current)
                } else if start - start_ms <= window {
                    (current, 0)
                } else {
                    (0, 0)
                }
            }
            _ => (0, 0),
        };
        Self {
            limit: policy.limit(),
            window,
            start,
            elapsed: at - start,
            previous,
            current,
        }
    }

    fn fits(&self, cost: u64) -> bool {
        self.estimate() <= self.limit - cost
    }

    fn consume(&mut self, cost: u64) {
        self.current = self.current.saturating_add(cost);
    }

    fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.estimate())
    }

    fn retry_after(&self, cost: u64) -> u64 {
        let allowance = self.limit - cost;
        // Later in this window, as the previous window's weight shrinks.
        if let Some(left) = allowance.checked_sub(self.current)
            && let Some(at) = first_elapsed_within(self.previous, left, self.window)
        {
            return at.saturating_sub(self.elapsed);
        }
        let to_next = self.window - self.elapsed;
        // In the next window, this window's count becomes the previous one.
        match first_elapsed_within(self.current, allowance, self.window) {
            Some(at) => to_next + at,
            // Two windows on, both counts are gone.
            None => to_next + self.window,
        }
    }

    fn reset_after(&self) -> u64 {
        let to_next = self.window - self.elapsed;
        if self.current > 0 {
            to_next + self.window
        } else if self.previous > 0 {
            to_next
        } else {
            0
        }
    }

    fn lease_end(&self) -> u64 {
        // A leased unit counts in the current window: it must be spent
        // before this window becomes the previous one.
        self.start.saturating_add(self.window)
    }

    fn refund(&mut self, _grant: &Grant, unused: u64) -> Option<Grant> {
        // A live lease ends with its window: that window is the current one.
        self.current = self.current.saturating_sub(unused);
        None
    }

    fn into_state(self) -> Option<State> {
        (self.previous > 0 || self.current > 0).then_some(State::SlidingWindow {
            start_ms: self.start,
            previous: self.previous,
            current: self.current,
            window_ms: self.window,
        })
    }
}
