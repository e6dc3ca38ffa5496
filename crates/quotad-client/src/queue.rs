//! The coalescing queue: its settings, the checks waiting for an in-flight
//! slot, and the slots themselves. What is sent when, and what a batch's
//! answer means for its callers, is `coalesce`'s; this module only keeps
//! the state, so the client's shared handle can hold it without depending
//! on the code that drives it.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use parking_lot::Mutex;
use quotad_proto::MAX_BATCH_ITEMS;
use quotad_proto::v1 as pb;
use thiserror::Error;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tonic::Status;

/// The default number of requests one client keeps in flight before checks
/// queue for a batch.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 8;

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
    pub(crate) max_in_flight: usize,
    max_batch_items: usize,
    max_batch_bytes: usize,
    pub(crate) max_delay: Option<Duration>,
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
pub(crate) struct Queued {
    pub(crate) request: pb::CheckRequest,
    pub(crate) bytes: usize,
    pub(crate) deadline: Instant,
    pub(crate) reply: oneshot::Sender<Delivered>,
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
pub(crate) struct Queue {
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
    pub(crate) fn push(&mut self, now: Instant, queued: Queued) -> u64 {
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
    pub(crate) fn clear(&mut self) -> VecDeque<Option<Queued>> {
        self.len = 0;
        std::mem::take(&mut self.slots)
    }
}

/// The in-flight slots taken and the queue, under one lock.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) in_flight: usize,
    pub(crate) queue: Queue,
}

/// The queue and the in-flight slots of one client and its clones.
#[derive(Debug)]
pub(crate) struct Coalescer {
    pub(crate) settings: Coalescing,
    pub(crate) state: Mutex<State>,
    /// Until this instant (client clock) checks go out alone: quotad, or a
    /// proxy in front of it, refused a batch as a whole (`CheckBatch` not
    /// allowed for this client, or not served).
    pub(crate) batches_refused_until_ms: AtomicU64,
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
    pub(crate) fn take_batch(&self, state: &mut State) -> Vec<Queued> {
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
    pub(crate) fn remove(&self, id: u64) {
        self.state.lock().queue.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

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
}
