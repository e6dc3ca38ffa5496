"""What the sync and asyncio clients share: settings, the address, the deny cache."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._deny_cache import DEFAULT_DENY_CACHE_CAPACITY, DenyCache
from ._types import Decision, FailurePolicy, Policy, PolicyLike, Reason
from ._wire import failure_decision
from .errors import InvalidAddressError, QuotadError, UnavailableError
from .tls import TLS

log = logging.getLogger("quotad")

OUTAGE_LOG_INTERVAL = 10.0
"""How often, in seconds, a client logs that quotad is unavailable while its
failure policy answers: one warning per interval, carrying the number of
failures kept quiet (the Rust client's ``OUTAGE_LOG_INTERVAL``)."""

DEFAULT_DEADLINE = 0.25
"""The default deadline of one call, in seconds (the Rust client's 250 ms)."""

# How a connection that stopped answering is found (the Rust client's
# defaults: a ping after 10 s without a frame, dropped 5 s later), and how
# soon a refused connection is tried again.
_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]


@dataclass(frozen=True)
class Target:
    """Where to connect, and with which credentials."""

    target: str
    tls: TLS | None
    options: list[tuple[str, Any]]


def parse_address(address: str, tls: TLS | None) -> Target:
    """``http://host:port``, ``https://host:port`` (TLS), ``unix:///path`` or ``host:port``."""
    options = list(_CHANNEL_OPTIONS)
    if address.startswith("unix:"):
        if tls is not None:
            raise InvalidAddressError("tls: not for a unix:// address")
        # gRPC's core would send the socket's path as the HTTP/2 authority,
        # which quotad's HTTP/2 server refuses as malformed.
        options.append(("grpc.default_authority", "localhost"))
        return Target(address, None, options)
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "http", address
    if scheme not in ("http", "https") or not rest or "/" in rest.rstrip("/"):
        raise InvalidAddressError(
            f"{address!r}: expected http://host:port, https://host:port or unix:///path"
        )
    if scheme == "http" and tls is not None:
        raise InvalidAddressError(f"tls: given for {address!r}; use an https:// address")
    if scheme == "https":
        tls = tls or TLS()
        if tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
    return Target(rest.rstrip("/"), tls, options)


def now_ms() -> int:
    """The clients' monotonic clock, in milliseconds."""
    return time.monotonic_ns() // 1_000_000


class Settings:
    """A client's settings; see :class:`quotad.Client`."""

    def __init__(
        self,
        deadline: float,
        on_unavailable: FailurePolicy | str,
        deny_cache: int | bool,
        clock: Callable[[], int] | None = None,
    ) -> None:
        if deadline <= 0:
            raise ValueError("deadline: must be above 0 seconds")
        self.deadline = deadline
        self.on_unavailable = FailurePolicy(on_unavailable)
        # Monotonic milliseconds: the deny cache's, the leases' and the
        # coalescing back-off's clock (a test gives its own).
        self.clock: Callable[[], int] = now_ms if clock is None else clock
        if deny_cache is True:
            deny_cache = DEFAULT_DENY_CACHE_CAPACITY
        self.cache = DenyCache(int(deny_cache)) if deny_cache else None
        self._outage_lock = threading.Lock()
        self._outage_logged_at: float | None = None
        self._outage_quiet = 0

    def failed(self, error: QuotadError, count: int) -> list[Decision]:
        """The failure policy: ``count`` decisions, or the error raised again."""
        if not isinstance(error, UnavailableError):
            raise error
        if self.on_unavailable is FailurePolicy.FAIL_OPEN:
            reason = Reason.FAIL_OPEN
        elif self.on_unavailable is FailurePolicy.FAIL_CLOSED:
            reason = Reason.FAIL_CLOSED
        else:
            raise error
        self._log_outage(error, reason)
        return [failure_decision(reason)] * count

    def _log_outage(self, error: QuotadError, reason: Reason) -> None:
        """Warns that the failure policy answered, at most once an interval."""
        now = time.monotonic()
        with self._outage_lock:
            last = self._outage_logged_at
            if last is not None and now - last < OUTAGE_LOG_INTERVAL:
                self._outage_quiet += 1
                return
            self._outage_logged_at = now
            suppressed, self._outage_quiet = self._outage_quiet, 0
        log.warning(
            "quotad unavailable: %s: %s; answering %s (%d more failures kept quiet)",
            error.code.name,
            error.message,
            reason.value,
            suppressed,
        )


def cache_key(policy: PolicyLike, key: str) -> tuple[object, str]:
    """The deny cache's key of ``key`` under ``policy``: a name, or what an inline
    policy counts by (algorithm, limit, window, ``burst`` defaulting to the
    limit), never its lease terms, so a check with terms and a reset without
    them (or with ``burst`` spelled out) meet the same entry, as in the Node
    client."""
    if isinstance(policy, Policy):
        burst = policy.limit if policy.burst is None else policy.burst
        return (("inline", policy.algorithm, policy.limit, policy.window_ms, burst), key)
    return (("named", policy), key)
