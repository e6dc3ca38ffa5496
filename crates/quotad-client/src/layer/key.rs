//! Which key a request counts under: its peer's network, a trusted proxy's
//! `X-Forwarded-For`, a header, or a closure.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::ConnectInfo;
use http::request::Parts;
use http::{HeaderMap, HeaderName};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use thiserror::Error;

use super::KeyFn;

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

impl KeyExtractor {
    /// Whether the key comes from the peer's address, which only the
    /// server can provide (axum's `ConnectInfo`): a request without one
    /// is the application's misconfiguration, not the caller's fault.
    pub(crate) fn needs_peer(&self) -> bool {
        matches!(
            self,
            KeyExtractor::PeerIp | KeyExtractor::ForwardedFor { .. }
        )
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
    // Split the raw bytes, not the header as text: one byte that is not
    // text, which the client can put on its own line, must not drop the
    // hops the trusted proxies appended to that line.
    let hops: Vec<&[u8]> = headers
        .get_all("x-forwarded-for")
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .collect();
    let mut client = peer;
    for hop in hops.iter().rev() {
        let Some(ip) = hop_address(hop) else {
            break;
        };
        client = ip.to_canonical();
        if !is_trusted(&client) {
            break;
        }
    }
    client
}

/// The address of one `X-Forwarded-For` hop: `192.0.2.1`, `2001:db8::1`,
/// or with a port as some proxies write it (`192.0.2.1:4711`,
/// `[2001:db8::1]:4711`).
fn hop_address(hop: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(hop).ok()?.trim();
    text.parse::<IpAddr>()
        .or_else(|_| text.parse::<SocketAddr>().map(|a| a.ip()))
        .ok()
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use axum::extract::ConnectInfo;
    use http::Request;

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
    fn a_byte_that_is_not_text_on_the_clients_line_does_not_drop_the_proxys_hop() {
        // nginx appends the peer to the client's own line:
        // `$proxy_add_x_forwarded_for`.
        let mut parts = parts_from("10.0.0.2:5000", None);
        let line = http::HeaderValue::from_bytes(b"\xff, 198.51.100.7").expect("a header value");
        parts.headers.insert("x-forwarded-for", line);
        let key = forwarded_for(&["10.0.0.0/8"]).extract(&parts);
        assert_eq!(key.as_deref(), Some("198.51.100.7"));
    }

    #[test]
    fn hops_written_with_a_port_count_by_their_address() {
        let parts = parts_from("10.0.0.2:5000", Some("198.51.100.7:4711"));
        let key = forwarded_for(&["10.0.0.0/8"]).extract(&parts);
        assert_eq!(key.as_deref(), Some("198.51.100.7"));
        let parts = parts_from("10.0.0.2:5000", Some("[2001:db8:1:2::7]:4711"));
        let key = forwarded_for(&["10.0.0.0/8"]).extract(&parts);
        assert_eq!(key.as_deref(), Some("2001:db8:1:2::/64"));
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
