"""Coalescing for :class:`quotad.AsyncClient`, with the Rust client's rules
(``crates/quotad-client/src/coalesce.rs``, docs/clients.md):

- a check goes out at once, alone, while the client has a free in-flight slot
  (8 by default), so a lone check never waits;
- while every slot is busy, new checks queue; when a slot frees, the queue
  leaves as one ``INDEPENDENT`` ``CheckBatch`` (at most 1,000 items and 1 MiB
  encoded; a batch of one is a plain ``Check``);
- each caller keeps its own deadline: a check whose deadline passes in the
  queue, or whose caller is cancelled, is never sent; a batch carries the
  earliest deadline of its checks, so a caller answered with its failure
  policy at its deadline is never counted after it;
- a refusal made before anything was decided (``INVALID_ARGUMENT``,
  ``NOT_FOUND``, ``FAILED_PRECONDITION`` naming ``items[i]``, and refusals
  such as ``PERMISSION_DENIED``) is the named item's own error, as a lone
  check would have had it (without the ``items[i].`` prefix), and every other
  item is sent again alone; a refusal of ``CheckBatch`` itself
  (``PERMISSION_DENIED``, ``UNAUTHENTICATED``, ``UNIMPLEMENTED`` naming no
  item) also sends checks alone for 30 s;
- an outage (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ...) gives every caller
  its own failure policy and nothing is sent again (quotad may have decided
  some items already); any other error goes to every caller;
- an item quotad could not decide (``REASON_UNAVAILABLE``) while it decided
  others is sent again alone (at most 8 of a batch), so its caller learns
  why; when none was decided, every caller gets its failure policy.

The sync :class:`quotad.Client` does not coalesce: its callers are threads
each blocked on its own call.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import grpc

from . import _wire
from .errors import BadResponseError, QuotadError, RejectedError, UnavailableError
from .v1 import quota_pb2 as pb

MAX_BATCH_ITEMS = 1_000
DEFAULT_MAX_IN_FLIGHT = 8
DEFAULT_MAX_BATCH_BYTES = 1 << 20
BATCH_REFUSAL_BACKOFF_MS = 30_000
"""How long (ms, on the client's clock) checks go out alone after quotad refused a
``CheckBatch`` as such; the first queue after it leaves as a batch again."""
MAX_RESENT_ALONE = 8
"""The most undecided checks of one batch that are sent again, each alone."""

_REFUSED_AS_A_WHOLE = frozenset(
    {
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)
_REFUSED_BEFORE_DECIDING = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)
_NAMING_AN_ITEM = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
    }
)
_ITEM = re.compile(r"^items\[(\d+)\]\.(.*)$", re.DOTALL)


@dataclass(frozen=True)
class Coalescing:
    """How :class:`~quotad.AsyncClient` coalesces concurrent checks.

    ``max_in_flight``: requests (a ``Check`` or a ``CheckBatch``) in flight
    before new checks queue (default 8). ``max_batch_items`` (1 to 1,000) and
    ``max_batch_bytes``: the bounds of one batch (a single larger check still
    goes, alone).
    """

    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_batch_items: int = MAX_BATCH_ITEMS
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES

    def __post_init__(self) -> None:
        if self.max_in_flight < 1:
            raise ValueError("coalescing.max_in_flight: must be at least 1")
        if not 1 <= self.max_batch_items <= MAX_BATCH_ITEMS:
            raise ValueError(
                f"coalescing.max_batch_items: must be between 1 and {MAX_BATCH_ITEMS} "
                f"(got {self.max_batch_items})"
            )
        if self.max_batch_bytes < 1:
            raise ValueError("coalescing.max_batch_bytes: must be at least 1")


@dataclass
class CoalescingStats:
    """What coalescing did: ``Check`` and ``CheckBatch`` calls sent, and the checks
    the batches carried."""

    check_calls: int = 0
    batch_calls: int = 0
    coalesced_checks: int = 0


# What one check gets: quotad's decision, or the error of its call.
Answer = pb.Decision | QuotadError


@dataclass
class _Queued:
    request: pb.CheckRequest
    bytes: int
    deadline: float
    # The answer, and when (on the client's clock) the check was sent.
    future: asyncio.Future[tuple[Answer, int]] = field(repr=False)


def _deliver(q: _Queued, answer: tuple[Answer, int]) -> None:
    if not q.future.done():
        q.future.set_result(answer)


class AsyncCoalescer:
    """The queue of checks waiting for an in-flight slot, and the slots.

    ``clock``: the client's monotonic clock in milliseconds, for the batch
    refusal back-off and for when each check was sent (a test gives its own);
    deadlines are real time, on :func:`time.monotonic`.
    """

    def __init__(self, settings: Coalescing, stub: Any, clock: Callable[[], int]) -> None:
        self.settings = settings
        self._stub = stub
        self._clock = clock
        self._in_flight = 0
        self._queue: deque[_Queued] = deque()
        self._refused_until_ms = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._active = 0
        self._idle = asyncio.Event()
        self._closed = False
        self.stats = CoalescingStats()

    @property
    def queued(self) -> int:
        """Checks waiting for an in-flight slot, to leave as the next batch."""
        return sum(1 for q in self._queue if not q.future.done())

    async def submit(self, request: pb.CheckRequest, timeout: float) -> tuple[Answer, int]:
        """Sends ``request`` now if a slot is free, or queues it for the next batch;
        answers within ``timeout`` seconds, with the time (on the client's clock)
        the check was sent (0 when it never was)."""
        if self._closed:
            return closed_error(), 0
        self._active += 1
        try:
            return await self._submit(request, timeout)
        finally:
            self._active -= 1
            self._settle()

    async def _submit(self, request: pb.CheckRequest, timeout: float) -> tuple[Answer, int]:
        if self._clock() < self._refused_until_ms:
            return await self._alone(request, timeout)
        if self._in_flight < self.settings.max_in_flight:
            self._in_flight += 1
            try:
                return await self._alone(request, timeout)
            finally:
                self._release()
        future: asyncio.Future[tuple[Answer, int]] = asyncio.get_running_loop().create_future()
        queued = _Queued(request, request.ByteSize(), time.monotonic() + timeout, future)
        self._queue.append(queued)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            return UnavailableError(
                grpc.StatusCode.DEADLINE_EXCEEDED, "no answer from quotad within the deadline"
            ), 0
        finally:
            # Timed out or cancelled in the queue: never sent; in a batch
            # already: its answer is dropped (and a batch whose callers all
            # left is cancelled).
            if not future.done():
                future.cancel()

    async def close(self) -> None:
        """Takes no more checks and waits until every check taken is answered
        (each within its own deadline): queued ones leave as batches as slots
        free, as before."""
        self._closed = True
        while self._active > 0 or self._tasks:
            self._idle.clear()
            await self._idle.wait()

    def _settle(self) -> None:
        if self._active == 0 and not self._tasks:
            self._idle.set()

    async def _alone(self, request: pb.CheckRequest, timeout: float) -> tuple[Answer, int]:
        self.stats.check_calls += 1
        sent_ms = self._clock()
        try:
            answer = await self._stub.Check(request, timeout=timeout)
        except grpc.RpcError as error:
            return _wire.classify(error), sent_ms
        return answer.decision, sent_ms

    def _take(self) -> list[_Queued]:
        batch: list[_Queued] = []
        size = 0
        while self._queue and len(batch) < self.settings.max_batch_items:
            nxt = self._queue[0]
            if nxt.future.done():
                self._queue.popleft()
                continue
            if batch and size + nxt.bytes > self.settings.max_batch_bytes:
                break
            batch.append(self._queue.popleft())
            size += nxt.bytes
        return batch

    def _release(self) -> None:
        """A slot came free: the queue's next batch takes it, or it is given back."""
        batch = self._take()
        if not batch:
            self._in_flight -= 1
            return
        task = asyncio.ensure_future(self._send_batch(batch))
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            # The slot passes to the next batch without being given back.
            self._release()
            self._settle()

        task.add_done_callback(done)

    async def _unless_abandoned(self, batch: list[_Queued], call: Any) -> Any:
        """Awaits ``call``, or cancels it (so quotad stops working on it) once every
        caller of ``batch`` has stopped waiting; then answers ``_ABANDONED``."""
        sent = asyncio.ensure_future(call)
        gone = asyncio.ensure_future(_every_caller_gone(batch))
        try:
            await asyncio.wait({sent, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not sent.done():
            sent.cancel()
            return _ABANDONED
        return sent.result()

    async def _send_batch(self, batch: list[_Queued]) -> None:
        # Stamped here, when the batch leaves: the deny cache times a denial
        # from the send, never from the enqueue.
        sent_ms = self._clock()
        now = time.monotonic()
        if all(q.future.done() for q in batch):
            return  # every caller left while it waited to be sent
        if len(batch) == 1:
            only = batch[0]
            self.stats.check_calls += 1
            try:
                answer = await self._unless_abandoned(
                    batch, self._stub.Check(only.request, timeout=max(only.deadline - now, 0.001))
                )
            except grpc.RpcError as error:
                _deliver(only, (_wire.classify(error), sent_ms))
                return
            if answer is not _ABANDONED:
                _deliver(only, (answer.decision, sent_ms))
            return
        # The earliest deadline of the batch: a caller answered with its
        # failure policy at its deadline is never counted after it.
        timeout = max(min(q.deadline for q in batch) - now, 0.001)
        self.stats.batch_calls += 1
        self.stats.coalesced_checks += len(batch)
        request = pb.CheckBatchRequest(
            items=[q.request for q in batch], mode=pb.BATCH_MODE_INDEPENDENT
        )
        try:
            answer = await self._unless_abandoned(
                batch, self._stub.CheckBatch(request, timeout=timeout)
            )
        except grpc.RpcError as error:
            await self._failed(batch, error, sent_ms)
            return
        if answer is _ABANDONED:
            return
        if len(answer.decisions) != len(batch):
            bad = BadResponseError("the number of decisions differs from the number of checks")
            for q in batch:
                _deliver(q, (bad, sent_ms))
            return
        any_decided = any(d.reason != pb.REASON_UNAVAILABLE for d in answer.decisions)
        resent: list[Coroutine[Any, Any, None]] = []
        now = time.monotonic()
        for q, d in zip(batch, answer.decisions, strict=True):
            if d.reason != pb.REASON_UNAVAILABLE:
                _deliver(q, (d, sent_ms))
            elif q.future.done() or q.deadline <= now:
                # Its caller has left (answered at its deadline): nothing to
                # send, and it takes no place among the re-sent.
                continue
            elif any_decided and len(resent) < MAX_RESENT_ALONE:
                # The failure may be this item's own: alone, it says what.
                resent.append(self._resend(q))
            else:
                _deliver(
                    q,
                    (
                        UnavailableError(
                            grpc.StatusCode.UNAVAILABLE,
                            "quotad could not decide this check (REASON_UNAVAILABLE)",
                        ),
                        sent_ms,
                    ),
                )
        await asyncio.gather(*resent)

    async def _failed(self, batch: list[_Queued], error: grpc.RpcError, sent_ms: int) -> None:
        code = error.code()
        details = error.details() or ""
        match = _ITEM.match(details) if code in _NAMING_AN_ITEM else None
        named = int(match.group(1)) if match is not None else None
        if named is not None and named >= len(batch):
            named = None
        if code in _REFUSED_AS_A_WHOLE and named is None:
            self._refused_until_ms = self._clock() + BATCH_REFUSAL_BACKOFF_MS
        if code not in _REFUSED_BEFORE_DECIDING:
            failure = _wire.classify(error)
            for q in batch:
                _deliver(q, (failure, sent_ms))
            return
        resent: list[Coroutine[Any, Any, None]] = []
        for i, q in enumerate(batch):
            if i == named and match is not None:
                _deliver(q, (RejectedError(code, match.group(2)), sent_ms))
            else:
                resent.append(self._resend(q))
        await asyncio.gather(*resent)

    async def _resend(self, q: _Queued) -> None:
        left = q.deadline - time.monotonic()
        if q.future.done() or left <= 0:
            return
        _deliver(q, await self._alone(q.request, left))


_ABANDONED = object()


async def _every_caller_gone(batch: list[_Queued]) -> None:
    await asyncio.wait([q.future for q in batch])


def closed_error() -> UnavailableError:
    """What a check gets from a closed client: quotad cannot be reached through it."""
    return UnavailableError(grpc.StatusCode.UNAVAILABLE, "the client is closed")
