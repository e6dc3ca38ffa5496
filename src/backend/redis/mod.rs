//! The Redis backend: quotad replicas become stateless and Redis owns the
//! state, standalone or as a Cluster.
//!
//! Every transition is one call of one Lua script (`quota.lua`), which loads
//! the state, brings it forward, decides, writes it back and sets its TTL
//! atomically, with the same integer arithmetic as quotad-core and the Redis
//! server's clock (`TIME`), so replicas with skewed clocks agree. The script
//! is called by SHA and loaded again transparently after `SCRIPT FLUSH` or a
//! restart (NOSCRIPT). An acquire of a concurrency slot is an item of that
//! script too (its slots' part, `slots.lua`, is put in front of it), so an
//! all-or-nothing batch of rates and acquires is one atomic call, and a
//! Peek of a concurrency policy reads its slots there; a lone Acquire,
//! Renew or Release is `concurrency.lua`, with the same slots' part.
//!
//! Keys (see `keys.rs`) are `<prefix>:<policy>|{<key>}|<format><algorithm><window_ms>`:
//! the braces make the rate-limit key the Redis Cluster hash tag, so one key
//! under several policies lives in one slot and an `ALL_OR_NOTHING` batch
//! over them is one atomic script; a batch spanning slots is refused with
//! [`BackendError::CrossSlot`]. The suffix binds the state to the algorithm,
//! the window and the state format, so replicas that disagree during a
//! rollout count apart instead of overwriting each other. A key's leases
//! are a second key of the same name and hash tag (its ledger), read and
//! written by the same script.
//!
//! Faults (see `connection.rs`, `deadline.rs`, `errors.rs`): every script
//! carries a deadline in Redis's clock and refuses to run past it; a
//! connection that falls silent is replaced in bounded time (a Cluster's
//! made again, following failovers); every error is classified on
//! purpose; unreadable state fails only its own key's items; passwords and
//! keys never reach errors or logs ([`redact`]).
//!
//! This file is the [`Backend`] over Redis —
//! checks, batches split into scripts and put back in order, resets,
//! health — against the script's reply format; connections, deadlines,
//! errors, keys and the script's codes (`wire.rs`) have files of their
//! own.

mod connection;
mod deadline;
mod errors;
mod keys;
mod overrides;
mod tls;
mod wire;

// Where Redis is and how calls to it are bounded are settings, declared
// with the configuration; the backend takes them as they are.
pub use crate::config::redis::{
    DEFAULT_MAX_ATOMIC_ITEMS, DEFAULT_RECONNECT_AFTER_TIMEOUTS, RedisSettings, RedisTarget,
    RedisTls, redact,
};

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use quotad_core::{
    Algorithm, BatchMode, CheckItem, Clock, Decision, Grant, LeaseAnswer, LeaseError, LeaseOutcome,
    Policy, SlotAnswer, SlotError,
};
use redis::{Cmd, RedisResult, Script, Value};

use self::connection::{
    Bound, CORRUPT_STATE, CallError, Connections, Counts, LateReply, Link, local_ms,
};
use self::wire::UNREADABLE;
use super::{
    AcquireResult, Atomicity, Backend, BackendError, BackendStats, Deadline, Fault, Figure,
    ItemResult, LeaseItem, LeaseResult, NotRun, SlotItem, SlotResult,
};

/// Checks, batches and peeks of every algorithm, acquires of concurrency
/// slots included: one script, so an all-or-nothing batch of rates and
/// acquires is one atomic call. The slots' part (`slots.lua`) comes first,
/// shared with [`CONCURRENCY_SCRIPT`].
const SCRIPT: &str = concat!(include_str!("slots.lua"), include_str!("quota.lua"));

/// A lone acquire, renew and release of one key's concurrency slots, by
/// the same slots' part as [`SCRIPT`].
const CONCURRENCY_SCRIPT: &str =
    concat!(include_str!("slots.lua"), include_str!("concurrency.lua"));

/// `Reset`: refuses past its deadline (`ARGV[1]`, ms in Redis's clock) as
/// the checks' script does; 1 done, 0 refused. It forgets the key's state
/// (`KEYS[1]`) and its leases (`KEYS[2]`), as the memory store does.
const RESET_SCRIPT: &str = "local t = redis.call('TIME') \
if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[1]) then return 0 end \
redis.call('UNLINK', KEYS[1], KEYS[2]) return 1";

/// What the Redis backend has counted since start, for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedisCounts {
    /// Connection attempts (to a standalone Redis, or a whole Cluster)
    /// that connected.
    pub connected: u64,
    /// Connection attempts that failed.
    pub connect_failures: u64,
    /// Scripts Redis refused to run because quotad had given up on them.
    pub late_refused: u64,
    /// Scripts that ran in time but whose reply came after quotad had
    /// answered the call as failed: counted although answered as failed.
    pub late_counted: u64,
    /// Calls that found a key holding state the script cannot read.
    pub corrupt_state: u64,
}

impl RedisCounts {
    /// The counts as the series the metrics export. (`metrics.rs` declares
    /// them too, so that they are there at 0 with any backend.)
    pub fn figures(&self) -> Vec<Figure> {
        let figure = |name, labels, value| Figure {
            name,
            labels,
            value,
        };
        vec![
            figure(CONNECTS, &[("outcome", "ok")], self.connected),
            figure(CONNECTS, &[("outcome", "error")], self.connect_failures),
            figure(LATE, &[("outcome", "refused")], self.late_refused),
            figure(LATE, &[("outcome", "counted")], self.late_counted),
            figure(CORRUPT, &[], self.corrupt_state),
        ]
    }
}

/// The series of [`RedisCounts::figures`].
const CONNECTS: &str = "quotad_redis_connection_attempts_total";
const LATE: &str = "quotad_redis_late_scripts_total";
const CORRUPT: &str = "quotad_redis_corrupt_state_total";

