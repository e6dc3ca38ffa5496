//! When each call arrived: the outermost of quotad's layers stamps every
//! request with the moment it reached the server, before its body is read
//! and decoded, so that quotad's deadline for the call counts from the same
//! moment as tonic's own timeout.

use std::task::{Context, Poll};

use http::Request;
use tower_layer::Layer;
use tower_service::Service;

/// When a call reached quotad's outermost layer, in the request's
/// extensions: quotad's deadline for the call counts from here, as tonic's
/// own timeout for it does (it starts before the body is read and decoded,
/// which on a loaded machine can take longer than the margin quotad keeps;
/// see `api::call_deadline`).
#[derive(Clone, Copy, Debug)]
pub struct Arrived(pub std::time::Instant);

/// The layer that stamps [`Arrived`] on every request.
#[derive(Clone, Copy, Debug, Default)]
pub struct ArrivalLayer;

impl<S> Layer<S> for ArrivalLayer {
    type Service = Arrival<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Arrival { inner }
    }
}

/// See [`ArrivalLayer`].
#[derive(Clone, Debug)]
pub struct Arrival<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for Arrival<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        request
            .extensions_mut()
            .insert(Arrived(std::time::Instant::now()));
        self.inner.call(request)
    }
}
