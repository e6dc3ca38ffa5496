//! A span per store call: [`Traced`] wraps a backend and runs each of its
//! calls in a child span of the RPC's, naming the backend (`memory` or
//! `redis`), the operation, the policy and algorithm, how many items, the
//! outcome and, for a standalone Redis, its address. Never the key.
//!
//! With export off ([`crate::trace::exporting`]) no span is made: each
//! call costs a load of a flag, and nothing is recorded.

use std::future::Future;
use std::sync::Arc;

use quotad_core::{BatchMode, CheckItem, Policy};
use tracing::field::Empty;
use tracing::{Instrument as _, Span};

use super::{
    AcquireResult, Atomicity, Backend, BackendError, BackendStats, Deadline, ItemResult, LeaseItem,
    LeaseResult, SlotItem, SlotResult,
};
use crate::trace::{TARGET, policy_label};

/// A backend whose calls each run in a span of their own.
#[derive(Debug)]
pub struct Traced<B> {
    inner: Arc<B>,
    /// The store's address, when one node serves every key.
    node: Option<String>,
}

impl<B: Backend> Traced<B> {
    /// Wraps `inner`; `node` is the store's address when every call goes
    /// to it (a standalone Redis), `None` otherwise.
    pub fn new(inner: Arc<B>, node: Option<String>) -> Self {
        Traced { inner, node }
    }

    /// The span of one call of `operation` on `items` items; disabled when
    /// export is off.
    fn span(&self, operation: &'static str, items: usize, policy: Option<&Policy>) -> Span {
        if !crate::trace::exporting() {
            return Span::none();
        }
        let span = tracing::info_span!(
            target: TARGET,
            "store",
            otel.name = Empty,
            otel.kind = "client",
            otel.status_code = Empty,
            quotad.backend = self.inner.name(),
            quotad.operation = operation,
            quotad.items = i64::try_from(items).unwrap_or(i64::MAX),
            quotad.policy = Empty,
            quotad.algorithm = Empty,
            quotad.outcome = Empty,
            server.address = Empty,
        );
        if span.is_disabled() {
            return span;
        }
        span.record(
            "otel.name",
            format!("{} {operation}", self.inner.name()).as_str(),
        );
        if let Some(node) = &self.node {
            span.record("server.address", node.as_str());
        }
        if let Some(policy) = policy {
            span.record("quotad.algorithm", policy.algorithm().as_str());
        }
        span
    }

    /// The span of a call on `items`: their policy when they share one,
    /// `mixed` when not.
    fn items_span(&self, operation: &'static str, items: &[CheckItem<'_>]) -> Span {
        let first = items.first();
        let span = self.span(operation, items.len(), first.map(CheckItem::policy));
        if span.is_disabled() {
            return span;
        }
        if let Some(first) = first {
            let one = items.iter().all(|i| i.name() == first.name());
            let name = if one {
                policy_label(first.name())
            } else {
                "mixed"
            };
            span.record("quotad.policy", name);
        }
        span
    }
}

/// The outcome of a decision: `allowed` or `denied`.
fn decided(allowed: bool) -> &'static str {
    if allowed { "allowed" } else { "denied" }
}

/// Records `outcome` on `span`, and marks the span failed for `error`.
fn outcome(span: &Span, outcome: &str) {
    span.record("quotad.outcome", outcome);
    if outcome == "error" {
        span.record("otel.status_code", "error");
    }
}

fn item_outcome(result: &ItemResult) -> &'static str {
    match result {
        Ok(decision) => decided(decision.allowed),
        Err(_) => "error",
    }
}

/// `allowed`, `denied` or `error` when every result says the same,
/// `mixed` otherwise.
fn batch_outcome(results: &[ItemResult]) -> &'static str {
    let mut outcomes = results.iter().map(item_outcome);
    let Some(first) = outcomes.next() else {
        return "none";
    };
    if outcomes.all(|o| o == first) {
        first
    } else {
        "mixed"
    }
}

/// Runs `call` in `span`, then records what `outcome_of` says of its
/// answer (when the span is enabled).
async fn traced<T>(
    span: Span,
    call: impl Future<Output = T>,
    outcome_of: impl FnOnce(&T) -> &'static str,
) -> T {
    let answer = call.instrument(span.clone()).await;
    if !span.is_disabled() {
        outcome(&span, outcome_of(&answer));
    }
    answer
}

fn unit_outcome<T>(result: &Result<T, BackendError>) -> &'static str {
    if result.is_ok() { "ok" } else { "error" }
}

