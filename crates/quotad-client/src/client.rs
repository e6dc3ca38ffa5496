//! The gRPC client: checks with a deadline and a failure policy, coalesced
//! into batches and answered from the deny cache where exactness allows.

use std::sync::Arc;
use std::time::Duration;

use quotad_core::{BatchMode, Decision, Reason};
use quotad_proto::v1 as pb;
use tokio::time::Instant;
use tonic::{Code, Status};

use crate::coalesce;
use crate::lease::{LeaseStats, Spent};
use crate::lessee::Lessee;
use crate::queue::{Answer, Coalescer};
use crate::request::{Check, Error, FailurePolicy, PolicyRef, source_chain};
use crate::shared::{Shared, call};

/// How often a client (or an HTTP layer) logs that quotad is unavailable:
/// one line per interval, carrying the number of failures kept quiet.
pub const OUTAGE_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// A cheap-to-clone handle to one quotad (or a load-balanced address of
/// many). Every clone shares one HTTP/2 connection, one coalescing queue
/// and one deny cache; each handle has its own deadline and failure policy
/// ([`Client::with_deadline`], [`Client::with_failure_policy`]).
///
/// ```no_run
/// # async fn run() -> Result<(), quotad_client::Error> {
/// use std::time::Duration;
/// use quotad_client::{Check, Client, FailurePolicy};
///
/// let client = Client::builder("http://127.0.0.1:50051")
///     .deadline(Duration::from_millis(100))
///     .on_unavailable(FailurePolicy::FailOpen)
///     .build()?;
/// let decision = client.check(&Check::named("api", "user-42")).await?;
/// if !decision.allowed {
///     println!("retry in {} ms", decision.retry_after_ms);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    pub(crate) shared: Arc<Shared>,
    pub(crate) deadline: Duration,
    pub(crate) on_unavailable: FailurePolicy,
    /// With leases on ([`ClientBuilder::leases`](crate::ClientBuilder::leases)).
    pub(crate) leases: Option<Arc<Lessee>>,
}

impl Client {
    /// A handle sharing this one's connection, queue and cache, whose calls
    /// take at most `deadline`.
    #[must_use]
    pub fn with_deadline(&self, deadline: Duration) -> Self {
        Self {
            deadline,
            ..self.clone()
        }
    }

    /// A handle sharing this one's connection, queue and cache, with its own
    /// failure policy.
    #[must_use]
    pub fn with_failure_policy(&self, policy: FailurePolicy) -> Self {
        Self {
            on_unavailable: policy,
            ..self.clone()
        }
    }

    /// What this client's leases have done (all zero with leases off).
    pub fn lease_stats(&self) -> LeaseStats {
        self.leases
            .as_ref()
            .map_or_else(LeaseStats::default, |l| l.stats())
    }

    /// Stops leasing and returns every lease held, with what was spent of
    /// it, so its unspent units go back to the budget at once; waits for
    /// lease calls in flight first, each within the client's deadline.
    /// Checks after it go to quotad one by one. Without it, the last
    /// handle dropped returns them on a task, if a runtime is still
    /// running; a lease never returned strands its units until it ends.
    /// Nothing to do with leases off.
    pub async fn shutdown(&self) {
        if let Some(lessee) = &self.leases {
            lessee.shutdown().await;
        }
    }

    /// Checks waiting for an in-flight slot, to leave as the next batch.
    pub fn queued_checks(&self) -> usize {
        self.shared.coalescer().map_or(0, Coalescer::queued)
    }

    /// The client's clock, in milliseconds.
    pub(crate) fn now_ms(&self) -> u64 {
        self.shared.now_ms()
    }

    /// Decides and consumes one request.
    ///
    /// Concurrent checks through this client and its clones may travel
    /// together in one `CheckBatch`; each still gets its own decision, its
    /// own error and its own failure policy, within its own deadline. A
    /// check that a cached `LIMIT_EXCEEDED` denial covers is answered
    /// without a call (counted in `quotad_client_local_denials_total`).
    ///
    /// With leases on, a check that a lease held for its policy and key
    /// covers is admitted locally, without a call, until the lease's units
    /// or time run out; a check that finds none is sent as above while a
    /// lease is acquired in the background.
    ///
    /// # Errors
    ///
    /// [`Error::Rejected`] for bad input or an unknown policy;
    /// [`Error::Unavailable`] when quotad cannot be reached and the failure
    /// policy is [`FailurePolicy::Error`].
    pub async fn check(&self, check: &Check) -> Result<Decision, Error> {
        let shared = &self.shared;
        if let Some(lessee) = &self.leases {
            match lessee.table.spend(check, shared.now_ms()) {
                Spent::Local(decision, renew) => {
                    if let Some(slot) = renew {
                        lessee.start(slot);
                    }
                    return Ok(decision);
                }
                Spent::Miss(Some(slot)) => lessee.start(slot),
                Spent::Miss(None) => {}
            }
        }
        if let Some(cache) = &shared.cache
            && let Some(decision) = cache.lookup(check, shared.now_ms())
        {
            metrics::counter!("quotad_client_local_denials_total", "policy" => check.policy_label())
                .increment(1);
            return Ok(decision);
        }
        // Boxed so that this future stays small: a local answer then costs
        // no copy of the call's whole state, which is far larger than the
        // local path and would dominate it; the box is nothing beside the
        // round trip it holds.
        Box::pin(self.ask(check)).await
    }

