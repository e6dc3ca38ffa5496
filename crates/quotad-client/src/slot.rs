//! Concurrency slots: [`Client::acquire`] takes one, and the [`SlotGuard`]
//! it answers holds it, renewing it in the background at a third of its
//! TTL (as each renewal answers it), until it is released: by
//! [`SlotGuard::release`], or when the guard is dropped (so also when the
//! code holding it panics, or the future holding it is cancelled: both drop
//! it). A holder that dies with its process strands the slot until its TTL
//! passes without a renewal.
//!
//! An acquire whose caller stops waiting (its future dropped: a timeout, a
//! `select!`, a cancelled request) does not cancel the call: the call goes
//! on, under the client's deadline, on a task of its own, and a slot it is
//! answered is released at once. Cancelling the call instead would strand
//! a slot quotad had already taken, with no one knowing its id, until its
//! TTL.
//!
//! The guard knows when its slot may have ended: a renewal answered that
//! it was gone (final), or its TTL passed, counted from when the last
//! renewal that was answered was sent, with no renewal answered since
//! (quotad unreachable: the earliest the slot can have ended). A renewal
//! answered later that finds the slot live shows it never ended (quotad
//! renews only a live slot), and the guard holds it again.
//! [`SlotGuard::is_lost`] says so, and [`SlotGuard::lost`] waits for it, so
//! work that must not run unguarded can stop.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use quotad_core::{Decision, Reason};
use quotad_proto::v1 as pb;
use quotad_proto::v1::concurrency_client::ConcurrencyClient;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::client::Client;
use crate::request::{Check, Error, FailurePolicy, PolicyRef};
use crate::shared::call;

/// What [`Client::acquire`] answers.
#[derive(Debug)]
pub enum Acquired {
    /// A slot is held until the guard is released or dropped.
    Held(SlotGuard),
    /// No slot: the limit is reached (`retry_after_ms` says when the
    /// soonest slot ends if none is released), or the failure policy
    /// answered closed.
    Denied(Decision),
}

/// What a guard shares with its renewal task.
struct Held {
    rpc: ConcurrencyClient<Channel>,
    key: String,
    policy: PolicyRef,
    /// Empty for an admission with no slot (quotad's or this client's
    /// fail-open).
    slot_id: String,
    deadline: Duration,
    /// The runtime the acquire was sent on: renewals and the release of a
    /// dropped guard go there too.
    runtime: Option<tokio::runtime::Handle>,
    /// Until when the slot lasts at the least, as far as this client
    /// knows: when the last answered acquire or renewal was sent, plus the
    /// TTL it answered. `None` for an admission with no slot.
    lasts_until: Mutex<Option<Instant>>,
    /// Set once a renewal answers that the slot is gone: final.
    lost: watch::Sender<bool>,
}

impl Held {
    fn request(&self) -> pb::SlotRequest {
        pb::SlotRequest {
            key: self.key.clone(),
            policy: Some(match &self.policy {
                PolicyRef::Named(name) => pb::slot_request::Policy::PolicyName(name.clone()),
                PolicyRef::Inline(p) => pb::slot_request::Policy::InlinePolicy(p.into()),
            }),
            slot_id: self.slot_id.clone(),
        }
    }

    /// Renews the slot, sent at `sent`; on an answer, moves
    /// [`Held::lasts_until`] and answers the TTL it now has (`None`: the
    /// slot is gone).
    async fn renew(&self, sent: Instant) -> Result<Option<Duration>, tonic::Status> {
        let mut rpc = self.rpc.clone();
        let answer = call(
            |r| async move { rpc.renew(r).await },
            self.request(),
            sent + self.deadline,
        )
        .await?;
        if !answer.renewed {
            return Ok(None);
        }
        let ttl = Duration::from_millis(answer.ttl_ms);
        *self.lasts_until.lock() = Some(sent + ttl);
        Ok(Some(ttl))
    }

