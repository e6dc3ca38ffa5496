//! Leases held by the client: their settings, the table of what is held per
//! (policy, key), the local spend, and the counts.
//!
//! A lease is a share of a key's budget that quotad charged when it granted
//! it; the client admits with it locally, with no call, until its units or
//! its time run out. Talking to quotad about leases (acquire, renew, return)
//! is `lessee`'s; this module only keeps the state, so the local decision
//! depends on nothing that sends.
//!
//! The local spend is lock-free: a read lock on one shard of the table (a
//! shared lock, taken by every spender at once) finds the key's slot, and
//! one `fetch_update` on its units left admits. Everything that changes
//! which lease a slot holds happens on the slot's own cold path, by the one
//! caller that claimed it (`Slot::claim`).

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use quotad_core::{Decision, LeaseTerms, Reason};
use thiserror::Error;

use crate::request::{Check, PolicyRef};

/// How much earlier than its TTL says the client stops spending a lease,
/// beyond the 0.1% for the two clocks' rates. Default of
/// [`LeaseOptions::margin`].
pub const DEFAULT_LEASE_MARGIN: Duration = Duration::from_millis(5);

/// How long a key whose lease quotad answered `direct` is checked call by
/// call before the client asks for a lease again (sooner if quotad said the
/// key's state is fresh again sooner). Default of
/// [`LeaseOptions::direct_backoff`].
pub const DEFAULT_DIRECT_BACKOFF: Duration = Duration::from_secs(1);

/// The default number of keys the client holds leases for.
pub const DEFAULT_MAX_LEASED_KEYS: usize = 10_000;

/// How long a policy that quotad refused leases for (no lease settings, or
/// an unknown name) goes unleased before the client asks again: a policy
/// reload may give it lease settings.
pub const NOT_LEASABLE_RECHECK: Duration = Duration::from_secs(60);

/// The most units one lease may be asked for: the API's bound (2^53).
pub const MAX_LEASE_WANT: u64 = 1 << 53;

/// Shards of the lease table: enough that spenders of different keys on
/// different cores rarely share a lock word.
const SHARDS: usize = 64;

/// How the client leases budget; see
/// [`ClientBuilder::leases`](crate::ClientBuilder::leases).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseOptions {
    pub(crate) want: u64,
    margin_ms: u64,
    direct_backoff_ms: u64,
    pub(crate) max_keys: usize,
}

/// Lease settings out of range; the message names the setting.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum LeaseOptionsError {
    /// `want` of 0 (which asks for no lease) or above 2^53.
    #[error("leases.want: must be from 1 to 2^53 (got {0})")]
    Want(u64),
}

impl LeaseOptions {
    /// Leases of up to `want` units each (quotad may grant fewer: the
    /// policy's `lease.max_units`, or a fair share of what is left), with a
    /// margin of [`DEFAULT_LEASE_MARGIN`], a back-off after `direct` of
    /// [`DEFAULT_DIRECT_BACKOFF`], for up to [`DEFAULT_MAX_LEASED_KEYS`]
    /// keys.
    ///
    /// # Errors
    ///
    /// [`LeaseOptionsError::Want`] when `want` is 0 or above
    /// [`MAX_LEASE_WANT`].
    pub fn try_new(want: u64) -> Result<Self, LeaseOptionsError> {
        if want == 0 || want > MAX_LEASE_WANT {
            return Err(LeaseOptionsError::Want(want));
        }
        Ok(Self {
            want,
            margin_ms: whole_ms(DEFAULT_LEASE_MARGIN),
            direct_backoff_ms: whole_ms(DEFAULT_DIRECT_BACKOFF),
            max_keys: DEFAULT_MAX_LEASED_KEYS,
        })
    }

    /// How much earlier than `send time + ttl_ms x (1 - 1/1000)` the client
    /// stops spending a lease (rounded up to whole milliseconds): room for
    /// the two clocks reading whole milliseconds at different phases.
    #[must_use]
    pub fn margin(mut self, margin: Duration) -> Self {
        self.margin_ms = whole_ms(margin);
        self
    }

    /// How long a key answered `direct` is checked call by call before the
    /// client asks for a lease again; also the wait after a lease call
    /// failed.
    #[must_use]
    pub fn direct_backoff(mut self, backoff: Duration) -> Self {
        self.direct_backoff_ms = whole_ms(backoff);
        self
    }

