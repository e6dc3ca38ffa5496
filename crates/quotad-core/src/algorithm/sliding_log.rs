//! Sliding log: the time and cost of every admission within the last window.
//! Exact: no window-long interval ever holds more than `limit`. Memory is
//! one 16-byte entry per distinct admission millisecond, at most `limit`
//! entries (capped by [`crate::SLIDING_LOG_MAX_LIMIT`]).

use std::collections::VecDeque;

use super::{Meter, State};
use crate::policy::Policy;

/// The admissions of one key within the last window, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Log {
    /// `(admitted at ms, cost)`, one entry per distinct millisecond.
    entries: VecDeque<(u64, u64)>,
    total: u64,
}

impl Log {
    /// The instant of the latest admission.
    pub fn last_ms(&self) -> Option<u64> {
        self.entries.back().map(|&(ms, _)| ms)
    }

    /// Units admitted within the log.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Number of entries kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the log holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

pub(super) struct SlidingLog {
    limit: u64,
    window: u64,
    at: u64,
    log: Box<Log>,
}

impl Meter for SlidingLog {
    fn advance(policy: &Policy, state: Option<State>, at: u64) -> Self {
        let window = policy.window_ms();
        let mut log = match state {
            Some(State::SlidingLog(log)) => log,
            _ => Box::default(),
        };
        // An admission at `ms` counts during `[ms, ms + window)`.
        while let Some(&(ms, cost)) = log.entries.front() {
            if ms.saturating_add(window) > at {
                break;
            }
            log.entries.pop_front();
            log.total -= cost;
        }
        Self {
            limit: policy.limit(),
            window,
            at,
            log,
        }
    }

    fn fits(&self, cost: u64) -> bool {
        self.log.total <= self.limit - cost
    }

    fn consume(&mut self, cost: u64) {
        match self.log.entries.back_mut() {
            Some((ms, sum)) if *ms == self.at => *sum += cost,
            _ => self.log.entries.push_back((self.at, cost)),
        }
        self.log.total += cost;
    }

    fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.log.total)
    }

    fn retry_after(&self, cost: u64) -> u64 {
        // Wait for the oldest admissions to leave until `cost` fits.
        let excess = self.log.total - (self.limit - cost);
        let mut freed = 0;
        for &(ms, sum) in &self.log.entries {
            freed += sum;
            if freed >= excess {
                return ms.saturating_add(self.window) - self.at;
            }
        }
        self.window
    }

    fn reset_after(&self) -> u64 {
        self.log
            .last_ms()
            .map_or(0, |ms| ms.saturating_add(self.window) - self.at)
    }

    fn into_state(self) -> Option<State> {
        (!self.log.is_empty()).then_some(State::SlidingLog(self.log))
    }
}
