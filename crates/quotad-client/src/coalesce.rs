//! Coalescing: concurrent checks through one client leave together as one
//! `CheckBatch` when more than one is waiting.
//!
//! A check goes out at once, alone, when the client has a free in-flight
//! slot, so a lone check never waits. While every slot is busy, new checks
//! queue; when a slot frees, the queue leaves as one `INDEPENDENT` batch
//! (bounded in items and bytes). Each caller keeps its own deadline: a check
//! whose deadline passes in the queue, or whose caller stops waiting, is
//! never sent. A batch carries the earliest deadline of its checks (as
//! `grpc-timeout`), so a caller answered with its failure policy at its
//! deadline is never counted after it; a batch whose callers all stopped
//! waiting is dropped, which tells quotad to stop working on it.
//!
//! What a batch-level error means for its callers:
//! - a refusal made before anything was decided (`INVALID_ARGUMENT`,
//!   `NOT_FOUND`, `FAILED_PRECONDITION` naming `items[i]`, and other
//!   refusals such as `PERMISSION_DENIED`): nothing was consumed, so the
//!   item it names gets that error as a lone `Check` would have (without the
//!   `items[i].` prefix) and every other item is sent again on its own. A
//!   refusal of `CheckBatch` as such (`PERMISSION_DENIED`,
//!   `UNAUTHENTICATED`, `UNIMPLEMENTED` naming no item: the method is not
//!   allowed for this client, or a proxy in between answered 403, 401 or
//!   404) also turns coalescing off for [`BATCH_REFUSAL_BACKOFF`], so
//!   checks meanwhile go out alone instead of being refused and re-sent;
//!   the next queue after it leaves as a batch again, and a refusal that
//!   lasts costs one refused batch per back-off;
//! - `UNAVAILABLE`, `DEADLINE_EXCEEDED` and the other outage codes: every
//!   caller in the batch gets its own failure policy, and nothing is sent
//!   again (quotad may have decided some items before the call failed, so
//!   re-sending could count a request twice);
//! - anything else (`INTERNAL`): every caller gets that error.
//!
//! An item quotad could not decide comes back as `REASON_UNAVAILABLE`
//! (quotad consumed nothing for it, except where docs/redis.md's residual
//! window says). When quotad decided others of the batch, the failure may
//! be the item's own (corrupt state under its key, a Cluster node): up to
//! [`MAX_RESENT_ALONE`] such items are sent again on their own, within their
//! callers' deadlines, and each caller gets what that lone `Check` answers:
//! the real error (a lone check of corrupt state answers `INTERNAL`, not an
//! outage), or UNAVAILABLE and its own failure policy, or a decision. When
//! quotad decided none (an outage of its store), or past that bound, the
//! callers get their failure policies at once, as for a failed call: an
//! outage is not multiplied into one call per check.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use prost::Message;
use quotad_proto::MAX_BATCH_ITEMS;
use quotad_proto::v1 as pb;
use thiserror::Error;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tonic::{Code, Status};

use crate::client::Shared;

/// The default number of requests one client keeps in flight before checks
/// queue for a batch.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 8;

/// How long checks go out alone after quotad (or a proxy in front of it)
/// refused a `CheckBatch` as such; the next batch after it tries again.
pub const BATCH_REFUSAL_BACKOFF: Duration = Duration::from_secs(30);

/// The default bound on a coalesced batch's encoded size: well under the 4
/// MiB a tonic server decodes by default.
pub const DEFAULT_MAX_BATCH_BYTES: usize = 1 << 20;

/// How concurrent checks are coalesced into batches; see
/// [`ClientBuilder::coalescing`](crate::ClientBuilder::coalescing).
///
/// On by default ([`Coalescing::default`]): [`DEFAULT_MAX_IN_FLIGHT`]
/// slots, up to [`MAX_BATCH_ITEMS`] items and [`DEFAULT_MAX_BATCH_BYTES`] a
/// batch, and no extra delay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coalescing {
    enabled: bool,
    max_in_flight: usize,
    max_batch_items: usize,
    max_batch_bytes: usize,
    max_delay: Option<Duration>,
}

