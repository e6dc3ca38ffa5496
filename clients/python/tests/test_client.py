"""The sync and asyncio clients against a real quotad: errors with their code and
field, the failure policy within the deadline, TLS and mTLS, concurrency."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import trustme
from servers import closed_port, real_quotad, stalled_port

import quotad
import quotad._settings


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with real_quotad() as q:
        yield q.address


def fresh(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize(
    ("key", "policy", "cost", "code", "field"),
    [
        ("", "login", 1, "INVALID_ARGUMENT", "key"),
        ("k", "login", 0, "INVALID_ARGUMENT", "cost"),
        ("k", "no-such-policy", 1, "NOT_FOUND", "policy_name"),
        ("k", quotad.Policy("fixed_window", 0, 1000), 1, "INVALID_ARGUMENT", "inline_policy.limit"),
        (
            "k",
            quotad.Policy("sliding_log", 3, 1000, 3),
            1,
            "INVALID_ARGUMENT",
            "inline_policy.burst",
        ),
        ("k", "login", 2**53 + 1, "INVALID_ARGUMENT", "cost"),
    ],
)
def test_a_refusal_raises_with_the_status_code_and_the_field_quotad_named(
    server: str, key: str, policy: quotad.PolicyLike, cost: int, code: str, field: str
) -> None:
    with quotad.Client(server, deadline=2, on_unavailable="fail_open") as client:
        for call in (client.check, client.peek):
            with pytest.raises(quotad.RejectedError) as raised:
                call(key, policy, cost=cost)
            assert raised.value.code is getattr(grpc.StatusCode, code)
            assert raised.value.field == field, raised.value.message


def test_a_batch_refusal_names_the_item(server: str) -> None:
    with quotad.Client(server, deadline=2) as client:
        items = [quotad.Check(fresh("a"), "login"), quotad.Check(fresh("b"), "login", cost=0)]
        with pytest.raises(quotad.RejectedError) as raised:
            client.check_batch(items)
        assert raised.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert raised.value.field == "items[1].cost"
        assert client.peek(items[0].key, "login").remaining == 3, "nothing consumed"


def test_decisions_are_frozen_and_compare_by_value(server: str) -> None:
    with quotad.Client(server, deadline=2) as client:
        d = client.peek(fresh("k"), "login")
        assert d == quotad.Decision(True, 3, 3, 0, 0, quotad.Reason.WITHIN_LIMIT)
        with pytest.raises(dataclasses.FrozenInstanceError):
            d.allowed = False  # type: ignore[misc]


@pytest.mark.parametrize("make_port", [closed_port, stalled_port], ids=["closed", "stalled"])
@pytest.mark.parametrize(
    ("policy", "expect"),
    [("fail_open", quotad.Reason.FAIL_OPEN), ("fail_closed", quotad.Reason.FAIL_CLOSED)],
)
def test_the_failure_policy_answers_every_call_within_the_deadline(
    make_port, policy, expect
) -> None:  # type: ignore[no-untyped-def]
    with make_port() as address, quotad.Client(address, deadline=0.2, on_unavailable=policy) as c:
        for _ in range(5):
            start = time.monotonic()
            decision = c.check("k", "login")
            # The deadline plus slack for a loaded machine: never the
            # connection's own timeouts (20 s and more).
            assert time.monotonic() - start < 1.2
            assert decision.reason is expect and decision.allowed is (policy == "fail_open")


@pytest.mark.parametrize("make_port", [closed_port, stalled_port], ids=["closed", "stalled"])
def test_the_error_policy_raises_unavailable_within_the_deadline_sync_and_async(make_port) -> None:  # type: ignore[no-untyped-def]
    with make_port() as address:
        with quotad.Client(address, deadline=0.2) as client:
            start = time.monotonic()
            with pytest.raises(quotad.UnavailableError) as raised:
                client.check("k", "login")
            assert time.monotonic() - start < 1.2
            assert raised.value.code in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            )

        async def go() -> None:
            async with quotad.AsyncClient(address, deadline=0.2) as client:
                start = time.monotonic()
                with pytest.raises(quotad.UnavailableError):
                    await client.check("k", "login")
                assert time.monotonic() - start < 1.2

        asyncio.run(go())


def test_a_per_call_deadline_overrides_the_clients(server: str) -> None:
    with stalled_port() as address, quotad.Client(address, deadline=30) as client:
        start = time.monotonic()
        with pytest.raises(quotad.UnavailableError):
            client.check("k", "login", deadline=0.2)
        assert time.monotonic() - start < 1.2


def test_a_reset_is_not_subject_to_the_failure_policy() -> None:
    with closed_port() as address, quotad.Client(address, on_unavailable="fail_open") as client:
        with pytest.raises(quotad.UnavailableError):
            client.reset("k", "login")


def test_concurrent_checks_from_threads_admit_exactly_the_limit(server: str) -> None:
    with quotad.Client(server, deadline=5, deny_cache=False) as client:
        for _ in range(5):
            key = fresh("threads")
            with ThreadPoolExecutor(8) as pool:
                results = list(
                    pool.map(lambda _i, k=key: client.check(k, "api").allowed, range(32))
                )
            assert results.count(True) == 5


def test_concurrent_async_checks_admit_exactly_the_limit(server: str) -> None:
    async def go() -> None:
        async with quotad.AsyncClient(server, deadline=5) as client:
            for _ in range(5):
                key = fresh("tasks")
                decisions = await asyncio.gather(*(client.check(key, "api") for _ in range(30)))
                assert sum(d.allowed for d in decisions) == 5
                denied = [d for d in decisions if not d.allowed]
                assert all(d.reason is quotad.Reason.LIMIT_EXCEEDED for d in denied)

    asyncio.run(go())


def test_a_cached_denial_is_answered_without_quotad(server: str) -> None:
    key = fresh("cached")
    with quotad.Client(server, deadline=2) as client:
        for _ in range(3):
            client.check(key, "login")
        assert not client.check(key, "login").allowed
        # With the connection closed a call cannot even start: the denial
        # that still holds is answered locally.
        client._channel.close()
        d = client.check(key, "login", cost=2)
        assert d.reason is quotad.Reason.LIMIT_EXCEEDED and d.retry_after_ms > 1_000_000
        with pytest.raises(ValueError):
            client.check(fresh("other"), "login")


@pytest.mark.parametrize(
    ("address", "tls", "why"),
    [
        ("ftp://127.0.0.1:1", None, "expected"),
        ("http://127.0.0.1:1", quotad.TLS(), "tls"),
        ("unix:///tmp/q.sock", quotad.TLS(), "tls"),
        ("http://127.0.0.1:1/path", None, "expected"),
    ],
)
def test_an_address_that_is_not_quotads_is_refused_at_once(address, tls, why) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(quotad.InvalidAddressError, match=why):
        quotad.Client(address, tls=tls)


def test_a_client_certificate_needs_its_key() -> None:
    with pytest.raises(quotad.InvalidAddressError, match="tls.cert and tls.key"):
        quotad.TLS(cert=b"pem")


@pytest.mark.parametrize("policy", ["fail_open", "fail_closed"])
def test_the_failure_policy_answering_logs_one_warning_an_interval_with_the_cause(
    policy: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING, logger="quotad")
    with closed_port() as address, quotad.Client(address, deadline=2, on_unavailable=policy) as c:
        for _ in range(3):
            assert c.check(fresh("outage"), "login").reason.value == policy
        warnings = [r for r in caplog.records if r.name == "quotad"]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        first = warnings[0]
        assert first.levelno == logging.WARNING
        assert first.getMessage().startswith("quotad unavailable: UNAVAILABLE: ")
        assert f"answering {policy} (0 more failures kept quiet)" in first.getMessage()
        # Once the interval has passed, the next failure logs again and
        # counts the two kept quiet.
        monkeypatch.setattr(quotad._settings, "OUTAGE_LOG_INTERVAL", 0.0)
        c.check(fresh("outage"), "login")
        warnings = [r for r in caplog.records if r.name == "quotad"]
        assert len(warnings) == 2
        assert "(2 more failures kept quiet)" in warnings[1].getMessage()


def test_the_error_policy_raises_and_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="quotad")
    with closed_port() as address, quotad.Client(address, deadline=2, on_unavailable="error") as c:
        with pytest.raises(quotad.UnavailableError):
            c.check(fresh("outage"), "login")
    assert [r for r in caplog.records if r.name == "quotad"] == []


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    ca = trustme.CA()
    other = trustme.CA()
    server = ca.issue_cert("quotad.test")
    app = ca.issue_cert("app")
    stranger = other.issue_cert("app")
    d = tmp_path_factory.mktemp("pki")
    files = {
        "ca": ca.cert_pem,
        "other_ca": other.cert_pem,
        "server_cert": server.cert_chain_pems[0],
        "server_key": server.private_key_pem,
        "app_cert": app.cert_chain_pems[0],
        "app_key": app.private_key_pem,
        "stranger_cert": stranger.cert_chain_pems[0],
        "stranger_key": stranger.private_key_pem,
    }
    out = {}
    for name, blob in files.items():
        blob.write_to_path(str(d / f"{name}.pem"))
        out[name] = d / f"{name}.pem"
    return out


def tls_args(pki: dict[str, Path], mtls: bool) -> list[str]:
    args = ["--tls-cert", str(pki["server_cert"]), "--tls-key", str(pki["server_key"])]
    return args + (["--tls-client-ca", str(pki["ca"])] if mtls else [])


def test_tls_to_a_server_whose_ca_the_client_trusts(pki: dict[str, Path]) -> None:
    with real_quotad(extra=tls_args(pki, mtls=False)) as q:
        https = f"https://{q.grpc_addr}"
        tls = quotad.TLS.from_pem_files(pki["ca"], server_name="quotad.test")
        with quotad.Client(https, tls=tls, deadline=5) as client:
            assert client.check(fresh("tls"), "login").remaining == 2
        # Another CA: the handshake fails, and that is quotad unavailable.
        wrong = quotad.TLS.from_pem_files(pki["other_ca"], server_name="quotad.test")
        with quotad.Client(https, tls=wrong, deadline=2, on_unavailable="fail_closed") as client:
            assert client.check(fresh("tls"), "login").reason is quotad.Reason.FAIL_CLOSED
        # Plaintext to a TLS port is not an answer either.
        with quotad.Client(q.address, deadline=2) as client, pytest.raises(quotad.UnavailableError):
            client.check(fresh("tls"), "login")


def test_tls_bytes_without_a_pem_block_are_refused_naming_the_field(pki: dict[str, Path]) -> None:
    ca, cert, key = (pki[n].read_bytes() for n in ("ca", "app_cert", "app_key"))
    assert quotad.TLS(ca=ca, cert=cert, key=key).ca == ca
    for tls_args, why in [
        ({"ca": b"not a certificate"}, "tls.ca: no PEM certificate found"),
        ({"ca": key}, "tls.ca: no PEM certificate found"),
        ({"ca": ca, "cert": b"", "key": key}, "tls.cert: no PEM certificate found"),
        ({"ca": ca, "cert": cert, "key": cert}, "tls.key: no PEM private key found"),
        ({"ca": "a str, not bytes"}, "tls.ca: PEM bytes expected, got str"),
    ]:
        with pytest.raises(quotad.InvalidAddressError, match=re.escape(why)):
            quotad.TLS(**tls_args)  # type: ignore[arg-type]


def test_mtls_admits_only_a_client_certificate_from_the_trusted_ca(pki: dict[str, Path]) -> None:
    with real_quotad(extra=tls_args(pki, mtls=True)) as q:
        https = f"https://{q.grpc_addr}"

        def client(cert: str | None, key: str | None) -> quotad.Client:
            tls = quotad.TLS.from_pem_files(
                pki["ca"],
                cert=pki[cert] if cert else None,
                key=pki[key] if key else None,
                server_name="quotad.test",
            )
            return quotad.Client(https, tls=tls, deadline=3)

        with client("app_cert", "app_key") as c:
            assert c.check(fresh("mtls"), "login").allowed

        async def async_check() -> quotad.Decision:
            tls = quotad.TLS.from_pem_files(
                pki["ca"], cert=pki["app_cert"], key=pki["app_key"], server_name="quotad.test"
            )
            async with quotad.AsyncClient(https, tls=tls, deadline=3) as c:
                return await c.check(fresh("mtls"), "login")

        assert asyncio.run(async_check()).remaining == 2
        for cert, key in ((None, None), ("stranger_cert", "stranger_key")):
            with client(cert, key) as c, pytest.raises(quotad.UnavailableError):
                c.check(fresh("mtls"), "login")


def test_threads_sharing_the_deny_cache_admit_exactly_the_limit_and_deny_with_retry(
    server: str,
) -> None:
    with quotad.Client(server, deadline=5) as client:
        for _ in range(5):
            key = fresh("cache-threads")
            with ThreadPoolExecutor(8) as pool:
                decisions = list(pool.map(lambda _i, k=key: client.check(k, "api"), range(40)))
            assert sum(d.allowed for d in decisions) == 5
            for d in decisions:
                if not d.allowed:
                    assert d.reason is quotad.Reason.LIMIT_EXCEEDED
                    # From quotad or from the cache: never shorter than quotad's
                    # wait, at most one window plus the cache's margin.
                    assert 3_500_000 <= d.retry_after_ms <= 3_600_000 + 3_601


def test_a_unix_socket_address_reaches_quotad(tmp_path: Path) -> None:
    sock = tmp_path / "quotad.sock"
    with real_quotad(grpc_addr=f"unix://{sock}") as q:
        with quotad.Client(f"unix://{sock}", deadline=2) as client:
            assert client.check(fresh("unix"), "login").remaining == 2

        async def go() -> quotad.Decision:
            async with quotad.AsyncClient(f"unix://{sock}", deadline=2) as client:
                return await client.peek(fresh("unix"), "login")

        assert asyncio.run(go()).remaining == 3
        assert q.address.startswith("unix:")


def test_a_cost_the_wire_cannot_carry_is_refused_naming_the_field_before_anything_is_sent() -> None:
    # Nothing listens: a refusal here was made locally.
    with closed_port() as address, quotad.Client(address, on_unavailable="fail_open") as client:
        for cost in (-1, 1 << 64):
            with pytest.raises(quotad.RejectedError) as raised:
                client.check("k", "login", cost=cost)
            assert raised.value.code is grpc.StatusCode.INVALID_ARGUMENT
            assert raised.value.field == "cost"
        with pytest.raises(quotad.RejectedError) as raised:
            client.check_batch([quotad.Check("k", "login"), quotad.Check("k", "login", -2)])
        assert raised.value.field == "items[1].cost"


def test_a_negative_or_zero_cost_is_never_spent_from_a_lease() -> None:
    from fake_quotad import Fake, fake_quotad

    fake = Fake(units=10)
    with fake_quotad(fake) as address:
        client = quotad.Client(address, deadline=2, leases=quotad.LeaseOptions(10))
        client.check("k", "api")
        deadline = time.monotonic() + 5
        while client.lease_stats().held == 0:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        with pytest.raises(quotad.RejectedError):
            client.check("k", "api", cost=-5)
        assert client.check("k", "api").remaining == 9
        # Cost 0 is quotad's to refuse (the fake admits anything it is sent),
        # never a local admission from the lease.
        checks = fake.checks
        client.check("k", "api", cost=0)
        assert fake.checks == checks + 1
        assert client.check("k", "api").remaining == 8
        client.close()
