//! The gRPC client: checks with a deadline and a failure policy.

use std::future::Future;
use std::time::Duration;

use quotad_core::{BatchMode, Decision, Policy, Reason};
use quotad_proto::v1 as pb;
use quotad_proto::v1::quota_client::QuotaClient;
use thiserror::Error;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

/// The default deadline for one call, connection included.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(250);

/// What a check answers when quotad cannot be reached within the deadline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FailurePolicy {
    /// Admit the request; the decision's reason is [`Reason::FailOpen`].
    FailOpen,
    /// Deny the request; the decision's reason is [`Reason::FailClosed`].
    FailClosed,
    /// Return [`Error::Unavailable`] and let the caller decide.
    #[default]
    Error,
}

/// Why a call failed.
#[derive(Debug, Error)]
pub enum Error {
    /// The address is not a valid URI.
    #[error("invalid quotad address: {0}")]
    InvalidAddress(String),
    /// quotad could not be reached, or did not answer within the deadline,
    /// and the failure policy is [`FailurePolicy::Error`].
    #[error("quotad is unavailable: {0}")]
    Unavailable(Status),
    /// quotad refused the request (bad input, unknown policy, ...): a bug in
    /// the caller, never subject to the failure policy.
    #[error("quotad rejected the request: {}: {}", .0.code(), .0.message())]
    Rejected(Status),
    /// The answer could not be understood (a server from a newer API).
    #[error("unexpected answer from quotad: {0}")]
    BadResponse(&'static str),
}

/// Which policy a check counts under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyRef {
    /// A named policy from the server's configuration.
    Named(String),
    /// A policy given in the request (when the server allows it).
    Inline(Policy),
}

/// One request: `cost` units of `key` under a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    key: String,
    cost: u64,
    policy: PolicyRef,
}

impl Check {
    /// One unit of `key` under the named policy `policy`.
    pub fn named(policy: impl Into<String>, key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            cost: 1,
            policy: PolicyRef::Named(policy.into()),
        }
    }

    /// One unit of `key` under an inline policy.
    pub fn inline(policy: Policy, key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            cost: 1,
            policy: PolicyRef::Inline(policy),
        }
    }

    /// Asks for `cost` units instead of one.
    #[must_use]
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// The key counted.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The policy referred to.
    pub fn policy(&self) -> &PolicyRef {
        &self.policy
    }

    fn to_proto(&self) -> pb::CheckRequest {
        pb::CheckRequest {
            key: self.key.clone(),
            cost: Some(self.cost),
            policy: Some(match &self.policy {
                PolicyRef::Named(name) => pb::check_request::Policy::PolicyName(name.clone()),
                PolicyRef::Inline(p) => pb::check_request::Policy::InlinePolicy(p.into()),
            }),
        }
    }
}

/// Settings for a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientBuilder {
    address: String,
    deadline: Duration,
    on_unavailable: FailurePolicy,
}

impl ClientBuilder {
    /// The longest one call may take, connecting included; past it the
    /// failure policy applies. Default [`DEFAULT_DEADLINE`].
    #[must_use]
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// What to answer when quotad cannot be reached. Default
    /// [`FailurePolicy::Error`].
    #[must_use]
    pub fn on_unavailable(mut self, policy: FailurePolicy) -> Self {
        self.on_unavailable = policy;
        self
    }

    fn endpoint(&self) -> Result<Endpoint, Error> {
        Ok(Endpoint::from_shared(self.address.clone())
            .map_err(|e| Error::InvalidAddress(format!("{}: {e}", self.address)))?
            .connect_timeout(self.deadline)
            .tcp_nodelay(true))
    }

    /// A client that connects on first use and reconnects by itself, so it
    /// can be made before quotad is up and outlives quotad restarts.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidAddress`] when the address is not a URI.
    pub fn build(self) -> Result<Client, Error> {
        let endpoint = self.endpoint()?;
        Ok(Client {
            rpc: QuotaClient::new(endpoint.connect_lazy()),
            deadline: self.deadline,
            on_unavailable: self.on_unavailable,
        })
    }
}

/// A cheap-to-clone handle to one quotad (or a load-balanced address of
/// many). Every clone shares one HTTP/2 connection.
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
    rpc: QuotaClient<Channel>,
    deadline: Duration,
    on_unavailable: FailurePolicy,
}

