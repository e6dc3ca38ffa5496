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
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::ConnectInfo;
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use quotad_core::{Decision, Reason, Throttle};
use thiserror::Error;
use tower_layer::Layer;
use tower_service::Service;

use crate::client::{Check, Client, Error, OUTAGE_LOG_INTERVAL};

type KeyFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;
type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;

/// How much of an IP address makes its key: the network prefix lengths for
/// IPv4 and IPv6 addresses.
///
/// A key is the address itself at the full length (/32, /128), else the
/// network in CIDR form (`2001:db8:1:2::/64`). IPv4-mapped IPv6 addresses
/// count as IPv4.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpPrefixes {
    v4: u8,
    v6: u8,
}

/// A prefix length longer than its address.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum PrefixError {
    /// The IPv4 prefix is longer than 32 bits.
    #[error("ipv4 prefix: must be at most 32 (got {0})")]
    V4(u8),
    /// The IPv6 prefix is longer than 128 bits.
    #[error("ipv6 prefix: must be at most 128 (got {0})")]
    V6(u8),
}

impl Default for IpPrefixes {
    /// IPv4 by address (/32), IPv6 by /64, the smallest network a host is
    /// usually given.
    fn default() -> Self {
        Self { v4: 32, v6: 64 }
    }
}

impl IpPrefixes {
    /// Keys IPv4 addresses by their first `v4` bits and IPv6 addresses by
    /// their first `v6` bits.
    ///
    /// # Errors
    ///
    /// [`PrefixError`] when `v4 > 32` or `v6 > 128`.
    pub fn try_new(v4: u8, v6: u8) -> Result<Self, PrefixError> {
        if v4 > 32 {
            return Err(PrefixError::V4(v4));
        }
        if v6 > 128 {
            return Err(PrefixError::V6(v6));
        }
        Ok(Self { v4, v6 })
    }

    /// The key of `ip`: the address at full length, else its network.
    pub fn key(&self, ip: IpAddr) -> String {
        match ip.to_canonical() {
            IpAddr::V4(v4) if self.v4 == 32 => v4.to_string(),
            IpAddr::V6(v6) if self.v6 == 128 => v6.to_string(),
            IpAddr::V4(v4) => Ipv4Net::new(v4, self.v4)
                .map_or_else(|_| v4.to_string(), |net| net.trunc().to_string()),
            IpAddr::V6(v6) => Ipv6Net::new(v6, self.v6)
                .map_or_else(|_| v6.to_string(), |net| net.trunc().to_string()),
        }
    }
}

/// Where the rate-limit key of a request comes from.
#[derive(Clone)]
pub enum KeyExtractor {
    /// The peer's IP network, from axum's `ConnectInfo<SocketAddr>` (serve
    /// with `into_make_service_with_connect_info::<SocketAddr>()`), at the
    /// layer's [`IpPrefixes`].
    PeerIp,
    /// The client address in `X-Forwarded-For`, believed only when the peer
    /// is one of `trusted` proxies: the right-most address that is not a
    /// trusted proxy. From any other peer, the peer's own IP. Keyed by
    /// network at the layer's [`IpPrefixes`].
    ForwardedFor {
        /// Proxies whose `X-Forwarded-For` is believed.
        trusted: Vec<IpNet>,
    },
    /// The value of a header, e.g. an API key.
    Header(HeaderName),
    /// Anything else.
    Custom(Arc<KeyFn>),
}

impl KeyExtractor {
    /// A key from a closure over the request head.
    pub fn custom(f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        KeyExtractor::Custom(Arc::new(f))
    }

    /// The key of a request, if it has one, with IP addresses keyed at the
    /// default [`IpPrefixes`].
    pub fn extract(&self, parts: &Parts) -> Option<String> {
        self.extract_with(parts, &IpPrefixes::default())
    }

    /// The key of a request, if it has one, with IP addresses keyed at
    /// `prefixes`.
    pub fn extract_with(&self, parts: &Parts, prefixes: &IpPrefixes) -> Option<String> {
        match self {
            KeyExtractor::PeerIp => peer_ip(parts).map(|ip| prefixes.key(ip)),
            KeyExtractor::ForwardedFor { trusted } => {
                let peer = peer_ip(parts)?;
                Some(prefixes.key(client_ip(peer, &parts.headers, trusted)))
            }
            KeyExtractor::Header(name) => parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(str::to_owned),
            KeyExtractor::Custom(f) => f(parts),
        }
    }
}