    /// The most keys leases are held for at once; past it, a new key is
    /// checked call by call until a slot's lease ends.
    #[must_use]
    pub fn max_keys(mut self, max_keys: NonZeroUsize) -> Self {
        self.max_keys = max_keys.get();
        self
    }

    /// The back-off after `direct` or a failed call, in ms.
    pub(crate) fn direct_backoff_ms(&self) -> u64 {
        self.direct_backoff_ms
    }

    /// The last instant (client clock, whole ms, exclusive) a lease sent at
    /// `sent_ms` with `ttl_ms` may be spent: the send time plus the TTL less
    /// 0.1% of it (rounded up: the clocks may run at rates 1,000 ppm apart)
    /// and the margin. Never later than quotad's own end, whatever the
    /// network's delay, because quotad's end counts from after the send.
    pub(crate) fn end_ms(&self, sent_ms: u64, ttl_ms: u64) -> u64 {
        let drift = ttl_ms.div_ceil(1_000);
        sent_ms
            .saturating_add(ttl_ms)
            .saturating_sub(drift)
            .saturating_sub(self.margin_ms)
    }
}

/// Whole milliseconds of `d`, rounded up: a margin never shrinks.
fn whole_ms(d: Duration) -> u64 {
    u64::try_from(d.as_micros().div_ceil(1_000)).unwrap_or(u64::MAX)
}

/// What the client's leases have done since it was made; see
/// [`Client::lease_stats`](crate::Client::lease_stats). All zero when
/// leases are off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseStats {
    /// Checks admitted locally, from a held lease, without a call.
    pub local_admissions: u64,
    /// Leases granted to a key that held none.
    pub acquired: u64,
    /// Leases granted in exchange for a settled one (a renewal).
    pub renewed: u64,
    /// Leases given back with nothing asked in exchange (shutdown, drop,
    /// a lease that arrived too late to be spent).
    pub returned: u64,
    /// Unspent units quotad took back from settled leases.
    pub returned_units: u64,
    /// Answers `direct`: no lease, check each request for now.
    pub direct: u64,
    /// Refusals that marked a policy as not leasable.
    pub not_leasable: u64,
    /// Lease calls that failed (quotad unreachable, a deadline, a refusal
    /// of the lease named, or of the key: that key alone then goes
    /// unleased until [`NOT_LEASABLE_RECHECK`]).
    pub failed: u64,
    /// Leases held now that can still be spent.
    pub held: u64,
}

/// The counters behind [`LeaseStats`], but local admissions (counted per
/// slot, so spenders share no counter beyond the key's own).
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) local_flushed: AtomicU64,
    pub(crate) acquired: AtomicU64,
    pub(crate) renewed: AtomicU64,
    pub(crate) returned: AtomicU64,
    pub(crate) returned_units: AtomicU64,
    pub(crate) direct: AtomicU64,
    pub(crate) not_leasable: AtomicU64,
    pub(crate) failed: AtomicU64,
}

impl Counts {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The lease a slot holds: what settling it needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) id: String,
    pub(crate) units: u64,
}

/// A lease settled out of a slot: its id and what was spent of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Taken {
    pub(crate) id: String,
    pub(crate) spent: u64,
    /// Units that were still left, never to be spent: the settle gives
    /// them back.
    pub(crate) left: u64,
}

/// What one (policy, key) holds.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) policy: PolicyRef,
    pub(crate) key: String,
    /// The inline policy's lease terms; `None` for a named policy.
    pub(crate) terms: Option<LeaseTerms>,
    /// Units left to admit with the lease held: the one word spenders
    /// contend on.
    left: AtomicU64,
    /// The instant (client clock, ms, exclusive) the lease stops being
    /// spent.
    end_ms: AtomicU64,
    /// Past this instant a spend asks for a renewal (half the TTL)...
    renew_at_ms: AtomicU64,
    /// ...and so does a spend leaving this many units or fewer (half
    /// spent).
    renew_below: AtomicU64,
    limit: AtomicU64,
    /// When the key's state is back to fresh at the latest, per quotad.
    reset_until_ms: AtomicU64,
    /// No lease call before this instant (after `direct`, a failure or a
    /// refusal).
    direct_until_ms: AtomicU64,
    /// Local admissions not yet added to [`Counts::local_flushed`].
    admitted: AtomicU64,
    /// A lease call for this slot is in flight (its claimer owns the cold
    /// state until it clears this).
    calling: AtomicBool,
    /// The lease held, for settling it; touched only by the claimer.
    held: Mutex<Option<Held>>,
    /// A lease stopped (never to be spent again) and not yet settled: sent
    /// with the next lease call; touched only by the claimer.
    stopped: Mutex<Option<Taken>>,
}