    /// [`Client::check`] when no local answer holds: asks quotad.
    async fn ask(&self, check: &Check) -> Result<Decision, Error> {
        let shared = &self.shared;
        let deadline = Instant::now() + self.deadline;
        let sent = shared.cache.as_ref().map(|c| c.sent(shared.now_ms()));
        let request = check.to_proto();
        let (answer, sent_ms) = match shared.coalescer() {
            Some(coalescer) => coalesce::submit(shared, coalescer, request, deadline).await,
            None => {
                let sent_ms = shared.now_ms();
                (shared.unary(request, deadline).await, sent_ms)
            }
        };
        let decision = match answer {
            Answer::Decided(d) => decision(Some(d))?,
            Answer::Malformed(why) => return Err(Error::BadResponse(why)),
            Answer::Failed(status) => return self.unavailable(status, 1).map(first),
        };
        if let (Some(cache), Some(sent)) = (&shared.cache, sent) {
            cache.record(check, &decision, sent.at(sent_ms), shared.now_ms());
        }
        Ok(decision)
    }

    /// Decides a batch of at most 1,000 items, in one round trip. Not
    /// coalesced and not answered from the deny cache: the batch's mode
    /// decides how its items affect each other.
    ///
    /// In an independent batch, an item whose backend failed while its
    /// policy reports errors comes back as a denial with
    /// [`Reason::Unavailable`] (nothing consumed) and the other items keep
    /// their decisions; the failure policy is not applied to it, since the
    /// call itself succeeded.
    ///
    /// # Errors
    ///
    /// As [`Client::check`].
    pub async fn check_batch(
        &self,
        checks: &[Check],
        mode: BatchMode,
    ) -> Result<Vec<Decision>, Error> {
        let request = pb::CheckBatchRequest {
            items: checks.iter().map(Check::to_proto).collect(),
            mode: pb::BatchMode::from(mode).into(),
        };
        match self.shared.batch(request, self.deadline_from_now()).await {
            Ok(answer) if answer.decisions.len() != checks.len() => Err(Error::BadResponse(
                "the number of decisions differs from the number of checks",
            )),
            Ok(answer) => answer
                .decisions
                .into_iter()
                .map(|d| decision(Some(d)))
                .collect(),
            Err(status) => self.unavailable(status, checks.len()),
        }
    }

    /// What [`Client::check`] would answer now, consuming nothing. Always
    /// asks quotad.
    ///
    /// # Errors
    ///
    /// As [`Client::check`].
    pub async fn peek(&self, check: &Check) -> Result<Decision, Error> {
        let mut rpc = self.shared.rpc.clone();
        let request = check.to_proto();
        match call(
            |r| async move { rpc.peek(r).await },
            request,
            self.deadline_from_now(),
        )
        .await
        {
            Ok(answer) => decision(answer.decision),
            Err(status) => self.unavailable(status, 1).map(first),
        }
    }

    /// Forgets the state of `key` under `policy`: its budget starts full.
    /// Drops this client's cached denial of the key. Not subject to the
    /// failure policy.
    ///
    /// # Errors
    ///
    /// [`Error::Rejected`] or [`Error::Unavailable`].
    pub async fn reset(&self, policy: &PolicyRef, key: &str) -> Result<(), Error> {
        let mut rpc = self.shared.rpc.clone();
        let request = pb::ResetRequest {
            key: key.to_owned(),
            policy: Some(match policy {
                PolicyRef::Named(name) => pb::reset_request::Policy::PolicyName(name.clone()),
                PolicyRef::Inline(p) => pb::reset_request::Policy::InlinePolicy(p.into()),
            }),
        };
        let result = call(
            |r| async move { rpc.reset(r).await },
            request,
            self.deadline_from_now(),
        )
        .await;
        // Even a reset that timed out may have happened.
        if let Some(cache) = &self.shared.cache {
            cache.forget(policy, key);
        }
        result.map(|_| ()).map_err(classify)
    }

