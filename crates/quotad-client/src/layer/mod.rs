//! A tower layer that rate-limits an HTTP service through quotad.
//!
//! Each request is keyed (peer IP, a trusted proxy's `X-Forwarded-For`, a
//! header, or a closure), priced (1 by default), and checked against one
//! policy. A denial answers `429 Too Many Requests` with `Retry-After`, the
//! IETF draft `RateLimit` / `RateLimit-Policy` fields and the legacy
//! `X-RateLimit-*` headers; admitted responses carry the same headers. When
//! quotad cannot be reached the client's failure policy decides: fail-open
//! passes the request, fail-closed answers `503`.
//!
//! IP keys are whole networks, not single addresses: one IPv6 host usually
//! holds a whole /64, so keying by /128 would give it unlimited budgets (and
//! fill quotad's key table). [`IpPrefixes`] sets the lengths (IPv4 /32 and
//! IPv6 /64 by default) for the peer and the trusted `X-Forwarded-For`
//! address alike.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use quotad_core::{Decision, Reason, Throttle};
use tower_layer::Layer;
use tower_service::Service;

use crate::client::{Client, OUTAGE_LOG_INTERVAL};
use crate::request::{Check, Error};

mod concurrency;
mod key;

pub use concurrency::{ConcurrencyLayer, ConcurrencyLimit, SlotBody};
pub use key::{IpPrefixes, KeyExtractor, PrefixError};

pub(crate) type KeyFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;
pub(crate) type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;

struct Settings {
    client: Client,
    policy: String,
    key: KeyExtractor,
    prefixes: IpPrefixes,
    cost: Arc<CostFn>,
    window_secs: Option<u64>,
    /// One warning per interval when checks fail, shared by every service
    /// the layer makes.
    failure_log: Arc<Throttle>,
}

/// Rate-limits the wrapped service under one quotad policy.
///
/// ```no_run
/// # fn app(client: quotad_client::Client) {
/// use axum::{Router, routing::get};
/// use quotad_client::{KeyExtractor, RateLimitLayer};
///
/// let limited = RateLimitLayer::new(client, "api", KeyExtractor::PeerIp)
///     .cost(|parts| if parts.uri.path().starts_with("/search") { 5 } else { 1 });
/// let app: Router = Router::new()
///     .route("/api/limited", get(|| async { "ok" }).layer(limited));
/// # }
/// ```
#[derive(Clone)]
pub struct RateLimitLayer {
    settings: Arc<Settings>,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("policy", &self.settings.policy)
            .field("key", &self.settings.key)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// Every request costs 1 unit of its key under the named `policy`.
    pub fn new(client: Client, policy: impl Into<String>, key: KeyExtractor) -> Self {
        Self {
            settings: Arc::new(Settings {
                client,
                policy: policy.into(),
                key,
                prefixes: IpPrefixes::default(),
                cost: Arc::new(|_| 1),
                window_secs: None,
                failure_log: Arc::new(Throttle::new(OUTAGE_LOG_INTERVAL)),
            }),
        }
    }