/// What the local path answered.
#[derive(Debug)]
pub(crate) enum Spent {
    /// Admitted locally; with a slot whose lease call the caller claimed
    /// and must start (a renewal).
    Local(Decision, Option<Arc<Slot>>),
    /// Not answered locally: check with quotad; with a claimed slot whose
    /// lease call the caller must start (an acquisition).
    Miss(Option<Arc<Slot>>),
}

impl Slot {
    fn new(check: &Check) -> Self {
        Self {
            policy: check.policy().clone(),
            key: check.key().to_owned(),
            terms: check.inline_terms(),
            left: AtomicU64::new(0),
            end_ms: AtomicU64::new(0),
            renew_at_ms: AtomicU64::new(0),
            renew_below: AtomicU64::new(0),
            limit: AtomicU64::new(0),
            reset_until_ms: AtomicU64::new(0),
            direct_until_ms: AtomicU64::new(0),
            admitted: AtomicU64::new(0),
            // Made by a caller that starts its first lease call at once.
            calling: AtomicBool::new(true),
            held: Mutex::new(None),
            stopped: Mutex::new(None),
        }
    }

    fn is(&self, check: &Check) -> bool {
        self.key == check.key() && &self.policy == check.policy()
    }

    /// Takes the right to make this slot's next lease call.
    fn claim(&self) -> bool {
        self.calling
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Gives the right back, the call done.
    pub(crate) fn release(&self) {
        self.calling.store(false, Ordering::Release);
    }

    /// The local decision for `cost` units at `now_ms`, if the lease held
    /// covers it.
    fn spend(self: &Arc<Self>, cost: u64, now_ms: u64) -> Spent {
        // The end is read before the units: a lease swapped in meanwhile
        // ends later than the one whose end was read.
        if now_ms < self.end_ms.load(Ordering::Acquire)
            && let Ok(before) =
                self.left
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                        left.checked_sub(cost)
                    })
        {
            let left = before - cost;
            self.admitted.fetch_add(1, Ordering::Relaxed);
            let decision = Decision {
                allowed: true,
                limit: self.limit.load(Ordering::Relaxed),
                remaining: left,
                retry_after_ms: 0,
                reset_after_ms: self
                    .reset_until_ms
                    .load(Ordering::Relaxed)
                    .saturating_sub(now_ms),
                reason: Reason::WithinLimit,
            };
            let due = left <= self.renew_below.load(Ordering::Relaxed)
                || now_ms >= self.renew_at_ms.load(Ordering::Relaxed);
            let renew =
                due && now_ms >= self.direct_until_ms.load(Ordering::Relaxed) && self.claim();
            return Spent::Local(decision, renew.then(|| Arc::clone(self)));
        }
        let call = now_ms >= self.direct_until_ms.load(Ordering::Relaxed) && self.claim();
        Spent::Miss(call.then(|| Arc::clone(self)))
    }

    /// Stops the lease held from being spent, and hands it over for
    /// settling: `None` when none is held or it has ended by `now_ms`
    /// (nothing to give back). Claimer only.
    pub(crate) fn take(&self, now_ms: u64) -> Option<Taken> {
        let held = self.held.lock().take();
        // Units left now are the ones never admitted: every spend either
        // came before this swap (and is counted in `spent`) or finds 0.
        let left = self.left.swap(0, Ordering::AcqRel);
        let held = held?;
        if now_ms >= self.end_ms.load(Ordering::Acquire) {
            return None;
        }
        Some(Taken {
            spent: held.units.saturating_sub(left),
            left,
            id: held.id,
        })
    }

    /// Keeps a stopped lease to settle with the next lease call (a settle
    /// that failed is sent again: quotad answers a settled one as ended or
    /// unknown, and the lease is never spent again either way). Claimer
    /// only.
    pub(crate) fn keep_stopped(&self, taken: Option<Taken>) {
        *self.stopped.lock() = taken;
    }

    /// The stopped lease to settle, if any. Claimer only.
    pub(crate) fn take_stopped(&self) -> Option<Taken> {
        self.stopped.lock().take()
    }

    /// Installs a new lease of `units`, spent until `end_ms`, renewed at
    /// `renew_at_ms` or half spent. Claimer only, after [`Slot::take`].
    pub(crate) fn install(
        &self,
        held: Held,
        end_ms: u64,
        renew_at_ms: u64,
        limit: u64,
        reset_until_ms: u64,
    ) {
        let units = held.units;
        *self.held.lock() = Some(held);
        self.limit.store(limit, Ordering::Relaxed);
        self.reset_until_ms.store(reset_until_ms, Ordering::Relaxed);
        self.renew_at_ms.store(renew_at_ms, Ordering::Relaxed);
        self.renew_below.store(units / 2, Ordering::Relaxed);
        self.end_ms.store(end_ms, Ordering::Release);
        // Last: a spender that sees the units sees everything above.
        self.left.store(units, Ordering::Release);
    }

    /// No lease call before `until_ms`.
    pub(crate) fn hold_off(&self, until_ms: u64) {
        self.direct_until_ms.store(until_ms, Ordering::Relaxed);
    }

    /// Local admissions since the last call, now counted elsewhere.
    pub(crate) fn flush_admitted(&self) -> u64 {
        self.admitted.swap(0, Ordering::Relaxed)
    }

    /// Whether a lease is held that can still be spent at `now_ms`.
    pub(crate) fn holds(&self, now_ms: u64) -> bool {
        now_ms < self.end_ms.load(Ordering::Acquire) && self.held.lock().is_some()
    }

    /// Nothing held, nothing in flight, no back-off: the slot can go.
    fn idle(&self, now_ms: u64) -> bool {
        !self.calling.load(Ordering::Acquire)
            && now_ms >= self.end_ms.load(Ordering::Acquire)
            && now_ms >= self.direct_until_ms.load(Ordering::Relaxed)
    }
}