/// A coalescing bound out of range; the message names the setting.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum CoalescingError {
    /// No in-flight slot.
    #[error("coalescing.max_in_flight: must be at least 1")]
    NoSlot,
    /// A batch bound of 0 items or more than the API allows.
    #[error("coalescing.max_batch_items: must be between 1 and {MAX_BATCH_ITEMS} (got {0})")]
    BatchItems(usize),
    /// A batch bound of 0 bytes.
    #[error("coalescing.max_batch_bytes: must be at least 1")]
    NoBytes,
}

impl Default for Coalescing {
    fn default() -> Self {
        Self {
            enabled: true,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_batch_items: MAX_BATCH_ITEMS,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            max_delay: None,
        }
    }
}

impl Coalescing {
    /// Coalescing with `max_in_flight` requests in flight (each a `Check` or
    /// a `CheckBatch`) before new checks queue, and batches of at most
    /// `max_batch_items` checks and `max_batch_bytes` encoded bytes (a
    /// single larger check still goes, alone). Fewer slots coalesce more;
    /// more slots queue less.
    ///
    /// # Errors
    ///
    /// [`CoalescingError`] when `max_in_flight` or `max_batch_bytes` is 0,
    /// or `max_batch_items` is not between 1 and [`MAX_BATCH_ITEMS`].
    pub fn try_new(
        max_in_flight: usize,
        max_batch_items: usize,
        max_batch_bytes: usize,
    ) -> Result<Self, CoalescingError> {
        if max_in_flight == 0 {
            return Err(CoalescingError::NoSlot);
        }
        if !(1..=MAX_BATCH_ITEMS).contains(&max_batch_items) {
            return Err(CoalescingError::BatchItems(max_batch_items));
        }
        if max_batch_bytes == 0 {
            return Err(CoalescingError::NoBytes);
        }
        Ok(Self {
            enabled: true,
            max_in_flight,
            max_batch_items,
            max_batch_bytes,
            max_delay: None,
        })
    }

    /// No coalescing: every check is its own `Check` call, however many are
    /// in flight.
    pub fn off() -> Self {
        Self {
            enabled: false,
            ..Self::default()
        }
    }

    /// The longest a check waits in the queue for a slot: past it, the
    /// queue leaves as a batch of its own even with every slot busy. None
    /// (the default) waits for a slot, bounded by each check's deadline.
    #[must_use]
    pub fn max_delay(mut self, delay: Option<Duration>) -> Self {
        self.max_delay = delay;
        self
    }

    /// Whether checks are coalesced at all.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }
}

/// quotad's answer to one check, before the caller's failure policy.
#[derive(Debug)]
pub(crate) enum Answer {
    Decided(pb::Decision),
    Failed(Status),
    Malformed(&'static str),
}

impl Answer {
    pub(crate) fn of_check(result: Result<pb::CheckResponse, Status>) -> Self {
        match result {
            Ok(response) => response
                .decision
                .map_or(Answer::Malformed("decision missing"), Answer::Decided),
            Err(status) => Answer::Failed(status),
        }
    }
}

/// An answer and when its request left, for the deny cache.
pub(crate) type Delivered = (Answer, u64);

/// A check waiting in the queue.
#[derive(Debug)]
struct Queued {
    request: pb::CheckRequest,
    bytes: usize,
    deadline: Instant,
    reply: oneshot::Sender<Delivered>,
}

impl Queued {
    fn is_dead(&self, now: Instant) -> bool {
        self.reply.is_closed() || self.deadline <= now
    }
}

/// The checks waiting for a slot, oldest first. Check `id`s are given in
/// order and every id from the front's on has a slot, so a caller that
/// leaves empties its own slot in O(1); empty slots and dead checks are
/// dropped when they reach the front.
#[derive(Debug, Default)]
struct Queue {
    slots: VecDeque<Option<Queued>>,
    /// The id the next check gets.
    next_id: u64,
    /// Slots still holding a check.
    len: usize,
    /// Slots looked at by [`Queue::remove`], to bound the work per caller.
    #[cfg(test)]
    examined: u64,
}

impl Queue {
    /// Checks waiting (some may have passed their deadline, not yet met).
    fn len(&self) -> usize {
        self.len
    }

