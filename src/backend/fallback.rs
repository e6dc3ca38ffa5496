//! `on_error = "local"`: while the shared store is down, each replica
//! decides alone from its own memory with its share of every limit.
//!
//! [`Fallback`] wraps the store. Every call goes to the store first; an
//! item the store could not decide ([`BackendError::Unavailable`]) whose
//! policy says `on_error = "local"` is decided by a [`MemoryStore`] of this
//! process instead, under the same algorithm and window with the limit
//! (and burst) divided by `store.fallback.replicas`, and answered with
//! [`Reason::LocalFallback`]. With the count right, `replicas` replicas
//! together admit at most the limit per window during an outage.
//!
//! What it does not decide locally, and why:
//! - concurrency slots: their holders renew and release them in the store,
//!   which cannot see a local slot; the API fails them closed;
//! - leases: a lease is charged in the store, and the lease API never
//!   grants one on a failure; clients then check, and checks are local;
//! - resets: an operator's reset is of the store's state.
//!
//! **The breaker** ([`Breaker`]). An outage of such an item opens it:
//! from then on no call of a falling-back item is sent to the store, each
//! is decided here at once, until a probe ([`Backend::probe`], one at a
//! time, with back-off between probes) answers. So a stalled store costs
//! each replica one timeout, not one per call. Items of other policies
//! (`error`, `fail_open`, `fail_closed`) still go to the store, breaker or
//! not: their answer is the store's or their `on_error`.
//!
//! Both kinds of outage fall back ([`Outage`]): a call that certainly did
//! not run, and one that **may have run** (sent, then no reply in time or
//! the connection broke). The second is still answered here, since its
//! caller is waiting and the store's answer is lost; if its script did
//! run, it is counted in the store and here too. That double count is
//! bounded: it can only be a call sent before the breaker opened, that is,
//! one of the calls in flight to the store when the outage began (at most
//! the calls this replica sent within one `store.redis.timeout` before the
//! first failure came back), and of those only the ones the store ran
//! before their deadline (a stalled Redis refuses scripts past it). Each
//! later outage, after a probe closed the breaker, adds at most its own
//! calls in flight. docs/redis.md states the same bound.
//!
//! Nothing decided here is carried into the store when it answers again:
//! the store's counts are what they were (a restarted Redis starts empty).
//! The local state is not dropped at recovery either, but swept as each
//! key becomes fresh: a store that flaps within one window finds the
//! replica's share already spent, not a new one.
//!
//! One breaker serves the whole store: on a Redis Cluster with one node
//! down, falling-back items of every node are decided here while it is
//! open (each within this replica's share, so never over the limit).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use quotad_core::{BatchMode, CheckItem, Clock, Decision, MemoryStore, Policy, Reason};

use super::breaker::{Admit, Backoff, Breaker, State};
use super::{
    AcquireResult, Backend, BackendError, BackendStats, Deadline, Figure, ItemResult, LeaseItem,
    LeaseResult, Outage, SlotItem, SlotResult,
};
use crate::config::{FallbackSettings, OnError};
use crate::metrics::{BREAKER_TRANSITIONS, LOCAL_FALLBACK as LOCAL_DECISIONS};
use crate::registry::PolicyRegistry;

/// The namespaces whose policy says `on_error = "local"` in the policies
/// in force at each call: a named policy's own `on_error`, and
/// `store_on_error` (`store.on_error`) for every other namespace (inline
/// policies, Envoy RLS).
pub(crate) fn local_policies(
    registry: &Arc<PolicyRegistry>,
    store_on_error: OnError,
) -> LocalPolicies {
    let registry = Arc::clone(registry);
    Box::new(move |name| {
        let on_error = registry
            .snapshot()
            .get(name)
            .map_or(store_on_error, |(_, named)| named.settings.on_error);
        on_error == OnError::Local
    })
}

/// Whether the policy namespace of an item falls back locally (its
/// policy's `on_error`, read from the policies in force at the call).
pub type LocalPolicies = Box<dyn Fn(&str) -> bool + Send + Sync>;

/// How often each local shard is swept of fresh state: the local store
/// holds keys only while an outage lasts and for one window after.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The store, and the local decisions of `on_error = "local"` when it fails.
pub struct Fallback<B> {
    store: B,
    local: Arc<MemoryStore>,
    /// `store.fallback.replicas`; `None` where no policy may fall back
    /// (config validation makes sure of it on Redis).
    replicas: Option<NonZeroU32>,
    is_local: LocalPolicies,
    breaker: Arc<Breaker>,
    allowed: AtomicU64,
    denied: AtomicU64,
}