/// A hasher for keys that are already hashes.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed; fold anything else rather than panic.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Slots by hash of (policy, key); the slot keeps both, so a collision is
/// a key that goes unleased, never a wrong answer.
type Shard = HashMap<u64, Arc<Slot>, BuildHasherDefault<Prehashed>>;

/// Every slot of a client, sharded, and the policies quotad refused.
#[derive(Debug)]
pub(crate) struct LeaseTable {
    pub(crate) options: LeaseOptions,
    hasher: foldhash::fast::RandomState,
    shards: Box<[RwLock<Shard>]>,
    per_shard: usize,
    /// Policies quotad refused leases for, until when.
    not_leasable: RwLock<HashMap<PolicyRef, u64>>,
    pub(crate) counts: Counts,
    /// Set by shutdown: nothing is leased any more.
    closed: AtomicBool,
}

impl LeaseTable {
    pub(crate) fn new(options: LeaseOptions) -> Self {
        Self {
            options,
            hasher: foldhash::fast::RandomState::default(),
            shards: (0..SHARDS).map(|_| RwLock::new(Shard::default())).collect(),
            per_shard: options.max_keys.div_ceil(SHARDS),
            not_leasable: RwLock::new(HashMap::new()),
            counts: Counts::default(),
            closed: AtomicBool::new(false),
        }
    }

    fn shard(&self, hash: u64) -> &RwLock<Shard> {
        // Bits the shard's own map does not index or tag with.
        &self.shards[(hash >> 32) as usize % SHARDS]
    }