impl fmt::Debug for KeyExtractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyExtractor::PeerIp => f.write_str("PeerIp"),
            KeyExtractor::ForwardedFor { trusted } => f
                .debug_struct("ForwardedFor")
                .field("trusted", trusted)
                .finish(),
            KeyExtractor::Header(name) => f.debug_tuple("Header").field(name).finish(),
            KeyExtractor::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

fn peer_ip(parts: &Parts) -> Option<IpAddr> {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip().to_canonical())
}

/// The right-most `X-Forwarded-For` hop that is not a trusted proxy; the
/// peer itself when the peer is not trusted or the header says nothing
/// usable. Hops are read from the right, the end the trusted proxies wrote,
/// and reading stops at the first that is not an address: everything left of
/// it came from the client and is never believed over a trusted hop.
fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let hops: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .collect();
    let mut client = peer;
    for hop in hops.iter().rev() {
        let Ok(ip) = hop.trim().parse::<IpAddr>() else {
            break;
        };
        client = ip.to_canonical();
        if !is_trusted(&client) {
            break;
        }
    }
    client
}

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
                    // quotad refusing the request (a bad key or cost from
                    // this app's extractors) is this server's fault, not an
                    // outage.
                    let status = match error {
                        Error::Rejected(_) => StatusCode::INTERNAL_SERVER_ERROR,
                        _ => StatusCode::SERVICE_UNAVAILABLE,
                    };
                    return Ok(plain(status, "rate limiter unavailable\n"));
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
                    let retry = retry_after_secs(decision.retry_after_ms);
                    response
                        .headers_mut()
                        .insert(http::header::RETRY_AFTER, HeaderValue::from(retry));
                    Ok(response)
                }
            }
        })
    }
}

