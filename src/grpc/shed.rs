//! Load shedding: at most `transport.max_in_flight` gRPC calls in progress
//! on the whole server; a call past it is answered UNAVAILABLE at once,
//! before its message is read, instead of waiting in a queue that only
//! grows while the load lasts.
//!
//! A shed call reaches no handler: nothing is decided, created or
//! consumed. UNAVAILABLE rather than RESOURCE_EXHAUSTED because every
//! quotad client (and Envoy's rate limit filter) answers UNAVAILABLE with
//! its failure policy, as when quotad cannot be reached, which is what an
//! overloaded replica is to its caller; RESOURCE_EXHAUSTED is the caller's
//! own fault (a message too large), which clients do not fall back on.
//!
//! gRPC health and reflection are never shed: a replica that is merely
//! busy must not look dead to the orchestrator that would restart it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use metrics::Counter;
use tokio::sync::Semaphore;
use tower_layer::Layer;
use tower_service::Service;

/// The message of a shed call.
pub const SHED_MESSAGE: &str =
    "quotad is over capacity (transport.max_in_flight calls in progress): retry later";

/// Paths never shed: health checking and reflection, and the calls that
/// keep or free concurrency slots (shed, a renewal lets a slot end under
/// its holder, and a release strands what it frees until its TTL).
const EXEMPT: [&str; 4] = [
    "/grpc.health.v1.Health/",
    "/grpc.reflection.",
    "/quotad.v1.Concurrency/Renew",
    "/quotad.v1.Concurrency/Release",
];

/// Sheds calls past a bound on the calls in progress; see the module.
#[derive(Clone, Debug)]
pub struct ShedLayer {
    /// `None`: no bound (`transport.max_in_flight = 0`).
    permits: Option<Arc<Semaphore>>,
    shed: Counter,
}

impl ShedLayer {
    /// At most `max_in_flight` calls at once (0: no bound), counting each
    /// shed call in `shed`.
    pub fn new(max_in_flight: usize, shed: Counter) -> Self {
        ShedLayer {
            permits: (max_in_flight > 0).then(|| Arc::new(Semaphore::new(max_in_flight))),
            shed,
        }
    }
}

impl<S> Layer<S> for ShedLayer {
    type Service = Shed<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Shed {
            inner,
            layer: self.clone(),
        }
    }
}

/// See [`ShedLayer`].
#[derive(Clone, Debug)]
pub struct Shed<S> {
    inner: S,
    layer: ShedLayer,
}

type ShedFuture<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, B, RB> Service<Request<B>> for Shed<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RB: Default + Send + 'static,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = ShedFuture<Response<RB>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let Some(permits) = &self.layer.permits else {
            return Box::pin(self.inner.call(request));
        };
        let path = request.uri().path();
        if EXEMPT.iter().any(|p| path.starts_with(p)) {
            return Box::pin(self.inner.call(request));
        }
        match Arc::clone(permits).try_acquire_owned() {
            Ok(permit) => {
                let call = self.inner.call(request);
                Box::pin(async move {
                    let response = call.await;
                    drop(permit);
                    response
                })
            }
            Err(_) => {
                self.layer.shed.increment(1);
                let response = tonic::Status::unavailable(SHED_MESSAGE).into_http();
                Box::pin(std::future::ready(Ok(response)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;

    /// A service whose calls each wait for a permit of its gate.
    #[derive(Clone)]
    struct Gated(Arc<Semaphore>);

    impl Service<Request<()>> for Gated {
        type Response = Response<String>;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Response<String>, Infallible>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            let gate = Arc::clone(&self.0);
            Box::pin(async move {
                gate.acquire().await.expect("open").forget();
                Ok(Response::new("done".to_owned()))
            })
        }
    }

    fn request(path: &str) -> Request<()> {
        Request::builder().uri(path).body(()).expect("valid")
    }

    fn status(response: &Response<String>) -> Option<&str> {
        response
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
    }

    #[tokio::test]
    async fn the_call_past_the_bound_is_refused_at_once_and_health_never_is() {
        let gate = Arc::new(Semaphore::new(0));
        let mut shed = ShedLayer::new(2, Counter::noop()).layer(Gated(Arc::clone(&gate)));
        let held: Vec<_> = (0..2)
            .map(|_| tokio::spawn(shed.call(request("/quotad.v1.Quota/Check"))))
            .collect();
        let refused = shed
            .call(request("/quotad.v1.Quota/Check"))
            .await
            .expect("answered");
        assert_eq!(status(&refused), Some("14"), "UNAVAILABLE");
        assert_eq!(refused.body(), "", "no handler ran");
        let health = tokio::spawn(shed.call(request("/grpc.health.v1.Health/Check")));
        gate.add_permits(3);
        for call in held {
            let done = call.await.expect("no panic").expect("answered");
            assert_eq!(done.body(), "done");
        }
        let health = health.await.expect("no panic").expect("answered");
        assert_eq!(health.body(), "done", "health is served past the bound");
        // The permits are back: the next call is served.
        gate.add_permits(1);
        let next = shed
            .call(request("/quotad.v1.Quota/Check"))
            .await
            .expect("answered");
        assert_eq!(next.body(), "done");
    }

    #[tokio::test]
    async fn no_bound_sheds_nothing() {
        let gate = Arc::new(Semaphore::new(100));
        let mut shed = ShedLayer::new(0, Counter::noop()).layer(Gated(gate));
        for _ in 0..100 {
            let done = shed
                .call(request("/quotad.v1.Quota/Check"))
                .await
                .expect("answered");
            assert_eq!(done.body(), "done");
        }
    }
}