    /// Prices each request.
    #[must_use]
    pub fn cost(self, f: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> Self {
        self.with(|s| s.cost = Arc::new(f))
    }

    /// Keys IP addresses (peer or trusted `X-Forwarded-For`) by these
    /// network prefixes; default IPv4 /32, IPv6 /64.
    #[must_use]
    pub fn ip_prefixes(self, prefixes: IpPrefixes) -> Self {
        self.with(|s| s.prefixes = prefixes)
    }

    /// Advertises the policy's window, in seconds, as `w` in
    /// `RateLimit-Policy` (the decision itself does not carry it).
    #[must_use]
    pub fn window_secs(self, secs: u64) -> Self {
        self.with(|s| s.window_secs = Some(secs))
    }

    fn with(self, f: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = Arc::try_unwrap(self.settings).unwrap_or_else(|shared| Settings {
            client: shared.client.clone(),
            policy: shared.policy.clone(),
            key: shared.key.clone(),
            prefixes: shared.prefixes,
            cost: Arc::clone(&shared.cost),
            window_secs: shared.window_secs,
            failure_log: Arc::clone(&shared.failure_log),
        });
        f(&mut settings);
        Self {
            settings: Arc::new(settings),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            settings: Arc::clone(&self.settings),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around another.
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    settings: Arc<Settings>,
}

impl<S> fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("policy", &self.settings.policy)
            .finish_non_exhaustive()
    }
}

impl<S, B, R> Service<Request<B>> for RateLimit<S>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
    R: From<&'static str> + Send,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The clone is not ready; the readied service goes with this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let settings = Arc::clone(&self.settings);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let Some(key) = settings.key.extract_with(&parts, &settings.prefixes) else {
                if settings.key.needs_peer() {
                    if let Some(suppressed) = settings.failure_log.record(settings.client.now_ms())
                    {
                        tracing::error!(
                            policy = %settings.policy,
                            suppressed,
                            "no peer address on the request: serve the app with connect info \
                             (axum: into_make_service_with_connect_info::<SocketAddr>)"
                        );
                    }
                    return Ok(plain(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "rate limiter misconfigured\n",
                    ));
                }
                return Ok(plain(
                    StatusCode::BAD_REQUEST,
                    "no rate-limit key in the request\n",
                ));
            };
            let check = Check::named(settings.policy.clone(), key).cost((settings.cost)(&parts));
            let request = Request::from_parts(parts, body);
            let decision = match settings.client.check(&check).await {
                Ok(decision) => decision,
                Err(error) => {
                    let now_ms = settings.client.now_ms();
                    if let Some(suppressed) = settings.failure_log.record(now_ms) {
                        tracing::warn!(
                            policy = %settings.policy,
                            %error,
                            suppressed,
                            "rate-limit check failed"
                        );
                    }
                    // quotad refusing the key (too long: it came from the
                    // request) is the caller's fault; refusing anything else
                    // (an unknown policy, a bad cost from this app's
                    // extractors) is this server's, not an outage.
                    return Ok(match error {
                        Error::Rejected(status)
                            if status.code() == tonic::Code::InvalidArgument
                                && status.message().starts_with("key:") =>
                        {
                            plain(StatusCode::BAD_REQUEST, "invalid rate-limit key\n")
                        }
                        Error::Rejected(_) => plain(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "rate limiter misconfigured\n",
                        ),
                        _ => plain(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "rate limiter unavailable\n",
                        ),
                    });
                }
            };
            match decision.reason {
                Reason::FailOpen => inner.call(request).await,
                Reason::FailClosed => Ok(plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "rate limiter unavailable\n",
                )),
                _ if decision.allowed => {
                    let mut response = inner.call(request).await?;
                    set_headers(response.headers_mut(), &settings, &decision);
                    Ok(response)
                }
                _ => {
                    let mut response = plain(StatusCode::TOO_MANY_REQUESTS, "too many requests\n");
                    set_headers(response.headers_mut(), &settings, &decision);
                    // Only a spent budget has a time after which the same
                    // request fits; a cost above the capacity never does.
                    if decision.reason == Reason::LimitExceeded {
                        let retry = retry_after_secs(decision.retry_after_ms);
                        response
                            .headers_mut()
                            .insert(http::header::RETRY_AFTER, HeaderValue::from(retry));
                    }
                    Ok(response)
                }
            }
        })
    }
}

pub(crate) fn plain<R: From<&'static str>>(status: StatusCode, body: &'static str) -> Response<R> {
    let mut response = Response::new(R::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Whole seconds to wait, rounded up, at least 1: a client that retries
/// after `Retry-After` must not be early.
pub fn retry_after_secs(retry_after_ms: u64) -> u64 {
    retry_after_ms.div_ceil(1_000).max(1)
}

fn set_headers(headers: &mut HeaderMap, settings: &Settings, d: &Decision) {
    let reset = d.reset_after_ms.div_ceil(1_000);
    // Names that are not valid sf-strings are still quoted safely: policy
    // names are [A-Za-z0-9_.-].
    let name = &settings.policy;
    let policy = match settings.window_secs {
        Some(w) => format!("\"{name}\";q={};w={w}", d.limit),
        None => format!("\"{name}\";q={}", d.limit),
    };
    let current = format!("\"{name}\";r={};t={reset}", d.remaining);
    let pairs: [(&str, String); 5] = [
        ("ratelimit-policy", policy),
        ("ratelimit", current),
        ("x-ratelimit-limit", d.limit.to_string()),
        ("x-ratelimit-remaining", d.remaining.to_string()),
        ("x-ratelimit-reset", reset.to_string()),
    ];
    for (name, value) in pairs {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_and_is_at_least_one() {
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(1_000), 1);
        assert_eq!(retry_after_secs(1_001), 2);
        assert_eq!(retry_after_secs(29_999), 30);
    }
}
