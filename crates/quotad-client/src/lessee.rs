//! [`Lessee`]: the client's side of `quotad.v1.Leases`. It acquires a lease
//! for a key in the background when a check finds none, renews it at half
//! spent or half its TTL (reporting what was spent), backs off when quotad
//! answers `direct` or fails, remembers policies quotad will not lease and
//! keys it refuses (a refusal naming `key` stops leasing for that key only),
//! and returns what is unspent on shutdown and drop.
//!
//! Every call is made by the one caller that claimed the key's slot, on a
//! task of its own, so a check never waits for a lease call.
//!
//! What a failed call means for the lease it settled: quotad changes
//! nothing on an error it answers (the lease stays live and is spent again
//! until its end, so a client keeps spending what it holds while quotad is
//! unreachable); a call whose fate is unknown (a deadline passed, a
//! connection broke after the request left) may have returned the lease's
//! unspent units, so they are not spent again (under-admission, bounded by
//! the lease, rather than a risk of over-admission).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use quotad_proto::v1 as pb;
use quotad_proto::v1::leases_client::LeasesClient;
use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::lease::{
    Counts, Held, LeaseStats, LeaseTable, NOT_LEASABLE_RECHECK, Slot, Taken, label,
};
use crate::request::PolicyRef;
use crate::shared::{Shared, call};

/// Leases of one client, and the calls that keep them.
#[derive(Debug)]
pub(crate) struct Lessee {
    pub(crate) table: LeaseTable,
    rpc: LeasesClient<Channel>,
    shared: Arc<Shared>,
    /// The deadline of each lease call.
    deadline: Duration,
    /// Lease calls in flight, so shutdown can wait for them.
    in_flight: AtomicUsize,
    idle: Notify,
}

/// A lease call's hold on its slot: whatever becomes of the task, the slot
/// is released and shutdown hears that one call fewer is in flight.
struct Calling {
    lessee: Arc<Lessee>,
    slot: Arc<Slot>,
}

impl Drop for Calling {
    fn drop(&mut self) {
        self.slot.release();
        if self.lessee.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.lessee.idle.notify_waiters();
        }
    }
}

/// What a lease call's answer was about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Acquired,
    Renewed,
    Returned,
    Direct,
    NotLeasable,
    Failed,
}

impl Event {
    fn as_str(self) -> &'static str {
        match self {
            Event::Acquired => "acquired",
            Event::Renewed => "renewed",
            Event::Returned => "returned",
            Event::Direct => "direct",
            Event::NotLeasable => "not_leasable",
            Event::Failed => "failed",
        }
    }
}