    /// Queues a check, after dropping what is dead at the front; answers
    /// its id.
    fn push(&mut self, now: Instant, queued: Queued) -> u64 {
        self.front(now);
        let id = self.next_id;
        self.next_id += 1;
        self.slots.push_back(Some(queued));
        self.len += 1;
        id
    }

    /// The oldest live check, after dropping empty slots and dead checks in
    /// front of it.
    fn front(&mut self, now: Instant) -> Option<&Queued> {
        loop {
            match self.slots.front() {
                None => return None,
                Some(Some(q)) if !q.is_dead(now) => break,
                Some(slot) => {
                    if slot.is_some() {
                        self.len -= 1;
                    }
                    self.slots.pop_front();
                }
            }
        }
        self.slots.front().and_then(Option::as_ref)
    }

    /// Takes the oldest live check.
    fn pop_front(&mut self, now: Instant) -> Option<Queued> {
        self.front(now)?;
        self.len -= 1;
        self.slots.pop_front().flatten()
    }

    /// Drops the check with `id`, if it is still queued.
    fn remove(&mut self, id: u64) {
        #[cfg(test)]
        {
            self.examined += 1;
        }
        let front_id = self.next_id - self.slots.len() as u64;
        let Some(index) = id.checked_sub(front_id) else {
            return;
        };
        let slot = usize::try_from(index)
            .ok()
            .and_then(|index| self.slots.get_mut(index));
        if let Some(slot) = slot
            && slot.take().is_some()
        {
            self.len -= 1;
        }
    }

    /// Empties the queue.
    fn clear(&mut self) -> VecDeque<Option<Queued>> {
        self.len = 0;
        std::mem::take(&mut self.slots)
    }
}

#[derive(Debug, Default)]
struct State {
    in_flight: usize,
    queue: Queue,
}

/// The queue and the in-flight slots of one client and its clones.
#[derive(Debug)]
pub(crate) struct Coalescer {
    settings: Coalescing,
    state: Mutex<State>,
    /// Until this instant (client clock) checks go out alone: quotad, or a
    /// proxy in front of it, refused a batch as a whole (`CheckBatch` not
    /// allowed for this client, or not served).
    batches_refused_until_ms: AtomicU64,
}

/// A queued check whose caller may stop waiting: dropping it takes the
/// check off the queue, so it is never sent.
struct Waiting<'a> {
    coalescer: &'a Coalescer,
    id: u64,
    queued: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.queued {
            self.coalescer.remove(self.id);
        }
    }
}

/// Holds one in-flight slot; dropping it hands the slot to the queue.
#[derive(Debug)]
struct Slot(Arc<Shared>);

impl Drop for Slot {
    fn drop(&mut self) {
        release(&self.0);
    }
}

impl Coalescer {
    pub(crate) fn new(settings: Coalescing) -> Self {
        Self {
            settings,
            state: Mutex::new(State::default()),
            batches_refused_until_ms: AtomicU64::new(0),
        }
    }

    /// Checks waiting in the queue.
    pub(crate) fn queued(&self) -> usize {
        self.state.lock().queue.len()
    }

    /// Takes the next batch off the front of the queue, dropping checks
    /// whose callers stopped waiting.
    fn take_batch(&self, state: &mut State) -> Vec<Queued> {
        let now = Instant::now();
        let mut batch: Vec<Queued> = Vec::new();
        let mut bytes = 0;
        while let Some(front) = state.queue.front(now) {
            if !batch.is_empty()
                && (batch.len() >= self.settings.max_batch_items
                    || bytes + front.bytes > self.settings.max_batch_bytes)
            {
                break;
            }
            bytes += front.bytes;
            batch.extend(state.queue.pop_front(now));
        }
        batch
    }

