//! Concurrency slots: [`Client::acquire`] takes one, and the [`SlotGuard`]
//! it answers holds it, renewing it in the background at a third of its
//! TTL, until it is released: by [`SlotGuard::release`], or when the guard
//! is dropped (so also when the code holding it panics, or the future
//! holding it is cancelled: both drop it). A holder that dies with its
//! process strands the slot until its TTL passes without a renewal.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use quotad_core::{Decision, Reason};
use quotad_proto::v1 as pb;
use quotad_proto::v1::concurrency_client::ConcurrencyClient;
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
    lost: AtomicBool,
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

    async fn renew(&self) -> Result<bool, tonic::Status> {
        let mut rpc = self.rpc.clone();
        let answer = call(
            |r| async move { rpc.renew(r).await },
            self.request(),
            Instant::now() + self.deadline,
        )
        .await?;
        Ok(answer.renewed)
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

    /// The slot's id as quotad answered it; empty when the admission holds
    /// no slot (fail-open).
    pub fn slot_id(&self) -> &str {
        &self.held.slot_id
    }

    /// Whether a renewal found the slot gone (it ended: renewals failed for
    /// longer than its TTL). Its units may be someone else's now; the work
    /// it guarded is no longer counted.
    pub fn is_lost(&self) -> bool {
        self.held.lost.load(Ordering::Relaxed)
    }

    /// Releases the slot now, and says whether it was still held.
    ///
    /// # Errors
    ///
    /// [`Error`] when quotad cannot be reached or refuses; the slot then
    /// ends by its TTL.
    pub async fn release(mut self) -> Result<bool, Error> {
        self.stop_renewing();
        self.released = true;
        if self.held.slot_id.is_empty() {
            return Ok(false);
        }
        metrics::counter!("quotad_client_calls_total", "method" => "release").increment(1);
        self.held.release().await.map_err(crate::client::classify)
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
        // on a task, since drop cannot wait. Without a runtime the slot
        // ends by its TTL.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let held = Arc::clone(&self.held);
            runtime.spawn(async move {
                metrics::counter!("quotad_client_calls_total", "method" => "release").increment(1);
                if let Err(status) = held.release().await {
                    tracing::warn!(slot = %held.slot_id, %status, "slot not released; it ends by its TTL");
                }
            });
        }
    }
}

/// Renews `held` every `every` until the slot is found gone; a failed
/// call is tried again at the next tick (the TTL leaves room for two).
async fn renew_every(held: Arc<Held>, every: Duration) {
    let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        metrics::counter!("quotad_client_calls_total", "method" => "renew").increment(1);
        match held.renew().await {
            Ok(true) => {}
            Ok(false) => {
                held.lost.store(true, Ordering::Relaxed);
                tracing::warn!(slot = %held.slot_id, "slot lost: it ended before it was renewed");
                return;
            }
            Err(status) => {
                tracing::warn!(slot = %held.slot_id, %status, "slot renewal failed; trying again");
            }
        }
    }
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
        let mut rpc = self.shared.slots.clone();
        metrics::counter!("quotad_client_calls_total", "method" => "acquire").increment(1);
        let answer = call(
            |r| async move { rpc.acquire(r).await },
            request,
            Instant::now() + self.deadline,
        )
        .await;
        let held = |slot_id: String| Held {
            rpc: self.shared.slots.clone(),
            key: check.key().to_owned(),
            policy: check.policy().clone(),
            slot_id,
            deadline: self.deadline,
            lost: AtomicBool::new(false),
        };
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
                        renewer: None,
                        released: false,
                    }));
                }
                return Ok(Acquired::Denied(decision));
            }
        };
        let decision = crate::client::decision(answer.decision)?;
        if !decision.allowed {
            return Ok(Acquired::Denied(decision));
        }
        let held = Arc::new(held(answer.slot_id));
        let renewer = (!held.slot_id.is_empty() && answer.ttl_ms > 0).then(|| {
            let every = Duration::from_millis((answer.ttl_ms / 3).max(1));
            tokio::spawn(renew_every(Arc::clone(&held), every))
        });
        Ok(Acquired::Held(SlotGuard {
            held,
            decision,
            renewer,
            released: false,
        }))
    }
}
