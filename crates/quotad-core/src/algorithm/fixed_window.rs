//! Fixed window: one counter per epoch-aligned window, or per local period
//! of a calendar.

use super::{Meter, State};
use crate::grant::Grant;
use crate::policy::Policy;

pub(super) struct FixedWindow {
    limit: u64,
    window: u64,
    at: u64,
    start: u64,
    end: u64,
    count: u64,
}

impl Meter for FixedWindow {
    fn advance(policy: &Policy, state: Option<State>, _grants: &[Grant], at: u64) -> Self {
        // The state is bound to this number (a calendar's binding for a
        // calendar policy), not to the window's length.
        let window = policy.ledger_window_ms();
        let (mut start, mut end) = policy.window_bounds(at);
        let calendar = policy.calendar_period().is_some();
        let count = match state {
            // A calendar count runs to the end of the period it was begun
            // in, whichever zone or week start began it (its state is bound
            // to the period kind only): a replica or a reload in another
            // zone goes on counting it until that period ends, and only
            // then starts its own. So two zones never count one key in two
            // budgets at once (see docs/algorithms.md, "Two zones at once").
            Some(State::FixedWindow {
                start_ms,
                end_ms,
                count,
                ..
            }) if calendar && at < end_ms => {
                (start, end) = (start_ms, end_ms);
                count
            }
            // A count from this window still applies; the state's own
            // window never starts later (`at` is never before it).
            Some(State::FixedWindow {
                start_ms, count, ..
            }) if !calendar && start_ms >= start => count,
            _ => 0,
        };
        Self {
            limit: policy.limit(),
            window,
            at,
            start,
            end,
            count,
        }
    }

    fn fits(&self, cost: u64) -> bool {
        self.count <= self.limit - cost
    }

    fn consume(&mut self, cost: u64) {
        self.count += cost;
    }

    fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.count)
    }

    fn retry_after(&self, _cost: u64) -> u64 {
        // The next window starts empty and any cost <= limit fits there.
        self.end - self.at
    }

    fn reset_after(&self) -> u64 {
        if self.count == 0 {
            0
        } else {
            self.end - self.at
        }
    }

    fn lease_end(&self) -> u64 {
        // Every leased unit must land in the window it was charged to.
        self.end
    }

    fn refund(&mut self, _grant: &Grant, unused: u64) -> Option<Grant> {
        // A live lease ends with its window: that window is this one.
        self.count = self.count.saturating_sub(unused);
        None
    }

    fn into_state(self) -> Option<State> {
        (self.count > 0).then_some(State::FixedWindow {
            start_ms: self.start,
            end_ms: self.end,
            count: self.count,
            window_ms: self.window,
        })
    }
}
