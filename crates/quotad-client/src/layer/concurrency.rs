//! A tower layer that bounds how many requests of a key an HTTP service
//! serves at once, through a quotad concurrency policy shared by every
//! replica: each request holds a slot ([`Client::acquire`]) from before
//! the inner service is called until its response body has ended (a
//! streamed download holds it to its last byte): the body, [`SlotBody`],
//! holds the guard and drops it at its end, on an error, or when it is
//! dropped unfinished (a client gone mid-download), which releases it; a
//! panic or a cancelled request drops it too. When the key's slots are full the answer is `429 Too
//! Many Requests` or `503 Service Unavailable` (by [`ConcurrencyLayer::when_full`]),
//! with `Retry-After`: the seconds until the soonest slot ends if none is
//! released, rounded up (a release usually comes sooner).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use quotad_core::Reason;
use tower_layer::Layer;
use tower_service::Service;

use super::key::{IpPrefixes, KeyExtractor};
use super::{CostFn, plain, retry_after_secs};
use crate::client::Client;
use crate::request::Check;
use crate::slot::{Acquired, SlotGuard};

pin_project_lite::pin_project! {
    /// The response body of a [`ConcurrencyLimit`]: the inner service's,
    /// holding the request's slot until it ends (or errs, or is dropped).
    pub struct SlotBody<B> {
        #[pin]
        inner: B,
        slot: Option<SlotGuard>,
    }
}

impl<B> SlotBody<B> {
    fn new(inner: B, slot: Option<SlotGuard>) -> Self {
        SlotBody { inner, slot }
    }

    /// Whether the body holds a slot now: one of a request admitted whose
    /// body has not ended (never for the layer's own 400, 429 and 503).
    pub fn holds_slot(&self) -> bool {
        self.slot.is_some()
    }

    /// The inner body; its slot, if it still held one, is released.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

/// A body of the text (holding no slot), so that a layer above this one
/// that answers text of its own (a [`super::RateLimitLayer`], another
/// `ConcurrencyLayer`) composes with it.
impl<B: From<&'static str>> From<&'static str> for SlotBody<B> {
    fn from(text: &'static str) -> Self {
        SlotBody::new(B::from(text), None)
    }
}

/// An empty body holding no slot (for layers that need `Default` bodies).
impl<B: Default> Default for SlotBody<B> {
    fn default() -> Self {
        SlotBody::new(B::default(), None)
    }
}

impl<B> fmt::Debug for SlotBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotBody")
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

impl<B: Body> Body for SlotBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        if !matches!(frame, Some(Ok(_))) {
            // The end, or an error: the request is done with its slot.
            this.slot.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

struct Settings {
    client: Client,
    policy: String,
    key: KeyExtractor,
    prefixes: IpPrefixes,
    cost: Arc<CostFn>,
    when_full: StatusCode,
}

/// Holds a slot of one quotad concurrency policy for each request.
///
/// ```no_run
/// # fn app(client: quotad_client::Client) {
/// use axum::{Router, routing::post};
/// use http::StatusCode;
/// use quotad_client::{ConcurrencyLayer, KeyExtractor};
///
/// // At most `limit` exports per tenant at once, across every replica.
/// let exports = ConcurrencyLayer::new(client, "exports", KeyExtractor::Header(http::HeaderName::from_static("x-tenant")))
///     .when_full(StatusCode::SERVICE_UNAVAILABLE);
/// let app: Router = Router::new().route("/export", post(|| async { "done" }).layer(exports));
/// # }
/// ```
#[derive(Clone)]
pub struct ConcurrencyLayer {
    settings: Arc<Settings>,
}

impl fmt::Debug for ConcurrencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLayer")
            .field("policy", &self.settings.policy)
            .field("when_full", &self.settings.when_full)
            .finish_non_exhaustive()
    }
}