    /// The local answer to `check` at `now_ms`, or a miss; either may come
    /// with a slot whose lease call the caller must start.
    pub(crate) fn spend(&self, check: &Check, now_ms: u64) -> Spent {
        if check.cost_units() == 0 {
            // Not a check quotad would decide: it goes there, to be refused
            // with INVALID_ARGUMENT, rather than admitted for nothing here.
            return Spent::Miss(None);
        }
        if matches!(check.policy(), PolicyRef::Inline(_)) && check.inline_terms().is_none() {
            // An inline policy without terms has nothing to lease with.
            return Spent::Miss(None);
        }
        if self.closed.load(Ordering::Relaxed) {
            return Spent::Miss(None);
        }
        let hash = self.hasher.hash_one((check.policy(), check.key()));
        let shard = self.shard(hash);
        if let Some(slot) = shard.read().get(&hash) {
            return if slot.is(check) {
                slot.spend(check.cost_units(), now_ms)
            } else {
                Spent::Miss(None)
            };
        }
        if self.refused(check.policy(), now_ms) {
            return Spent::Miss(None);
        }
        let mut map = shard.write();
        if let Some(slot) = map.get(&hash) {
            return if slot.is(check) {
                slot.spend(check.cost_units(), now_ms)
            } else {
                Spent::Miss(None)
            };
        }
        if map.len() >= self.per_shard {
            let gone: Vec<u64> = map
                .iter()
                .filter(|(_, s)| s.idle(now_ms))
                .map(|(h, _)| *h)
                .collect();
            for h in gone {
                if let Some(slot) = map.remove(&h) {
                    self.flush(&slot);
                }
            }
            if map.len() >= self.per_shard {
                // Full of keys holding leases: this one is checked call by
                // call.
                return Spent::Miss(None);
            }
        }
        let slot = Arc::new(Slot::new(check));
        map.insert(hash, Arc::clone(&slot));
        Spent::Miss(Some(slot))
    }

    /// Adds a slot's local admissions to the flushed count, and to the
    /// metric (counted here, off the hot path).
    pub(crate) fn flush(&self, slot: &Slot) {
        let n = slot.flush_admitted();
        if n > 0 {
            self.counts.local_flushed.fetch_add(n, Ordering::Relaxed);
            metrics::counter!("quotad_client_local_admissions_total", "policy" => label(&slot.policy))
                .increment(n);
        }
    }

    /// Whether quotad refused leases for `policy` recently.
    fn refused(&self, policy: &PolicyRef, now_ms: u64) -> bool {
        let refused = self.not_leasable.read();
        refused.get(policy).is_some_and(|&until| now_ms < until)
    }

    /// Remembers that quotad refuses leases for `policy` until `until_ms`.
    pub(crate) fn refuse(&self, policy: &PolicyRef, until_ms: u64) {
        self.not_leasable.write().insert(policy.clone(), until_ms);
    }

    /// Stops leasing: every check goes to quotad from now on.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Every slot, for shutdown and the stats.
    pub(crate) fn slots(&self) -> Vec<Arc<Slot>> {
        self.shards
            .iter()
            .flat_map(|s| s.read().values().cloned().collect::<Vec<_>>())
            .collect()
    }

    /// Takes a slot's claim for shutdown: `false` while its call is in
    /// flight.
    pub(crate) fn claim(slot: &Slot) -> bool {
        slot.claim()
    }

    /// The counts now.
    pub(crate) fn stats(&self, now_ms: u64) -> LeaseStats {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let c = &self.counts;
        let mut stats = LeaseStats {
            local_admissions: load(&c.local_flushed),
            acquired: load(&c.acquired),
            renewed: load(&c.renewed),
            returned: load(&c.returned),
            returned_units: load(&c.returned_units),
            direct: load(&c.direct),
            not_leasable: load(&c.not_leasable),
            failed: load(&c.failed),
            held: 0,
        };
        for slot in self.slots() {
            stats.local_admissions += slot.admitted.load(Ordering::Relaxed);
            stats.held += u64::from(slot.holds(now_ms));
        }
        stats
    }
}