/// The Redis state store.
#[derive(Clone)]
pub struct RedisBackend {
    connections: Arc<Connections>,
    prefix: Arc<str>,
    /// `store.redis.max_atomic_items`.
    max_atomic_items: usize,
    script: Arc<Script>,
    concurrency: Arc<Script>,
    /// Concurrency slots the scripts dropped as ended unreleased.
    slots_expired: Arc<std::sync::atomic::AtomicU64>,
    /// Tests only: a clock to decide by instead of Redis `TIME`.
    clock: Option<Arc<dyn Clock>>,
    /// Tests only: quotad's reading of Redis's clock, when it is not the
    /// test clock itself.
    reading: Option<Arc<dyn Clock>>,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("connections", &self.connections)
            .finish_non_exhaustive()
    }
}

/// What the script is asked to do with a batch.
#[derive(Clone, Copy)]
enum Mode {
    Check,
    AllOrNothing,
    Peek,
}

impl Mode {
    fn as_arg(self) -> &'static str {
        match self {
            Mode::Check => "check",
            Mode::AllOrNothing => "all",
            Mode::Peek => "peek",
        }
    }
}

/// Units of work per script of an independent batch on a standalone Redis
/// ([`weight`]: 64 checks, or 16 sliding logs), so that no script runs
/// long enough to stall Redis for everyone else: a few milliseconds of
/// Redis time at the worst measured (BENCHMARKS.md). Also the default of
/// `store.redis.max_atomic_items`, the all-or-nothing batch's bound in
/// items.
const CHUNK: usize = DEFAULT_MAX_ATOMIC_ITEMS;

/// Numbers the script answers per item: remaining, retry_after_ms,
/// reset_after_ms, reason.
const PER_ITEM: usize = 4;

/// Numbers the fixed window's short path answers for a lone check it
/// admitted: remaining, reset_after_ms (the least a reply can carry; each
/// number costs Redis time).
const ADMITTED: usize = 2;

impl RedisBackend {
    /// Connects to Redis and reads its clock.
    ///
    /// # Errors
    ///
    /// [`BackendError::Unavailable`] when Redis cannot be reached within the
    /// timeout.
    pub async fn connect(settings: &RedisSettings) -> Result<Self, BackendError> {
        Ok(Self {
            connections: Arc::new(Connections::connect(settings).await?),
            prefix: settings.key_prefix.as_str().into(),
            max_atomic_items: settings.max_atomic_items,
            script: Arc::new(Script::new(SCRIPT)),
            concurrency: Arc::new(Script::new(CONCURRENCY_SCRIPT)),
            slots_expired: Arc::default(),
            clock: None,
            reading: None,
        })
    }

    /// Decides by `clock` instead of the Redis server's `TIME`. For tests
    /// that compare backends at injected instants; never set by the server.
    #[doc(hidden)]
    #[must_use]
    pub fn with_test_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Takes `reading` for quotad's reading of Redis's clock (what the
    /// server estimates as its own clock plus the offset the link has
    /// measured), from which a calendar item's bounds are computed, while
    /// the script decides by the test clock: a reading that lags or leads
    /// the instant decided at, as a real one may. For tests; never set by
    /// the server.
    #[doc(hidden)]
    #[must_use]
    pub fn with_test_reading(mut self, reading: Arc<dyn Clock>) -> Self {
        self.reading = Some(reading);
        self
    }

    /// What the backend has counted since start.
    pub fn counts(&self) -> RedisCounts {
        let c = &self.connections.counts;
        RedisCounts {
            connected: c.connected.load(Ordering::Relaxed),
            connect_failures: c.connect_failures.load(Ordering::Relaxed),
            late_refused: c.late_refused.load(Ordering::Relaxed),
            late_counted: c.late_counted.load(Ordering::Relaxed),
            corrupt_state: c.corrupt.load(Ordering::Relaxed),
        }
    }

    /// Whether `items` fit in one all-or-nothing script
    /// (`store.redis.max_atomic_items`, a sliding log or an acquire counting
    /// as 4).
    fn fits_one_script<'i>(&self, items: impl IntoIterator<Item = CheckItem<'i>>) -> bool {
        items.into_iter().map(|i| weight(&i)).sum::<usize>() <= self.max_atomic_items
    }

    /// Runs the script over `items` in one call, with a deadline in Redis's
    /// clock past which it refuses to run: the moment quotad gives up on
    /// the call, at `store.redis.timeout` or the caller's earlier
    /// `deadline`.
    async fn eval(
        &self,
        mode: Mode,
        items: &[CheckItem<'_>],
        deadline: Deadline,
    ) -> Result<Vec<ItemResult>, BackendError> {
        let bound = self.connections.bound(deadline);
        let keys = self.keys(items);
        let slot = match (self.connections.is_cluster(), keys.first()) {
            (true, Some(key)) => deadline::slot(key.as_bytes()),
            _ => 0,
        };
        let call = self.start(slot, &bound).await?;
        self.eval_on(&call, mode, items, &keys).await
    }

    fn keys(&self, items: &[CheckItem<'_>]) -> Vec<String> {
        items
            .iter()
            .map(|item| keys::state_key(&self.prefix, item.name(), item.policy(), item.key()))
            .collect()
    }

    /// The instant the script will decide at, as well as quotad knows it:
    /// the test clock's, or Redis's clock by the offset the link has
    /// measured (the deadline's).
    fn redis_now(&self, call: &Call<'_>) -> u64 {
        match (&self.reading, &self.clock) {
            (Some(reading), _) => reading.now_ms(),
            (None, Some(clock)) => clock.now_ms(),
            (None, None) => {
                let local = local_ms();
                call.link
                    .offsets
                    .redis_now(call.slot, local)
                    .unwrap_or(call.deadline)
            }
        }
    }

    /// The link a call to `slot` goes over and its deadline in Redis's
    /// clock, both from one connection.
    async fn start<'b>(&self, slot: u16, bound: &'b Bound) -> Result<Call<'b>, BackendError> {
        let failed = |e: CallError| e.into_backend(bound);
        let link = self.connections.link(slot, bound).await.map_err(failed)?;
        let deadline = self
            .connections
            .deadline(&link, slot, bound)
            .await
            .map_err(failed)?;
        Ok(Call {
            link,
            bound,
            slot,
            deadline,
        })
    }

