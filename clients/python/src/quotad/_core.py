"""What a check decides before and after its call, without I/O, shared by the sync
and asyncio clients: a lease or a cached denial answers it locally, else it
leaves as a request, and quotad's answer teaches the deny cache. The clients
only make the call (blocking, or awaited) and say when it left."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import _wire
from ._deny_cache import CacheKey, Sent
from ._lease import LeaseTable, Slot
from ._settings import Settings, cache_key
from ._types import Decision, PolicyLike
from .v1 import quota_pb2 as pb


@dataclass(frozen=True)
class Ask:
    """A check no local answer covers: the request to send, and what the deny cache
    needs to learn from quotad's answer."""

    request: pb.CheckRequest
    key: CacheKey
    cost: int
    sent: Sent | None


class CheckCore:
    """A client's check logic. ``start`` begins a lease call in the background (the
    client's own way: a thread, or a task)."""

    def __init__(
        self, settings: Settings, leases: LeaseTable | None, start: Callable[[Slot], None]
    ) -> None:
        self._settings = settings
        self._leases = leases
        self._start = start

    def local(self, key: str, policy: PolicyLike, cost: int) -> Decision | Ask:
        """The local answer (a lease spent, a cached denial), or what to ask quotad.

        Raises :class:`~quotad.RejectedError` for a cost the wire cannot carry,
        before anything is spent.
        """
        _wire.valid_cost(cost)
        clock = self._settings.clock
        if self._leases is not None:
            spent = self._leases.spend(policy, key, cost, clock())
            if spent.call is not None:
                self._start(spent.call)
            if spent.decision is not None:
                return spent.decision
        cache = self._settings.cache
        ckey = cache_key(policy, key)
        if cache is not None:
            denied = cache.lookup(ckey, cost, clock())
            if denied is not None:
                return denied
        sent = cache.sent(clock()) if cache is not None else None
        return Ask(_wire.check_request(key, policy, cost), ckey, cost, sent)

    def answered(self, ask: Ask, answer: pb.Decision, sent_ms: int) -> Decision:
        """quotad's decision of ``ask``, sent at ``sent_ms`` on the client's clock (in
        a batch, maybe later than it was asked): the deny cache times a denial
        from that send."""
        decision = _wire.decision(answer)
        cache = self._settings.cache
        if cache is not None and ask.sent is not None:
            cache.record(ask.key, ask.cost, decision, ask.sent.at(sent_ms), self._settings.clock())
        return decision