    /// Whether the slot is known gone, or may be: see the module's docs.
    fn is_lost(&self) -> bool {
        *self.lost.borrow()
            || self
                .lasts_until
                .lock()
                .is_some_and(|until| Instant::now() >= until)
    }

    fn mark_lost(&self) {
        self.lost.send_replace(true);
    }

    /// Spawns a release of the slot (for a guard dropped, or a slot nobody
    /// waited for); without a runtime it ends by its TTL.
    fn release_later(self: Arc<Self>, why: &'static str) {
        let runtime = self
            .runtime
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok());
        let Some(runtime) = runtime else {
            tracing::warn!(slot = %self.slot_id, "slot not released (no runtime); it ends by its TTL");
            return;
        };
        runtime.spawn(async move {
            metrics::counter!("quotad_client_calls_total", "method" => "release").increment(1);
            match self.release().await {
                Ok(_) => tracing::debug!(slot = %self.slot_id, why, "slot released"),
                Err(status) => tracing::warn!(slot = %self.slot_id, why, %status, "slot not released; it ends by its TTL"),
            }
        });
    }

    async fn release(&self) -> Result<bool, tonic::Status> {
        let mut rpc = self.rpc.clone();
        let answer = call(
            |r| async move { rpc.release(r).await },
            self.request(),
            Instant::now() + self.deadline,
        )
        .await?;
        Ok(answer.was_held)
    }
}

/// A held slot of a concurrency limit. Renewed in the background while it
/// lives; released when dropped (on a task of the runtime it was acquired
/// on) or by [`SlotGuard::release`].
pub struct SlotGuard {
    held: Arc<Held>,
    decision: Decision,
    /// The TTL the acquire answered (zero with no slot).
    ttl: Duration,
    renewer: Option<JoinHandle<()>>,
    released: bool,
}

impl fmt::Debug for SlotGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotGuard")
            .field("slot_id", &self.held.slot_id)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl SlotGuard {
    /// The acquire's decision (allowed; `remaining` units were free after it).
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// How long the slot lasted unless renewed, as the acquire answered
    /// (zero when the admission holds no slot); renewals may answer
    /// another TTL (a reload changed `slot_ttl`), which the guard follows.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The slot's id as quotad answered it; empty when the admission holds
    /// no slot (fail-open).
    pub fn slot_id(&self) -> &str {
        &self.held.slot_id
    }

    /// Whether the slot has ended or may have: a renewal answered that it
    /// was gone (final), or its TTL has passed since the last renewal that
    /// was answered was sent. Its units may be someone else's then; the
    /// work it guarded may no longer be counted. The guard goes on renewing
    /// in the second case: a renewal answered later that finds the slot
    /// live shows it never ended, and this is false again.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// Waits until [`SlotGuard::is_lost`]; pending for ever for a guard
    /// with no slot (fail-open). For work that must stop when it is no
    /// longer counted:
    ///
    /// ```no_run
    /// # async fn f(guard: quotad_client::SlotGuard, work: impl std::future::Future<Output = ()>) {
    /// tokio::select! {
    ///     () = work => {}
    ///     () = guard.lost() => { /* stop: the slot may be someone else's */ }
    /// }
    /// # }
    /// ```
    pub async fn lost(&self) {
        let mut changed = self.held.lost.subscribe();
        loop {
            if self.held.is_lost() {
                return;
            }
            let until = *self.held.lasts_until.lock();
            match until {
                Some(until) => tokio::select! {
                    _ = changed.changed() => {}
                    () = tokio::time::sleep_until(until) => {}
                },
                None => std::future::pending().await,
            }
        }
    }

    /// Releases the slot now, and says whether it was still held.
    ///
    /// # Errors
    ///
    /// [`Error`] when quotad cannot be reached or refuses; the slot then
    /// ends by its TTL.
    pub async fn release(mut self) -> Result<bool, Error> {
        self.stop_renewing();
        if self.held.slot_id.is_empty() {
            self.released = true;
            return Ok(false);
        }
        metrics::counter!("quotad_client_calls_total", "method" => "release").increment(1);
        // Marked released only once answered: a release cancelled on the
        // way drops the guard unreleased, which releases it on a task.
        let answer = self.held.release().await;
        self.released = true;
        answer.map_err(crate::client::classify)
    }

    fn stop_renewing(&mut self) {
        if let Some(task) = self.renewer.take() {
            task.abort();
        }
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.stop_renewing();
        if self.released || self.held.slot_id.is_empty() {
            return;
        }
        // Dropped while held (scope end, panic, cancelled future): release
        // on a task, since drop cannot wait.
        Arc::clone(&self.held).release_later("guard dropped");
    }
}

