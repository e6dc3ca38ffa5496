"""Leases, with the Rust client's rules (crates/quotad-client/tests/client/leases.rs):
against a fake quotad that records every call, and against a real one."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from fake_quotad import Fake, fake_quotad
from servers import real_quotad

import quotad
from quotad import LeaseOptions


def eventually(what: str, condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.005)


def leased_client(address: str, want: int = 10, **options: int) -> quotad.Client:
    return quotad.Client(address, deadline=2, leases=LeaseOptions(want, **options))


def test_checks_covered_by_a_lease_are_admitted_locally_without_a_call() -> None:
    fake = Fake(units=10)
    with fake_quotad(fake) as address, leased_client(address) as client:
        first = client.check("k", "api")
        assert first.allowed and fake.checks == 1, "the first check is never delayed"
        eventually("a lease is held", lambda: client.lease_stats().held == 1)
        for remaining in (9, 8, 7, 6):
            d = client.check("k", "api")
            assert (d.allowed, d.remaining, d.limit, d.reason) == (
                True,
                remaining,
                100,
                quotad.Reason.WITHIN_LIMIT,
            )
        assert fake.checks == 1, "no call for a check the lease covers"
        assert client.lease_stats().local_admissions == 4
        [acquire] = fake.lease_calls()
        assert acquire.want == 10 and not acquire.HasField("settle")


def test_renewal_asks_for_the_next_lease_while_the_current_one_is_spent_and_settles_it_later() -> (
    None
):
    fake = Fake(units=10)
    with fake_quotad(fake) as address, leased_client(address) as client:
        client.check("k", "api")
        eventually("a lease", lambda: client.lease_stats().held == 1)
        # Spent to half: the renewal starts, and spending goes on meanwhile.
        for _ in range(5):
            assert client.check("k", "api").allowed
        eventually("renewed", lambda: client.lease_stats().renewed == 1)
        calls = fake.lease_calls()
        assert len(calls) == 2
        # The renewal settles nothing: L1 could still be spent when it left.
        assert not calls[1].HasField("settle")
        # L2 is now spent; spend it to half so the next renewal goes.
        for _ in range(5):
            assert client.check("k", "api").allowed
        eventually("renewed twice", lambda: client.lease_stats().renewed == 2)
        calls = fake.lease_calls()
        assert len(calls) == 3
        # L1, stopped when L2 was installed, is settled now with what was
        # spent of it; L2, still spendable when this call left, is not.
        assert calls[2].settle.lease_id == "L1"
        assert calls[2].settle.spent == 5
        assert fake.checks == 1


def test_a_lease_is_renewed_at_half_its_ttl_though_little_was_spent() -> None:
    fake = Fake(units=100, ttl_ms=400)
    with fake_quotad(fake) as address, leased_client(address, 100) as client:
        client.check("k", "api")
        eventually("a lease", lambda: client.lease_stats().held == 1)
        time.sleep(0.25)
        assert client.check("k", "api").allowed
        eventually("renewed at half its TTL", lambda: client.lease_stats().renewed == 1)


def test_a_lease_is_never_spent_past_its_send_time_plus_the_ttl_less_a_thousandth_and_the_margin() -> (  # noqa: E501
    None
):
    assert LeaseOptions(10).end_ms(1_000, 10_000) == 1_000 + 10_000 - 10 - 5
    assert LeaseOptions(10).end_ms(0, 3) == 0, "too short to spend"
    fake = Fake(units=1000, ttl_ms=300)
    with fake_quotad(fake) as address, leased_client(address, 1000, margin_ms=100) as client:
        client.check("k", "api")
        eventually("a lease", lambda: client.lease_stats().held == 1)
        fake.direct = True  # no new lease: after the end, every check is a call
        time.sleep(0.25)
        checks = fake.checks
        client.check("k", "api")
        assert fake.checks == checks + 1, "past send + 300 - 1 - 100 ms the lease is not spent"


def test_a_direct_answer_sends_each_check_to_quotad_until_the_back_off_ends() -> None:
    fake = Fake(direct=True)
    with fake_quotad(fake) as address, leased_client(address, direct_backoff_ms=300) as client:
        client.check("k", "api")
        eventually("direct", lambda: client.lease_stats().direct == 1)
        for _ in range(5):
            client.check("k", "api")
        assert fake.checks == 6 and len(fake.lease_calls()) == 1, "no lease call in the back-off"
        fake.direct = False
        time.sleep(0.35)
        client.check("k", "api")
        eventually("asked again after the back-off", lambda: client.lease_stats().acquired == 1)


def test_a_policy_quotad_will_not_lease_is_remembered_for_every_key() -> None:
    fake = Fake(refuse=grpc.StatusCode.INVALID_ARGUMENT)
    with fake_quotad(fake) as address, leased_client(address) as client:
        client.check("a", "api")
        eventually("refused", lambda: client.lease_stats().not_leasable == 1)
        for key in ("a", "b", "c"):
            assert client.check(key, "api").allowed
        assert len(fake.lease_calls()) == 1 and fake.checks == 4


def test_a_refusal_naming_the_key_stops_leasing_for_that_key_only() -> None:
    fake = Fake(refuse_keys=frozenset({"much-too-long"}))
    with fake_quotad(fake) as address, leased_client(address) as client:
        client.check("much-too-long", "api")
        eventually("the key's lease refused", lambda: client.lease_stats().failed == 1)
        assert client.lease_stats().not_leasable == 0, "the key, not the policy"
        # The policy's other keys still lease.
        client.check("k", "api")
        eventually("k holds a lease", lambda: client.lease_stats().held == 1)
        checks = fake.checks
        assert client.check("k", "api").allowed
        assert fake.checks == checks, "admitted locally"
        # The refused key is not asked for again within the recheck.
        client.check("much-too-long", "api")
        time.sleep(0.1)
        assert [c.key for c in fake.lease_calls()] == ["much-too-long", "k"]


def test_a_refused_key_is_not_asked_for_again_for_exactly_60_s_and_other_keys_lease_meanwhile() -> (
    None
):
    fake = Fake(refuse_keys=frozenset({"much-too-long"}))
    now = [1_000_000]
    with (
        fake_quotad(fake) as address,
        quotad.Client(address, deadline=2, leases=LeaseOptions(10), clock=lambda: now[0]) as client,
    ):
        client.check("much-too-long", "api")
        eventually("the key's lease refused", lambda: client.lease_stats().failed == 1)
        asked = lambda: [c.key for c in fake.lease_calls()]  # noqa: E731
        now[0] += 59_999
        client.check("much-too-long", "api")
        # Another key, meanwhile, leases at once; its call comes after
        # anything the refused key's check could have started.
        client.check("k", "api")
        eventually("k holds a lease", lambda: client.lease_stats().held == 1)
        assert asked() == ["much-too-long", "k"], "not asked again within 60 s"
        now[0] += 1
        client.check("much-too-long", "api")
        # The fake records a call before refusing it: wait for both.
        eventually(
            "asked again at 60 s, and refused",
            lambda: len(fake.lease_calls()) == 3 and client.lease_stats().failed == 2,
        )
        assert asked() == ["much-too-long", "k", "much-too-long"]


async def _async_refused_key(address: str) -> None:
    async with quotad.AsyncClient(address, deadline=2, leases=LeaseOptions(10)) as client:
        await client.check("much-too-long", "api")
        while client.lease_stats().failed < 1:
            await asyncio.sleep(0.005)
        await client.check("k", "api")
        while client.lease_stats().held < 1:
            await asyncio.sleep(0.005)
        assert client.lease_stats().not_leasable == 0


def test_the_async_client_stops_leasing_for_a_refused_key_only() -> None:
    fake = Fake(refuse_keys=frozenset({"much-too-long"}))
    with fake_quotad(fake) as address:
        asyncio.run(asyncio.wait_for(_async_refused_key(address), 10))
    # Asked for: the refused key once, then `k` (closing gave `k`'s lease back).
    assert [c.key for c in fake.lease_calls() if c.want > 0] == ["much-too-long", "k"]


def test_inline_policies_with_terms_ask_for_leases_and_without_terms_never_do() -> None:
    fake = Fake()
    with fake_quotad(fake) as address, leased_client(address) as client:
        for _ in range(3):
            client.check("k", quotad.Policy("token_bucket", 10, 1000))
        assert fake.lease_calls() == [] and fake.checks == 3
        terms = quotad.LeaseTerms(max_units=5, min_units=1, max_ttl_ms=10_000)
        client.check("k", quotad.Policy("token_bucket", 10, 1000, lease=terms))
        eventually("a lease", lambda: client.lease_stats().held == 1)
        [call] = fake.lease_calls()
        assert call.WhichOneof("policy") == "inline_policy"
        assert call.inline_policy.limit == 10 and call.inline_policy.window_ms == 1000
        assert (call.inline_terms.max_units, call.inline_terms.max_ttl_ms) == (5, 10_000)


def test_closing_returns_the_unspent_units_with_what_was_spent() -> None:
    fake = Fake(units=10)
    with fake_quotad(fake) as address:
        client = leased_client(address)
        client.check("k", "api")
        eventually("a lease", lambda: client.lease_stats().held == 1)
        for _ in range(3):
            client.check("k", "api")
        client.close()
        last = fake.lease_calls()[-1]
        assert (last.want, last.settle.lease_id, last.settle.spent) == (0, "L1", 3)
        assert client.lease_stats().returned == 1


KEYS = 20


def test_closing_returns_many_leases_at_once_within_about_one_deadline() -> None:
    stalled = threading.Event()
    fake = Fake(units=10, stall_returns=stalled)
    deadline = 0.5
    with fake_quotad(fake) as address:
        client = quotad.Client(address, deadline=deadline, leases=LeaseOptions(10))
        for i in range(KEYS):
            client.check(f"k{i}", "api")
        eventually("every key leased", lambda: client.lease_stats().held == KEYS)
        try:
            started = time.monotonic()
            client.close()
            took = time.monotonic() - started
        finally:
            stalled.set()
        # One after another, twenty returns would take twenty deadlines.
        assert took < 3 * deadline, f"close took {took:.2f}s"
        assert client.lease_stats().failed == KEYS


def test_the_async_client_closing_returns_many_leases_at_once_within_about_one_deadline() -> None:
    stalled = threading.Event()
    fake = Fake(units=10, stall_returns=stalled)
    deadline = 0.5

    async def go(address: str) -> tuple[float, quotad.LeaseStats]:
        client = quotad.AsyncClient(address, deadline=deadline, leases=LeaseOptions(10))
        for i in range(KEYS):
            await client.check(f"k{i}", "api")
        for _ in range(1000):
            if client.lease_stats().held == KEYS:
                break
            await asyncio.sleep(0.005)
        assert client.lease_stats().held == KEYS
        started = time.monotonic()
        await client.close()
        return time.monotonic() - started, client.lease_stats()

    with fake_quotad(fake) as address:
        try:
            took, stats = asyncio.run(go(address))
        finally:
            stalled.set()
        assert took < 3 * deadline, f"close took {took:.2f}s"
        assert stats.failed == KEYS


def test_while_quotad_is_unreachable_a_lease_is_spent_to_its_end_then_the_failure_policy() -> None:
    fake = Fake(units=1000, ttl_ms=600)
    with fake_quotad(fake) as address:
        client = quotad.Client(
            address, deadline=0.2, on_unavailable="fail_closed", leases=LeaseOptions(1000)
        )
        client.check("k", "api")
        eventually("a lease", lambda: client.lease_stats().held == 1)
    # The fake is gone: the lease held still admits, locally...
    d = client.check("k", "api")
    assert d.allowed and d.reason is quotad.Reason.WITHIN_LIMIT
    time.sleep(0.6)
    # ...until its end; then the failure policy answers.
    assert client.check("k", "api").reason is quotad.Reason.FAIL_CLOSED
    client._channel.close()


def test_many_threads_on_one_key_admit_exactly_the_leases_units_locally() -> None:
    for _ in range(5):
        fake = Fake(units=50, ttl_ms=60_000, direct=False)
        with fake_quotad(fake) as address, leased_client(address, 50) as client:
            client.check("k", "api")
            eventually("a lease", lambda c=client: c.lease_stats().held == 1)
            fake.direct = True  # no renewal grants more
            with ThreadPoolExecutor(8) as pool:
                before = fake.checks
                decisions = list(pool.map(lambda _i, c=client: c.check("k", "api"), range(80)))
            local = len(decisions) - (fake.checks - before)
            assert local == 50, "every unit of the lease, and never one more"
            assert client.lease_stats().local_admissions == 50


def test_with_leases_two_real_clients_admit_exactly_the_limit() -> None:
    # `leased`: 10 an hour, leases of up to 4 units (tests/clients/quotad.toml).
    with real_quotad() as q:
        for _ in range(3):
            key = f"lease-{uuid.uuid4().hex[:8]}"
            a, b = leased_client(q.address, 4), leased_client(q.address, 4)
            admitted = 0
            for i in range(40):
                admitted += (a if i % 2 else b).check(key, "leased").allowed
                time.sleep(0.002)  # room for the background lease calls
            a.close()
            b.close()
            assert admitted == 10
            assert a.lease_stats().local_admissions + b.lease_stats().local_admissions > 0


def test_an_inline_policy_with_terms_is_leased_by_a_real_quotad_and_admits_exactly_its_limit() -> (
    None
):
    terms = quotad.LeaseTerms(max_units=4, min_units=1, max_ttl_ms=10_000)
    policy = quotad.Policy("token_bucket", 12, 3_600_000, lease=terms)
    with real_quotad() as q:
        for _ in range(3):
            key = f"inline-lease-{uuid.uuid4().hex[:8]}"
            client = leased_client(q.address, 4)
            admitted = 0
            for _ in range(40):
                admitted += client.check(key, policy).allowed
                time.sleep(0.002)
            client.close()
            assert admitted == 12
            assert client.lease_stats().acquired >= 1
            assert client.lease_stats().local_admissions > 0


def test_the_async_client_leases_as_the_sync_one() -> None:
    fake = Fake(units=10)

    async def go(address: str) -> tuple[int, quotad.LeaseStats]:
        async with quotad.AsyncClient(address, deadline=2, leases=LeaseOptions(10)) as client:
            await client.check("k", "api")
            for _ in range(200):
                if client.lease_stats().held:
                    break
                await asyncio.sleep(0.005)
            for _ in range(4):
                assert (await client.check("k", "api")).allowed
            return fake.checks, client.lease_stats()

    with fake_quotad(fake) as address:
        checks, stats = asyncio.run(go(address))
        assert checks == 1 and stats.local_admissions == 4
        assert fake.lease_calls()[-1].want == 0, "closing returned the lease"


def test_want_must_be_from_one_to_two_to_the_fifty_third() -> None:
    with pytest.raises(ValueError, match="leases.want"):
        LeaseOptions(0)
    LeaseOptions(1 << 53)
    with pytest.raises(ValueError, match="leases.want"):
        LeaseOptions((1 << 53) + 1)


def test_a_lease_that_arrives_too_late_to_spend_goes_straight_back() -> None:
    # A 6 ms lease ends (send + 6 - 1 - 5 ms) before its answer can arrive.
    fake = Fake(units=10, ttl_ms=6)
    with fake_quotad(fake) as address, leased_client(address) as client:
        client.check("k", "api")
        eventually("returned", lambda: client.lease_stats().returned == 1)
        acquire, give_back = fake.lease_calls()
        assert acquire.want == 10
        assert (give_back.want, give_back.settle.lease_id, give_back.settle.spent) == (0, "L1", 0)
        assert client.lease_stats().held == 0 and client.lease_stats().acquired == 0


class _Unreachable(grpc.RpcError):  # type: ignore[misc]
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "scripted"


@pytest.mark.parametrize(
    ("code", "event"),
    [
        (grpc.StatusCode.UNAVAILABLE, "failed"),
        (grpc.StatusCode.FAILED_PRECONDITION, "not_leasable"),
    ],
)
def test_a_lease_call_is_counted_only_once_its_slot_is_held_off_and_released(
    code: grpc.StatusCode, event: str
) -> None:
    from quotad._lease import LeaseTable
    from quotad._lessee import Lessee

    now = 1_000_000
    table = LeaseTable(LeaseOptions(10))
    seen: list[tuple[str, bool, int]] = []
    bump = table.bump

    def watching(name: str, n: int = 1) -> None:
        for s in table.slots():
            seen.append((name, s.calling, s.direct_until_ms))
        bump(name, n)

    table.bump = watching  # type: ignore[method-assign]
    channel = grpc.insecure_channel("127.0.0.1:1")
    lessee = Lessee(table, channel, 1.0, clock=lambda: now)

    def refuse(request: object) -> object:
        raise _Unreachable(code)

    lessee._send = refuse  # type: ignore[method-assign]  # noqa: SLF001
    spent = table.spend("api", "k", 1, now)
    assert spent.call is not None, "the first check claims the slot"
    lessee._run(spent.call)  # noqa: SLF001
    assert [name for name, _, _ in seen] == [event]
    _, calling, held_off_until = seen[0]
    assert not calling, "released before it is counted"
    assert held_off_until > now, "held off before it is counted"
    channel.close()
