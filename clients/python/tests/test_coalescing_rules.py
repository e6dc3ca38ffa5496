"""Coalescing's rules against a scripted in-process quotad, on a clock the test
drives, as the Rust client's (crates/quotad-client/src/coalesce.rs): the batch
refusal back-off and its length, checks of a refused batch sent again alone,
undecided items sent again (at most eight), the deny cache timed from the
batch's send, abandoned batches dropped, and closing that drains."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable

import grpc
import pytest
from fake_quotad import Fake, fake_quotad

import quotad
from quotad.v1 import quota_pb2

NOON = 1_000_000


class FakeClock:
    """Monotonic milliseconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = NOON

    def __call__(self) -> int:
        return self.now


async def until(what: str, condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Polls (bounded) for a state the client or the fake reaches in the background."""
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"never: {what}"
        await asyncio.sleep(0.002)


def run(go: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(go(), 20)

    asyncio.run(bounded())


def client_of(address: str, clock: FakeClock, **options: object) -> quotad.AsyncClient:
    return quotad.AsyncClient(
        address,
        deadline=5,
        deny_cache=options.pop("deny_cache", False),  # type: ignore[arg-type]
        coalescing=quotad.Coalescing(1),
        clock=clock,
        **options,  # type: ignore[arg-type]
    )


async def with_slot_held(
    fake: Fake, client: quotad.AsyncClient, hold: str, keys: list[str]
) -> tuple[asyncio.Future[quotad.Decision], list[asyncio.Future[quotad.Decision]]]:
    """Holds the one in-flight slot with a check of ``hold`` that quotad keeps
    waiting, and queues a check of each of ``keys`` behind it."""
    fake.hold[hold] = threading.Event()
    held = asyncio.ensure_future(client.check(hold, "api"))
    await until(f"{hold} reached quotad", lambda: ("Check", hold) in fake.calls_made())
    queued = [asyncio.ensure_future(client.check(k, "api")) for k in keys]
    await until(
        "the checks queued",
        lambda: (
            client._coalescer is not None  # noqa: SLF001
            and client._coalescer.queued == len(keys)
        ),
    )  # noqa: SLF001
    return held, queued


def since(fake: Fake, mark: int) -> list[tuple[str, str]]:
    return fake.calls_made()[mark:]


def test_a_batch_refused_as_such_sends_its_checks_alone_and_batching_stops_for_exactly_30_s() -> (
    None
):
    fake = Fake()
    clock = FakeClock()

    async def go() -> None:
        async with client_of(address, clock) as client:
            fake.refuse_batches = (grpc.StatusCode.PERMISSION_DENIED, "CheckBatch: not allowed")
            held, queued = await with_slot_held(fake, client, "h1", ["a", "b", "c"])
            fake.hold["h1"].set()
            answers = await asyncio.gather(held, *queued)
            assert all(d.allowed for d in answers), "every check decided, alone"
            calls = fake.calls_made()
            assert calls[:2] == [("Check", "h1"), ("CheckBatch", "a,b,c")]
            assert sorted(calls[2:]) == [("Check", "a"), ("Check", "b"), ("Check", "c")]

            # Within the back-off every check goes out alone, though the
            # slot is busy: nothing queues, no CheckBatch is refused again.
            clock.now = NOON + 29_999
            mark = len(fake.calls_made())
            fake.hold["h2"] = threading.Event()
            held = asyncio.ensure_future(client.check("h2", "api"))
            await until("h2 reached quotad", lambda: ("Check", "h2") in fake.calls_made())
            alone = await asyncio.gather(client.check("d", "api"), client.check("e", "api"))
            assert all(d.allowed for d in alone)
            fake.hold["h2"].set()
            await held
            assert sorted(since(fake, mark)) == [("Check", "d"), ("Check", "e"), ("Check", "h2")]

            # At 30 s the next queue leaves as a batch again.
            clock.now = NOON + 30_000
            fake.refuse_batches = None
            mark = len(fake.calls_made())
            held, queued = await with_slot_held(fake, client, "h3", ["f", "g"])
            fake.hold["h3"].set()
            assert all(d.allowed for d in await asyncio.gather(held, *queued))
            assert since(fake, mark) == [("Check", "h3"), ("CheckBatch", "f,g")]

    with fake_quotad(fake) as address:
        run(go)


def test_a_batch_refused_naming_an_item_fails_that_item_only_and_batching_goes_on() -> None:
    fake = Fake()
    clock = FakeClock()

    async def go() -> None:
        async with client_of(address, clock) as client:
            fake.refuse_batches = (grpc.StatusCode.INVALID_ARGUMENT, "items[1].key: too long")
            held, queued = await with_slot_held(fake, client, "h1", ["a", "b", "c"])
            fake.hold["h1"].set()
            await held
            a, b, c = await asyncio.gather(*queued, return_exceptions=True)
            assert isinstance(b, quotad.RejectedError)
            assert (b.code, b.field, b.message) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                "key",
                "key: too long",
            )
            assert isinstance(a, quotad.Decision) and a.allowed
            assert isinstance(c, quotad.Decision) and c.allowed
            assert sorted(fake.calls_made()[2:]) == [("Check", "a"), ("Check", "c")]
            # Refusing an item is no refusal of CheckBatch: no back-off.
            fake.refuse_batches = None
            mark = len(fake.calls_made())
            held, queued = await with_slot_held(fake, client, "h2", ["d", "e"])
            fake.hold["h2"].set()
            await asyncio.gather(held, *queued)
            assert since(fake, mark) == [("Check", "h2"), ("CheckBatch", "d,e")]

    with fake_quotad(fake) as address:
        run(go)


def undecided_but(decided: set[str]) -> Callable[[quota_pb2.CheckRequest], quota_pb2.Decision]:
    """quotad deciding only the keys in ``decided`` in a batch (alone, every key)."""

    def decide(request: quota_pb2.CheckRequest) -> quota_pb2.Decision:
        if request.key in decided:
            return quota_pb2.Decision(allowed=True, limit=100, remaining=50, reason=1)
        return quota_pb2.Decision(reason=quota_pb2.REASON_UNAVAILABLE)

    return decide


def test_at_most_eight_undecided_items_of_a_batch_are_sent_again_alone() -> None:
    fake = Fake()
    clock = FakeClock()
    keys = [f"k{i}" for i in range(11)]

    async def go() -> None:
        async with client_of(address, clock, on_unavailable="fail_closed") as client:
            # quotad decides k0 only in the batch, and every key alone.
            fake.decide_in_batch = undecided_but({"k0"})
            held, queued = await with_slot_held(fake, client, "h1", keys)
            fake.hold["h1"].set()
            await held
            answers = await asyncio.gather(*queued)
            resent = [k for call, k in fake.calls_made()[2:] if call == "Check"]
            assert sorted(resent) == keys[1:9], "the first eight undecided, each alone"
            assert all(answers[i].allowed for i in range(9))
            # Past the eight: the failure policy, no call.
            assert [d.reason for d in answers[9:]] == [quotad.Reason.FAIL_CLOSED] * 2

            # quotad deciding none of the batch (its store is down): no
            # item is sent again; every caller gets its failure policy.
            fake.decide_in_batch = undecided_but(set())
            mark = len(fake.calls_made())
            held, queued = await with_slot_held(fake, client, "h2", ["x", "y", "z"])
            fake.hold["h2"].set()
            await held
            answers = await asyncio.gather(*queued)
            assert [d.reason for d in answers] == [quotad.Reason.FAIL_CLOSED] * 3
            assert since(fake, mark) == [("Check", "h2"), ("CheckBatch", "x,y,z")]

    with fake_quotad(fake) as address:
        run(go)


def test_undecided_items_whose_callers_left_take_no_place_among_the_eight_sent_again() -> None:
    fake = Fake()
    clock = FakeClock()
    keys = [f"k{i}" for i in range(11)]
    fake.hold_batches = threading.Event()

    async def go() -> None:
        async with client_of(address, clock, on_unavailable="fail_closed") as client:
            fake.decide_in_batch = undecided_but({"k0"})
            held, queued = await with_slot_held(fake, client, "h1", keys)
            fake.hold["h1"].set()
            await held
            await until("the batch reached quotad", lambda: len(fake.calls_made()) == 2)
            # Three callers leave while their batch is out.
            for q in queued[1:4]:
                q.cancel()
            await asyncio.gather(*queued[1:4], return_exceptions=True)
            fake.hold_batches.set()
            answers = await asyncio.gather(*queued[0:1], *queued[4:])
            resent = [k for call, k in fake.calls_made()[2:] if call == "Check"]
            assert sorted(resent) == sorted(keys[4:]), "seven undecided with callers, each alone"
            assert all(d.allowed for d in answers), [d.reason for d in answers]

    with fake_quotad(fake) as address:
        run(go)


def test_a_lone_queued_check_that_quotad_refuses_gets_its_own_error_at_once() -> None:
    fake = Fake()
    clock = FakeClock()
    fake.refuse_checks["nope"] = (grpc.StatusCode.NOT_FOUND, "policy_name: no policy named api")

    async def go() -> None:
        async with client_of(address, clock) as client:
            held, [queued] = await with_slot_held(fake, client, "h1", ["nope"])
            fake.hold["h1"].set()
            await held
            with pytest.raises(quotad.RejectedError) as refused:
                await queued
            assert (refused.value.code, refused.value.field) == (
                grpc.StatusCode.NOT_FOUND,
                "policy_name",
            )
            assert fake.calls_made() == [("Check", "h1"), ("Check", "nope")]

    with fake_quotad(fake) as address:
        run(go)


def test_a_denial_from_a_batch_is_cached_from_when_the_batch_left_not_from_the_enqueue() -> None:
    fake = Fake()
    clock = FakeClock()
    # Denied, 10 s to wait: cached for 10,000 - (1 + 10) = 9,989 ms from the send.
    denied = quota_pb2.Decision(
        allowed=False,
        limit=5,
        remaining=0,
        retry_after_ms=10_000,
        reset_after_ms=10_000,
        reason=quota_pb2.REASON_LIMIT_EXCEEDED,
    )
    fake.decide = lambda r: (
        denied if r.key == "k" else quota_pb2.Decision(allowed=True, limit=5, remaining=4, reason=1)
    )

    async def go() -> None:
        async with client_of(address, clock, deny_cache=True) as client:
            held, queued = await with_slot_held(fake, client, "h1", ["k", "other"])
            # The checks wait 5 s in the queue before their batch leaves.
            clock.now = NOON + 5_000
            fake.hold["h1"].set()
            await held
            k, _ = await asyncio.gather(*queued)
            assert (k.allowed, k.reason) == (False, quotad.Reason.LIMIT_EXCEEDED)
            assert fake.calls_made()[1] == ("CheckBatch", "k,other")
            sent = NOON + 5_000
            calls = len(fake.calls_made())
            clock.now = sent + 9_988
            local = await client.check("k", "api")
            assert (local.allowed, local.reason) == (False, quotad.Reason.LIMIT_EXCEEDED)
            assert len(fake.calls_made()) == calls, "still within send + retry - margin"
            clock.now = sent + 9_989
            await client.check("k", "api")
            assert fake.calls_made()[calls:] == [("Check", "k")], "the cached window ended"

    with fake_quotad(fake) as address:
        run(go)


def test_a_batch_whose_callers_all_left_is_cancelled_so_quotad_stops_working_on_it() -> None:
    fake = Fake()
    clock = FakeClock()
    fake.hold_batches = threading.Event()

    async def go() -> None:
        async with client_of(address, clock) as client:
            held, queued = await with_slot_held(fake, client, "h1", ["a", "b"])
            fake.hold["h1"].set()
            await held
            await until("the batch reached quotad", lambda: len(fake.calls_made()) == 2)
            queued[0].cancel()
            # A real bound, long enough for a cancel to reach quotad (the fake
            # polls every 5 ms), so a client that cancelled here would be seen.
            await asyncio.sleep(0.1)
            assert fake.cancelled == [], "one caller still waits"
            queued[1].cancel()
            # The batch's deadline is 5 s away: only the client's cancel ends it now.
            await until("quotad saw the batch cancelled", lambda: fake.cancelled == ["a,b"], 2)
            # Callers gone before their batch left: nothing is sent.
            mark = len(fake.calls_made())
            held, queued = await with_slot_held(fake, client, "h2", ["c", "d"])
            for q in queued:
                q.cancel()
            fake.hold["h2"].set()
            await held
            assert (await client.check("e", "api")).allowed
            assert since(fake, mark) == [("Check", "h2"), ("Check", "e")]
        fake.hold_batches.set()

    with fake_quotad(fake) as address:
        run(go)


def test_closing_the_async_client_drains_checks_in_flight_and_queued_then_refuses_new_ones() -> (
    None
):
    fake = Fake()
    clock = FakeClock()

    async def go() -> None:
        client = client_of(address, clock, on_unavailable="fail_closed")
        held, queued = await with_slot_held(fake, client, "h1", ["a", "b"])
        closing = asyncio.ensure_future(client.close())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not closing.done(), "close waits for the checks it was given"
        late = await client.check("late", "api")
        assert (late.allowed, late.reason) == (False, quotad.Reason.FAIL_CLOSED)
        with pytest.raises(quotad.UnavailableError, match="the client is closed"):
            await client.reset("late", "api")
        fake.hold["h1"].set()
        answers = await asyncio.gather(held, *queued)
        assert [(d.allowed, d.reason) for d in answers] == [(True, quotad.Reason.WITHIN_LIMIT)] * 3
        await closing
        assert ("Check", "late") not in fake.calls_made()
        assert fake.calls_made()[:2] == [("Check", "h1"), ("CheckBatch", "a,b")]

    with fake_quotad(fake) as address:
        run(go)


def test_closing_the_sync_client_waits_for_calls_in_flight_then_refuses_new_ones() -> None:
    fake = Fake()
    fake.hold["h1"] = threading.Event()
    with fake_quotad(fake) as address:
        client = quotad.Client(address, deadline=5, on_unavailable="fail_closed")
        got: list[quotad.Decision] = []
        caller = threading.Thread(target=lambda: got.append(client.check("h1", "api")))
        caller.start()
        end = time.monotonic() + 5
        while ("Check", "h1") not in fake.calls_made():
            assert time.monotonic() < end, "the check never reached quotad"
            time.sleep(0.002)
        closer = threading.Thread(target=client.close)
        closer.start()
        end = time.monotonic() + 5
        while not client._closed:  # noqa: SLF001
            assert time.monotonic() < end, "close never began"
            time.sleep(0.002)
        assert closer.is_alive(), "close waits for the call in flight"
        late = client.check("late", "api")
        assert (late.allowed, late.reason) == (False, quotad.Reason.FAIL_CLOSED)
        fake.hold["h1"].set()
        caller.join(10)
        closer.join(10)
        assert not closer.is_alive()
        assert [(d.allowed, d.reason) for d in got] == [(True, quotad.Reason.WITHIN_LIMIT)]
        assert fake.calls_made() == [("Check", "h1")]


def denying_k() -> Callable[[quota_pb2.CheckRequest], quota_pb2.Decision]:
    denied = quota_pb2.Decision(
        allowed=False,
        limit=5,
        remaining=0,
        retry_after_ms=10_000,
        reset_after_ms=10_000,
        reason=quota_pb2.REASON_LIMIT_EXCEEDED,
    )
    return lambda r: (
        denied if r.key == "k" else quota_pb2.Decision(allowed=True, limit=5, remaining=4, reason=1)
    )


def test_a_closed_async_client_answers_closed_even_where_its_deny_cache_would_answer() -> None:
    fake = Fake()
    clock = FakeClock()
    fake.decide = denying_k()

    async def go() -> None:
        client = client_of(address, clock, deny_cache=True, on_unavailable="fail_closed")
        first = await client.check("k", "api")
        assert first.reason is quotad.Reason.LIMIT_EXCEEDED
        await client.close()
        late = await client.check("k", "api")
        assert (late.allowed, late.reason) == (False, quotad.Reason.FAIL_CLOSED)
        assert fake.calls_made() == [("Check", "k")]

    with fake_quotad(fake) as address:
        run(go)


def test_a_closed_sync_client_answers_closed_even_where_its_deny_cache_would_answer() -> None:
    fake = Fake()
    fake.decide = denying_k()
    with fake_quotad(fake) as address:
        client = quotad.Client(address, deadline=5, on_unavailable="fail_closed")
        assert client.check("k", "api").reason is quotad.Reason.LIMIT_EXCEEDED
        client.close()
        late = client.check("k", "api")
        assert (late.allowed, late.reason) == (False, quotad.Reason.FAIL_CLOSED)
        assert fake.calls_made() == [("Check", "k")]


def test_a_second_async_close_waits_for_the_first_even_when_the_first_was_cancelled() -> None:
    fake = Fake()
    clock = FakeClock()

    async def go() -> None:
        client = client_of(address, clock)
        held, queued = await with_slot_held(fake, client, "h1", ["a"])
        first = asyncio.ensure_future(client.close())
        for _ in range(5):
            await asyncio.sleep(0)
        first.cancel()
        second = asyncio.ensure_future(client.close())
        # A real bound: a close that did not wait would be done by now.
        await asyncio.sleep(0.1)
        assert not second.done(), "the closing still waits for the check in flight"
        fake.hold["h1"].set()
        await second
        assert held.done() and all(q.done() for q in queued), "closed only once drained"
        answers = await asyncio.gather(held, *queued)
        assert [d.allowed for d in answers] == [True, True]

    with fake_quotad(fake) as address:
        run(go)


def test_a_second_sync_close_returns_only_once_the_first_has_finished() -> None:
    fake = Fake()
    fake.hold["h1"] = threading.Event()
    with fake_quotad(fake) as address:
        client = quotad.Client(address, deadline=5, on_unavailable="fail_closed")
        caller = threading.Thread(target=lambda: client.check("h1", "api"))
        caller.start()
        end = time.monotonic() + 5
        while ("Check", "h1") not in fake.calls_made():
            assert time.monotonic() < end, "the check never reached quotad"
            time.sleep(0.002)
        first = threading.Thread(target=client.close)
        first.start()
        end = time.monotonic() + 5
        while not client._closed:  # noqa: SLF001
            assert time.monotonic() < end, "close never began"
            time.sleep(0.002)
        second = threading.Thread(target=client.close)
        second.start()
        # A real bound: a second close that did not wait would have returned.
        second.join(0.1)
        assert second.is_alive(), "the second close waits for the first"
        fake.hold["h1"].set()
        for t in (caller, first, second):
            t.join(10)
            assert not t.is_alive()
