"""Key extraction: the Rust layer's rules (crates/quotad-client/src/layer/key.rs)."""

from __future__ import annotations

import pytest

from quotad.middleware import IpPrefixes, KeyExtractor, RequestInfo, retry_after_secs


def request(peer: str | None, xff: str | bytes | None = None, **headers: str) -> RequestInfo:
    pairs: list[tuple[str, bytes]] = [(k.replace("_", "-"), v.encode()) for k, v in headers.items()]
    if xff is not None:
        pairs.append(("x-forwarded-for", xff if isinstance(xff, bytes) else xff.encode()))
    return RequestInfo("GET", "/x", pairs, peer)


def forwarded_for(*trusted: str) -> KeyExtractor:
    return KeyExtractor.forwarded_for(trusted)


def test_the_peer_ip_is_the_key_by_default() -> None:
    assert KeyExtractor.peer_ip().extract(request("203.0.113.9", "198.51.100.1")) == "203.0.113.9"


def test_forwarded_for_is_ignored_from_an_untrusted_peer() -> None:
    key = forwarded_for("10.0.0.0/8").extract(request("203.0.113.9", "198.51.100.1"))
    assert key == "203.0.113.9"


def test_forwarded_for_from_a_trusted_proxy_gives_the_right_most_untrusted_hop() -> None:
    r = request("10.0.0.2", "1.2.3.4, 198.51.100.7, 10.0.0.1")
    assert forwarded_for("10.0.0.0/8").extract(r) == "198.51.100.7"


def test_a_forged_left_most_entry_cannot_hide_the_hops_the_proxies_wrote() -> None:
    assert forwarded_for("10.0.0.0/8").extract(request("10.0.0.2", "garbage, 198.51.100.7")) == (
        "198.51.100.7"
    )
    # The last trusted hop, not the proxy.
    assert forwarded_for("10.0.0.0/8").extract(request("10.0.0.2", "unknown, 10.0.0.9")) == (
        "10.0.0.9"
    )


def test_a_byte_that_is_not_text_on_the_clients_line_does_not_drop_the_proxys_hop() -> None:
    r = request("10.0.0.2", b"\xff, 198.51.100.7")
    assert forwarded_for("10.0.0.0/8").extract(r) == "198.51.100.7"


def test_several_forwarded_for_lines_read_as_one_list() -> None:
    r = RequestInfo(
        "GET",
        "/",
        [("x-forwarded-for", b"198.51.100.7"), ("x-forwarded-for", b"10.0.0.1")],
        "10.0.0.2",
    )
    assert forwarded_for("10.0.0.0/8").extract(r) == "198.51.100.7"


def test_hops_written_with_a_port_count_by_their_address() -> None:
    ff = forwarded_for("10.0.0.0/8")
    assert ff.extract(request("10.0.0.2", "198.51.100.7:4711")) == "198.51.100.7"
    assert ff.extract(request("10.0.0.2", "[2001:db8:1:2::7]:4711")) == "2001:db8:1:2::/64"


def test_mapped_ipv6_hops_are_matched_against_ipv4_proxies() -> None:
    r = request("10.0.0.2", "198.51.100.7, ::ffff:10.0.0.1")
    assert forwarded_for("10.0.0.0/8").extract(r) == "198.51.100.7"


def test_forwarded_for_with_nothing_usable_falls_back_to_the_peer() -> None:
    ff = forwarded_for("10.0.0.0/8")
    assert ff.extract(request("10.0.0.2", "garbage")) == "10.0.0.2"
    assert ff.extract(request("10.0.0.2")) == "10.0.0.2"


def test_ipv6_peers_are_keyed_by_their_64_by_default() -> None:
    key = KeyExtractor.peer_ip().extract
    a = key(request("2001:db8:1:2:aaaa::1"))
    assert a == "2001:db8:1:2::/64"
    assert a == key(request("2001:db8:1:2:bbbb::9")), "one /64, one budget"
    assert a != key(request("2001:db8:1:3::1"))


def test_ipv4_peers_are_keyed_by_address_by_default_and_mapped_ones_count_as_ipv4() -> None:
    assert KeyExtractor.peer_ip().extract(request("203.0.113.9")) == "203.0.113.9"
    assert KeyExtractor.peer_ip().extract(request("::ffff:203.0.113.9")) == "203.0.113.9"


def test_prefix_lengths_are_configurable_for_both_families() -> None:
    prefixes = IpPrefixes(24, 48)
    peer = KeyExtractor.peer_ip()
    assert peer.extract(request("203.0.113.9"), prefixes) == "203.0.113.0/24"
    assert peer.extract(request("2001:db8:1:2::1"), prefixes) == "2001:db8:1::/48"
    assert peer.extract(request("2001:db8:1:2::1"), IpPrefixes(32, 128)) == "2001:db8:1:2::1"
    with pytest.raises(ValueError, match="ipv4 prefix"):
        IpPrefixes(33, 64)
    with pytest.raises(ValueError, match="ipv6 prefix"):
        IpPrefixes(32, 129)


def test_the_trusted_forwarded_for_address_is_keyed_by_its_prefix_too() -> None:
    ff = forwarded_for("10.0.0.0/8")
    assert ff.extract(request("10.0.0.2", "2001:db8:7:7:1:2:3:4, 10.0.0.1")) == "2001:db8:7:7::/64"
    assert ff.extract(request("10.0.0.2", "198.51.100.7"), IpPrefixes(16, 64)) == "198.51.0.0/16"


def test_a_header_key_must_be_present_non_empty_and_text() -> None:
    header = KeyExtractor.header("X-Api-Key")
    assert header.extract(request(None, x_api_key="k-123")) == "k-123"
    assert header.extract(request(None, x_api_key="")) is None
    assert header.extract(request(None)) is None
    bad = RequestInfo("GET", "/", [("x-api-key", "k\u00e9".encode())], None)
    assert header.extract(bad) is None


def test_no_peer_address_gives_no_key_for_the_address_extractors() -> None:
    assert KeyExtractor.peer_ip().extract(request(None)) is None
    assert forwarded_for("10.0.0.0/8").extract(request(None, "198.51.100.7")) is None
    assert KeyExtractor.peer_ip().needs_peer and not KeyExtractor.header("a").needs_peer


def test_a_custom_key_function_sees_the_request() -> None:
    tenant = KeyExtractor.custom(lambda r: f"{r.method}:{r.path}")
    assert tenant.extract(request("127.0.0.1")) == "GET:/x"
    assert KeyExtractor.custom(lambda r: None).extract(request("127.0.0.1")) is None


def test_retry_after_rounds_up_to_whole_seconds_and_is_at_least_one() -> None:
    assert [retry_after_secs(ms) for ms in (0, 1, 1_000, 1_001, 29_999)] == [1, 1, 1, 2, 30]