    /// Runs the script over `items` as one call over `call`'s link. The
    /// request is sent at the first poll, before anything is awaited, so
    /// calls started in order reach Redis in order.
    async fn eval_on(
        &self,
        call: &Call<'_>,
        mode: Mode,
        items: &[CheckItem<'_>],
        keys: &[String],
    ) -> Result<Vec<ItemResult>, BackendError> {
        let failed = |e: CallError| match e {
            CallError::Corrupt(detail) => unreadable(items, keys, &detail),
            other => other.into_backend(call.bound),
        };
        let redis_now = self.redis_now(call);
        let args = |cmd: &mut Cmd| {
            for item in items {
                let policy = item.policy();
                cmd.arg(wire::algorithm(policy.algorithm()))
                    .arg(policy.limit());
                match item.slot() {
                    // An acquire: the slot's TTL, and its id (a decimal
                    // string: a double cannot hold every u64) in
                    // capacity's place, which is the limit sent already.
                    Some(id) => {
                        cmd.arg(policy.slot_ttl_ms()).arg(id.to_string());
                    }
                    None => {
                        window_arg(cmd, policy, redis_now);
                        cmd.arg(policy.capacity());
                    }
                }
                cmd.arg(item.cost().get());
            }
        };
        let reply = self
            .send(call, mode.as_arg(), keys, &args)
            .await
            .map_err(failed)?;
        let received = local_ms();
        let numbers = integers(&reply)?;
        match numbers.as_slice() {
            [time] => {
                call.link
                    .offsets
                    .record(call.slot, u64::try_from(*time).unwrap_or(0), received);
                self.connections
                    .counts
                    .late_refused
                    .fetch_add(1, Ordering::Relaxed);
                Err(NotRun::RefusedLate("script").into())
            }
            [time, rest @ ..] => {
                call.link
                    .offsets
                    .record(call.slot, u64::try_from(*time).unwrap_or(0), received);
                // A call holding acquires answers the ended slots it
                // dropped last.
                let (rest, expired) = match rest {
                    [rest @ .., expired] if items.iter().any(|i| i.slot().is_some()) => {
                        (rest, Some(*expired))
                    }
                    rest => (rest, None),
                };
                let decided = decisions(rest, items)?;
                // Counted once the reply is known to be well formed.
                if let Some(expired) = expired {
                    self.count_expired(expired);
                }
                Ok(decided
                    .into_iter()
                    .enumerate()
                    .map(|(i, d)| {
                        d.ok_or_else(|| {
                            self.connections
                                .counts
                                .corrupt
                                .fetch_add(1, Ordering::Relaxed);
                            unreadable_item(items[i].name(), &keys[i])
                        })
                    })
                    .collect())
            }
            [] => Err(BackendError::Internal(Fault::Reply(format!(
                "the script answered {reply:?}"
            )))),
        }
    }

    /// Sends the script over `call`'s link with `keys`, the mode, the
    /// deadline and the test clock, then what `args` adds: by SHA, and
    /// whole when Redis has not loaded it. The request goes out at the
    /// first poll, before anything is awaited.
    async fn send(
        &self,
        call: &Call<'_>,
        mode: &str,
        keys: &[String],
        args: &(dyn Fn(&mut Cmd) + Sync),
    ) -> Result<Value, CallError> {
        self.send_script(call, (&self.script, SCRIPT), mode, keys, args)
            .await
    }

    /// [`RedisBackend::send`] of `script` (loaded, and its source).
    async fn send_script(
        &self,
        call: &Call<'_>,
        (script, source): (&Script, &'static str),
        mode: &str,
        keys: &[String],
        args: &(dyn Fn(&mut Cmd) + Sync),
    ) -> Result<Value, CallError> {
        // The test clock, read once: the NOSCRIPT retry sends the same.
        let now = self.clock.as_ref().map(|clock| clock.now_ms());
        let command = |name: &str, script: &str| {
            let mut cmd = Cmd::new();
            cmd.arg(name)
                .arg(script)
                .arg(keys.len())
                .arg(keys)
                .arg(mode)
                .arg(call.deadline);
            match now {
                Some(ms) => cmd.arg(ms),
                None => cmd.arg(""),
            };
            args(&mut cmd);
            cmd
        };
        let counts = Arc::clone(&self.connections.counts);
        let late = || -> LateReply {
            let counts = Arc::clone(&counts);
            Box::new(move |reply| late_reply(&counts, reply))
        };
        let connections = &self.connections;
        let (link, bound, slot) = (&call.link, call.bound, call.slot);
        match connections
            .call(
                link,
                slot,
                command("EVALSHA", script.get_hash()),
                bound,
                Some(late()),
            )
            .await
        {
            // Not loaded (a restart, SCRIPT FLUSH, a failover): EVAL loads it.
            Err(CallError::NoScript(_)) => {
                connections
                    .call(link, slot, command("EVAL", source), bound, Some(late()))
                    .await
            }
            other => other,
        }
    }

    /// Runs the script over `items` in one call: every item decided, or
    /// every item failed.
    async fn eval_each(
        &self,
        mode: Mode,
        items: &[CheckItem<'_>],
        deadline: Deadline,
    ) -> Vec<ItemResult> {
        match self.eval(mode, items, deadline).await {
            Ok(results) => results,
            Err(error) => vec![Err(error); items.len()],
        }
    }

    /// Items decided (or, by [`Mode::Peek`], looked at) each on its own.
    /// On a Cluster, they may live in different slots, so each goes in its
    /// own call (all concurrently, over one multiplexed connection per
    /// node) and a node that is down fails only its own items; a
    /// standalone server takes them in scripts of at most [`CHUNK`] units.
    async fn each(
        &self,
        mode: Mode,
        items: &[CheckItem<'_>],
        deadline: Deadline,
    ) -> Vec<ItemResult> {
        if self.connections.is_cluster() {
            let calls = items
                .iter()
                .map(|item| self.eval_each(mode, std::slice::from_ref(item), deadline));
            futures_util::future::join_all(calls)
                .await
                .into_iter()
                .flatten()
                .collect()
        } else if units(items) <= CHUNK {
            self.eval_each(mode, items, deadline).await
        } else {
            // Pipelined scripts over one link with one deadline: Redis
            // serves other clients between them. Each key's items are in
            // one script, in the batch's order ([`scripts`]), so they are
            // decided in that order whatever order the scripts run in (a
            // script that met a lost script cache is sent again after the
            // next ones ran). Only a key with more than one script's worth
            // of items spans scripts; those are sent in order (each at its
            // first poll, which join_all gives them in order).
            let bound = self.connections.bound(deadline);
            let call = match self.start(0, &bound).await {
                Ok(call) => call,
                Err(error) => return vec![Err(error); items.len()],
            };
            let cut = scripts(items);
            let calls = cut.iter().map(|script| {
                let chunk: Vec<CheckItem<'_>> = script.iter().map(|&i| items[i]).collect();
                let keys = self.keys(&chunk);
                let call = &call;
                async move {
                    match self.eval_on(call, mode, &chunk, &keys).await {
                        Ok(results) => results,
                        Err(error) => vec![Err(error); chunk.len()],
                    }
                }
            });
            let answers = futures_util::future::join_all(calls).await;
            let mut results: Vec<Option<ItemResult>> = vec![None; items.len()];
            for (script, answers) in cut.iter().zip(answers) {
                for (&i, answer) in script.iter().zip(answers) {
                    results[i] = Some(answer);
                }
            }
            results
                .into_iter()
                .map(|r| r.expect("every item is in one script, which answers each"))
                .collect()
        }
    }
}

impl RedisBackend {
    /// Runs `concurrency.lua` in `mode` on the slots of `(name, key)`:
    /// the reply's numbers after a refusal check (a script past its
    /// deadline is an error, as a check's).
    #[allow(clippy::too_many_arguments, reason = "one call's arguments, named")]
    async fn slots_call(
        &self,
        name: &str,
        key: &str,
        policy: &Policy,
        mode: &str,
        cost: u64,
        id: u64,
        deadline: Deadline,
    ) -> Result<Vec<i64>, BackendError> {
        let keys = [keys::state_key(&self.prefix, name, policy, key)];
        let slot = if self.connections.is_cluster() {
            deadline::slot(keys[0].as_bytes())
        } else {
            0
        };
        let bound = self.connections.bound(deadline);
        let call = self.start(slot, &bound).await?;
        let args = |cmd: &mut Cmd| {
            cmd.arg(policy.limit())
                .arg(policy.slot_ttl_ms())
                .arg(cost)
                .arg(id.to_string());
        };
        let reply = self
            .send_script(
                &call,
                (&self.concurrency, CONCURRENCY_SCRIPT),
                mode,
                &keys,
                &args,
            )
            .await
            .map_err(|e| match e {
                CallError::Corrupt(_) => unreadable_item(name, &keys[0]),
                other => other.into_backend(&bound),
            })?;
        let received = local_ms();
        let numbers = integers(&reply)?;
        if let Some(&time) = numbers.first() {
            call.link
                .offsets
                .record(slot, u64::try_from(time).unwrap_or(0), received);
        }
        if numbers.len() == 1 {
            self.connections
                .counts
                .late_refused
                .fetch_add(1, Ordering::Relaxed);
            return Err(NotRun::RefusedLate("script").into());
        }
        Ok(numbers)
    }

    /// Counts slots a script dropped as ended unreleased.
    fn count_expired(&self, expired: i64) {
        if let Ok(n) = u64::try_from(expired) {
            self.slots_expired.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// A renew or release of one slot.
    async fn slot_change(&self, slot: &SlotItem<'_>, mode: &str, deadline: Deadline) -> SlotResult {
        let numbers = self
            .slots_call(
                slot.name,
                slot.key,
                &slot.policy,
                mode,
                1,
                slot.id,
                deadline,
            )
            .await?;
        let bad = || {
            BackendError::Internal(Fault::Reply(format!(
                "the concurrency script answered {numbers:?}"
            )))
        };
        let n = |v: i64| u64::try_from(v).map_err(|_| bad());
        let [time, held, remaining, ends_at, expired] = numbers[..] else {
            return Err(bad());
        };
        self.count_expired(expired);
        let now = n(time)?;
        let answer = SlotAnswer {
            slot: (held == 1).then_some(Grant {
                id: slot.id,
                units: 0,
                granted_at: now,
                ends_at: n(ends_at)?,
            }),
            limit: slot.policy.limit(),
            remaining: n(remaining)?,
        };
        Ok(answer)
    }
}

/// What one item costs a script, in units of the cheapest check: a
/// sliding log's searches and trims a sorted set, up to about four times
/// the others' at its 10,000-entry cap (BENCHMARKS.md); an acquire reads
/// every slot its key holds (up to its limit, 10,000), counted as a log.
fn weight(item: &CheckItem<'_>) -> usize {
    match item.policy().algorithm() {
        Algorithm::SlidingLog | Algorithm::Concurrency => 4,
        _ => 1,
    }
}

fn units(items: &[CheckItem<'_>]) -> usize {
    items.iter().map(weight).sum()
}

/// `items` cut into scripts of at most [`CHUNK`] units each (64 checks, or
/// 16 sliding logs), as the indices of the items each holds. Each key's
/// items go together, in the batch's order, into one script when they fit
/// in one; keys come in the order of their first item. A key with more
/// items than one script holds spans consecutive scripts, in order.
fn scripts(items: &[CheckItem<'_>]) -> Vec<Vec<usize>> {
    let mut by_key: Vec<Vec<usize>> = Vec::new();
    let mut group_of: HashMap<(&str, &str), usize> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        let group = *group_of
            .entry((item.name(), item.key()))
            .or_insert_with(|| {
                by_key.push(Vec::new());
                by_key.len() - 1
            });
        by_key[group].push(i);
    }
    let (mut cut, mut script, mut used) = (Vec::new(), Vec::new(), 0);
    for group in by_key {
        let units: usize = group.iter().map(|&i| weight(&items[i])).sum();
        if units <= CHUNK {
            if used + units > CHUNK {
                cut.push(std::mem::take(&mut script));
                used = 0;
            }
            script.extend(group);
            used += units;
            continue;
        }
        for i in group {
            if used + weight(&items[i]) > CHUNK && !script.is_empty() {
                cut.push(std::mem::take(&mut script));
                used = 0;
            }
            script.push(i);
            used += weight(&items[i]);
        }
    }
    if !script.is_empty() {
        cut.push(script);
    }
    cut
}

/// One call's link, bound, slot and deadline in Redis's clock.
struct Call<'b> {
    link: Arc<Link>,
    bound: &'b Bound,
    slot: u16,
    deadline: u64,
}

/// An item's window argument: the window's length, or for a calendar
/// policy the bounds of its local periods around `redis_now`, which the
/// script cannot compute (Lua has no time zones). Four bounds, three
/// consecutive periods, `prev:start:end:next`: the script picks the one
/// holding its own instant (its `TIME`, or the state's floor when the
/// clock stepped back), which is within a period of `redis_now` (quotad's
/// reading of that same clock, at most a round trip behind).
fn window_arg(cmd: &mut Cmd, policy: &Policy, redis_now: u64) {
    match policy.calendar_period() {
        None => {
            cmd.arg(policy.window_ms());
        }
        Some(calendar) => {
            let (start, end) = calendar.bounds(redis_now);
            let previous = if start == 0 {
                0
            } else {
                calendar.bounds(start - 1).0
            };
            let next = calendar.bounds(end).1;
            cmd.arg(format!("{previous}:{start}:{end}:{next}"));
        }
    }
}

/// The error of an item whose key holds state the script cannot read:
/// named by its policy and the SHA-256 of its Redis key (the key itself
/// may be a credential, and errors are logged).
fn unreadable_item(name: &str, redis_key: &str) -> BackendError {
    Fault::Corrupt(unreadable_message(name, redis_key)).into()
}

fn unreadable_message(name: &str, redis_key: &str) -> String {
    format!(
        "{CORRUPT_STATE} under policy {name:?} (redis key sha256 {})",
        fingerprint(redis_key)
    )
}

/// The first 16 hex digits of the SHA-256 of `redis_key`: what an operator
/// matches with `printf %s KEY | sha256sum`.
fn fingerprint(redis_key: &str) -> String {
    use std::fmt::Write as _;
    let digest = ring::digest::digest(&ring::digest::SHA256, redis_key.as_bytes());
    digest.as_ref()[..8]
        .iter()
        .fold(String::with_capacity(16), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

/// The error of a call the script refused whole for unreadable state:
/// `detail` is Redis's (`<key>: why`, or a `WRONGTYPE` message).
fn unreadable(items: &[CheckItem<'_>], keys: &[String], detail: &str) -> BackendError {
    let named = keys.iter().enumerate().find_map(|(i, key)| {
        let why = detail.strip_prefix(key.as_str())?.strip_prefix(": ")?;
        Some((i, why))
    });
    match (named, items) {
        (Some((i, why)), _) => BackendError::Internal(Fault::Corrupt(format!(
            "{}: {why}",
            unreadable_message(items[i].name(), &keys[i])
        ))),
        (None, [item]) => unreadable_item(item.name(), &keys[0]),
        (None, _) => Fault::Corrupt(CORRUPT_STATE.to_owned()).into(),
    }
}

/// Counts what Redis did with a script quotad had stopped waiting for: its
/// `TIME` alone (refused), or decisions too (it ran).
fn late_reply(counts: &Counts, reply: &RedisResult<Value>) {
    match reply {
        Ok(Value::Array(values)) if values.len() == 1 => {
            counts.late_refused.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Value::Array(values)) if values.len() > 1 => {
            counts.late_counted.fetch_add(1, Ordering::Relaxed);
            static LOG: std::sync::OnceLock<crate::log::Throttled> = std::sync::OnceLock::new();
            if let Some(suppressed) = LOG.get_or_init(crate::log::Throttled::default).record() {
                tracing::warn!(
                    suppressed,
                    "a script quotad had given up on ran in time: its reply came late (one line per interval: suppressed counts the others)"
                );
            }
        }
        _ => {}
    }
}

fn integers(reply: &Value) -> Result<Vec<i64>, BackendError> {
    let bad = || BackendError::Internal(Fault::Reply(format!("the script answered {reply:?}")));
    match reply {
        Value::Array(values) => values
            .iter()
            .map(|v| match v {
                Value::Int(n) => Ok(*n),
                _ => Err(bad()),
            })
            .collect(),
        _ => Err(bad()),
    }
}

impl Backend for RedisBackend {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn check_one(&self, item: &CheckItem<'_>, deadline: Deadline) -> ItemResult {
        self.eval(Mode::Check, std::slice::from_ref(item), deadline)
            .await?
            .remove(0)
    }

    async fn check(
        &self,
        items: &[CheckItem<'_>],
        mode: BatchMode,
        deadline: Deadline,
    ) -> Vec<ItemResult> {
        match mode {
            BatchMode::Independent => self.each(Mode::Check, items, deadline).await,
            BatchMode::AllOrNothing if !self.fits_one_script(items.iter().copied()) => {
                let error = BackendError::TooManyAtomicItems {
                    max: self.max_atomic_items,
                    got: units(items),
                };
                vec![Err(error); items.len()]
            }
            BatchMode::AllOrNothing => self.eval_each(Mode::AllOrNothing, items, deadline).await,
        }
    }

    /// A batch too large for one script is refused; on a Cluster, one
    /// that fits is atomic only when its keys share a slot, which the
    /// caller learns by sending it (a caller that can do without the
    /// atomicity, RLS, decides such batches item by item instead, as the
    /// reference does).
    fn atomicity<'i>(&self, items: impl IntoIterator<Item = CheckItem<'i>>) -> Atomicity {
        if !self.fits_one_script(items) {
            Atomicity::TooLarge
        } else if self.connections.is_cluster() {
            Atomicity::IfColocated
        } else {
            Atomicity::Atomic
        }
    }

    async fn peek(&self, item: &CheckItem<'_>, deadline: Deadline) -> ItemResult {
        self.eval(Mode::Peek, std::slice::from_ref(item), deadline)
            .await?
            .remove(0)
    }

    async fn peek_each(&self, items: &[CheckItem<'_>], deadline: Deadline) -> Vec<ItemResult> {
        self.each(Mode::Peek, items, deadline).await
    }

    /// Settles and grants in the key's own script (`quota.lua`, mode
    /// `lease`), in its slot, with its state and its ledger (`keys.rs`), by
    /// Redis `TIME` and under the same deadline as a check: a call quotad
    /// answered as failed grants and returns nothing later.
    async fn lease(&self, item: &LeaseItem<'_>, deadline: Deadline) -> LeaseResult {
        let key = keys::state_key(&self.prefix, item.name, &item.policy, item.key);
        let ledger = keys::ledger_key(&key);
        // One slot for both: the ledger's name has the state key's tag.
        let keys = [key, ledger];
        let slot = if self.connections.is_cluster() {
            deadline::slot(keys[0].as_bytes())
        } else {
            0
        };
        let bound = self.connections.bound(deadline);
        let call = self.start(slot, &bound).await?;
        let (policy, terms, ask) = (item.policy, item.terms, item.ask);
        let redis_now = self.redis_now(&call);
        let args = |cmd: &mut Cmd| {
            cmd.arg(wire::algorithm(policy.algorithm()))
                .arg(policy.limit());
            window_arg(cmd, &policy, redis_now);
            cmd.arg(policy.capacity())
                .arg(1)
                .arg(terms.max_units())
                .arg(terms.min_units())
                .arg(terms.max_ttl_ms())
                .arg(quotad_core::MAX_GRANTS_PER_KEY);
            // Ids as decimal strings: the script compares them as strings,
            // since a double cannot hold every u64.
            match ask.settle {
                Some(settle) => cmd
                    .arg(settle.id.to_string())
                    .arg(settle.ends_at)
                    .arg(settle.spent),
                None => cmd.arg("").arg(0).arg(0),
            };
            cmd.arg(ask.want).arg(ask.new_id.to_string());
        };
        let reply = self
            .send(&call, "lease", &keys, &args)
            .await
            .map_err(|e| match e {
                CallError::Corrupt(_) => unreadable_item(item.name, &keys[0]),
                other => other.into_backend(&bound),
            })?;
        let received = local_ms();
        let numbers = integers(&reply)?;
        if let Some(&time) = numbers.first() {
            call.link
                .offsets
                .record(slot, u64::try_from(time).unwrap_or(0), received);
        }
        if numbers.len() == 1 {
            self.connections
                .counts
                .late_refused
                .fetch_add(1, Ordering::Relaxed);
            return Err(NotRun::RefusedLate("script").into());
        }
        lease_outcome(&numbers, item)
    }

    /// Acquires in the key's own slots script (`concurrency.lua`), in its
    /// Cluster slot, by Redis `TIME` and under the same deadline as a
    /// check: an acquire quotad answered as failed takes nothing later.
    async fn acquire(&self, item: &CheckItem<'_>, deadline: Deadline) -> AcquireResult {
        let Some(id) = item.slot() else {
            return Ok(Err(SlotError::NotConcurrency(item.policy().algorithm())));
        };
        let policy = *item.policy();
        let numbers = self
            .slots_call(
                item.name(),
                item.key(),
                &policy,
                "acquire",
                item.cost().get(),
                id,
                deadline,
            )
            .await?;
        let bad = || {
            BackendError::Internal(Fault::Reply(format!(
                "the concurrency script answered {numbers:?}"
            )))
        };
        let n = |v: i64| u64::try_from(v).map_err(|_| bad());
        let [_time, code, remaining, retry, reset, expired, ends_at] = numbers[..] else {
            return Err(bad());
        };
        self.count_expired(expired);
        let ends_at = n(ends_at)?;
        let (allowed, reason) = match code {
            wire::WITHIN_CODE => (true, quotad_core::Reason::WithinLimit),
            wire::EXCEEDED_CODE => (false, quotad_core::Reason::LimitExceeded),
            wire::ID_IN_USE => return Ok(Err(SlotError::IdInUse)),
            _ => return Err(bad()),
        };
        let decision = Decision {
            allowed,
            limit: policy.capacity(),
            remaining: n(remaining)?,
            retry_after_ms: n(retry)?,
            reset_after_ms: n(reset)?,
            reason,
        };
        let slot = allowed.then(|| Grant {
            id,
            units: item.cost().get(),
            granted_at: ends_at.saturating_sub(policy.slot_ttl_ms()),
            ends_at,
        });
        Ok(Ok(quotad_core::Acquired { decision, slot }))
    }

    async fn renew(&self, slot: &SlotItem<'_>, deadline: Deadline) -> SlotResult {
        self.slot_change(slot, "renew", deadline).await
    }

    async fn release(&self, slot: &SlotItem<'_>, deadline: Deadline) -> SlotResult {
        self.slot_change(slot, "release", deadline).await
    }

    /// Forgets the key by a script with the same deadline as a check's (the
    /// store timeout or the caller's earlier `deadline`): a reset queued in
    /// a stalled Redis that quotad answered as failed does not happen
    /// later. `UNLINK`: a long sliding log is freed off Redis's thread.
    async fn reset(
        &self,
        name: &str,
        policy: &Policy,
        key: &str,
        deadline: Deadline,
    ) -> Result<(), BackendError> {
        let key = keys::state_key(&self.prefix, name, policy, key);
        let slot = if self.connections.is_cluster() {
            deadline::slot(key.as_bytes())
        } else {
            0
        };
        let bound = self.connections.bound(deadline);
        let call = self.start(slot, &bound).await?;
        let mut eval = redis::cmd("EVAL");
        eval.arg(RESET_SCRIPT)
            .arg(2)
            .arg(&key)
            .arg(keys::ledger_key(&key))
            .arg(call.deadline);
        let reply = self
            .connections
            .call(&call.link, slot, eval, &bound, None)
            .await
            .map_err(|e| e.into_backend(&bound))?;
        match reply {
            Value::Int(1) => Ok(()),
            Value::Int(0) => Err(NotRun::RefusedLate("reset").into()),
            other => Err(BackendError::Internal(Fault::Reply(format!(
                "the reset script answered {other:?}"
            )))),
        }
    }

    /// In the hash of overrides every replica polls (`overrides`).
    async fn write_override(
        &self,
        write: &crate::backend::OverrideWrite<'_>,
        deadline: Deadline,
    ) -> Result<crate::backend::OverrideWritten, crate::backend::OverrideWriteError> {
        self.write_override_in_redis(write, deadline).await
    }

    async fn load_overrides(
        &self,
        known: Option<crate::backend::OverridesVersion>,
        deadline: Deadline,
    ) -> Result<Option<crate::backend::StoredOverrides>, BackendError> {
        self.load_overrides_from_redis(known, deadline).await
    }

    /// A `PING` within `store.redis.timeout`; on a Cluster, every primary
    /// must answer.
    async fn probe(&self) -> Result<(), BackendError> {
        self.connections.ping().await
    }

    fn stats(&self) -> BackendStats {
        // Redis expires state by TTL; quotad keeps no count of keys.
        BackendStats {
            figures: self.counts().figures(),
            slots_expired: self.slots_expired.load(Ordering::Relaxed),
            ..BackendStats::default()
        }
    }
}

/// The outcome in a lease reply (after `TIME`): an unknown or overspent
/// lease, or what was settled and granted.
fn lease_outcome(reply: &[i64], item: &LeaseItem<'_>) -> LeaseResult {
    let bad =
        || BackendError::Internal(Fault::Reply(format!("the lease script answered {reply:?}")));
    let n = |v: i64| u64::try_from(v).map_err(|_| bad());
    match reply {
        [_, wire::UNKNOWN_LEASE] => Ok(Err(LeaseError::UnknownLease)),
        [_, wire::OVERSPENT, units] => Ok(Err(LeaseError::Overspent {
            spent: item.ask.settle.map_or(0, |s| s.spent),
            units: n(*units)?,
        })),
        [
            _,
            wire::LEASED,
            settled,
            returned,
            answer,
            units,
            granted_at,
            ends_at,
            remaining,
            reset,
        ] => {
            let settled = wire::settled(*settled, n(*returned)?).ok_or_else(bad)?;
            let answer = match *answer {
                wire::NOT_ASKED => LeaseAnswer::None,
                wire::DIRECT => LeaseAnswer::Direct,
                wire::GRANTED => LeaseAnswer::Granted(Grant {
                    id: item.ask.new_id,
                    units: n(*units)?,
                    granted_at: n(*granted_at)?,
                    ends_at: n(*ends_at)?,
                }),
                _ => return Err(bad()),
            };
            Ok(Ok(LeaseOutcome {
                settled,
                answer,
                remaining: n(*remaining)?,
                limit: item.policy.capacity(),
                reset_after_ms: n(*reset)?,
            }))
        }
        _ => Err(bad()),
    }
}

/// The decisions in the script's reply: four numbers per item, its limit
/// the capacity quotad sent, allowed exactly when within the limit; or,
/// for a lone check admitted on the fixed window's short path, two
/// ([`ADMITTED`]). `None` for an item whose key holds state the script
/// cannot read ([`UNREADABLE`]).
fn decisions(
    reply: &[i64],
    items: &[CheckItem<'_>],
) -> Result<Vec<Option<Decision>>, BackendError> {
    if let ([remaining, reset], [item]) = (reply, items)
        && reply.len() == ADMITTED
    {
        let n = |v: i64| {
            u64::try_from(v).map_err(|_| {
                BackendError::Internal(Fault::Reply(format!("the script answered {reply:?}")))
            })
        };
        return Ok(vec![Some(Decision {
            allowed: true,
            limit: item.policy().capacity(),
            remaining: n(*remaining)?,
            retry_after_ms: 0,
            reset_after_ms: n(*reset)?,
            reason: quotad_core::Reason::WithinLimit,
        })]);
    }
    if reply.len() != items.len() * PER_ITEM {
        return Err(BackendError::Internal(Fault::Reply(format!(
            "the script answered {} numbers for {} items",
            reply.len(),
            items.len()
        ))));
    }
    reply
        .chunks_exact(PER_ITEM)
        .zip(items)
        .map(|(d, item)| {
            if d[3] == UNREADABLE {
                return Ok(None);
            }
            let reason = wire::reason(d[3]).ok_or_else(|| {
                BackendError::Internal(Fault::Reply(format!("the script answered reason {}", d[3])))
            })?;
            let n = |i: usize| {
                u64::try_from(d[i]).map_err(|_| {
                    BackendError::Internal(Fault::Reply(format!(
                        "the script answered {} at {i}",
                        d[i]
                    )))
                })
            };
            Ok(Some(Decision {
                allowed: reason == quotad_core::Reason::WithinLimit,
                limit: item.policy().capacity(),
                remaining: n(0)?,
                retry_after_ms: n(1)?,
                reset_after_ms: n(2)?,
                reason,
            }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use quotad_proto::v1 as pb;

    #[test]
    fn scripts_hold_at_most_64_units_in_order_and_every_item_once() {
        use quotad_core::{Algorithm, CheckItem, Policy};
        let policy = |algorithm| {
            Policy::try_new(algorithm, 10, std::time::Duration::from_secs(1), None).expect("valid")
        };
        let (log, fixed) = (
            policy(Algorithm::SlidingLog),
            policy(Algorithm::FixedWindow),
        );
        // 100 fixed windows, 20 logs, 10 fixed windows.
        let keys: Vec<String> = (0..130).map(|i| format!("k{i}")).collect();
        let items: Vec<CheckItem<'_>> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let p = if (100..120).contains(&i) { log } else { fixed };
                CheckItem::new("p", p, k, 1).expect("valid")
            })
            .collect();
        let cut = super::scripts(&items);
        let sizes: Vec<usize> = cut.iter().map(Vec::len).collect();
        // 64; 36 + 7 logs (28 units); 13 logs (52) + 10 fixed (10).
        assert_eq!(sizes, [64, 43, 23]);
        let units = |script: &Vec<usize>| {
            script
                .iter()
                .map(|&i| super::weight(&items[i]))
                .sum::<usize>()
        };
        assert!(cut.iter().all(|c| units(c) <= super::CHUNK));
        // Distinct keys keep the batch's order.
        let order: Vec<usize> = cut.iter().flatten().copied().collect();
        assert_eq!(order, (0..130).collect::<Vec<_>>());
        // One item heavier than a script still goes, alone.
        assert_eq!(super::scripts(&items[100..101]).len(), 1);
    }

    #[test]
    fn a_keys_items_share_one_script_in_order_unless_they_fill_more_than_one() {
        use quotad_core::{Algorithm, CheckItem, Policy};
        let fixed = Policy::try_new(
            Algorithm::FixedWindow,
            10,
            std::time::Duration::from_secs(1),
            None,
        )
        .expect("valid");
        // 150 items over 30 keys, key i % 30, and then "big" 70 times.
        let names: Vec<String> = (0..150)
            .map(|i| format!("k{}", i % 30))
            .chain((0..70).map(|_| "big".to_owned()))
            .collect();
        let items: Vec<CheckItem<'_>> = names
            .iter()
            .map(|k| CheckItem::new("p", fixed, k, 1).expect("valid"))
            .collect();
        let cut = super::scripts(&items);
        assert!(cut.iter().all(|c| c.len() <= super::CHUNK), "{cut:?}");
        let mut seen: Vec<usize> = cut.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..220).collect::<Vec<_>>(), "every item once");
        for key in (0..30).map(|i| format!("k{i}")) {
            let holding: Vec<&Vec<usize>> = cut
                .iter()
                .filter(|c| c.iter().any(|&i| names[i] == key))
                .collect();
            assert_eq!(holding.len(), 1, "{key} in one script");
            let mine: Vec<usize> = holding[0]
                .iter()
                .copied()
                .filter(|&i| names[i] == key)
                .collect();
            assert!(mine.is_sorted(), "{key} in the batch's order");
        }
        // 30 keys of 5 units: 12 a script (60), 12, 6; then 70 of one key
        // fill the third script (34) and a fourth (36), in order.
        let sizes: Vec<usize> = cut.iter().map(Vec::len).collect();
        assert_eq!(sizes, [60, 60, 64, 36]);
        let big: Vec<usize> = cut
            .iter()
            .flatten()
            .copied()
            .filter(|&i| i >= 150)
            .collect();
        assert_eq!(big, (150..220).collect::<Vec<_>>());
    }
    use super::*;

    /// The reply's layout, read from the script's own text (its codes are
    /// held against their table in `wire.rs`).
    #[test]
    fn the_scripts_reply_has_the_shape_quotad_reads() {
        // TIME, then four numbers per item; TIME alone when refused.
        assert!(SCRIPT.contains("local out = { time }"));
        assert_eq!(PER_ITEM, 4);
        assert_eq!(
            SCRIPT.matches("out[#out + 1] = d[").count(),
            PER_ITEM,
            "the general reply"
        );
        assert!(SCRIPT.contains("return { time }"));
        // The fast path's replies have the same shape.
        for reply in SCRIPT
            .lines()
            .filter(|l| l.trim_start().starts_with("return { time, "))
        {
            let mut depth = 0;
            let commas = reply
                .chars()
                .filter(|&c| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    c == ',' && depth == 0
                })
                .count();
            assert!(commas == PER_ITEM || commas == ADMITTED, "{reply}");
        }
        assert!(SCRIPT.contains(&format!("local UNREADABLE = {UNREADABLE}")));
        assert_eq!(
            i32::try_from(UNREADABLE),
            Ok(pb::Reason::Unspecified as i32)
        );
    }

    #[test]
    fn passwords_in_urls_are_redacted() {
        assert_eq!(
            redact("cannot reach redis://user:s3cret@10.0.0.1:6379/0 now"),
            "cannot reach redis://user:***@10.0.0.1:6379/0 now"
        );
        assert_eq!(redact("rediss://:pw@h:1"), "rediss://:***@h:1");
        assert_eq!(redact("redis://pw@h"), "redis://***@h");
        assert_eq!(
            redact("a redis://h:1/ b redis://u:p@h2/ c"),
            "a redis://h:1/ b redis://u:***@h2/ c"
        );
        assert_eq!(redact("no url here"), "no url here");
        // Characters that end a URL's authority when written unencoded in a
        // password still leave nothing of it.
        for c in ['#', '/', '?', '"', '@', ' ', ':'] {
            let url = format!("redis://user:s3cr{c}et@h:6379/0");
            let shown = redact(&format!("store.redis.url: {url:?}: bad"));
            assert!(
                !shown.contains("s3cr") && !shown.contains("et@"),
                "{c:?}: {shown}"
            );
            assert!(shown.contains("@h:6379/0"), "{c:?}: {shown}");
        }
        let target = RedisTarget::Cluster(vec!["redis://:p4ss@a:1".to_owned()]);
        assert!(!format!("{target:?}").contains("p4ss"));
        // A password in the query, as redis+unix:// URLs take it.
        assert_eq!(
            redact("at redis+unix:///run/redis.sock?db=1&pass=s3cret refused"),
            "at redis+unix:///run/redis.sock?db=1&pass=*** refused"
        );
        assert_eq!(
            redact("redis+unix:///s?PASSWORD=s3cret&user=u"),
            "redis+unix:///s?PASSWORD=***&user=u"
        );
        let target = RedisTarget::Standalone("redis+unix:///s?pass=s3cret".to_owned());
        assert!(!target.to_string().contains("s3cret"), "{target}");
    }

    #[test]
    fn a_reply_of_the_wrong_length_is_an_error_not_a_decision() {
        let policy = Policy::try_new(
            quotad_core::Algorithm::FixedWindow,
            10,
            Duration::from_secs(1),
            None,
        )
        .expect("valid");
        let item = CheckItem::new("p", policy, "k", 1).expect("valid");
        let one = std::slice::from_ref(&item);
        assert!(decisions(&[9, 0, 100], one).is_err());
        assert!(decisions(&[9, 0, 100, 1, 4], one).is_err());
        assert!(decisions(&[9, 0, 100, 99], one).is_err(), "no such reason");
        let d = decisions(&[0, 30, 30, 2], one).expect("well formed");
        let d = d[0].expect("decided");
        assert_eq!(d.reason, quotad_core::Reason::LimitExceeded);
        assert!(!d.allowed);
        assert_eq!(d.limit, 10);
        let d = decisions(&[9, 0, 100, 1], one).expect("well formed");
        assert!(d[0].is_some_and(|d| d.allowed && d.remaining == 9));
        let admitted = decisions(&[9, 100], one).expect("the short path's reply");
        assert_eq!(admitted, d);
        assert!(decisions(&[9, 100], &[item, item]).is_err());
        let two =
            decisions(&[0, 30, 30, 2, 0, 0, 0, UNREADABLE], &[item, item]).expect("well formed");
        assert!(
            two[0].is_some() && two[1].is_none(),
            "the second key is unreadable"
        );
    }
}