impl Lessee {
    pub(crate) fn new(
        table: LeaseTable,
        rpc: LeasesClient<Channel>,
        shared: Arc<Shared>,
        deadline: Duration,
    ) -> Self {
        Self {
            table,
            rpc,
            shared,
            deadline,
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.shared.now_ms()
    }

    /// Starts the lease call a spend claimed for `slot`, on a task of its
    /// own; without a runtime to run it on, gives the claim back.
    pub(crate) fn start(self: &Arc<Self>, slot: Arc<Slot>) {
        let Some(runtime) = self.shared.runtime() else {
            slot.release();
            return;
        };
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let calling = Calling {
            lessee: Arc::clone(self),
            slot,
        };
        runtime.spawn(async move {
            calling.lessee.renew(&calling.slot).await;
            drop(calling);
        });
    }

    /// Asks for the lease that follows the one `slot` holds, settling the
    /// one stopped before it, if any.
    ///
    /// The lease held is spent on while its successor is asked for, and is
    /// stopped only once the successor is installed; its settle goes with
    /// the next call. So a lease is never settled while it can still be
    /// spent: quotad may have settled a lease even when the call failed (on
    /// Redis, a script that ran but whose reply came too late is answered
    /// UNAVAILABLE), and a client that spent on after such a failure would
    /// admit its returned units twice.
    async fn renew(&self, slot: &Slot) {
        self.table.flush(slot);
        let stopped = slot.take_stopped();
        if self.table.is_closed() {
            if let Some(stopped) = stopped {
                self.give_back(slot, stopped).await;
            }
            if let Some(taken) = slot.take(self.now_ms()) {
                self.give_back(slot, taken).await;
            }
            return;
        }
        let renewal = slot.holds(self.now_ms());
        let request = request(slot, self.table.options.want, stopped.as_ref());
        // The lease's time counts from here, before the request leaves.
        let sent_ms = self.now_ms();
        let result = self.send(request).await;
        let received_ms = self.now_ms();
        match result {
            Ok(answer) => {
                self.settled(&answer);
                self.answered(slot, renewal, answer, sent_ms, received_ms)
                    .await;
            }
            Err(status) => self.failed(slot, stopped, &status, received_ms),
        }
    }

    async fn send(&self, request: pb::LeaseRequest) -> Result<pb::LeaseResponse, Status> {
        metrics::counter!("quotad_client_calls_total", "method" => "lease").increment(1);
        let mut rpc = self.rpc.clone();
        call(
            |r| async move { rpc.lease(r).await },
            request,
            Instant::now() + self.deadline,
        )
        .await
    }

    fn count(&self, slot: &Slot, event: Event) {
        let c: &Counts = &self.table.counts;
        Counts::bump(match event {
            Event::Acquired => &c.acquired,
            Event::Renewed => &c.renewed,
            Event::Returned => &c.returned,
            Event::Direct => &c.direct,
            Event::NotLeasable => &c.not_leasable,
            Event::Failed => &c.failed,
        });
        metrics::counter!(
            "quotad_client_leases_total",
            "policy" => label(&slot.policy),
            "event" => event.as_str()
        )
        .increment(1);
    }

    /// Counts the units a settled lease gave back.
    fn settled(&self, answer: &pb::LeaseResponse) {
        if answer.settled == i32::from(pb::Settled::Returned) {
            self.table
                .counts
                .returned_units
                .fetch_add(answer.returned, Ordering::Relaxed);
        }
    }

    /// Installs the lease quotad granted, or backs off after `direct`.
    async fn answered(
        &self,
        slot: &Slot,
        renewal: bool,
        answer: pb::LeaseResponse,
        sent_ms: u64,
        received_ms: u64,
    ) {
        let options = &self.table.options;
        let lease = answer.lease.filter(|l| !answer.direct && l.units > 0);
        let Some(lease) = lease else {
            self.count(slot, Event::Direct);
            // Until the key's state is fresh again, when quotad said that
            // comes sooner than the back-off.
            let wait = match answer.reset_after_ms {
                0 => options.direct_backoff_ms(),
                reset => reset.min(options.direct_backoff_ms()),
            };
            slot.hold_off(received_ms.saturating_add(wait));
            tracing::debug!(policy = %label(&slot.policy), wait_ms = wait, "quotad answers direct");
            return;
        };
        let end_ms = options.end_ms(sent_ms, lease.ttl_ms);
        if end_ms <= received_ms || self.table.is_closed() {
            // Arrived too late to spend any of it (a TTL shorter than the
            // round trip and the margin), or after shutdown: straight back.
            let taken = Taken {
                id: lease.lease_id,
                spent: 0,
                left: lease.units,
            };
            self.give_back(slot, taken).await;
            slot.hold_off(received_ms.saturating_add(options.direct_backoff_ms()));
            return;
        }
        let renew_at_ms = sent_ms.saturating_add(lease.ttl_ms / 2).min(end_ms);
        // The lease held until now stops here, and is settled with the next
        // call (or at shutdown).
        slot.keep_stopped(slot.take(received_ms));
        slot.install(
            Held {
                id: lease.lease_id,
                units: lease.units,
            },
            end_ms,
            renew_at_ms,
            answer.limit,
            received_ms.saturating_add(answer.reset_after_ms),
        );
        // Counted once installed: whoever sees the count (`await_leases`)
        // can spend the lease.
        self.count(
            slot,
            if renewal {
                Event::Renewed
            } else {
                Event::Acquired
            },
        );
    }

    /// After a failed call: keep the stopped lease to settle next time
    /// (never to spend), remember a policy quotad will not lease, back off.
    /// The lease held, if any, is spent on until its end: the call did not
    /// name it.
    fn failed(&self, slot: &Slot, stopped: Option<Taken>, status: &Status, now_ms: u64) {
        let backoff = self.table.options.direct_backoff_ms();
        match status.code() {
            Code::NotFound if stopped.is_some() => {
                // The key no longer holds the stopped lease (it was reset):
                // nothing to settle. A fresh acquisition may follow at once.
                self.count(slot, Event::Failed);
                tracing::debug!(policy = %label(&slot.policy), "quotad no longer holds the lease");
                slot.hold_off(now_ms);
            }
            Code::InvalidArgument if names_the_key(status.message()) => {
                // quotad refuses this key (too long, empty), not the policy:
                // only this key goes unleased until the recheck, the
                // policy's other keys keep leasing.
                self.count(slot, Event::Failed);
                slot.hold_off(now_ms.saturating_add(ms(NOT_LEASABLE_RECHECK)));
                tracing::debug!(
                    policy = %label(&slot.policy),
                    error = status.message(),
                    "quotad refuses this key's lease; its checks are sent one by one"
                );
            }
            code if refused(code) => {
                // quotad will not lease this policy (and so not settle the
                // stopped lease either: its units come back when it ends).
                self.count(slot, Event::NotLeasable);
                let until = now_ms.saturating_add(ms(NOT_LEASABLE_RECHECK));
                self.table.refuse(&slot.policy, until);
                slot.hold_off(until);
                tracing::warn!(
                    policy = %label(&slot.policy),
                    code = %status.code(),
                    error = status.message(),
                    recheck_ms = ms(NOT_LEASABLE_RECHECK),
                    "quotad does not lease this policy; its checks are sent one by one"
                );
            }
            _ => {
                // quotad failed, could not be reached, or the fate of the
                // call is unknown: the stopped lease is settled next time,
                // the one held spent on until its end.
                slot.keep_stopped(stopped);
                self.count(slot, Event::Failed);
                slot.hold_off(now_ms.saturating_add(backoff));
                tracing::debug!(
                    policy = %label(&slot.policy),
                    code = %status.code(),
                    error = status.message(),
                    "lease call failed; the lease held is spent on until its end"
                );
            }
        }
    }

    /// Returns `taken` to quotad, asking for nothing.
    async fn give_back(&self, slot: &Slot, taken: Taken) {
        let request = request(slot, 0, Some(&taken));
        match self.send(request).await {
            Ok(answer) => {
                self.settled(&answer);
                self.count(slot, Event::Returned);
            }
            Err(status) => {
                self.count(slot, Event::Failed);
                tracing::debug!(
                    policy = %label(&slot.policy),
                    code = %status.code(),
                    error = status.message(),
                    "returning a lease failed; its units come back when it ends"
                );
            }
        }
    }

    /// Stops leasing, waits (within the deadline) for lease calls in
    /// flight, and returns every lease held with what was spent of it.
    pub(crate) async fn shutdown(self: &Arc<Self>) {
        self.table.close();
        let deadline = Instant::now() + self.deadline;
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.in_flight.load(Ordering::Acquire) == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                break;
            }
        }
        let now_ms = self.now_ms();
        let mut returns = tokio::task::JoinSet::new();
        for slot in self.table.slots() {
            if !LeaseTable::claim(&slot) {
                continue;
            }
            self.table.flush(&slot);
            let held: Vec<Taken> = [slot.take_stopped(), slot.take(now_ms)]
                .into_iter()
                .flatten()
                .collect();
            if held.is_empty() {
                slot.release();
                continue;
            }
            let lessee = Arc::clone(self);
            returns.spawn(async move {
                for taken in held {
                    lessee.give_back(&slot, taken).await;
                }
                slot.release();
            });
        }
        while returns.join_next().await.is_some() {}
    }

    pub(crate) fn stats(&self) -> LeaseStats {
        self.table.stats(self.now_ms())
    }
}

