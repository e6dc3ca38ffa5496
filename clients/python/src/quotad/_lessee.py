"""Talking to quotad about leases, in the background: a thread pool for the sync
client, tasks for the asyncio one. What a call does with its answer is
``_lease``'s; this module only sends."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any

import grpc

from . import _lease
from ._lease import LeaseTable, Slot, Taken
from ._settings import now_ms
from .v1 import lease_pb2_grpc

log = logging.getLogger("quotad.leases")


class Lessee:
    """The sync client's lease calls, each on a worker thread."""

    def __init__(
        self,
        table: LeaseTable,
        channel: grpc.Channel,
        deadline: float,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.table = table
        self._clock = clock
        self._stub = lease_pb2_grpc.LeasesStub(channel)
        self._deadline = deadline
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="quotad-lease")
        self._lock = threading.Lock()
        self._in_flight: set[concurrent.futures.Future[None]] = set()

    def start(self, slot: Slot) -> None:
        with self._lock:
            if self.table.closed:
                slot.release()
                return
            future = self._pool.submit(self._run, slot)
            self._in_flight.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: concurrent.futures.Future[None]) -> None:
        with self._lock:
            self._in_flight.discard(future)

    def _run(self, slot: Slot) -> None:
        events: list[str] = []
        try:
            self._renew(slot, events)
        except Exception:  # a lease call never breaks checks: they go direct
            log.exception("lease call failed")
        finally:
            slot.release()
            # Counted last: whoever sees a count finds the slot free again.
            for event in events:
                self.table.bump(event)

    def _send(self, request: Any) -> Any:
        return self._stub.Lease(request, timeout=self._deadline)

    def _renew(self, slot: Slot, events: list[str]) -> None:
        p = _lease.plan(self.table, slot, self._clock())
        p.events = events
        if p.request is None:
            for taken in p.give_back:
                events.append(self._give_back(slot, taken))
            return
        sent = self._clock()
        try:
            answer = self._send(p.request)
        except grpc.RpcError as error:
            _lease.failed(self.table, slot, p, error.code(), error.details() or "", self._clock())
            return
        late = _lease.answered(self.table, slot, p, answer, sent, self._clock())
        if late is not None:
            events.append(self._give_back(slot, late))

    def _give_back(self, slot: Slot, taken: Taken) -> str:
        """Returns ``taken``; what happened, for the caller to count."""
        try:
            answer = self._send(_lease.lease_request(slot, 0, taken))
        except grpc.RpcError:
            return "failed"  # its units come back when it ends
        _lease.settled(self.table, answer)
        return "returned"

    def shutdown(self) -> None:
        """Stops leasing; waits (within the deadline) for calls in flight, then
        returns every lease held with what was spent of it, all at once under
        one deadline."""
        with self._lock:
            self.table.closed = True
            pending = list(self._in_flight)
        concurrent.futures.wait(pending, timeout=self._deadline)
        # Jobs still queued would send on a channel about to close.
        self._pool.shutdown(wait=False, cancel_futures=True)
        now = self._clock()
        claimed: list[Slot] = []
        calls: list[tuple[Slot, Any]] = []
        try:
            for slot in self.table.slots():
                if not slot.claim():
                    continue
                claimed.append(slot)
                with slot.lock:
                    stopped, slot.stopped = slot.stopped, None
                for taken in (stopped, slot.take(now)):
                    if taken is not None:
                        request = _lease.lease_request(slot, 0, taken)
                        calls.append(
                            (slot, self._stub.Lease.future(request, timeout=self._deadline))
                        )
            for _slot, call in calls:
                try:
                    answer = call.result()
                except grpc.RpcError:
                    self.table.bump("failed")  # its units come back when it ends
                    continue
                _lease.settled(self.table, answer)
                self.table.bump("returned")
        finally:
            for slot in claimed:
                slot.release()


class AsyncLessee:
    """The asyncio client's lease calls, each a task on the client's loop."""

    def __init__(
        self, table: LeaseTable, channel: Any, deadline: float, clock: Callable[[], int] = now_ms
    ) -> None:
        self.table = table
        self._clock = clock
        self._stub = lease_pb2_grpc.LeasesStub(channel)
        self._deadline = deadline
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, slot: Slot) -> None:
        if self.table.closed:
            slot.release()
            return
        task = asyncio.get_running_loop().create_task(self._run(slot))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, slot: Slot) -> None:
        events: list[str] = []
        try:
            await self._renew(slot, events)
        except Exception:
            log.exception("lease call failed")
        finally:
            slot.release()
            # Counted last: whoever sees a count finds the slot free again.
            for event in events:
                self.table.bump(event)

    async def _renew(self, slot: Slot, events: list[str]) -> None:
        p = _lease.plan(self.table, slot, self._clock())
        p.events = events
        if p.request is None:
            for taken in p.give_back:
                await self._give_back(slot, taken)
            return
        sent = self._clock()
        try:
            answer = await self._stub.Lease(p.request, timeout=self._deadline)
        except grpc.RpcError as error:
            _lease.failed(self.table, slot, p, error.code(), error.details() or "", self._clock())
            return
        late = _lease.answered(self.table, slot, p, answer, sent, self._clock())
        if late is not None:
            await self._give_back(slot, late)

    async def _give_back(self, slot: Slot, taken: Taken) -> None:
        try:
            answer = await self._stub.Lease(
                _lease.lease_request(slot, 0, taken), timeout=self._deadline
            )
        except grpc.RpcError:
            self.table.bump("failed")
            return
        _lease.settled(self.table, answer)
        self.table.bump("returned")

    async def shutdown(self) -> None:
        """Stops leasing; waits (within the deadline) for calls in flight, then
        returns every lease held, all at once under one deadline."""
        self.table.closed = True
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self._deadline)
        now = self._clock()
        claimed: list[Slot] = []
        returns: list[Any] = []
        try:
            for slot in self.table.slots():
                if not slot.claim():
                    continue
                claimed.append(slot)
                with slot.lock:
                    stopped, slot.stopped = slot.stopped, None
                for taken in (stopped, slot.take(now)):
                    if taken is not None:
                        returns.append(self._give_back(slot, taken))
            # Each call carries the deadline; gathered, they end within one.
            await asyncio.gather(*returns)
        finally:
            for slot in claimed:
                slot.release()