    /// Forgets a queued check whose caller gave up.
    fn remove(&self, id: u64) {
        self.state.lock().queue.remove(id);
    }
}

/// How a check was let in: sent now on a free slot, or queued by id.
enum Admitted {
    Now(pb::CheckRequest),
    Queued(u64),
}

/// Sends `request` now if a slot is free, or queues it for the next batch;
/// answers within `deadline`.
pub(crate) async fn submit(
    shared: &Arc<Shared>,
    coalescer: &Coalescer,
    request: pb::CheckRequest,
    deadline: Instant,
) -> Delivered {
    if shared.now_ms() < coalescer.batches_refused_until_ms.load(Ordering::Relaxed) {
        let sent_ms = shared.now_ms();
        return (shared.unary(request, deadline).await, sent_ms);
    }
    let (reply, mut answer) = oneshot::channel();
    let admitted = {
        let mut state = coalescer.state.lock();
        if state.in_flight < coalescer.settings.max_in_flight {
            state.in_flight += 1;
            Admitted::Now(request)
        } else {
            let queued = Queued {
                bytes: request.encoded_len(),
                request,
                deadline,
                reply,
            };
            let id = state.queue.push(Instant::now(), queued);
            Admitted::Queued(id)
        }
    };
    let id = match admitted {
        Admitted::Now(request) => {
            let slot = Slot(Arc::clone(shared));
            let sent_ms = shared.now_ms();
            let answer = shared.unary(request, deadline).await;
            drop(slot);
            return (answer, sent_ms);
        }
        Admitted::Queued(id) => id,
    };
    let mut waiting = Waiting {
        coalescer,
        id,
        queued: true,
    };

    let mut flush_at = coalescer.settings.max_delay.map(|d| Instant::now() + d);
    loop {
        tokio::select! {
            biased;
            delivered = &mut answer => {
                waiting.queued = false;
                return delivered.unwrap_or_else(|_| {
                    // Dropped unsent: past its deadline (the queue drops
                    // those first), or the runtime is shutting down.
                    let status = if Instant::now() >= deadline {
                        deadline_exceeded()
                    } else {
                        Status::unavailable("the client stopped before sending the check")
                    };
                    (Answer::Failed(status), 0)
                });
            }
            () = tokio::time::sleep_until(deadline) => {
                return (Answer::Failed(deadline_exceeded()), 0);
            }
            () = sleep_until_some(flush_at) => {
                // Waited long enough for a slot: the front of the queue
                // leaves now, beside the busy slots.
                let batch = coalescer.take_batch(&mut coalescer.state.lock());
                spawn_batch(Arc::clone(shared), batch, None);
                flush_at = coalescer.settings.max_delay.map(|d| Instant::now() + d);
            }
        }
    }
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

pub(crate) fn deadline_exceeded() -> Status {
    Status::deadline_exceeded("no answer from quotad within the deadline")
}

/// A slot came free: the queue's next batch takes it, or it is given back.
fn release(shared: &Arc<Shared>) {
    let Some(coalescer) = shared.coalescer() else {
        return;
    };
    let batch = {
        let mut state = coalescer.state.lock();
        let batch = coalescer.take_batch(&mut state);
        if batch.is_empty() {
            state.in_flight -= 1;
            return;
        }
        batch
    };
    // The slot passes to the batch without being given back.
    spawn_batch(Arc::clone(shared), batch, Some(Slot(Arc::clone(shared))));
}

/// Sends `batch` on a task of its own (holding `slot`, if any, until done).
fn spawn_batch(shared: Arc<Shared>, batch: Vec<Queued>, slot: Option<Slot>) {
    if batch.is_empty() {
        return;
    }
    match shared.runtime() {
        Some(runtime) => {
            runtime.spawn(async move {
                send_batch(&shared, batch).await;
                drop(slot);
            });
        }
        None => {
            // No runtime left to send on (the application is shutting
            // down): every queued caller hears that the client stopped, and
            // the slot, given back, finds the queue empty.
            drop(batch);
            let queue = shared.coalescer().map(|c| c.state.lock().queue.clear());
            drop(queue);
            drop(slot);
        }
    }
}

/// Sends a batch and gives each caller its own answer.
async fn send_batch(shared: &Arc<Shared>, mut batch: Vec<Queued>) {
    let sent_ms = shared.now_ms();
    if batch.iter().all(|q| q.reply.is_closed()) {
        return;
    }
    if let [_] = batch.as_slice() {
        let Some(mut only) = batch.pop() else {
            return;
        };
        let answer = tokio::select! {
            answer = shared.unary(only.request, only.deadline) => answer,
            // The caller left: dropping the call resets its stream, so
            // quotad stops working on it.
            () = only.reply.closed() => return,
        };
        let _ = only.reply.send((answer, sent_ms));
        return;
    }
    // The earliest deadline of the batch goes to quotad (as grpc-timeout):
    // a caller answered with its failure policy at its deadline must not
    // be counted after it, so the call ends then for everyone in it.
    let deadline = batch
        .iter()
        .map(|q| q.deadline)
        .min()
        .unwrap_or_else(Instant::now);
    let (requests, waiters): (Vec<_>, Vec<_>) = batch
        .into_iter()
        .map(|q| (q.request, (q.reply, q.deadline)))
        .unzip();
    let request = pb::CheckBatchRequest {
        items: requests.clone(),
        mode: pb::BatchMode::Independent.into(),
    };
    metrics::counter!("quotad_client_coalesced_batches_total").increment(1);
    metrics::counter!("quotad_client_coalesced_checks_total").increment(waiters.len() as u64);
    let mut waiters = waiters;
    let result = tokio::select! {
        result = shared.batch(request, deadline) => result,
        () = every_caller_gone(&mut waiters) => return,
    };
    match result {
        Ok(response) if response.decisions.len() == waiters.len() => {
            let undecided = |d: &pb::Decision| d.reason == i32::from(pb::Reason::Unavailable);
            let any_decided = !response.decisions.iter().all(undecided);
            let mut resent = Vec::new();
            for ((request, (reply, deadline)), decision) in
                requests.into_iter().zip(waiters).zip(response.decisions)
            {
                if undecided(&decision) {
                    if any_decided && resent.len() < MAX_RESENT_ALONE {
                        // The failure may be this item's own: the check
                        // alone says what went wrong, as it would have
                        // without the batch.
                        resent.extend(send_alone(shared, request, reply, deadline));
                    } else {
                        let status = Status::unavailable(
                            "quotad could not decide this check (REASON_UNAVAILABLE)",
                        );
                        let _ = reply.send((Answer::Failed(status), sent_ms));
                    }
                } else {
                    let _ = reply.send((Answer::Decided(decision), sent_ms));
                }
            }
            join(resent).await;
        }
        Ok(_) => {
            for (reply, _) in waiters {
                let _ = reply.send((
                    Answer::Malformed("the number of decisions differs from the number of checks"),
                    sent_ms,
                ));
            }
        }
        Err(status) => on_batch_error(shared, requests, waiters, &status, sent_ms).await,
    }
}

/// The most checks of one batch that quotad could not decide which are sent
/// again, each on its own, to learn why (see the module's docs).
pub const MAX_RESENT_ALONE: usize = 8;

/// Resolves once every caller of a batch has stopped waiting for it.
async fn every_caller_gone(waiters: &mut [(oneshot::Sender<Delivered>, Instant)]) {
    for (reply, _) in waiters {
        reply.closed().await;
    }
}

/// Gives each caller of a refused batch its own outcome; see the module
/// docs.
async fn on_batch_error(
    shared: &Arc<Shared>,
    requests: Vec<pb::CheckRequest>,
    waiters: Vec<(oneshot::Sender<Delivered>, Instant)>,
    status: &Status,
    sent_ms: u64,
) {
    if refused_as_a_whole(status.code())
        && offending_item(status, waiters.len()).is_none()
        && let Some(coalescer) = shared.coalescer()
    {
        let now_ms = shared.now_ms();
        let backoff_ms =
            u64::try_from(BATCH_REFUSAL_BACKOFF.as_millis()).expect("the back-off is 30 s");
        let previous = coalescer
            .batches_refused_until_ms
            .swap(now_ms.saturating_add(backoff_ms), Ordering::Relaxed);
        if previous <= now_ms {
            tracing::warn!(
                code = %status.code(),
                error = status.message(),
                backoff_ms,
                "quotad refuses CheckBatch from this client; checks go out one by one until the back-off ends"
            );
        }
    }
    if !refused_before_deciding(status.code()) {
        for (reply, _) in waiters {
            let _ = reply.send((Answer::Failed(status.clone()), sent_ms));
        }
        return;
    }
    let offender = offending_item(status, waiters.len());
    let mut resent = Vec::with_capacity(waiters.len());
    for (i, (request, (reply, deadline))) in requests.into_iter().zip(waiters).enumerate() {
        if let Some((index, own)) = &offender
            && *index == i
        {
            let _ = reply.send((Answer::Failed(own.clone()), sent_ms));
            continue;
        }
        resent.extend(send_alone(shared, request, reply, deadline));
    }
    join(resent).await;
}

/// Sends one check of a batch again, alone, on a task of its own, and gives
/// its caller that answer; nothing when its caller stopped waiting or its
/// deadline passed (the caller then hears its deadline).
fn send_alone(
    shared: &Arc<Shared>,
    request: pb::CheckRequest,
    reply: oneshot::Sender<Delivered>,
    deadline: Instant,
) -> Option<tokio::task::JoinHandle<()>> {
    if reply.is_closed() || deadline <= Instant::now() {
        return None;
    }
    let shared = Arc::clone(shared);
    Some(tokio::spawn(async move {
        let sent_ms = shared.now_ms();
        let answer = shared.unary(request, deadline).await;
        let _ = reply.send((answer, sent_ms));
    }))
}

/// Waits for the checks sent again, so the batch keeps its slot until
/// they are answered.
async fn join(resent: Vec<tokio::task::JoinHandle<()>>) {
    for task in resent {
        // A re-send that panicked has already dropped its reply, which its
        // caller hears as the client stopping.
        let _ = task.await;
    }
}

/// Codes with which quotad refuses a batch for what it is rather than for
/// an item: the method not allowed for this client, or not served.
fn refused_as_a_whole(code: Code) -> bool {
    matches!(
        code,
        Code::PermissionDenied | Code::Unauthenticated | Code::Unimplemented
    )
}

/// Codes with which quotad refuses a request before deciding anything.
fn refused_before_deciding(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument
            | Code::NotFound
            | Code::FailedPrecondition
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::ResourceExhausted
            | Code::Unimplemented
    )
}