impl Drop for Lessee {
    /// Best effort: the last handle gone, what is still held goes back on a
    /// task of the client's runtime, if one is still running.
    fn drop(&mut self) {
        let now_ms = self.now_ms();
        let returns: Vec<pb::LeaseRequest> = self
            .table
            .slots()
            .iter()
            .flat_map(|slot| {
                [slot.take_stopped(), slot.take(now_ms)]
                    .into_iter()
                    .flatten()
                    .map(|taken| request(slot, 0, Some(&taken)))
                    .collect::<Vec<_>>()
            })
            .collect();
        if returns.is_empty() {
            return;
        }
        let Some(runtime) = self.shared.runtime() else {
            return;
        };
        let rpc = self.rpc.clone();
        let deadline = self.deadline;
        runtime.spawn(async move {
            for request in returns {
                let mut rpc = rpc.clone();
                let _ = call(
                    |r| async move { rpc.lease(r).await },
                    request,
                    Instant::now() + deadline,
                )
                .await;
            }
        });
    }
}

/// Codes with which quotad refuses to lease for the policy itself (no
/// lease settings, an unknown policy, a server without leases) and changes
/// nothing.
fn refused(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument
            | Code::NotFound
            | Code::FailedPrecondition
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented
    )
}

/// Whether a refusal names the request's `key` (quotad words a refusal as
/// `<field>: <what is wrong>`), rather than the policy or the settle.
fn names_the_key(message: &str) -> bool {
    message.starts_with("key: ")
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The `Lease` request for `slot`: settle `taken` (if any), then want
/// `want` units (0: a return).
fn request(slot: &Slot, want: u64, taken: Option<&Taken>) -> pb::LeaseRequest {
    pb::LeaseRequest {
        key: slot.key.clone(),
        policy: Some(match &slot.policy {
            PolicyRef::Named(name) => pb::lease_request::Policy::PolicyName(name.clone()),
            PolicyRef::Inline(p) => pb::lease_request::Policy::InlinePolicy(p.into()),
        }),
        inline_terms: slot.terms.map(|t| pb::LeaseTerms {
            max_units: t.max_units(),
            min_units: t.min_units(),
            max_ttl_ms: t.max_ttl_ms(),
        }),
        want,
        settle: taken.map(|t| pb::LeaseSettle {
            lease_id: t.id.clone(),
            spent: t.spent,
        }),
    }
}