/// The metrics label of a policy: its name, or `inline` (never the key).
pub(crate) fn label(policy: &PolicyRef) -> String {
    match policy {
        PolicyRef::Named(name) => name.clone(),
        PolicyRef::Inline(_) => "inline".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> LeaseTable {
        LeaseTable::new(LeaseOptions::try_new(10).expect("valid"))
    }

    fn held(units: u64) -> Held {
        Held {
            id: "L1".to_owned(),
            units,
        }
    }

    #[test]
    fn want_must_be_from_one_to_two_to_the_fifty_third() {
        assert_eq!(LeaseOptions::try_new(0), Err(LeaseOptionsError::Want(0)));
        assert!(LeaseOptions::try_new(MAX_LEASE_WANT).is_ok());
        assert!(LeaseOptions::try_new(MAX_LEASE_WANT + 1).is_err());
    }

    #[test]
    fn a_lease_ends_at_its_send_time_plus_the_ttl_less_a_thousandth_and_the_margin() {
        let options = LeaseOptions::try_new(10).expect("valid");
        assert_eq!(options.end_ms(1_000, 10_000), 1_000 + 10_000 - 10 - 5);
        // 0.1% of 1,500 ms is 1.5 ms: rounded up, never later.
        assert_eq!(options.end_ms(0, 1_500), 1_500 - 2 - 5);
        let tight = options.margin(Duration::from_micros(1));
        assert_eq!(tight.end_ms(0, 100), 100 - 1 - 1);
        assert_eq!(options.end_ms(0, 3), 0, "too short to spend");
    }

    #[test]
    fn the_first_check_misses_and_claims_the_acquisition_once() {
        let table = table();
        let check = Check::named("api", "k");
        let Spent::Miss(Some(slot)) = table.spend(&check, 0) else {
            panic!("a first check claims the acquisition");
        };
        assert!(
            matches!(table.spend(&check, 0), Spent::Miss(None)),
            "already in flight"
        );
        slot.install(held(5), 100, 50, 10, 60_000);
        slot.release();
        let Spent::Local(d, renew) = table.spend(&check.clone().cost(2), 10) else {
            panic!("spent locally");
        };
        assert!(d.allowed && renew.is_none());
        assert_eq!(
            (d.remaining, d.limit, d.reason),
            (3, 10, Reason::WithinLimit)
        );
        assert_eq!(d.reset_after_ms, 60_000 - 10);
        // Half spent: this spend claims the renewal.
        let Spent::Local(d, Some(_)) = table.spend(&check, 10) else {
            panic!("renewal due");
        };
        assert_eq!(d.remaining, 2);
        assert_eq!(table.stats(10).local_admissions, 2);
    }

    #[test]
    fn a_lease_is_never_spent_at_or_after_its_end() {
        let table = table();
        let check = Check::named("api", "k");
        let Spent::Miss(Some(slot)) = table.spend(&check, 0) else {
            panic!("claims");
        };
        slot.install(held(100), 100, 1_000, 100, 0);
        slot.release();
        assert!(matches!(table.spend(&check, 99), Spent::Local(..)));
        assert!(matches!(table.spend(&check, 100), Spent::Miss(_)));
    }

    #[test]
    fn taking_a_lease_reports_what_was_spent_and_stops_it_for_good() {
        let table = table();
        let check = Check::named("api", "k");
        let Spent::Miss(Some(slot)) = table.spend(&check, 0) else {
            panic!("claims");
        };
        slot.install(held(10), 100, 1_000, 10, 0);
        for _ in 0..3 {
            assert!(matches!(table.spend(&check, 1), Spent::Local(..)));
        }
        let taken = slot.take(2).expect("live");
        assert_eq!((taken.spent, taken.left), (3, 7));
        assert!(matches!(table.spend(&check, 2), Spent::Miss(None)), "taken");
        // Kept only to be settled: never spent again.
        slot.keep_stopped(Some(taken));
        assert!(matches!(table.spend(&check, 3), Spent::Miss(None)));
        assert_eq!(slot.take_stopped().map(|t| t.spent), Some(3));
        assert_eq!(slot.take(100), None, "ended: nothing to give back");
    }

    #[test]
    fn inline_policies_without_terms_are_never_leased() {
        let table = table();
        let policy = quotad_core::Policy::try_new(
            quotad_core::Algorithm::FixedWindow,
            10,
            Duration::from_secs(1),
            None,
        )
        .expect("valid");
        assert!(matches!(
            table.spend(&Check::inline(policy, "k"), 0),
            Spent::Miss(None)
        ));
        let terms = LeaseTerms::try_new(5, 1, Duration::from_secs(1)).expect("valid");
        assert!(matches!(
            table.spend(&Check::inline(policy, "k").lease_terms(terms), 0),
            Spent::Miss(Some(_))
        ));
    }

    #[test]
    fn a_refused_policy_is_not_leased_until_the_recheck() {
        let table = table();
        let check = Check::named("plain", "k");
        table.refuse(check.policy(), 1_000);
        assert!(matches!(table.spend(&check, 999), Spent::Miss(None)));
        assert!(matches!(table.spend(&check, 1_000), Spent::Miss(Some(_))));
    }
}
