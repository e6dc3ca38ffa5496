"""Settings both middlewares share, and their throttled failure log."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .._settings import now_ms
from ._keys import IpPrefixes, KeyExtractor, RequestInfo

log = logging.getLogger("quotad.middleware")

LOG_INTERVAL_MS = 10_000
"""One log line per interval while checks fail, with the count kept quiet."""


class Throttle:
    """Lets one event through per interval and counts the rest."""

    def __init__(self, interval_ms: int = LOG_INTERVAL_MS) -> None:
        self._interval = interval_ms
        self._lock = threading.Lock()
        self._last: int | None = None
        self._suppressed = 0

    def record(self) -> int | None:
        """The number suppressed since the last one let through, or ``None`` to stay quiet."""
        now = now_ms()
        with self._lock:
            if self._last is not None and now - self._last < self._interval:
                self._suppressed += 1
                return None
            self._last, suppressed, self._suppressed = now, self._suppressed, 0
            return suppressed


class Options:
    """What a rate-limit middleware checks, and how it answers."""

    def __init__(
        self,
        policy: str,
        key: KeyExtractor | None,
        cost: Callable[[RequestInfo], int] | None,
        ip_prefixes: IpPrefixes | None,
        window_secs: int | None,
        headers: bool,
    ) -> None:
        self.policy = policy
        self.key = key or KeyExtractor.peer_ip()
        self.cost = cost or (lambda _request: 1)
        self.prefixes = ip_prefixes or IpPrefixes()
        self.window_secs = window_secs
        self.headers = headers
        self.failures = Throttle()

    def log_failure(self, what: str, error: object) -> None:
        suppressed = self.failures.record()
        if suppressed is not None:
            log.warning("%s policy=%s error=%s suppressed=%d", what, self.policy, error, suppressed)
