"""The synchronous client."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType

import grpc

from . import _wire
from ._coalesce import closed_error
from ._core import CheckCore
from ._lease import LeaseOptions, LeaseStats, LeaseTable, Slot
from ._lessee import Lessee
from ._settings import DEFAULT_DEADLINE, Settings, cache_key, parse_address
from ._types import BatchMode, Check, Decision, FailurePolicy, PolicyLike
from .errors import BadResponseError
from .tls import TLS
from .v1 import quota_pb2_grpc


class Client:
    """A client of quotad, safe to share between threads.

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
    :meth:`close` returns what is unspent. ``clock``: a monotonic clock in
    whole milliseconds for the deny cache and the leases (tests; the
    system's by default).

    The client connects on first use and reconnects by itself.

    >>> with quotad.Client("http://127.0.0.1:50051") as client:   # doctest: +SKIP
    ...     decision = client.check("user-42", "api")
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
        clock: Callable[[], int] | None = None,
    ) -> None:
        target = parse_address(address, tls)
        self._settings = Settings(deadline, on_unavailable, deny_cache, clock)
        self._clock = self._settings.clock
        # Calls in flight, and whether close() has begun: closing waits for
        # the calls, as the Rust client's shutdown does.
        self._calls = 0
        self._calls_done = threading.Condition()
        self._closed = False
        # Set by the first close() once it has finished: later ones wait on it.
        self._close_done = threading.Event()
        if target.tls is None:
            self._channel = grpc.insecure_channel(target.target, options=target.options)
        else:
            self._channel = grpc.secure_channel(
                target.target, target.tls.credentials(), options=target.options
            )
        self._stub = quota_pb2_grpc.QuotaStub(self._channel)
        self._lessee = (
            None
            if leases is None
            else Lessee(LeaseTable(leases), self._channel, self._settings.deadline, self._clock)
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

    @property
    def deadline(self) -> float:
        """The deadline of a call, in seconds."""
        return self._settings.deadline

    @property
    def on_unavailable(self) -> FailurePolicy:
        """What a call answers when quotad cannot be reached."""
        return self._settings.on_unavailable

    def check(
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
        sent_ms = self._clock()
        try:
            with self._call():
                answer = self._stub.Check(ask.request, timeout=self._timeout(deadline))
        except grpc.RpcError as error:
            return self._settings.failed(_wire.classify(error), 1)[0]
        return self._core.answered(ask, answer.decision, sent_ms)

    def check_batch(
        self,
        items: Sequence[Check],
        *,
        mode: BatchMode | str = BatchMode.INDEPENDENT,
        deadline: float | None = None,
    ) -> list[Decision]:
        """Decides at most 1,000 items in one round trip, one decision per item in order.
        Not answered from the deny cache: the mode decides how items affect each other."""
        request = _wire.batch_request(items, BatchMode(mode))
        try:
            with self._call():
                answer = self._stub.CheckBatch(request, timeout=self._timeout(deadline))
        except grpc.RpcError as error:
            return self._settings.failed(_wire.classify(error), len(items))
        if len(answer.decisions) != len(items):
            raise BadResponseError("the number of decisions differs from the number of checks")
        return [_wire.decision(d) for d in answer.decisions]

    def peek(
        self, key: str, policy: PolicyLike, *, cost: int = 1, deadline: float | None = None
    ) -> Decision:
        """What :meth:`check` would answer now, consuming nothing. Always asks quotad."""
        _wire.valid_cost(cost)
        try:
            with self._call():
                answer = self._stub.Peek(
                    _wire.check_request(key, policy, cost), timeout=self._timeout(deadline)
                )
        except grpc.RpcError as error:
            return self._settings.failed(_wire.classify(error), 1)[0]
        return _wire.decision(answer.decision)

    def reset(self, key: str, policy: PolicyLike, *, deadline: float | None = None) -> None:
        """Forgets the state of ``key`` under ``policy``; drops this client's cached denial.
        Not subject to the failure policy: raises when quotad cannot be reached."""
        try:
            with self._call():
                self._stub.Reset(_wire.reset_request(key, policy), timeout=self._timeout(deadline))
        except grpc.RpcError as error:
            raise _wire.classify(error) from None
        finally:
            # Even a reset that timed out may have happened.
            if self._settings.cache is not None:
                self._settings.cache.forget(cache_key(policy, key))

    def close(self) -> None:
        """Drains, returns the leases, then closes the connection, as the Rust client
        shuts down: calls in flight on other threads are answered as before, each
        within its own deadline (closing the connection under them would cut them
        off); then every lease held is returned (with leases on) and the
        connection closed. A call made once ``close`` has begun answers as an
        unreachable quotad does (``UNAVAILABLE`` "the client is closed", through
        the failure policy; :meth:`reset` raises it). A second ``close`` returns
        once the first has finished."""
        with self._calls_done:
            first = not self._closed
            self._closed = True
            if first and self._lessee is not None:
                # No lease call starts once closing has begun.
                self._lessee.table.closed = True
        if not first:
            self._close_done.wait()
            return
        try:
            with self._calls_done:
                self._calls_done.wait_for(lambda: self._calls == 0)
            if self._lessee is not None:
                self._lessee.shutdown()
            self._channel.close()
        finally:
            self._close_done.set()

    def _start_lease(self, slot: Slot) -> None:
        if self._lessee is not None:
            self._lessee.start(slot)

    @contextmanager
    def _call(self) -> Iterator[None]:
        """Counts one call in flight; refuses it once closing has begun."""
        with self._calls_done:
            if self._closed:
                raise _Closed
            self._calls += 1
        try:
            yield
        finally:
            with self._calls_done:
                self._calls -= 1
                self._calls_done.notify_all()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _timeout(self, deadline: float | None) -> float:
        return self._settings.deadline if deadline is None else deadline


class _Closed(grpc.RpcError):  # type: ignore[misc]
    """A call refused because the client is closing: answered as an unreachable
    quotad (``_wire.classify`` makes it :class:`~quotad.UnavailableError`)."""

    def code(self) -> grpc.StatusCode:
        return closed_error().code

    def details(self) -> str:
        return closed_error().message
