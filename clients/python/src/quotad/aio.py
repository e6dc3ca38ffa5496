"""The asyncio client: the same names and arguments as :class:`quotad.Client`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from types import TracebackType

import grpc
import grpc.aio

from . import _wire
from ._coalesce import AsyncCoalescer, Coalescing, CoalescingStats, closed_error
from ._core import CheckCore
from ._lease import LeaseOptions, LeaseStats, LeaseTable, Slot
from ._lessee import AsyncLessee
from ._settings import DEFAULT_DEADLINE, Settings, cache_key, parse_address
from ._types import BatchMode, Check, Decision, FailurePolicy, PolicyLike
from .errors import BadResponseError, QuotadError
from .tls import TLS
from .v1 import quota_pb2_grpc


class AsyncClient:
    """An asyncio client of quotad: :class:`quotad.Client` with coroutines. Make it, and
    use it, inside one running event loop.

    ``address``: ``http://host:port``, ``https://host:port`` (TLS; give
    ``tls`` for a private CA or mTLS), ``unix:///path/to.sock``, or
    ``host:port``. ``deadline``: the longest one call may take, connecting
    included, in seconds (default 0.25, the Rust client's); past it the
    failure policy applies. ``on_unavailable``: what a call answers when
    quotad cannot be reached in time (``"error"`` by default: raise
    :class:`~quotad.UnavailableError`; ``"fail_open"``; ``"fail_closed"``).
    ``deny_cache``: the most keys the local deny cache holds (``True``:
    10,000, the default; ``0`` or ``False``: off): a ``LIMIT_EXCEEDED``
    denial of cost ``c`` answers later checks of that key and policy for a
    cost of ``c`` or more locally until its retry time. ``leases``: a
    :class:`~quotad.LeaseOptions` turns leases on for named policies whose
    quotad settings allow them, and inline ones given ``lease`` terms (see
    ``quotad._lease`` for the rules);
    :meth:`close` returns what is unspent. ``coalescing``: concurrent checks
    beyond the in-flight slots leave together as one ``CheckBatch``, as the
    Rust client's (on by default; a :class:`~quotad.Coalescing` tunes it,
    ``False`` turns it off; see ``quotad._coalesce`` for the rules).
    ``clock``: a monotonic clock in whole milliseconds for the deny cache,
    the leases and the coalescing back-off (tests; the system's by default).

    The client connects on first use and reconnects by itself.

    >>> async with quotad.AsyncClient("http://127.0.0.1:50051") as client:   # doctest: +SKIP
    ...     decision = await client.check("user-42", "api")
    """

    def __init__(
        self,
        address: str = "http://127.0.0.1:50051",
        *,
        deadline: float = DEFAULT_DEADLINE,
        on_unavailable: FailurePolicy | str = FailurePolicy.ERROR,
        tls: TLS | None = None,
        deny_cache: int | bool = True,
        leases: LeaseOptions | None = None,
        coalescing: Coalescing | bool = True,
        clock: Callable[[], int] | None = None,
    ) -> None:
        target = parse_address(address, tls)
        self._settings = Settings(deadline, on_unavailable, deny_cache, clock)
        self._clock = self._settings.clock
        self._closed = False
        # The first close()'s work, run as a task of its own: a second close,
        # or one whose caller was cancelled, awaits the same task.
        self._closing: asyncio.Task[None] | None = None
        self._in_flight = _InFlight()
        if target.tls is None:
            self._channel = grpc.aio.insecure_channel(target.target, options=target.options)
        else:
            self._channel = grpc.aio.secure_channel(
                target.target, target.tls.credentials(), options=target.options
            )
        self._stub = quota_pb2_grpc.QuotaStub(self._channel)
        if coalescing is True:
            coalescing = Coalescing()
        self._coalescer = (
            AsyncCoalescer(coalescing, self._stub, self._clock)
            if isinstance(coalescing, Coalescing)
            else None
        )
        self._lessee = (
            None
            if leases is None
            else AsyncLessee(
                LeaseTable(leases), self._channel, self._settings.deadline, self._clock
            )
        )
        self._core = CheckCore(
            self._settings,
            None if self._lessee is None else self._lessee.table,
            self._start_lease,
        )

    def lease_stats(self) -> LeaseStats:
        """What this client's leases have done (all zero with leases off)."""
        if self._lessee is None:
            return LeaseStats()
        return self._lessee.table.stats(self._clock())

    def coalescing_stats(self) -> CoalescingStats:
        """The ``Check`` and ``CheckBatch`` calls coalescing sent, and the checks its
        batches carried (all zero with coalescing off)."""
        if self._coalescer is None:
            return CoalescingStats()
        s = self._coalescer.stats
        return CoalescingStats(s.check_calls, s.batch_calls, s.coalesced_checks)

    @property
    def deadline(self) -> float:
        """The deadline of a call, in seconds."""
        return self._settings.deadline

    @property
    def on_unavailable(self) -> FailurePolicy:
        """What a call answers when quotad cannot be reached."""
        return self._settings.on_unavailable

    async def check(
        self, key: str, policy: PolicyLike, *, cost: int = 1, deadline: float | None = None
    ) -> Decision:
        """Decides and consumes ``cost`` units of ``key`` under ``policy`` (a name or a
        :class:`~quotad.Policy`).

        Raises :class:`~quotad.RejectedError` for bad input or an unknown
        policy (``code`` and ``field`` say which), and
        :class:`~quotad.UnavailableError` when quotad cannot be reached and
        the failure policy is ``"error"``.
        """
        # Before any local answer: once closing has begun, no lease is spent,
        # no cached denial answers and no lease call starts.
        if self._closed:
            _wire.valid_cost(cost)
            return self._settings.failed(closed_error(), 1)[0]
        ask = self._core.local(key, policy, cost)
        if isinstance(ask, Decision):
            return ask
        if self._coalescer is not None:
            got, sent_ms = await self._coalescer.submit(ask.request, self._timeout(deadline))
            if isinstance(got, QuotadError):
                return self._settings.failed(got, 1)[0]
            return self._core.answered(ask, got, sent_ms)
        if self._closed:
            return self._settings.failed(closed_error(), 1)[0]
        sent_ms = self._clock()
        try:
            with self._in_flight:
                answer = await self._stub.Check(ask.request, timeout=self._timeout(deadline))
        except grpc.RpcError as error:
            return self._settings.failed(_wire.classify(error), 1)[0]
        return self._core.answered(ask, answer.decision, sent_ms)

    async def check_batch(
        self,
        items: Sequence[Check],
        *,
        mode: BatchMode | str = BatchMode.INDEPENDENT,
        deadline: float | None = None,
    ) -> list[Decision]:
        """Decides at most 1,000 items in one round trip, one decision per item in order.
        Not answered from the deny cache: the mode decides how items affect each other."""
        request = _wire.batch_request(items, BatchMode(mode))
        if self._closed:
            return self._settings.failed(closed_error(), len(items))
        try:
            with self._in_flight:
                answer = await self._stub.CheckBatch(request, timeout=self._timeout(deadline))
        except grpc.RpcError as error:
            return self._settings.failed(_wire.classify(error), len(items))
        if len(answer.decisions) != len(items):
            raise BadResponseError("the number of decisions differs from the number of checks")
        return [_wire.decision(d) for d in answer.decisions]

    async def peek(
        self, key: str, policy: PolicyLike, *, cost: int = 1, deadline: float | None = None
    ) -> Decision:
        """What :meth:`check` would answer now, consuming nothing. Always asks quotad."""
        _wire.valid_cost(cost)
        if self._closed:
            return self._settings.failed(closed_error(), 1)[0]
        try:
            with self._in_flight:
                answer = await self._stub.Peek(
                    _wire.check_request(key, policy, cost), timeout=self._timeout(deadline)
                )
        except grpc.RpcError as error:
            return self._settings.failed(_wire.classify(error), 1)[0]
        return _wire.decision(answer.decision)

    async def reset(self, key: str, policy: PolicyLike, *, deadline: float | None = None) -> None:
        """Forgets the state of ``key`` under ``policy``; drops this client's cached denial.
        Not subject to the failure policy: raises when quotad cannot be reached."""
        if self._closed:
            raise closed_error()
        try:
            with self._in_flight:
                await self._stub.Reset(
                    _wire.reset_request(key, policy), timeout=self._timeout(deadline)
                )
        except grpc.RpcError as error:
            raise _wire.classify(error) from None
        finally:
            # Even a reset that timed out may have happened.
            if self._settings.cache is not None:
                self._settings.cache.forget(cache_key(policy, key))

    async def close(self) -> None:
        """Drains, returns the leases, then closes the connection, as the Rust client
        shuts down: checks already taken (in flight or queued for the next batch)
        are sent and answered as before, each within its own deadline; then every
        lease held is returned (with leases on) and the connection closed. A call
        made once ``close`` has begun answers as an unreachable quotad does
        (``UNAVAILABLE`` "the client is closed", through the failure policy;
        :meth:`reset` raises it). A second ``close`` returns once the first has
        finished; cancelling a caller of ``close`` does not stop the closing."""
        if self._closing is None:
            self._closed = True
            if self._lessee is not None:
                # No lease call starts once closing has begun.
                self._lessee.table.closed = True
            self._closing = asyncio.get_running_loop().create_task(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        if self._coalescer is not None:
            await self._coalescer.close()
        await self._in_flight.idle()
        if self._lessee is not None:
            await self._lessee.shutdown()
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _start_lease(self, slot: Slot) -> None:
        if self._lessee is not None:
            self._lessee.start(slot)

    def _timeout(self, deadline: float | None) -> float:
        return self._settings.deadline if deadline is None else deadline


class _InFlight:
    """Counts the calls made outside the coalescer, so closing waits for them."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def __enter__(self) -> None:
        self._count += 1
        self._idle.clear()

    def __exit__(self, *_: object) -> None:
        self._count -= 1
        if self._count == 0:
            self._idle.set()

    async def idle(self) -> None:
        await self._idle.wait()
