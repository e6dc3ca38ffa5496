"""Which key a request counts against: the Rust ``KeyExtractor``'s choices and rules."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class RequestInfo:
    """What a key function sees of a request, the same for ASGI and WSGI.

    ``headers`` are ``(lower-case name, raw value)`` pairs in arrival order;
    ``peer`` is the connecting address (``None`` when the server gives none).
    """

    method: str
    path: str
    headers: Sequence[tuple[str, bytes]]
    peer: str | None

    def header(self, name: str) -> bytes | None:
        """The first value of header ``name``, if any."""
        name = name.lower()
        return next((v for n, v in self.headers if n == name), None)

    def header_values(self, name: str) -> list[bytes]:
        """Every value of header ``name``, in order."""
        name = name.lower()
        return [v for n, v in self.headers if n == name]


@dataclass(frozen=True)
class IpPrefixes:
    """How much of a client address keys it: the whole IPv4 address (/32) and the
    IPv6 /64 by default, since one IPv6 host usually holds a whole /64."""

    v4: int = 32
    v6: int = 64

    def __post_init__(self) -> None:
        if not 0 <= self.v4 <= 32:
            raise ValueError(f"ipv4 prefix: must be at most 32 (got {self.v4})")
        if not 0 <= self.v6 <= 128:
            raise ValueError(f"ipv6 prefix: must be at most 128 (got {self.v6})")

    def key(self, ip: IpAddress) -> str:
        """The key of ``ip``: itself at a full prefix, else its network (``2001:db8::/64``)."""
        ip = canonical(ip)
        prefix = self.v4 if ip.version == 4 else self.v6
        if prefix == ip.max_prefixlen:
            return str(ip)
        return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))


def canonical(ip: IpAddress) -> IpAddress:
    """An IPv4-mapped IPv6 address as the IPv4 address it maps."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _parse_ip(text: str) -> IpAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    # host:port, [v6]:port
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        return None
    if host.startswith("[") and host.endswith("]"):
        try:
            return ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return None
    try:
        return ipaddress.IPv4Address(host)
    except ValueError:
        return None


def _hop_address(hop: bytes) -> IpAddress | None:
    try:
        text = hop.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    return _parse_ip(text)


def client_ip(
    peer: IpAddress, forwarded_for: Iterable[bytes], trusted: Sequence[IpNetwork]
) -> IpAddress:
    """The right-most address in ``X-Forwarded-For`` that is not a trusted proxy, read
    only when the peer itself is trusted; the peer otherwise. A hop that is not an
    address stops the walk (the last address read stands)."""

    def is_trusted(ip: IpAddress) -> bool:
        return any(ip.version == net.version and ip in net for net in trusted)

    if not is_trusted(peer):
        return peer
    hops = [hop for line in forwarded_for for hop in line.split(b",")]
    client = peer
    for hop in reversed(hops):
        ip = _hop_address(hop)
        if ip is None:
            break
        client = canonical(ip)
        if not is_trusted(client):
            break
    return client


def _visible(value: bytes) -> str | None:
    # As the Rust layer's HeaderValue::to_str: visible ASCII and tabs only.
    if all(b == 9 or 32 <= b < 127 for b in value):
        return value.decode("ascii")
    return None


@dataclass(frozen=True)
class KeyExtractor:
    """How the middleware finds a request's key. Make one with :meth:`peer_ip`,
    :meth:`forwarded_for`, :meth:`header` or :meth:`custom`."""

    kind: str
    header_name: str | None = None
    trusted: tuple[IpNetwork, ...] = ()
    func: Callable[[RequestInfo], str | None] | None = field(default=None, compare=False)

    @classmethod
    def peer_ip(cls) -> KeyExtractor:
        """The connecting address (the default): right when clients connect directly."""
        return cls("peer_ip")

    @classmethod
    def forwarded_for(cls, trusted: Iterable[str | IpNetwork]) -> KeyExtractor:
        """The client address from ``X-Forwarded-For``, believed only from a peer in
        ``trusted`` (CIDRs of your proxies): the right-most hop that is not a trusted
        proxy. From any other peer the header is ignored and the peer is the key."""
        nets = tuple(
            ipaddress.ip_network(n, strict=False) if isinstance(n, str) else n for n in trusted
        )
        return cls("forwarded_for", trusted=nets)

    @classmethod
    def header(cls, name: str) -> KeyExtractor:
        """The value of a header (an API key, a tenant id); a request without it, or
        with an empty value, is answered 400."""
        return cls("header", header_name=name.lower())

    @classmethod
    def custom(cls, func: Callable[[RequestInfo], str | None]) -> KeyExtractor:
        """Any function of the request; ``None`` means no key (400)."""
        return cls("custom", func=func)

    @property
    def needs_peer(self) -> bool:
        return self.kind in ("peer_ip", "forwarded_for")

    def extract(self, request: RequestInfo, prefixes: IpPrefixes | None = None) -> str | None:
        """The key of ``request``, or ``None``."""
        prefixes = prefixes or IpPrefixes()
        if self.kind == "header":
            assert self.header_name is not None
            value = request.header(self.header_name)
            text = _visible(value) if value is not None else None
            return text or None
        if self.kind == "custom":
            assert self.func is not None
            return self.func(request)
        peer = _parse_ip(request.peer) if request.peer else None
        if peer is None:
            return None
        peer = canonical(peer)
        if self.kind == "peer_ip":
            return prefixes.key(peer)
        return prefixes.key(client_ip(peer, request.header_values("x-forwarded-for"), self.trusted))