impl<B: Backend> Backend for Traced<B> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn check_one(
        &self,
        item: &CheckItem<'_>,
        deadline: Deadline,
    ) -> impl Future<Output = ItemResult> + Send {
        let span = self.items_span("check", std::slice::from_ref(item));
        traced(span, self.inner.check_one(item, deadline), item_outcome)
    }

    fn check(
        &self,
        items: &[CheckItem<'_>],
        mode: BatchMode,
        deadline: Deadline,
    ) -> impl Future<Output = Vec<ItemResult>> + Send {
        let span = self.items_span("check_batch", items);
        traced(span, self.inner.check(items, mode, deadline), |r| {
            batch_outcome(r)
        })
    }

    fn peek(
        &self,
        item: &CheckItem<'_>,
        deadline: Deadline,
    ) -> impl Future<Output = ItemResult> + Send {
        let span = self.items_span("peek", std::slice::from_ref(item));
        traced(span, self.inner.peek(item, deadline), item_outcome)
    }

    fn peek_each(
        &self,
        items: &[CheckItem<'_>],
        deadline: Deadline,
    ) -> impl Future<Output = Vec<ItemResult>> + Send {
        let span = self.items_span("peek_batch", items);
        traced(span, self.inner.peek_each(items, deadline), |r| {
            batch_outcome(r)
        })
    }

    fn reset(
        &self,
        name: &str,
        policy: &Policy,
        key: &str,
        deadline: Deadline,
    ) -> impl Future<Output = Result<(), BackendError>> + Send {
        let span = self.span("reset", 1, Some(policy));
        if !span.is_disabled() {
            span.record("quotad.policy", policy_label(name));
        }
        traced(
            span,
            self.inner.reset(name, policy, key, deadline),
            unit_outcome,
        )
    }

    fn lease(
        &self,
        item: &LeaseItem<'_>,
        deadline: Deadline,
    ) -> impl Future<Output = LeaseResult> + Send {
        let span = self.span("lease", 1, Some(&item.policy));
        if !span.is_disabled() {
            span.record("quotad.policy", policy_label(item.name));
        }
        traced(span, self.inner.lease(item, deadline), unit_outcome)
    }

    fn acquire(
        &self,
        item: &CheckItem<'_>,
        deadline: Deadline,
    ) -> impl Future<Output = AcquireResult> + Send {
        let span = self.items_span("acquire", std::slice::from_ref(item));
        traced(span, self.inner.acquire(item, deadline), |r| match r {
            Ok(Ok(acquired)) => decided(acquired.decision.allowed),
            Ok(Err(_)) => "refused",
            Err(_) => "error",
        })
    }

    fn renew(
        &self,
        slot: &SlotItem<'_>,
        deadline: Deadline,
    ) -> impl Future<Output = SlotResult> + Send {
        let span = self.span("renew", 1, Some(&slot.policy));
        if !span.is_disabled() {
            span.record("quotad.policy", policy_label(slot.name));
        }
        traced(span, self.inner.renew(slot, deadline), unit_outcome)
    }

    fn release(
        &self,
        slot: &SlotItem<'_>,
        deadline: Deadline,
    ) -> impl Future<Output = SlotResult> + Send {
        let span = self.span("release", 1, Some(&slot.policy));
        if !span.is_disabled() {
            span.record("quotad.policy", policy_label(slot.name));
        }
        traced(span, self.inner.release(slot, deadline), unit_outcome)
    }

    crate::backend::passes_overrides_to!(inner);

    fn stats(&self) -> BackendStats {
        self.inner.stats()
    }

    fn probe(&self) -> impl Future<Output = Result<(), BackendError>> + Send {
        // Readiness probes are not calls anyone traces.
        self.inner.probe()
    }

    fn spends_when_denied(&self) -> bool {
        self.inner.spends_when_denied()
    }

    fn atomicity<'i>(&self, items: impl IntoIterator<Item = CheckItem<'i>>) -> Atomicity {
        self.inner.atomicity(items)
    }
}

#[cfg(test)]
mod tests {
    use quotad_core::{Decision, Reason};

    use super::*;

    fn decision(allowed: bool) -> ItemResult {
        Ok(Decision {
            allowed,
            limit: 1,
            remaining: 0,
            retry_after_ms: 0,
            reset_after_ms: 0,
            reason: if allowed {
                Reason::WithinLimit
            } else {
                Reason::LimitExceeded
            },
        })
    }

    #[test]
    fn a_batch_outcome_is_the_items_one_when_they_agree_and_mixed_when_not() {
        assert_eq!(batch_outcome(&[decision(true), decision(true)]), "allowed");
        assert_eq!(batch_outcome(&[decision(false)]), "denied");
        assert_eq!(batch_outcome(&[decision(true), decision(false)]), "mixed");
        let failed = Err(BackendError::from(crate::backend::NotRun::NotConnected));
        assert_eq!(batch_outcome(&[failed.clone(), failed]), "error");
        assert_eq!(batch_outcome(&[]), "none");
    }
}