impl ConcurrencyLayer {
    /// Each request holds 1 unit of its key under the named concurrency
    /// `policy`; `429` when full.
    pub fn new(client: Client, policy: impl Into<String>, key: KeyExtractor) -> Self {
        Self {
            settings: Arc::new(Settings {
                client,
                policy: policy.into(),
                key,
                prefixes: IpPrefixes::default(),
                cost: Arc::new(|_| 1),
                when_full: StatusCode::TOO_MANY_REQUESTS,
            }),
        }
    }

    /// Units each request holds.
    #[must_use]
    pub fn cost(self, f: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> Self {
        self.with(|s| s.cost = Arc::new(f))
    }

    /// Keys IP addresses by these network prefixes (as [`super::RateLimitLayer`]).
    #[must_use]
    pub fn ip_prefixes(self, prefixes: IpPrefixes) -> Self {
        self.with(|s| s.prefixes = prefixes)
    }

    /// The status answered when the key's slots are full: `429 Too Many
    /// Requests` (the default: the caller sends too much at once) or
    /// `503 Service Unavailable` (the service is busy, whoever asks).
    #[must_use]
    pub fn when_full(self, status: StatusCode) -> Self {
        self.with(|s| s.when_full = status)
    }

    fn with(self, f: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = Arc::try_unwrap(self.settings).unwrap_or_else(|shared| Settings {
            client: shared.client.clone(),
            policy: shared.policy.clone(),
            key: shared.key.clone(),
            prefixes: shared.prefixes,
            cost: Arc::clone(&shared.cost),
            when_full: shared.when_full,
        });
        f(&mut settings);
        Self {
            settings: Arc::new(settings),
        }
    }
}

impl<S> Layer<S> for ConcurrencyLayer {
    type Service = ConcurrencyLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimit {
            inner,
            settings: Arc::clone(&self.settings),
        }
    }
}

/// The service [`ConcurrencyLayer`] wraps around another.
#[derive(Clone)]
pub struct ConcurrencyLimit<S> {
    inner: S,
    settings: Arc<Settings>,
}

impl<S> fmt::Debug for ConcurrencyLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimit")
            .field("policy", &self.settings.policy)
            .finish_non_exhaustive()
    }
}

impl<S, B, R> Service<Request<B>> for ConcurrencyLimit<S>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
    R: From<&'static str> + Send,
{
    type Response = Response<SlotBody<R>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let settings = Arc::clone(&self.settings);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let Some(key) = settings.key.extract_with(&parts, &settings.prefixes) else {
                return Ok(unheld(plain(
                    StatusCode::BAD_REQUEST,
                    "no concurrency-limit key in the request\n",
                )));
            };
            let check = Check::named(settings.policy.clone(), key).cost((settings.cost)(&parts));
            let request = Request::from_parts(parts, body);
            match settings.client.acquire(&check).await {
                Ok(Acquired::Held(slot)) => {
                    // Held by the body to its end; an inner error releases it.
                    let response = inner.call(request).await?;
                    Ok(response.map(|body| SlotBody::new(body, Some(slot))))
                }
                Ok(Acquired::Denied(decision)) if decision.reason == Reason::FailClosed => {
                    Ok(unheld(plain(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "limiter unavailable\n",
                    )))
                }
                Ok(Acquired::Denied(decision)) => {
                    let mut response = plain(settings.when_full, "too many requests at once\n");
                    let retry = retry_after_secs(decision.retry_after_ms);
                    response
                        .headers_mut()
                        .insert(http::header::RETRY_AFTER, HeaderValue::from(retry));
                    Ok(unheld(response))
                }
                Err(error) => {
                    tracing::warn!(policy = %settings.policy, %error, "concurrency acquire failed");
                    Ok(unheld(match error {
                        crate::request::Error::Rejected(_) => plain(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "concurrency limiter misconfigured\n",
                        ),
                        _ => plain(StatusCode::SERVICE_UNAVAILABLE, "limiter unavailable\n"),
                    }))
                }
            }
        })
    }
}

/// An answer of the layer's own, holding no slot.
fn unheld<R>(response: Response<R>) -> Response<SlotBody<R>> {
    response.map(|body| SlotBody::new(body, None))
}
