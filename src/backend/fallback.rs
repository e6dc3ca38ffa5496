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
//! Nothing decided here is carried into the store when it answers again:
//! the store's counts are what they were (a stalled Redis refuses scripts
//! past their deadline; a restarted one starts empty). But every
//! `Unavailable` falls back, including a call whose script ran and whose
//! reply came late or was lost: that one is counted in the store and
//! decided here too (docs/redis.md says the bound). The local state is not dropped at recovery either, but
//! swept as each key becomes fresh: a store that flaps within one window
//! finds the replica's share already spent, not a new one.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use quotad_core::{BatchMode, CheckItem, Clock, Decision, MemoryStore, Policy, Reason};

use super::{
    AcquireResult, Backend, BackendError, BackendStats, Deadline, Figure, ItemResult, LeaseItem,
    LeaseResult, SlotItem, SlotResult,
};
use crate::config::{FallbackSettings, OnError};
use crate::metrics::LOCAL_FALLBACK as LOCAL_DECISIONS;
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
        Fallback {
            store,
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

    /// Whether `item`, which the store failed with `error`, is decided here.
    fn falls_back(&self, item: &CheckItem<'_>, error: &BackendError) -> bool {
        matches!(error, BackendError::Unavailable(_))
            && self.replicas.is_some()
            && item.policy().algorithm().is_rate()
            && (self.is_local)(item.name())
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
        let result = self.store.check_one(item, deadline).await;
        self.resolve_one(item, result, false)
    }

    async fn check(
        &self,
        items: &[CheckItem<'_>],
        mode: BatchMode,
        deadline: Deadline,
    ) -> Vec<ItemResult> {
        let results = self.store.check(items, mode, deadline).await;
        self.resolve(items, results, mode, false)
    }

    async fn peek(&self, item: &CheckItem<'_>, deadline: Deadline) -> ItemResult {
        let result = self.store.peek(item, deadline).await;
        self.resolve_one(item, result, true)
    }

    async fn peek_each(&self, items: &[CheckItem<'_>], deadline: Deadline) -> Vec<ItemResult> {
        let results = self.store.peek_each(items, deadline).await;
        self.resolve(items, results, BatchMode::Independent, true)
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
            Err(BackendError::Unavailable("down".to_owned()))
        }
        async fn check(
            &self,
            items: &[CheckItem<'_>],
            _: BatchMode,
            _: Deadline,
        ) -> Vec<ItemResult> {
            items
                .iter()
                .map(|_| Err(BackendError::Unavailable("down".to_owned())))
                .collect()
        }
        async fn peek(&self, _: &CheckItem<'_>, _: Deadline) -> ItemResult {
            Err(BackendError::Unavailable("down".to_owned()))
        }
        async fn reset(
            &self,
            _: &str,
            _: &Policy,
            _: &str,
            _: Deadline,
        ) -> Result<(), BackendError> {
            Err(BackendError::Unavailable("down".to_owned()))
        }
        async fn lease(&self, _: &LeaseItem<'_>, _: Deadline) -> LeaseResult {
            Err(BackendError::Unavailable("down".to_owned()))
        }
        async fn acquire(&self, _: &CheckItem<'_>, _: Deadline) -> AcquireResult {
            Err(BackendError::Unavailable("down".to_owned()))
        }
        async fn renew(&self, _: &SlotItem<'_>, _: Deadline) -> SlotResult {
            Err(BackendError::Unavailable("down".to_owned()))
        }
        async fn release(&self, _: &SlotItem<'_>, _: Deadline) -> SlotResult {
            Err(BackendError::Unavailable("down".to_owned()))
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
        Fallback::new(
            Down,
            &settings,
            Arc::clone(clock) as Arc<dyn Clock>,
            Box::new(|name| name == "local"),
        )
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
        let counted: u64 = stats.figures.iter().map(|f| f.value).sum();
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
        let item = CheckItem::new("local", policy(Algorithm::FixedWindow, 30, None), "k", 1)
            .expect("valid");
        for _ in 0..20 {
            let d = store.peek(&item, Deadline::NONE).await.expect("local");
            assert_eq!((d.allowed, d.remaining), (true, 10));
        }
    }

    #[tokio::test]
    async fn the_share_renews_with_each_window() {
        let clock = Arc::new(FakeClock::new(1_700_000_000_000));
        let store = fallback(3, &clock);
        let item = CheckItem::new("local", policy(Algorithm::FixedWindow, 30, None), "k", 1)
            .expect("valid");
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