/// The item a batch refusal names (`items[3].key: ...`), with the status a
/// lone check of it would have had.
fn offending_item(status: &Status, len: usize) -> Option<(usize, Status)> {
    if !matches!(
        status.code(),
        Code::InvalidArgument | Code::NotFound | Code::FailedPrecondition
    ) {
        return None;
    }
    let rest = status.message().strip_prefix("items[")?;
    let (index, rest) = rest.split_once("].")?;
    let index: usize = index.parse().ok()?;
    (index < len).then(|| (index, Status::new(status.code(), rest)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_naming_an_item_is_that_items_own_error_without_the_prefix() {
        let status = Status::not_found("items[2].policy_name: no policy named \"nope\"");
        let (index, own) = offending_item(&status, 3).expect("names item 2");
        assert_eq!(index, 2);
        assert_eq!(own.code(), Code::NotFound);
        assert_eq!(own.message(), "policy_name: no policy named \"nope\"");
        assert!(offending_item(&status, 2).is_none(), "out of range");
        assert!(offending_item(&Status::invalid_argument("items: too many"), 3).is_none());
        assert!(offending_item(&Status::unavailable("items[0].key: x"), 3).is_none());
    }

    /// A queued check for `key`, with the receiver its caller waits on.
    fn queued(key: &str, deadline: Instant) -> (Queued, oneshot::Receiver<Delivered>) {
        let (reply, answer) = oneshot::channel();
        let request = pb::CheckRequest {
            key: key.to_owned(),
            ..pb::CheckRequest::default()
        };
        let queued = Queued {
            bytes: request.encoded_len(),
            request,
            deadline,
            reply,
        };
        (queued, answer)
    }

    #[tokio::test]
    async fn callers_leaving_a_long_queue_each_take_constant_work() {
        const N: u64 = 10_000;
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let mut queue = Queue::default();
        let mut answers = Vec::new();
        let ids: Vec<u64> = (0..N)
            .map(|i| {
                let (q, answer) = queued(&format!("k{i}"), later);
                answers.push(answer);
                queue.push(now, q)
            })
            .collect();
        // Every other caller leaves, newest first (the worst order for a
        // scan from the front).
        for id in ids.iter().rev().step_by(2) {
            queue.remove(*id);
        }
        assert_eq!(queue.len(), (N / 2) as usize);
        assert!(
            queue.examined <= N,
            "{} slots looked at for {} callers leaving",
            queue.examined,
            N / 2
        );
        // What is left leaves in order, without the callers who left.
        let keys: Vec<String> = std::iter::from_fn(|| queue.pop_front(now))
            .map(|q| q.request.key)
            .collect();
        let expected: Vec<String> = (0..N).step_by(2).map(|i| format!("k{i}")).collect();
        assert_eq!(keys, expected);
        assert_eq!(queue.len(), 0);
        // A caller answered from the batch then leaving changes nothing.
        queue.remove(ids[0]);
        assert_eq!(queue.len(), 0);
    }

    #[tokio::test]
    async fn dead_checks_and_empty_slots_are_dropped_when_they_reach_the_front() {
        let now = Instant::now();
        let mut queue = Queue::default();
        let (gone, gone_answer) = queued("gone", now + Duration::from_secs(60));
        let (expired, _expired_answer) = queued("expired", now);
        let (left, _left_answer) = queued("left", now + Duration::from_secs(60));
        let (live, _live_answer) = queued("live", now + Duration::from_secs(60));
        queue.push(now, gone);
        queue.push(now, expired);
        let left_id = queue.push(now, left);
        queue.push(now, live);
        drop(gone_answer);
        queue.remove(left_id);
        assert_eq!(queue.len(), 3, "the two dead ones are not met yet");
        assert_eq!(
            queue.front(now).map(|q| q.request.key.as_str()),
            Some("live")
        );
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.slots.len(), 1, "nothing dead is kept");
        let (next, _next_answer) = queued("next", now + Duration::from_secs(60));
        let next_id = queue.push(now, next);
        queue.pop_front(now);
        queue.remove(next_id);
        assert_eq!(queue.len(), 0);
        assert!(queue.pop_front(now).is_none());
    }

    #[test]
    fn settings_are_validated_naming_the_field() {
        assert_eq!(
            Coalescing::try_new(
                DEFAULT_MAX_IN_FLIGHT,
                MAX_BATCH_ITEMS,
                DEFAULT_MAX_BATCH_BYTES
            ),
            Ok(Coalescing::default())
        );
        for (result, field) in [
            (Coalescing::try_new(0, 10, 10), "max_in_flight"),
            (Coalescing::try_new(1, 0, 10), "max_batch_items"),
            (Coalescing::try_new(1, 1_001, 10), "max_batch_items"),
            (Coalescing::try_new(1, 10, 0), "max_batch_bytes"),
        ] {
            let message = result.expect_err("invalid").to_string();
            assert!(
                message.starts_with(&format!("coalescing.{field}: ")),
                "{message}"
            );
        }
    }

    #[test]
    fn outage_codes_are_never_re_sent() {
        for code in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Cancelled,
            Code::Unknown,
            Code::Internal,
            Code::Aborted,
        ] {
            assert!(!refused_before_deciding(code), "{code:?}");
        }
    }
}