fn plain<R: From<&'static str>>(status: StatusCode, body: &'static str) -> Response<R> {
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

    fn parts_from(peer: &str, xff: Option<&str>) -> Parts {
        let mut request = Request::builder().uri("/x");
        if let Some(xff) = xff {
            request = request.header("x-forwarded-for", xff);
        }
        let (mut parts, ()) = request.body(()).expect("valid request").into_parts();
        let addr: SocketAddr = peer.parse().expect("valid address");
        parts.extensions.insert(ConnectInfo(addr));
        parts
    }

    fn forwarded_for(trusted: &[&str]) -> KeyExtractor {
        KeyExtractor::ForwardedFor {
            trusted: trusted
                .iter()
                .map(|n| n.parse().expect("valid net"))
                .collect(),
        }
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_and_is_at_least_one() {
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(1_000), 1);
        assert_eq!(retry_after_secs(1_001), 2);
        assert_eq!(retry_after_secs(29_999), 30);
    }

    #[test]
    fn the_peer_ip_is_the_key_by_default() {
        let parts = parts_from("203.0.113.9:5000", Some("198.51.100.1"));
        assert_eq!(
            KeyExtractor::PeerIp.extract(&parts).as_deref(),
            Some("203.0.113.9")
        );
    }

    #[test]
    fn forwarded_for_is_ignored_from_an_untrusted_peer() {
        let parts = parts_from("203.0.113.9:5000", Some("198.51.100.1"));
        let key = forwarded_for(&["10.0.0.0/8"]).extract(&parts);
        assert_eq!(key.as_deref(), Some("203.0.113.9"));
    }

    #[test]
    fn forwarded_for_from_a_trusted_proxy_gives_the_right_most_untrusted_hop() {
        // The client forged the first entry; the proxies appended the rest.
        let parts = parts_from("10.0.0.2:5000", Some("1.2.3.4, 198.51.100.7, 10.0.0.1"));
        let key = forwarded_for(&["10.0.0.0/8"]).extract(&parts);
        assert_eq!(key.as_deref(), Some("198.51.100.7"));
    }

    #[test]
    fn a_forged_left_most_entry_cannot_hide_the_hops_the_proxies_wrote() {
        let parts = parts_from("10.0.0.2:5000", Some("garbage, 198.51.100.7"));
        let key = forwarded_for(&["10.0.0.0/8"]).extract(&parts);
        assert_eq!(key.as_deref(), Some("198.51.100.7"));
        let parts = parts_from("10.0.0.2:5000", Some("unknown, 10.0.0.9"));
        let key = forwarded_for(&["10.0.0.0/8"]).extract(&parts);
        assert_eq!(
            key.as_deref(),
            Some("10.0.0.9"),
            "the last trusted hop, not the proxy"
        );
    }

    #[test]
    fn mapped_ipv6_hops_are_matched_against_ipv4_proxies() {
        let parts = parts_from("10.0.0.2:5000", Some("198.51.100.7, ::ffff:10.0.0.1"));
        let key = forwarded_for(&["10.0.0.0/8"]).extract(&parts);
        assert_eq!(key.as_deref(), Some("198.51.100.7"));
    }

    #[test]
    fn forwarded_for_with_nothing_usable_falls_back_to_the_peer() {
        let parts = parts_from("10.0.0.2:5000", Some("garbage"));
        let key = forwarded_for(&["10.0.0.0/8"]).extract(&parts);
        assert_eq!(key.as_deref(), Some("10.0.0.2"));
        let parts = parts_from("10.0.0.2:5000", None);
        assert_eq!(
            forwarded_for(&["10.0.0.0/8"]).extract(&parts).as_deref(),
            Some("10.0.0.2")
        );
    }

    #[test]
    fn ipv6_peers_are_keyed_by_their_64_by_default() {
        let a = parts_from("[2001:db8:1:2:aaaa::1]:5000", None);
        let b = parts_from("[2001:db8:1:2:bbbb::9]:5000", None);
        let other = parts_from("[2001:db8:1:3::1]:5000", None);
        let key = |parts: &Parts| KeyExtractor::PeerIp.extract(parts);
        assert_eq!(key(&a).as_deref(), Some("2001:db8:1:2::/64"));
        assert_eq!(key(&a), key(&b), "one /64, one budget");
        assert_ne!(key(&a), key(&other));
    }

    #[test]
    fn ipv4_peers_are_keyed_by_address_by_default_and_mapped_ones_count_as_ipv4() {
        let parts = parts_from("203.0.113.9:5000", None);
        assert_eq!(
            KeyExtractor::PeerIp.extract(&parts).as_deref(),
            Some("203.0.113.9")
        );
        let mapped = parts_from("[::ffff:203.0.113.9]:5000", None);
        assert_eq!(
            KeyExtractor::PeerIp.extract(&mapped).as_deref(),
            Some("203.0.113.9")
        );
    }

    #[test]
    fn prefix_lengths_are_configurable_for_both_families() {
        let prefixes = IpPrefixes::try_new(24, 48).expect("valid lengths");
        let v4 = parts_from("203.0.113.9:5000", None);
        let v6 = parts_from("[2001:db8:1:2::1]:5000", None);
        assert_eq!(
            KeyExtractor::PeerIp.extract_with(&v4, &prefixes).as_deref(),
            Some("203.0.113.0/24")
        );
        assert_eq!(
            KeyExtractor::PeerIp.extract_with(&v6, &prefixes).as_deref(),
            Some("2001:db8:1::/48")
        );
        let full = IpPrefixes::try_new(32, 128).expect("valid lengths");
        assert_eq!(
            KeyExtractor::PeerIp.extract_with(&v6, &full).as_deref(),
            Some("2001:db8:1:2::1")
        );
        assert_eq!(IpPrefixes::try_new(33, 64), Err(PrefixError::V4(33)));
        assert_eq!(IpPrefixes::try_new(32, 129), Err(PrefixError::V6(129)));
    }

    #[test]
    fn the_trusted_forwarded_for_address_is_keyed_by_its_prefix_too() {
        let parts = parts_from("10.0.0.2:5000", Some("2001:db8:7:7:1:2:3:4, 10.0.0.1"));
        let key = forwarded_for(&["10.0.0.0/8"]).extract(&parts);
        assert_eq!(key.as_deref(), Some("2001:db8:7:7::/64"));
        let prefixes = IpPrefixes::try_new(16, 64).expect("valid lengths");
        let parts = parts_from("10.0.0.2:5000", Some("198.51.100.7"));
        let key = forwarded_for(&["10.0.0.0/8"]).extract_with(&parts, &prefixes);
        assert_eq!(key.as_deref(), Some("198.51.0.0/16"));
    }

    #[test]
    fn a_header_key_must_be_present_and_non_empty() {
        let extractor = KeyExtractor::Header(HeaderName::from_static("x-api-key"));
        let (parts, ()) = Request::builder()
            .header("x-api-key", "k-123")
            .body(())
            .expect("valid")
            .into_parts();
        assert_eq!(extractor.extract(&parts).as_deref(), Some("k-123"));
        let (parts, ()) = Request::builder()
            .header("x-api-key", "")
            .body(())
            .expect("valid")
            .into_parts();
        assert_eq!(extractor.extract(&parts), None);
    }
}
