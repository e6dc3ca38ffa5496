"""The check logic both clients share, without I/O (``quotad._core``): what is
answered locally, what is asked, and what the deny cache learns, on a clock the
test sets."""

from __future__ import annotations

import pytest

import quotad
from quotad._core import Ask, CheckCore
from quotad._lease import LeaseOptions, LeaseTable, Slot
from quotad._settings import Settings
from quotad.v1 import quota_pb2

NOON = 1_000_000


def core(now: list[int], leases: LeaseTable | None = None) -> tuple[CheckCore, list[Slot]]:
    started: list[Slot] = []
    settings = Settings(1.0, "error", True, lambda: now[0])
    return CheckCore(settings, leases, started.append), started


def test_a_check_no_local_answer_covers_is_asked_with_its_request() -> None:
    c, _ = core([NOON])
    ask = c.local("alice", "login", 2)
    assert isinstance(ask, Ask)
    assert (ask.request.key, ask.request.policy_name, ask.request.cost) == ("alice", "login", 2)


def test_a_denial_is_held_from_the_send_time_it_is_told_and_then_asked_again() -> None:
    now = [NOON]
    c, _ = core(now)
    ask = c.local("alice", "login", 1)
    assert isinstance(ask, Ask)
    denied = quota_pb2.Decision(
        allowed=False,
        limit=3,
        remaining=0,
        retry_after_ms=10_000,
        reset_after_ms=10_000,
        reason=quota_pb2.REASON_LIMIT_EXCEEDED,
    )
    # Sent 5 s after it was asked (it waited in a queue).
    now[0] = NOON + 5_000
    d = c.answered(ask, denied, NOON + 5_000)
    assert (d.allowed, d.reason) == (False, quotad.Reason.LIMIT_EXCEEDED)
    now[0] = NOON + 5_000 + 9_988
    local = c.local("alice", "login", 1)
    assert isinstance(local, quotad.Decision) and not local.allowed
    now[0] = NOON + 5_000 + 9_989
    assert isinstance(c.local("alice", "login", 1), Ask)


def test_a_leased_check_starts_the_lease_call_and_is_still_asked() -> None:
    c, started = core([NOON], LeaseTable(LeaseOptions(10)))
    assert isinstance(c.local("alice", "login", 1), Ask), "the first check is never delayed"
    assert [(s.policy, s.key) for s in started] == [("login", "alice")]


def test_a_cost_the_wire_cannot_carry_is_refused_before_anything_is_spent() -> None:
    c, started = core([NOON], LeaseTable(LeaseOptions(10)))
    with pytest.raises(quotad.RejectedError, match="cost"):
        c.local("alice", "login", -1)
    assert started == []
