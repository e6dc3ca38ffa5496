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

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use prost::Message;
use quotad_proto::v1 as pb;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tonic::{Code, Status};

use crate::queue::{Answer, Coalescer, Delivered, Queued};
use crate::request::deadline_exceeded;
use crate::shared::Shared;

/// How long checks go out alone after quotad (or a proxy in front of it)
/// refused a `CheckBatch` as such; the next batch after it tries again.
pub const BATCH_REFUSAL_BACKOFF: Duration = Duration::from_secs(30);

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
