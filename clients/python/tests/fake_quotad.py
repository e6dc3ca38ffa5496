"""A small in-process quotad for the lease and coalescing tests: grants and
decides what it is told and records every call, so a test sees exactly what
the client sent; a check of a key in ``hold`` waits until the test lets it go,
and a batch can be held, refused, or answered undecided for some items."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc

from quotad.v1 import lease_pb2, lease_pb2_grpc, quota_pb2, quota_pb2_grpc


@dataclass
class Fake:
    units: int = 10
    ttl_ms: int = 60_000
    direct: bool = False
    refuse: grpc.StatusCode | None = None
    # Keys whose leases are refused as quotad refuses a bad key.
    refuse_keys: frozenset[str] = frozenset()
    limit: int = 100
    # When given, a call returning a lease (want 0) waits for it: a quotad
    # that stopped answering.
    stall_returns: threading.Event | None = None
    checks: int = 0
    # Coalescing: a Check of a key here waits for its event; a CheckBatch
    # waits for `hold_batches` (when given), then is refused with
    # `refuse_batches` (code, details) or decided item by item by `decide`.
    hold: dict[str, threading.Event] = field(default_factory=dict)
    hold_batches: threading.Event | None = None
    refuse_batches: tuple[grpc.StatusCode, str] | None = None
    decide: Callable[[quota_pb2.CheckRequest], quota_pb2.Decision] | None = None
    # Checks of these keys are refused with (code, details).
    refuse_checks: dict[str, tuple[grpc.StatusCode, str]] = field(default_factory=dict)
    # How a batch's items are decided, when not as `decide` decides them alone.
    decide_in_batch: Callable[[quota_pb2.CheckRequest], quota_pb2.Decision] | None = None
    # ("Check", key) or ("CheckBatch", "a,b,c"), in the order they arrived;
    # the keys of batches whose calls the client cancelled.
    calls: list[tuple[str, str]] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    leases: list[lease_pb2.LeaseRequest] = field(default_factory=list)
    granted: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def calls_made(self) -> list[tuple[str, str]]:
        with self.lock:
            return list(self.calls)

    def lease_calls(self) -> list[lease_pb2.LeaseRequest]:
        with self.lock:
            return list(self.leases)


class _Quota(quota_pb2_grpc.QuotaServicer):
    def __init__(self, fake: Fake) -> None:
        self.fake = fake

    def _decide(self, request: quota_pb2.CheckRequest) -> quota_pb2.Decision:
        if self.fake.decide is not None:
            return self.fake.decide(request)
        return quota_pb2.Decision(allowed=True, limit=self.fake.limit, remaining=50, reason=1)

    def Check(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        with self.fake.lock:
            self.fake.checks += 1
            self.fake.calls.append(("Check", request.key))
        gate = self.fake.hold.get(request.key)
        if gate is not None:
            gate.wait(30)
        refusal = self.fake.refuse_checks.get(request.key)
        if refusal is not None:
            context.abort(*refusal)
        return quota_pb2.CheckResponse(decision=self._decide(request))

    def CheckBatch(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        keys = ",".join(item.key for item in request.items)
        with self.fake.lock:
            self.fake.calls.append(("CheckBatch", keys))
        held = self.fake.hold_batches
        if held is not None:
            while not held.wait(0.005):
                if not context.is_active():
                    with self.fake.lock:
                        self.fake.cancelled.append(keys)
                    return quota_pb2.CheckBatchResponse()
        if self.fake.refuse_batches is not None:
            context.abort(*self.fake.refuse_batches)
        decide = self.fake.decide_in_batch or self._decide
        return quota_pb2.CheckBatchResponse(decisions=[decide(i) for i in request.items])


class _Leases(lease_pb2_grpc.LeasesServicer):
    def __init__(self, fake: Fake) -> None:
        self.fake = fake

    def Lease(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        fake = self.fake
        if request.want == 0 and fake.stall_returns is not None:
            fake.stall_returns.wait(30)
        with fake.lock:
            fake.leases.append(request)
            if fake.refuse is not None:
                context.abort(fake.refuse, "policy_name: no lease settings")
            if request.key in fake.refuse_keys:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "key: must be at most 8 bytes")
            response = lease_pb2.LeaseResponse(limit=fake.limit, reset_after_ms=30_000)
            if request.HasField("settle"):
                response.settled = lease_pb2.SETTLED_RETURNED
                response.returned = 0
            if request.want > 0:
                if fake.direct:
                    response.direct = True
                else:
                    lease_id = f"L{len(fake.granted) + 1}"
                    fake.granted.append(lease_id)
                    response.lease.lease_id = lease_id
                    response.lease.units = min(fake.units, request.want)
                    response.lease.ttl_ms = fake.ttl_ms
            return response


@contextmanager
def fake_quotad(fake: Fake) -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(16))
    quota_pb2_grpc.add_QuotaServicer_to_server(_Quota(fake), server)
    lease_pb2_grpc.add_LeasesServicer_to_server(_Leases(fake), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop(0)
