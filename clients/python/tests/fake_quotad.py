"""A small in-process quotad for the lease tests: grants what it is told and
records every call, so a test sees exactly what the client sent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
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
    leases: list[lease_pb2.LeaseRequest] = field(default_factory=list)
    granted: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def lease_calls(self) -> list[lease_pb2.LeaseRequest]:
        with self.lock:
            return list(self.leases)


class _Quota(quota_pb2_grpc.QuotaServicer):
    def __init__(self, fake: Fake) -> None:
        self.fake = fake

    def Check(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        with self.fake.lock:
            self.fake.checks += 1
        return quota_pb2.CheckResponse(
            decision=quota_pb2.Decision(allowed=True, limit=self.fake.limit, remaining=50, reason=1)
        )


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