/// Renews `held` at a third of its TTL (as each renewal answers it),
/// counted from when the last renewal was sent, until the slot is found
/// gone. A renewal that fails (after at most the client's deadline) is
/// sent again at the next third, or at once if that has passed, so one
/// renewal may fail before the slot ends.
async fn renew_every(held: Arc<Held>, ttl: Duration) {
    let mut next = Instant::now() + third(ttl);
    let mut ttl = ttl;
    loop {
        tokio::time::sleep_until(next).await;
        metrics::counter!("quotad_client_calls_total", "method" => "renew").increment(1);
        let sent = Instant::now();
        match held.renew(sent).await {
            Ok(Some(renewed)) => ttl = renewed,
            Ok(None) => {
                held.mark_lost();
                tracing::warn!(slot = %held.slot_id, "slot lost: it ended before it was renewed");
                return;
            }
            Err(status) => {
                if held.is_lost() {
                    tracing::warn!(slot = %held.slot_id, %status, "slot renewal failed past its TTL: it may have ended");
                } else {
                    tracing::warn!(slot = %held.slot_id, %status, "slot renewal failed; trying again");
                }
            }
        }
        next = sent + third(ttl);
    }
}

fn third(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(1))
}

impl Client {
    /// Takes a slot of `check`'s concurrency policy for `check`'s cost, and
    /// holds it until the answered guard is released or dropped, renewing
    /// it meanwhile at a third of its TTL.
    ///
    /// When quotad cannot be reached, the failure policy answers: fail-open
    /// holds a guard with no slot (nothing to renew or release), fail-closed
    /// a denial with reason [`Reason::FailClosed`].
    ///
    /// # Errors
    ///
    /// [`Error::Rejected`] for bad input or an unknown policy (a rate
    /// policy, a cost above the limit); [`Error::Unavailable`] when quotad
    /// cannot be reached and the failure policy is [`FailurePolicy::Error`].
    pub async fn acquire(&self, check: &Check) -> Result<Acquired, Error> {
        let request = check.to_proto();
        let request = pb::AcquireRequest {
            key: request.key,
            cost: request.cost,
            policy: request.policy.map(|p| match p {
                pb::check_request::Policy::PolicyName(n) => {
                    pb::acquire_request::Policy::PolicyName(n)
                }
                pb::check_request::Policy::InlinePolicy(p) => {
                    pb::acquire_request::Policy::InlinePolicy(p)
                }
            }),
        };
        let runtime = self.shared.runtime();
        let held = |slot_id: String| Held {
            rpc: self.shared.slots.clone(),
            key: check.key().to_owned(),
            policy: check.policy().clone(),
            slot_id,
            deadline: self.deadline,
            runtime: runtime.clone(),
            lasts_until: Mutex::new(None),
            lost: watch::Sender::new(false),
        };
        let sent = Instant::now();
        let answer = self
            .acquire_call(request, sent, [held(String::new()), held(String::new())])
            .await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(status) => {
                let status = match crate::client::classify(status) {
                    Error::Unavailable(status) => status,
                    refused => return Err(refused),
                };
                let reason = match self.on_unavailable {
                    FailurePolicy::FailOpen => Reason::FailOpen,
                    FailurePolicy::FailClosed => Reason::FailClosed,
                    FailurePolicy::Error => return Err(Error::Unavailable(status)),
                };
                let decision = crate::client::failure_decision(reason);
                if reason == Reason::FailOpen {
                    return Ok(Acquired::Held(SlotGuard {
                        held: Arc::new(held(String::new())),
                        decision,
                        ttl: Duration::ZERO,
                        renewer: None,
                        released: false,
                    }));
                }
                return Ok(Acquired::Denied(decision));
            }
        };
        let decision = match crate::client::decision(answer.decision) {
            Ok(decision) => decision,
            Err(error) => {
                // An answer this client cannot read: a slot it names is
                // released rather than stranded.
                if !answer.slot_id.is_empty() {
                    Arc::new(held(answer.slot_id)).release_later("unreadable acquire answer");
                }
                return Err(error);
            }
        };
        if !decision.allowed {
            return Ok(Acquired::Denied(decision));
        }
        let held = Arc::new(held(answer.slot_id));
        let ttl = Duration::from_millis(answer.ttl_ms);
        let renewer = (!held.slot_id.is_empty() && answer.ttl_ms > 0).then(|| {
            *held.lasts_until.lock() = Some(sent + ttl);
            let renewing = renew_every(Arc::clone(&held), ttl);
            match &held.runtime {
                Some(runtime) => runtime.spawn(renewing),
                None => tokio::spawn(renewing),
            }
        });
        Ok(Acquired::Held(SlotGuard {
            held,
            decision,
            ttl,
            renewer,
            released: false,
        }))
    }

    /// Sends an acquire on a task of its own, so that a caller who stops
    /// waiting does not cancel it. A slot answered to no one is released
    /// (through one of `releases`: the request's key and policy, no slot id
    /// yet), by the task if the caller was gone when the answer came, or
    /// by the caller's end ([`Pending`]) if the answer was handed over but
    /// not taken.
    async fn acquire_call(
        &self,
        request: pb::AcquireRequest,
        sent: Instant,
        releases: [Held; 2],
    ) -> Result<pb::AcquireResponse, tonic::Status> {
        let mut rpc = self.shared.slots.clone();
        let deadline = sent + self.deadline;
        let call = async move {
            metrics::counter!("quotad_client_calls_total", "method" => "acquire").increment(1);
            call(|r| async move { rpc.acquire(r).await }, request, deadline).await
        };
        let Some(runtime) = self.shared.runtime() else {
            return call.await;
        };
        let [by_task, by_caller] = releases;
        let (answer, answered) = oneshot::channel();
        runtime.spawn(async move {
            if let Err(Ok(unheard)) = answer.send(call.await) {
                release_unheard(by_task, unheard);
            }
        });
        let mut pending = Pending {
            answered,
            release: Some(by_caller),
        };
        let answer = (&mut pending.answered).await;
        pending.release = None;
        answer.unwrap_or_else(|_| {
            Err(tonic::Status::unavailable(
                "the acquire's task ended without an answer (its runtime shut down)",
            ))
        })
    }
}

/// The caller's end of an acquire sent on a task. Dropped before the answer
/// was taken (the caller stopped waiting), it closes the hand-off and
/// releases a slot an answer already handed over holds; an answer not yet
/// handed over is then refused to the task, which releases it. Exactly one
/// side sees each answer.
struct Pending {
    answered: oneshot::Receiver<Result<pb::AcquireResponse, tonic::Status>>,
    /// `None` once the answer was taken.
    release: Option<Held>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(release) = self.release.take() else {
            return;
        };
        self.answered.close();
        if let Ok(Ok(unheard)) = self.answered.try_recv() {
            release_unheard(release, unheard);
        }
    }
}

/// Releases the slot of an acquire answer no one took, if it holds one.
fn release_unheard(mut release: Held, unheard: pb::AcquireResponse) {
    let slot = unheard.decision.as_ref().is_some_and(|d| d.allowed);
    if slot && !unheard.slot_id.is_empty() {
        release.slot_id = unheard.slot_id;
        Arc::new(release).release_later("acquired after its caller stopped waiting");
    }
}
