"""The local deny cache: a ``LIMIT_EXCEEDED`` denial answered again without
asking quotad, for as long as it is certain to hold.

The same rules as the Rust client's (``crates/quotad-client/src/deny_cache.rs``):
a denial of cost ``c`` with retry time ``r`` says the key has less than ``c``
room, and only time makes room, so until ``r`` has passed every check of that
key and policy for a cost of ``c`` or more (and at most the capacity) is
denied too. The window is timed from when the denied request was *sent* and
ends a margin early (``1 + r // 1000`` ms, for clocks that read whole
milliseconds at different phases and run at slightly different rates), so it
never outlasts quotad's. The wait a cached denial *reports* counts from when
quotad's answer *arrived*, plus the margin, so a caller that waits it out is
never early.

A reset through the client drops the entry and any denial still in flight;
quotad answering with another limit (a reload), or admitting a cost the
entry denies (a reset made elsewhere), drops it too.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import dataclass

from ._types import Decision, Reason

DEFAULT_DENY_CACHE_CAPACITY = 10_000
"""The default number of keys the deny cache holds."""

CacheKey = tuple[object, str]


def margin(retry_after_ms: int) -> int:
    """How much earlier than quotad's retry time a cached denial ends."""
    return 1 + retry_after_ms // 1_000


@dataclass(frozen=True)
class Sent:
    """When a check left, and the reset epoch it left in."""

    at_ms: int
    epoch: int

    def at(self, at_ms: int) -> Sent:
        """The same, sent at ``at_ms`` instead (a check that left later, in a batch)."""
        return Sent(at_ms, self.epoch)


@dataclass
class _Entry:
    cost: int
    until_ms: int
    retry_until_ms: int
    reset_until_ms: int
    limit: int
    remaining: int


class DenyCache:
    """A bounded map from (policy, key) to the denial that still holds."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._lock = threading.Lock()
        self._entries: dict[CacheKey, _Entry] = {}
        # (until_ms, seq, key) of every entry, earliest first; items of
        # replaced entries are skipped when they surface. The sequence number
        # breaks ties, so keys (whose policies need not be orderable) are
        # never compared.
        self._expiry: list[tuple[int, int, CacheKey]] = []
        self._seq = itertools.count()
        self._epoch = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def lookup(self, key: CacheKey, cost: int, now_ms: int) -> Decision | None:
        """The denial a check gets at ``now_ms`` without asking quotad, if one is certain."""
        with self._lock:
            entry = self._entries.get(key)
            # A cost above the capacity is quotad's COST_EXCEEDS_CAPACITY,
            # which no wait cures: never a cached LIMIT_EXCEEDED.
            if entry is None or now_ms >= entry.until_ms or cost < entry.cost or cost > entry.limit:
                return None
            retry_after_ms = max(entry.retry_until_ms - now_ms, 0)
            return Decision(
                allowed=False,
                limit=entry.limit,
                remaining=entry.remaining,
                retry_after_ms=retry_after_ms,
                reset_after_ms=max(entry.reset_until_ms - now_ms, 0, retry_after_ms),
                reason=Reason.LIMIT_EXCEEDED,
            )

    def sent(self, now_ms: int) -> Sent:
        """Marks a check as sent now."""
        with self._lock:
            return Sent(now_ms, self._epoch)

    def record(
        self, key: CacheKey, cost: int, decision: Decision, sent: Sent, received_ms: int
    ) -> None:
        """Learns from quotad's answer to a check sent at ``sent``, received at ``received_ms``."""
        with self._lock:
            if sent.epoch != self._epoch:
                return  # decided before a reset
            m = margin(decision.retry_after_ms)
            hold_ms = max(decision.retry_after_ms - m, 0)
            cacheable = (
                not decision.allowed and decision.reason is Reason.LIMIT_EXCEEDED and hold_ms > 0
            )
            old = self._entries.get(key)
            if not cacheable:
                # Another limit (a reload), or a cost the entry denies now
                # admitted (a reset elsewhere): room came early.
                if old is not None and (
                    old.limit != decision.limit or (decision.allowed and cost >= old.cost)
                ):
                    del self._entries[key]
                return
            entry = _Entry(
                cost=cost,
                until_ms=sent.at_ms + hold_ms,
                retry_until_ms=received_ms + decision.retry_after_ms + m,
                reset_until_ms=received_ms + decision.reset_after_ms + m,
                limit=decision.limit,
                remaining=decision.remaining,
            )
            if (
                old is not None
                and old.cost <= entry.cost
                and old.until_ms >= entry.until_ms
                and old.limit == entry.limit
            ):
                return  # the entry already denies more, for longer
            self._purge(received_ms)
            if len(self._entries) >= self._capacity and key not in self._entries:
                return  # full of live denials: keep them
            self._entries[key] = entry
            heapq.heappush(self._expiry, (entry.until_ms, next(self._seq), key))

    def forget(self, key: CacheKey) -> None:
        """Drops what is known of ``key`` and every denial still in flight: it was reset."""
        with self._lock:
            self._epoch += 1
            self._entries.pop(key, None)

    def _purge(self, now_ms: int) -> None:
        while self._expiry and self._expiry[0][0] <= now_ms:
            until_ms, _, key = heapq.heappop(self._expiry)
            entry = self._entries.get(key)
            if entry is not None and entry.until_ms == until_ms:
                del self._entries[key]
        # Items of replaced or forgotten entries stay until they surface;
        # keep the heap from growing past a few times the live entries.
        if len(self._expiry) > 4 * max(len(self._entries), 64):
            self._expiry = [(e.until_ms, next(self._seq), k) for k, e in self._entries.items()]
            heapq.heapify(self._expiry)