impl Client {
    /// Settings for a client of quotad at `address` (`http://host:port`).
    pub fn builder(address: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            address: address.into(),
            deadline: DEFAULT_DEADLINE,
            on_unavailable: FailurePolicy::default(),
        }
    }

    /// Connects with default settings and fails if quotad cannot be reached
    /// within the deadline.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidAddress`], or [`Error::Unavailable`] when no
    /// connection could be made.
    pub async fn connect(address: impl Into<String>) -> Result<Self, Error> {
        let builder = Self::builder(address);
        let channel = builder
            .endpoint()?
            .connect()
            .await
            .map_err(|e| Error::Unavailable(Status::unavailable(e.to_string())))?;
        Ok(Self {
            rpc: QuotaClient::new(channel),
            deadline: builder.deadline,
            on_unavailable: builder.on_unavailable,
        })
    }

    /// Decides and consumes one request.
    ///
    /// # Errors
    ///
    /// [`Error::Rejected`] for bad input or an unknown policy;
    /// [`Error::Unavailable`] when quotad cannot be reached and the failure
    /// policy is [`FailurePolicy::Error`].
    pub async fn check(&self, check: &Check) -> Result<Decision, Error> {
        let mut rpc = self.rpc.clone();
        let request = check.to_proto();
        match self
            .call(|r| async move { rpc.check(r).await }, request)
            .await
        {
            Ok(answer) => decision(answer.decision),
            Err(status) => self.unavailable(status, 1).map(first),
        }
    }

    /// Decides a batch of at most 1,000 items, in one round trip.
    ///
    /// # Errors
    ///
    /// As [`Client::check`].
    pub async fn check_batch(
        &self,
        checks: &[Check],
        mode: BatchMode,
    ) -> Result<Vec<Decision>, Error> {
        let mut rpc = self.rpc.clone();
        let request = pb::CheckBatchRequest {
            items: checks.iter().map(Check::to_proto).collect(),
            mode: pb::BatchMode::from(mode).into(),
        };
        match self
            .call(|r| async move { rpc.check_batch(r).await }, request)
            .await
        {
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

    /// What [`Client::check`] would answer now, consuming nothing.
    ///
    /// # Errors
    ///
    /// As [`Client::check`].
    pub async fn peek(&self, check: &Check) -> Result<Decision, Error> {
        let mut rpc = self.rpc.clone();
        let request = check.to_proto();
        match self
            .call(|r| async move { rpc.peek(r).await }, request)
            .await
        {
            Ok(answer) => decision(answer.decision),
            Err(status) => self.unavailable(status, 1).map(first),
        }
    }

    /// Forgets the state of `key` under `policy`: its budget starts full.
    /// Not subject to the failure policy.
    ///
    /// # Errors
    ///
    /// [`Error::Rejected`] or [`Error::Unavailable`].
    pub async fn reset(&self, policy: &PolicyRef, key: &str) -> Result<(), Error> {
        let mut rpc = self.rpc.clone();
        let request = pb::ResetRequest {
            key: key.to_owned(),
            policy: Some(match policy {
                PolicyRef::Named(name) => pb::reset_request::Policy::PolicyName(name.clone()),
                PolicyRef::Inline(p) => pb::reset_request::Policy::InlinePolicy(p.into()),
            }),
        };
        self.call(|r| async move { rpc.reset(r).await }, request)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    /// Runs one call under the deadline (sent to the server as
    /// `grpc-timeout` too, so it stops working on an abandoned call).
    async fn call<Req, Res, F, Fut>(&self, f: F, request: Req) -> Result<Res, Status>
    where
        F: FnOnce(tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Res>, Status>>,
    {
        let mut request = tonic::Request::new(request);
        request.set_timeout(self.deadline);
        match tokio::time::timeout(self.deadline, f(request)).await {
            Ok(answer) => answer.map(tonic::Response::into_inner),
            Err(_) => Err(Status::deadline_exceeded(
                "no answer from quotad within the deadline",
            )),
        }
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
        tracing::warn!(code = %status.code(), outcome = %reason, "quotad unavailable");
        Ok(vec![failure_decision(reason); count])
    }
}

/// The domain decision of an answer.
fn decision(d: Option<pb::Decision>) -> Result<Decision, Error> {
    let d = d.ok_or(Error::BadResponse("decision missing"))?;
    Decision::try_from(&d).map_err(|_| Error::BadResponse("unknown reason"))
}

fn first(decisions: Vec<Decision>) -> Decision {
    decisions
        .into_iter()
        .next()
        .expect("the failure policy answers one decision per check")
}

/// Unreachable-style codes fall to the failure policy; anything else is the
/// server refusing the request.
fn classify(status: Status) -> Error {
    match status.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
            Error::Unavailable(status)
        }
        _ => Error::Rejected(status),
    }
}

fn failure_decision(reason: Reason) -> Decision {
    Decision {
        allowed: reason == Reason::FailOpen,
        limit: 0,
        remaining: 0,
        retry_after_ms: 0,
        reset_after_ms: 0,
        reason,
    }
}