    fn deadline_from_now(&self) -> Instant {
        Instant::now() + self.deadline
    }

    /// A failed call: the server's refusal passes through; an unreachable
    /// quotad becomes `count` decisions as the failure policy says, or an
    /// error.
    fn unavailable(&self, status: Status, count: usize) -> Result<Vec<Decision>, Error> {
        let status = match classify(status) {
            Error::Unavailable(status) => status,
            refused => return Err(refused),
        };
        let reason = match self.on_unavailable {
            FailurePolicy::FailOpen => Reason::FailOpen,
            FailurePolicy::FailClosed => Reason::FailClosed,
            FailurePolicy::Error => {
                metrics::counter!("quotad_client_unavailable_total", "outcome" => "error")
                    .increment(1);
                return Err(Error::Unavailable(status));
            }
        };
        metrics::counter!("quotad_client_unavailable_total", "outcome" => reason.as_str())
            .increment(1);
        if let Some(suppressed) = self.shared.outage_log.record(self.now_ms()) {
            tracing::warn!(
                code = %status.code(),
                error = status.message(),
                cause = %cause(&status),
                outcome = %reason,
                suppressed,
                "quotad unavailable"
            );
        }
        Ok(vec![failure_decision(reason); count])
    }
}

/// What lies under a failed call's status: the errors tonic keeps as its
/// source (a refused connection; a TLS handshake failing on an unknown CA,
/// another name or an expired certificate), or `none` when the status came
/// from quotad itself.
fn cause(status: &Status) -> String {
    std::error::Error::source(status).map_or_else(|| "none".to_owned(), source_chain)
}

/// The domain decision of an answer.
pub(crate) fn decision(d: Option<pb::Decision>) -> Result<Decision, Error> {
    let d = d.ok_or(Error::BadResponse("decision missing"))?;
    Decision::try_from(&d).map_err(|_| Error::BadResponse("unknown reason"))
}

fn first(decisions: Vec<Decision>) -> Decision {
    decisions
        .into_iter()
        .next()
        .expect("the failure policy answers one decision per check")
}

/// Unreachable-style codes, and any status this side made from a transport
/// error (tonic reports a broken HTTP/2 exchange, e.g. plaintext to a TLS
/// port, as `INTERNAL` with the error as its source), fall to the failure
/// policy; anything else is the server refusing the request.
pub(crate) fn classify(status: Status) -> Error {
    match status.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
            Error::Unavailable(status)
        }
        _ if std::error::Error::source(&status).is_some() => Error::Unavailable(status),
        _ => Error::Rejected(status),
    }
}

pub(crate) fn failure_decision(reason: Reason) -> Decision {
    Decision {
        allowed: reason == Reason::FailOpen,
        limit: 0,
        remaining: 0,
        retry_after_ms: 0,
        reset_after_ms: 0,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn the_cause_of_a_status_is_its_source_chain_without_repeats() {
        assert_eq!(cause(&Status::unavailable("from quotad")), "none");
        let handshake = Layer("invalid peer certificate: UnknownIssuer", None);
        let quoting = Layer(
            "tls: invalid peer certificate: UnknownIssuer",
            Some(Box::new(handshake)),
        );
        let mut status = Status::unavailable("transport error");
        status.set_source(Arc::new(Layer("transport error", Some(Box::new(quoting)))));
        assert_eq!(
            cause(&status),
            "transport error: tls: invalid peer certificate: UnknownIssuer"
        );
    }

    #[test]
    fn refusals_from_the_server_are_rejections_and_local_transport_failures_are_not() {
        assert!(matches!(
            classify(Status::invalid_argument("key: must not be empty")),
            Error::Rejected(_)
        ));
        assert!(matches!(
            classify(Status::internal("from the server")),
            Error::Rejected(_)
        ));
        let mut broken = Status::internal("h2 protocol error: http2 error");
        broken.set_source(Arc::new(std::io::Error::other("GOAWAY: FRAME_SIZE_ERROR")));
        assert!(matches!(classify(broken), Error::Unavailable(_)));
        for code in [Code::Unavailable, Code::DeadlineExceeded, Code::Cancelled] {
            assert!(matches!(
                classify(Status::new(code, "")),
                Error::Unavailable(_)
            ));
        }
    }
}
