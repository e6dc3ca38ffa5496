"""Coalescing in the AsyncClient against a real quotad, counting the calls quotad
decided from its own metrics (one store call per Check or CheckBatch): concurrent
checks beyond the in-flight slots leave as one CheckBatch, answered as the Rust
client answers them (crates/quotad-client/tests/client/coalescing.rs)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
from servers import Quotad, deciding_calls, real_quotad, stalled_port

import quotad

# Twenty an hour, counted from the request: every answer is exact.
TWENTY = quotad.Policy("token_bucket", 20, 3_600_000)


@pytest.fixture(scope="module")
def server() -> Iterator[Quotad]:
    with real_quotad() as q:
        yield q


def fresh() -> str:
    return f"py-coalesce-{uuid.uuid4().hex[:8]}"


async def burst(client: quotad.AsyncClient, count: int, key: str) -> list[quotad.Decision]:
    return list(await asyncio.gather(*(client.check(key, TWENTY) for _ in range(count))))


def assert_exact(answers: list[quotad.Decision]) -> None:
    """What 50 checks of a limit of 20 answer, whichever order quotad decides them in."""
    allowed = [d for d in answers if d.allowed]
    assert len(allowed) == 20
    assert sorted(d.remaining for d in allowed) == list(range(20)), "one unit each"
    for d in answers:
        if not d.allowed:
            assert (d.reason, d.limit, d.remaining) == (quotad.Reason.LIMIT_EXCEEDED, 20, 0)
            assert 0 < d.retry_after_ms <= 180_000


def run(server: Quotad, coalescing: quotad.Coalescing | bool, count: int = 50):  # type: ignore[no-untyped-def]
    async def go() -> tuple[list[quotad.Decision], quotad.CoalescingStats]:
        async with quotad.AsyncClient(
            server.address, deadline=5, deny_cache=False, coalescing=coalescing
        ) as client:
            answers = await burst(client, count, fresh())
            return answers, client.coalescing_stats()

    before = deciding_calls(server)
    answers, stats = asyncio.run(go())
    return answers, stats, deciding_calls(server) - before


def test_a_lone_check_goes_out_at_once_as_a_check(server: Quotad) -> None:
    answers, stats, calls = run(server, quotad.Coalescing(max_in_flight=1), count=1)
    assert (answers[0].allowed, answers[0].remaining) == (True, 19)
    assert calls == 1
    assert (stats.check_calls, stats.batch_calls) == (1, 0)


def test_with_one_slot_fifty_concurrent_checks_are_two_calls(server: Quotad) -> None:
    for _ in range(5):
        answers, stats, calls = run(server, quotad.Coalescing(max_in_flight=1))
        assert_exact(answers)
        assert calls == 2, "the first alone, the other 49 one CheckBatch"
        assert (stats.check_calls, stats.batch_calls, stats.coalesced_checks) == (1, 1, 49)


def test_with_the_default_eight_slots_fifty_checks_are_eight_checks_and_one_batch(
    server: Quotad,
) -> None:
    for _ in range(5):
        answers, stats, calls = run(server, True)
        assert_exact(answers)
        assert calls == 9
        assert (stats.check_calls, stats.coalesced_checks) == (8, 42)


def test_without_coalescing_every_check_is_its_own_call(server: Quotad) -> None:
    answers, _, calls = run(server, False)
    assert_exact(answers)
    assert calls == 50


def test_a_batch_bound_of_ten_items_sends_the_queue_as_batches_of_ten(server: Quotad) -> None:
    answers, stats, calls = run(server, quotad.Coalescing(max_in_flight=1, max_batch_items=10))
    assert_exact(answers)
    # 1 alone, then the 49 queued as 10 + 10 + 10 + 10 + 9 on the one slot.
    assert calls == 6
    assert stats.batch_calls == 5


def test_a_refusal_naming_an_item_of_a_batch_is_that_callers_own_error(server: Quotad) -> None:
    async def go() -> list[object]:
        async with quotad.AsyncClient(
            server.address, deadline=5, deny_cache=False, coalescing=quotad.Coalescing(1)
        ) as client:
            key = fresh()
            return list(
                await asyncio.gather(
                    client.check(key, TWENTY),
                    client.check(key, TWENTY),
                    client.check(key, "no-such-policy"),
                    client.check(key, TWENTY),
                    return_exceptions=True,
                )
            )

    results = asyncio.run(go())
    refused = results[2]
    assert isinstance(refused, quotad.RejectedError), results
    assert refused.field == "policy_name" and not refused.message.startswith("items[")
    decided = [r for i, r in enumerate(results) if i != 2]
    assert all(isinstance(d, quotad.Decision) for d in decided), results
    assert sorted(d.remaining for d in decided) == [17, 18, 19]  # type: ignore[union-attr]


def test_queued_checks_against_a_stalled_quotad_get_the_failure_policy_in_time() -> None:
    async def go(address: str) -> tuple[list[quotad.Decision], float]:
        async with quotad.AsyncClient(
            address, deadline=0.2, on_unavailable="fail_open", coalescing=quotad.Coalescing(1)
        ) as client:
            start = time.monotonic()
            checks = (client.check(fresh(), "login") for _ in range(5))
            answers = list(await asyncio.gather(*checks))
            return answers, time.monotonic() - start

    with stalled_port() as address:
        answers, elapsed = asyncio.run(go(address))
    assert [d.reason for d in answers] == [quotad.Reason.FAIL_OPEN] * 5
    assert elapsed < 0.5, f"answered in {elapsed:.3f} s, the deadline is 0.2"


def test_a_caller_cancelled_in_the_queue_is_never_sent(server: Quotad) -> None:
    async def go() -> quotad.CoalescingStats:
        async with quotad.AsyncClient(
            server.address, deadline=5, deny_cache=False, coalescing=quotad.Coalescing(1)
        ) as client:
            key = fresh()
            first = asyncio.ensure_future(client.check(key, TWENTY))
            queued = asyncio.ensure_future(client.check(key, TWENTY))
            await asyncio.sleep(0)
            queued.cancel()
            await first
            with pytest.raises(asyncio.CancelledError):
                await queued
            d = await client.check(key, TWENTY)
            assert d.remaining == 18, "the cancelled check was never counted"
            return client.coalescing_stats()

    stats = asyncio.run(go())
    assert (stats.check_calls, stats.batch_calls) == (2, 0)


def test_coalescing_settings_out_of_range_are_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match="coalescing.max_in_flight"):
        quotad.Coalescing(max_in_flight=0)
    with pytest.raises(ValueError, match="coalescing.max_batch_items"):
        quotad.Coalescing(max_batch_items=1_001)