impl<B> std::fmt::Debug for Fallback<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fallback")
            .field("replicas", &self.replicas)
            .field("local_keys", &self.local.live_keys())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Fallback<B> {
    /// `store`, falling back for the namespaces `is_local` names to a local
    /// store of `settings` that reads `clock`.
    pub fn new(
        store: B,
        settings: &FallbackSettings,
        clock: Arc<dyn Clock>,
        is_local: LocalPolicies,
    ) -> Self {
        // The breaker's back-off is a wait, not a time of day: a step of
        // the wall clock must not lengthen it.
        let waits: Arc<dyn Clock> = Arc::new(quotad_core::MonotonicClock::new());
        Self::with_clocks(store, settings, clock, waits, is_local)
    }

    /// [`Fallback::new`] with the breaker's back-off timed by `waits`.
    pub(crate) fn with_clocks(
        store: B,
        settings: &FallbackSettings,
        clock: Arc<dyn Clock>,
        waits: Arc<dyn Clock>,
        is_local: LocalPolicies,
    ) -> Self {
        Fallback {
            store,
            breaker: Arc::new(Breaker::new(waits, Backoff::DEFAULT)),
            local: Arc::new(MemoryStore::new(settings.store, clock)),
            replicas: settings.replicas,
            is_local,
            allowed: AtomicU64::new(0),
            denied: AtomicU64::new(0),
        }
    }

    /// The local store, for its sweep.
    pub fn local(&self) -> &Arc<MemoryStore> {
        &self.local
    }

    /// The wrapped store.
    pub fn store(&self) -> &B {
        &self.store
    }

    /// The breaker in front of the store.
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// Whether `item` is decided here when the store cannot decide it.
    fn may_fall_back(&self, item: &CheckItem<'_>) -> bool {
        self.replicas.is_some()
            && item.policy().algorithm().is_rate()
            && (self.is_local)(item.name())
    }

    /// Whether `item`, which the store failed with `error`, is decided
    /// here: an outage of either kind ([`Outage`]), never a bug.
    fn falls_back(&self, item: &CheckItem<'_>, error: &BackendError) -> bool {
        matches!(
            error,
            BackendError::Unavailable(Outage::NotRun(_) | Outage::MayHaveRun(_))
        ) && self.may_fall_back(item)
    }

    /// Whether calls of falling-back items go to the store now: the
    /// breaker closed, or this call's probe answered (by `deadline`; a
    /// probe its caller stops waiting for has failed).
    async fn sends(&self, deadline: Deadline) -> bool {
        match self.breaker.admit() {
            Admit::Send => true,
            Admit::Local => false,
            Admit::Probe(probe) => {
                // A probe its caller stops waiting for (the caller's own
                // deadline, or a cancelled call, which drops `probe`) is
                // abandoned, not failed: it says nothing of the store.
                let answered = match deadline.instant() {
                    Some(at) => {
                        match tokio::time::timeout_at(at.into(), self.store.probe()).await {
                            Ok(answer) => answer.is_ok(),
                            Err(_) => {
                                probe.abandon();
                                return false;
                            }
                        }
                    }
                    None => self.store.probe().await.is_ok(),
                };
                probe.settle(answered);
                answered
            }
        }
    }

    /// What the store answered falling-back items tells the breaker: an
    /// outage opens it; an answer starts its back-off over.
    fn observe<'r>(&self, results: impl IntoIterator<Item = &'r ItemResult>) {
        let mut answered = false;
        for result in results {
            match result {
                Err(BackendError::Unavailable(outage)) if outage.store_down() => {
                    return self.breaker.failed();
                }
                Ok(_) => answered = true,
                Err(_) => {}
            }
        }
        if answered {
            self.breaker.succeeded();
        }
    }

    /// `items` decided with the store, or here when the breaker is open:
    /// `peek` looks (each item alone), otherwise checks as a batch of
    /// `mode`.
    async fn batch(
        &self,
        items: &[CheckItem<'_>],
        mode: BatchMode,
        deadline: Deadline,
        peek: bool,
    ) -> Vec<ItemResult> {
        let falls: Vec<bool> = items.iter().map(|i| self.may_fall_back(i)).collect();
        let every = falls.iter().all(|&f| f);
        // An all-or-nothing batch with an item that does not fall back is
        // the store's to decide, breaker or not.
        let store_decides = !falls.contains(&true) || (mode == BatchMode::AllOrNothing && !every);
        if store_decides || self.sends(deadline).await {
            let results = self.store_batch(items, mode, deadline, peek).await;
            self.observe(
                results
                    .iter()
                    .zip(&falls)
                    .filter_map(|(r, &f)| f.then_some(r)),
            );
            return self.resolve(items, results, mode, peek);
        }
        if every {
            return self.decide(items, mode, peek).into_iter().map(Ok).collect();
        }
        // Independent items, some falling back: the others still go to the
        // store.
        let (mut local, mut sent) = (Vec::new(), Vec::new());
        for (item, &f) in items.iter().zip(&falls) {
            if f {
                local.push(*item)
            } else {
                sent.push(*item)
            }
        }
        let mut local = self
            .decide(&local, BatchMode::Independent, peek)
            .into_iter()
            .map(Ok);
        let mut sent = self
            .store_batch(&sent, BatchMode::Independent, deadline, peek)
            .await
            .into_iter();
        falls
            .iter()
            .map(|&f| {
                let next = if f { local.next() } else { sent.next() };
                next.expect("one result per item")
            })
            .collect()
    }

    async fn store_batch(
        &self,
        items: &[CheckItem<'_>],
        mode: BatchMode,
        deadline: Deadline,
        peek: bool,
    ) -> Vec<ItemResult> {
        if peek {
            self.store.peek_each(items, deadline).await
        } else {
            self.store.check(items, mode, deadline).await
        }
    }

    /// One item decided with the store, or here when the breaker is open.
    async fn one(&self, item: &CheckItem<'_>, deadline: Deadline, peek: bool) -> ItemResult {
        let falls = self.may_fall_back(item);
        if falls && !self.sends(deadline).await {
            return self.resolve_one(item, Err(super::NotRun::BreakerOpen.into()), peek);
        }
        let result = if peek {
            self.store.peek(item, deadline).await
        } else {
            self.store.check_one(item, deadline).await
        };
        if falls {
            self.observe([&result]);
        }
        self.resolve_one(item, result, peek)
    }

    /// The local item of `item`: its share of the limit, or `None` when the
    /// share is below one unit (every local decision then denies).
    fn share<'i>(&self, item: &CheckItem<'i>) -> Option<CheckItem<'i>> {
        let replicas = u64::from(self.replicas?.get());
        let policy = share(item.policy(), replicas)?;
        CheckItem::new(item.name(), policy, item.key(), item.cost().get())
            .ok()
            .map(|local| local.with_spend(item.spend()))
    }

    /// Decides `items` (each a rate item the store failed on) locally, as
    /// one batch of `mode`.
    fn decide(&self, items: &[CheckItem<'_>], mode: BatchMode, peek: bool) -> Vec<Decision> {
        let shares: Vec<Option<CheckItem<'_>>> = items.iter().map(|i| self.share(i)).collect();
        // A batch whose every item has a share is decided as the store
        // would; an item without one denies, and takes an all-or-nothing
        // batch with it.
        let all_shared = shares.iter().all(Option::is_some);
        let decisions: Vec<Decision> = if peek {
            shares
                .iter()
                .map(|s| s.as_ref().map_or_else(no_share, |s| self.local.peek(s)))
                .collect()
        } else if mode == BatchMode::AllOrNothing && !all_shared {
            shares.iter().map(|_| no_share()).collect()
        } else if all_shared {
            let shared: Vec<CheckItem<'_>> = shares.into_iter().flatten().collect();
            self.local.check(&shared, mode)
        } else {
            shares
                .iter()
                .map(|s| {
                    s.as_ref()
                        .map_or_else(no_share, |s| self.local.check_one(s))
                })
                .collect()
        };
        decisions
            .into_iter()
            .map(|mut d| {
                if !peek {
                    let counter = if d.allowed {
                        &self.allowed
                    } else {
                        &self.denied
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                d.reason = Reason::LocalFallback;
                d
            })
            .collect()
    }

    /// The store's result for `item`, or the local decision when it falls
    /// back (no allocation on the store's own answers).
    fn resolve_one(&self, item: &CheckItem<'_>, result: ItemResult, peek: bool) -> ItemResult {
        match result {
            Err(e) if self.falls_back(item, &e) => Ok(self
                .decide(std::slice::from_ref(item), BatchMode::Independent, peek)
                .pop()
                .expect("one decision for one item")),
            other => other,
        }
    }

    /// The store's results for `items`, with what falls back decided here.
    fn resolve(
        &self,
        items: &[CheckItem<'_>],
        mut results: Vec<ItemResult>,
        mode: BatchMode,
        peek: bool,
    ) -> Vec<ItemResult> {
        let failed: Vec<usize> = results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r {
                Err(e) if self.falls_back(&items[i], e) => Some(i),
                _ => None,
            })
            .collect();
        if failed.is_empty() {
            return results;
        }
        // An all-or-nothing batch failed whole: it falls back whole, or not
        // at all (an item whose policy reports errors keeps the error).
        if mode == BatchMode::AllOrNothing && failed.len() != items.len() {
            return results;
        }
        let picked: Vec<CheckItem<'_>> = failed.iter().map(|&i| items[i]).collect();
        for (i, decision) in failed.into_iter().zip(self.decide(&picked, mode, peek)) {
            results[i] = Ok(decision);
        }
        results
    }
}

/// `policy` with its limit and burst divided by `replicas`, rounded down;
/// `None` when a share is below one unit.
fn share(policy: &Policy, replicas: u64) -> Option<Policy> {
    let limit = policy.limit() / replicas;
    let burst = policy.burst() / replicas;
    if limit == 0 || burst == 0 {
        return None;
    }
    let algorithm = policy.algorithm();
    if let Some(calendar) = policy.calendar_period() {
        // The same local periods: a share per calendar period, not per
        // epoch-aligned stretch of its nominal length.
        return Policy::calendar(algorithm, limit, calendar).ok();
    }
    let burst = algorithm.is_bucket().then_some(burst);
    Policy::try_new(
        algorithm,
        limit,
        Duration::from_millis(policy.window_ms()),
        burst,
    )
    .ok()
}

/// The labels of `quotad_store_breaker_transitions_total` into `to`.
fn transition_labels(to: State) -> &'static [(&'static str, &'static str)] {
    match to {
        State::Open => &[("to", "open")],
        State::HalfOpen => &[("to", "half_open")],
        State::Closed => &[("to", "closed")],
    }
}

/// A local decision where the replica's share is below one unit.
fn no_share() -> Decision {
    Decision {
        allowed: false,
        limit: 0,
        remaining: 0,
        retry_after_ms: 0,
        reset_after_ms: 0,
        reason: Reason::LocalFallback,
    }
}

impl<B: Backend> Backend for Fallback<B> {
    fn name(&self) -> &'static str {
        self.store.name()
    }

    async fn check_one(&self, item: &CheckItem<'_>, deadline: Deadline) -> ItemResult {
        self.one(item, deadline, false).await
    }

    async fn check(
        &self,
        items: &[CheckItem<'_>],
        mode: BatchMode,
        deadline: Deadline,
    ) -> Vec<ItemResult> {
        self.batch(items, mode, deadline, false).await
    }

    async fn peek(&self, item: &CheckItem<'_>, deadline: Deadline) -> ItemResult {
        self.one(item, deadline, true).await
    }

    async fn peek_each(&self, items: &[CheckItem<'_>], deadline: Deadline) -> Vec<ItemResult> {
        self.batch(items, BatchMode::Independent, deadline, true)
            .await
    }

    async fn reset(
        &self,
        name: &str,
        policy: &Policy,
        key: &str,
        deadline: Deadline,
    ) -> Result<(), BackendError> {
        self.store.reset(name, policy, key, deadline).await
    }

    async fn lease(&self, item: &LeaseItem<'_>, deadline: Deadline) -> LeaseResult {
        self.store.lease(item, deadline).await
    }

    async fn acquire(&self, item: &CheckItem<'_>, deadline: Deadline) -> AcquireResult {
        self.store.acquire(item, deadline).await
    }

    async fn renew(&self, slot: &SlotItem<'_>, deadline: Deadline) -> SlotResult {
        self.store.renew(slot, deadline).await
    }

    async fn release(&self, slot: &SlotItem<'_>, deadline: Deadline) -> SlotResult {
        self.store.release(slot, deadline).await
    }

    // Overrides are the store's, outage or not: a change during an outage
    // fails (UNAVAILABLE), and each replica keeps the set it last read.
    crate::backend::passes_overrides_to!(store);

    fn stats(&self) -> BackendStats {
        let mut stats = self.store.stats();
        stats.figures.extend([
            Figure {
                name: LOCAL_DECISIONS,
                labels: &[("outcome", "allowed")],
                value: self.allowed.load(Ordering::Relaxed),
            },
            Figure {
                name: LOCAL_DECISIONS,
                labels: &[("outcome", "denied")],
                value: self.denied.load(Ordering::Relaxed),
            },
        ]);
        stats.figures.extend(
            [State::Open, State::HalfOpen, State::Closed].map(|to| Figure {
                name: BREAKER_TRANSITIONS,
                labels: transition_labels(to),
                value: self.breaker.transitions(to),
            }),
        );
        stats.breaker_state = Some(self.breaker.state().gauge());
        stats
    }

    fn probe(&self) -> impl std::future::Future<Output = Result<(), BackendError>> + Send {
        self.store.probe()
    }

    fn spends_when_denied(&self) -> bool {
        self.store.spends_when_denied()
    }

    fn atomicity<'i>(&self, items: impl IntoIterator<Item = CheckItem<'i>>) -> super::Atomicity {
        self.store.atomicity(items)
    }
}

#[cfg(test)]
mod tests {
    use quotad_core::{Algorithm, FakeClock, OnFull, StoreConfig};

    use super::*;

    /// A store that is always down.
    struct Down;

    impl Backend for Down {
        fn name(&self) -> &'static str {
            "down"
        }
        async fn check_one(&self, _: &CheckItem<'_>, _: Deadline) -> ItemResult {
            Err(BackendError::from(crate::backend::NotRun::NotConnected))
        }
        async fn check(
            &self,
            items: &[CheckItem<'_>],
            _: BatchMode,
            _: Deadline,
        ) -> Vec<ItemResult> {
            items
                .iter()
                .map(|_| Err(BackendError::from(crate::backend::NotRun::NotConnected)))
                .collect()
        }
        async fn peek(&self, _: &CheckItem<'_>, _: Deadline) -> ItemResult {
            Err(BackendError::from(crate::backend::NotRun::NotConnected))
        }
        async fn reset(
            &self,
            _: &str,
            _: &Policy,
            _: &str,
            _: Deadline,
        ) -> Result<(), BackendError> {
            Err(BackendError::from(crate::backend::NotRun::NotConnected))
        }
        async fn lease(&self, _: &LeaseItem<'_>, _: Deadline) -> LeaseResult {
            Err(BackendError::from(crate::backend::NotRun::NotConnected))
        }
        async fn acquire(&self, _: &CheckItem<'_>, _: Deadline) -> AcquireResult {
            Err(BackendError::from(crate::backend::NotRun::NotConnected))
        }
        async fn renew(&self, _: &SlotItem<'_>, _: Deadline) -> SlotResult {
            Err(BackendError::from(crate::backend::NotRun::NotConnected))
        }
        async fn release(&self, _: &SlotItem<'_>, _: Deadline) -> SlotResult {
            Err(BackendError::from(crate::backend::NotRun::NotConnected))
        }
        crate::backend::keeps_no_overrides!();

        fn stats(&self) -> BackendStats {
            BackendStats::default()
        }
    }

    fn fallback(replicas: u32, clock: &Arc<FakeClock>) -> Fallback<Down> {
        let settings = FallbackSettings {
            replicas: NonZeroU32::new(replicas),
            store: StoreConfig::try_new(1_000, 1, OnFull::Deny).expect("valid"),
        };
        Fallback::with_clocks(
            Down,
            &settings,
            Arc::clone(clock) as Arc<dyn Clock>,
            Arc::clone(clock) as Arc<dyn Clock>,
            Box::new(|name| name == "local"),
        )
    }

    /// A store that answers each check with `failing`'s error, or allows
    /// it when there is none, and counts the calls and probes it gets.
    #[derive(Default)]
    struct Counting {
        failing: std::sync::Mutex<Option<BackendError>>,
        calls: AtomicU64,
        probes: AtomicU64,
    }

    impl Counting {
        fn answer(&self) -> ItemResult {
            self.calls.fetch_add(1, Ordering::SeqCst);
            match self.failing.lock().expect("not poisoned").clone() {
                Some(e) => Err(e),
                None => Ok(Decision {
                    allowed: true,
                    limit: 30,
                    remaining: 29,
                    retry_after_ms: 0,
                    reset_after_ms: 0,
                    reason: Reason::WithinLimit,
                }),
            }
        }

        fn fail_with(&self, error: Option<BackendError>) {
            *self.failing.lock().expect("not poisoned") = error;
        }

        fn counts(&self) -> (u64, u64) {
            (
                self.calls.load(Ordering::SeqCst),
                self.probes.load(Ordering::SeqCst),
            )
        }
    }

    impl Backend for Counting {
        fn name(&self) -> &'static str {
            "counting"
        }
        async fn check_one(&self, _: &CheckItem<'_>, _: Deadline) -> ItemResult {
            self.answer()
        }
        async fn check(
            &self,
            items: &[CheckItem<'_>],
            _: BatchMode,
            _: Deadline,
        ) -> Vec<ItemResult> {
            items.iter().map(|_| self.answer()).collect()
        }
        async fn peek(&self, _: &CheckItem<'_>, _: Deadline) -> ItemResult {
            self.answer()
        }
        async fn reset(
            &self,
            _: &str,
            _: &Policy,
            _: &str,
            _: Deadline,
        ) -> Result<(), BackendError> {
            Ok(())
        }
        async fn lease(&self, _: &LeaseItem<'_>, _: Deadline) -> LeaseResult {
            Err(super::super::NotRun::NotConnected.into())
        }
        async fn acquire(&self, _: &CheckItem<'_>, _: Deadline) -> AcquireResult {
            Err(super::super::NotRun::NotConnected.into())
        }
        async fn renew(&self, _: &SlotItem<'_>, _: Deadline) -> SlotResult {
            Err(super::super::NotRun::NotConnected.into())
        }
        async fn release(&self, _: &SlotItem<'_>, _: Deadline) -> SlotResult {
            Err(super::super::NotRun::NotConnected.into())
        }
        crate::backend::keeps_no_overrides!();

        fn stats(&self) -> BackendStats {
            BackendStats::default()
        }

        async fn probe(&self) -> Result<(), BackendError> {
            self.probes.fetch_add(1, Ordering::SeqCst);
            match self.failing.lock().expect("not poisoned").clone() {
                Some(e) => Err(e),
                None => Ok(()),
            }
        }
    }

    fn counting(clock: &Arc<FakeClock>) -> Fallback<Counting> {
        let settings = FallbackSettings {
            replicas: NonZeroU32::new(3),
            store: StoreConfig::try_new(1_000, 1, OnFull::Deny).expect("valid"),
        };
        Fallback::with_clocks(
            Counting::default(),
            &settings,
            Arc::clone(clock) as Arc<dyn Clock>,
            Arc::clone(clock) as Arc<dyn Clock>,
            Box::new(|name| name == "local"),
        )
    }

    /// Key `k` of the `local` namespace under a fixed window of 30.
    fn local_item() -> CheckItem<'static> {
        CheckItem::new("local", policy(Algorithm::FixedWindow, 30, None), "k", 1).expect("valid")
    }

    fn no_reply() -> BackendError {
        super::super::MayHaveRun::NoReply(super::super::Waited {
            after: Duration::from_millis(200),
            callers: false,
        })
        .into()
    }

    #[tokio::test]
    async fn a_callers_own_deadline_or_a_call_refused_alone_leaves_the_breaker_closed() {
        let clock = Arc::new(FakeClock::new(1_700_000_000_000));
        let store = counting(&clock);
        let item = local_item();
        let callers = super::super::Waited {
            after: Duration::from_millis(2),
            callers: true,
        };
        for error in [
            BackendError::from(super::super::MayHaveRun::NoReply(callers)),
            BackendError::from(super::super::NotRun::NotSent(callers)),
            BackendError::from(super::super::NotRun::RefusedLate("rate script")),
        ] {
            store.store().fail_with(Some(error));
            let d = store.check_one(&item, Deadline::NONE).await.expect("local");
            assert_eq!(d.reason, Reason::LocalFallback, "this call falls back");
            assert_eq!(store.breaker().state(), State::Closed, "the next is sent");
        }
        store.store().fail_with(None);
        let d = store.check_one(&item, Deadline::NONE).await.expect("sent");
        assert_ne!(d.reason, Reason::LocalFallback);
        assert_eq!(store.store().counts(), (4, 0), "four calls sent, no probe");
    }

    #[tokio::test]
    async fn after_a_call_that_may_have_run_no_call_is_sent_until_a_probe_answers() {
        let clock = Arc::new(FakeClock::new(1_700_000_000_000));
        let store = counting(&clock);
        let item = local_item();
        store.store().fail_with(Some(no_reply()));
        for _ in 0..10 {
            let d = store.check_one(&item, Deadline::NONE).await.expect("local");
            assert_eq!(d.reason, Reason::LocalFallback);
        }
        assert_eq!(
            store.store().counts(),
            (1, 0),
            "one call sent, no probe yet"
        );
        assert_eq!(store.breaker().state(), State::Open);
        // The back-off passed: one probe, failing, and the call is local.
        clock.advance(Duration::from_millis(100));
        let d = store.check_one(&item, Deadline::NONE).await.expect("local");
        assert_eq!(d.reason, Reason::LocalFallback);
        assert_eq!(store.store().counts(), (1, 1));
        // The store is back: the next probe, after twice the wait, answers,
        // and that call and the next go to the store.
        store.store().fail_with(None);
        clock.advance(Duration::from_millis(199));
        store.check_one(&item, Deadline::NONE).await.expect("local");
        assert_eq!(store.store().counts(), (1, 1), "still backing off");
        clock.advance(Duration::from_millis(1));
        for _ in 0..2 {
            let d = store.check_one(&item, Deadline::NONE).await.expect("store");
            assert_eq!(d.reason, Reason::WithinLimit);
        }
        assert_eq!(store.store().counts(), (3, 2));
        assert_eq!(store.breaker().state(), State::Closed);
        let stats = store.stats();
        let transitions = |to: &str| {
            stats
                .figures
                .iter()
                .find(|f| f.name == BREAKER_TRANSITIONS && f.labels == [("to", to)])
                .map(|f| f.value)
        };
        assert_eq!(
            [
                transitions("open"),
                transitions("half_open"),
                transitions("closed")
            ],
            [Some(2), Some(2), Some(1)]
        );
        assert_eq!(stats.breaker_state, Some(0));
    }

    #[tokio::test]
    async fn while_open_other_policies_still_go_to_the_store_and_keep_its_answer() {
        let clock = Arc::new(FakeClock::new(1_700_000_000_000));
        let store = counting(&clock);
        let p = policy(Algorithm::FixedWindow, 30, None);
        let local = CheckItem::new("local", p, "k", 1).expect("valid");
        let strict = CheckItem::new("strict", p, "k", 1).expect("valid");
        store.store().fail_with(Some(no_reply()));
        store
            .check_one(&local, Deadline::NONE)
            .await
            .expect("local");
        assert_eq!(store.breaker().state(), State::Open);
        let results = store
            .check(
                &[strict, local, strict],
                BatchMode::Independent,
                Deadline::NONE,
            )
            .await;
        assert!(results[0].is_err() && results[2].is_err(), "{results:?}");
        assert_eq!(
            results[1].as_ref().map(|d| d.reason),
            Ok(Reason::LocalFallback)
        );
        assert_eq!(store.store().counts(), (3, 0), "the strict items only");
        // An all-or-nothing batch of falling-back items sends nothing.
        let results = store
            .check(&[local, local], BatchMode::AllOrNothing, Deadline::NONE)
            .await;
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        assert_eq!(store.store().counts(), (3, 0));
    }

    #[tokio::test]
    async fn a_bug_in_the_store_is_not_answered_locally_nor_opens_the_breaker() {
        let clock = Arc::new(FakeClock::new(1_700_000_000_000));
        let store = counting(&clock);
        let item = local_item();
        store.store().fail_with(Some(
            super::super::Fault::Reply("a bad reply".into()).into(),
        ));
        for _ in 0..3 {
            assert!(matches!(
                store.check_one(&item, Deadline::NONE).await,
                Err(BackendError::Internal(_))
            ));
        }
        assert_eq!(store.breaker().state(), State::Closed);
        assert_eq!(store.store().counts(), (3, 0));
    }

    #[tokio::test]
    async fn an_outage_that_did_not_run_falls_back_and_opens_the_breaker_too() {
        let clock = Arc::new(FakeClock::new(1_700_000_000_000));
        let store = counting(&clock);
        let item = local_item();
        store
            .store()
            .fail_with(Some(super::super::NotRun::Reconnecting.into()));
        for _ in 0..3 {
            let d = store.check_one(&item, Deadline::NONE).await.expect("local");
            assert_eq!(d.reason, Reason::LocalFallback);
        }
        assert_eq!(store.store().counts(), (1, 0));
    }

    fn policy(algorithm: Algorithm, limit: u64, burst: Option<u64>) -> Policy {
        Policy::try_new(algorithm, limit, Duration::from_secs(2), burst).expect("valid")
    }

    #[test]
    fn a_calendar_policys_share_keeps_its_local_periods_and_an_items_spend() {
        use quotad_core::{Calendar, Period, Spend, Zone};
        let day = Calendar::new(
            Period::Day,
            Zone::named("America/New_York").expect("a zone"),
        );
        let policy = Policy::calendar(Algorithm::FixedWindow, 30, day).expect("valid");
        let local = share(&policy, 3).expect("a share");
        assert_eq!(local.limit(), 10);
        assert_eq!(local.calendar_period(), Some(day));
        let at = 1_700_000_000_000;
        assert_eq!(local.window_bounds(at), policy.window_bounds(at));
        let clock = Arc::new(FakeClock::new(at));
        let fallback = fallback(3, &clock);
        let item = CheckItem::new("p", policy, "k", 1)
            .expect("valid")
            .with_spend(Spend::Always);
        let local = fallback.share(&item).expect("a share");
        assert_eq!(local.spend(), Spend::Always);
    }

    #[tokio::test]
    async fn each_algorithm_admits_its_share_of_the_limit_and_says_so() {
        let clock = Arc::new(FakeClock::new(1_700_000_000_000));
        let store = fallback(3, &clock);
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
            Algorithm::LeakyBucket,
            Algorithm::SlidingLog,
        ] {
            let policy = policy(algorithm, 31, None);
            let item = CheckItem::new("local", policy, algorithm.as_str(), 1).expect("valid");
            let mut admitted = 0;
            for _ in 0..40 {
                let d = store.check_one(&item, Deadline::NONE).await.expect("local");
                assert_eq!(d.reason, Reason::LocalFallback, "{algorithm}");
                admitted += u64::from(d.allowed);
            }
            assert_eq!(admitted, 10, "{algorithm}: floor(31 / 3)");
        }
        let stats = store.stats();
        let counted: u64 = stats
            .figures
            .iter()
            .filter(|f| f.name == LOCAL_DECISIONS)
            .map(|f| f.value)
            .sum();
        assert_eq!(counted, 200);
    }

    #[tokio::test]
    async fn a_bucket_divides_its_burst_too() {
        let clock = Arc::new(FakeClock::new(1_700_000_000_000));
        let store = fallback(2, &clock);
        let item = CheckItem::new(
            "local",
            policy(Algorithm::TokenBucket, 10, Some(40)),
            "k",
            1,
        )
        .expect("valid");
        let mut admitted = 0;
        for _ in 0..30 {
            admitted += u64::from(
                store
                    .check_one(&item, Deadline::NONE)
                    .await
                    .expect("local")
                    .allowed,
            );
        }
        assert_eq!(admitted, 20, "burst 40 / 2");
    }

    #[tokio::test]
    async fn a_limit_below_the_replica_count_denies_every_local_decision() {
        let clock = Arc::new(FakeClock::new(1_700_000_000_000));
        let store = fallback(3, &clock);
        let item = CheckItem::new("local", policy(Algorithm::FixedWindow, 2, None), "k", 1)
            .expect("valid");
        let d = store.check_one(&item, Deadline::NONE).await.expect("local");
        assert!(!d.allowed);
        assert_eq!(d.reason, Reason::LocalFallback);
    }

    #[tokio::test]
    async fn other_policies_and_peeks_of_them_keep_the_stores_error() {
        let clock = Arc::new(FakeClock::new(1_700_000_000_000));
        let store = fallback(3, &clock);
        let item = CheckItem::new("strict", policy(Algorithm::FixedWindow, 30, None), "k", 1)
            .expect("valid");
        assert!(matches!(
            store.check_one(&item, Deadline::NONE).await,
            Err(BackendError::Unavailable(_))
        ));
        assert!(store.peek(&item, Deadline::NONE).await.is_err());
    }

    #[tokio::test]
    async fn an_all_or_nothing_batch_with_a_strict_item_falls_back_not_at_all() {
        let clock = Arc::new(FakeClock::new(1_700_000_000_000));
        let store = fallback(3, &clock);
        let p = policy(Algorithm::FixedWindow, 30, None);
        let items = [
            CheckItem::new("local", p, "k", 1).expect("valid"),
            CheckItem::new("strict", p, "k", 1).expect("valid"),
        ];
        let results = store
            .check(&items, BatchMode::AllOrNothing, Deadline::NONE)
            .await;
        assert!(results.iter().all(Result::is_err), "{results:?}");
        assert_eq!(store.local().live_keys(), 0, "nothing counted locally");
        let results = store
            .check(&items, BatchMode::Independent, Deadline::NONE)
            .await;
        assert_eq!(
            results[0].as_ref().map(|d| d.reason),
            Ok(Reason::LocalFallback)
        );
        assert!(results[1].is_err());
    }

    #[tokio::test]
    async fn a_peek_consumes_nothing_locally() {
        let clock = Arc::new(FakeClock::new(1_700_000_000_000));
        let store = fallback(3, &clock);
        let item = local_item();
        for _ in 0..20 {
            let d = store.peek(&item, Deadline::NONE).await.expect("local");
            assert_eq!((d.allowed, d.remaining), (true, 10));
        }
    }

    #[tokio::test]
    async fn the_share_renews_with_each_window() {
        let clock = Arc::new(FakeClock::new(1_700_000_000_000));
        let store = fallback(3, &clock);
        let item = local_item();
        for _ in 0..10 {
            assert!(
                store
                    .check_one(&item, Deadline::NONE)
                    .await
                    .expect("local")
                    .allowed
            );
        }
        assert!(
            !store
                .check_one(&item, Deadline::NONE)
                .await
                .expect("local")
                .allowed
        );
        clock.advance(Duration::from_secs(2));
        assert!(
            store
                .check_one(&item, Deadline::NONE)
                .await
                .expect("local")
                .allowed
        );
    }
}
