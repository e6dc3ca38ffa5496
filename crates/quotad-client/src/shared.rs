//! [`Shared`]: what every clone of a client shares, and the one way a call
//! goes out (under a deadline, sent to quotad as `grpc-timeout` too).
//!
//! Both the client and the coalescing code send through it, so it sits
//! below both of them.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use quotad_core::{Clock, Throttle};
use quotad_proto::v1 as pb;
use quotad_proto::v1::quota_client::QuotaClient;
use tokio::time::Instant;
use tonic::Status;
use tonic::transport::Channel;

use crate::deny_cache::DenyCache;
use crate::queue::{Answer, Coalescer};
use crate::request::deadline_exceeded;

/// What every clone of a client shares: the connection, the coalescing
/// queue, the deny cache.
pub(crate) struct Shared {
    pub(crate) rpc: QuotaClient<Channel>,
    /// `quotad.v1.Concurrency` on the same connection.
    pub(crate) slots: quotad_proto::v1::concurrency_client::ConcurrencyClient<Channel>,
    pub(crate) coalescer: Option<Coalescer>,
    pub(crate) cache: Option<DenyCache>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) outage_log: Throttle,
    pub(crate) runtime: Option<tokio::runtime::Handle>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("coalescer", &self.coalescer)
            .field("cache", &self.cache.is_some())
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub(crate) fn coalescer(&self) -> Option<&Coalescer> {
        self.coalescer.as_ref()
    }

    /// The runtime batches are sent on: the one the client was built in,
    /// else the caller's.
    pub(crate) fn runtime(&self) -> Option<tokio::runtime::Handle> {
        self.runtime
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok())
    }

    /// One `Check` call, answered by `deadline`.
    pub(crate) async fn unary(&self, request: pb::CheckRequest, deadline: Instant) -> Answer {
        metrics::counter!("quotad_client_calls_total", "method" => "check").increment(1);
        let mut rpc = self.rpc.clone();
        Answer::of_check(call(|r| async move { rpc.check(r).await }, request, deadline).await)
    }

    /// One `CheckBatch` call, answered by `deadline`.
    pub(crate) async fn batch(
        &self,
        request: pb::CheckBatchRequest,
        deadline: Instant,
    ) -> Result<pb::CheckBatchResponse, Status> {
        metrics::counter!("quotad_client_calls_total", "method" => "check_batch").increment(1);
        let mut rpc = self.rpc.clone();
        call(
            |r| async move { rpc.check_batch(r).await },
            request,
            deadline,
        )
        .await
    }
}

/// Runs one call under `deadline` (sent to the server as `grpc-timeout`
/// too, so it stops working on an abandoned call).
pub(crate) async fn call<Req, Res, F, Fut>(
    f: F,
    request: Req,
    deadline: Instant,
) -> Result<Res, Status>
where
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Res>, Status>>,
{
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(deadline_exceeded());
    }
    let mut request = tonic::Request::new(request);
    request.set_timeout(left);
    crate::transport::propagate(request.metadata_mut());
    match tokio::time::timeout_at(deadline, f(request)).await {
        Ok(answer) => answer.map(tonic::Response::into_inner),
        Err(_) => Err(deadline_exceeded()),
    }
}
