//! The answer to one check.

use std::fmt;

/// Why a decision came out the way it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Admitted: the cost fit in the remaining budget.
    WithinLimit,
    /// Denied: the budget is spent for now; `retry_after_ms` says for how long.
    LimitExceeded,
    /// Denied: the cost is larger than the policy's capacity and can never
    /// fit. Nothing was consumed and there is no retry time.
    CostExceedsCapacity,
    /// Denied: the store is full, by its key or byte budget: a new key
    /// cannot be stored, or a key's state cannot grow (a sliding log that
    /// needs a larger allocation). Nothing was consumed; no retry time.
    Capacity,
    /// Denied: in an all-or-nothing batch this item would have fit, but
    /// another item did not, so nothing was consumed.
    BatchRejected,
    /// Admitted without counting: the backend failed and the policy fails open.
    FailOpen,
    /// Denied without counting: the backend failed and the policy fails closed.
    FailClosed,
    /// Not decided: in an independent batch, the backend failed for this
    /// item and its policy reports errors. Nothing was consumed; the item
    /// stands for the error a lone check would have answered.
    Unavailable,
    /// Allowed or denied by this replica alone: the backend failed and the
    /// policy falls back to a local store holding the replica's share of
    /// the limit. Counted only there, never in the backend.
    LocalFallback,
}

impl Reason {
    /// Every reason, in declaration order: `Reason::ALL[r as usize] == r`.
    pub const ALL: [Reason; 9] = [
        Reason::WithinLimit,
        Reason::LimitExceeded,
        Reason::CostExceedsCapacity,
        Reason::Capacity,
        Reason::BatchRejected,
        Reason::FailOpen,
        Reason::FailClosed,
        Reason::Unavailable,
        Reason::LocalFallback,
    ];

    /// The snake_case name used in metric labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::WithinLimit => "within_limit",
            Reason::LimitExceeded => "limit_exceeded",
            Reason::CostExceedsCapacity => "cost_exceeds_capacity",
            Reason::Capacity => "capacity",
            Reason::BatchRejected => "batch_rejected",
            Reason::FailOpen => "fail_open",
            Reason::FailClosed => "fail_closed",
            Reason::Unavailable => "unavailable",
            Reason::LocalFallback => "local_fallback",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of one check. A denial is a normal decision, never an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Decision {
    /// Whether the cost was admitted (and consumed).
    pub allowed: bool,
    /// The policy's capacity: the largest cost that can ever be admitted.
    pub limit: u64,
    /// How many unit-cost requests would be admitted at this same instant.
    pub remaining: u64,
    /// 0 when allowed; when denied, the exact smallest wait after which the
    /// same cost would be admitted with no other traffic; 0 as well when the
    /// cost can never fit.
    pub retry_after_ms: u64,
    /// Time until the key's state is back to fresh (full budget).
    pub reset_after_ms: u64,
    /// Why.
    pub reason: Reason,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_reason_at_its_own_index() {
        for (i, reason) in Reason::ALL.into_iter().enumerate() {
            assert_eq!(reason as usize, i, "{reason}");
        }
    }
}
