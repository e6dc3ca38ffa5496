"""The shared conformance cases (tests/clients/cases.json) run through the Python
client: every case with the sync Client and with the AsyncClient, and every HTTP
case through the ASGI middleware (on the AsyncClient) and the WSGI middleware (on
the sync Client). A case answered differently fails naming the case and step."""

from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from servers import CASES, server_for

import quotad
from quotad.middleware import KeyExtractor, RateLimitMiddleware, WSGIRateLimitMiddleware

# The units a leasing client of a case asks for (tests/clients/README.md).
LEASE_WANT = 4

SUITE = json.loads(CASES.read_text())
assert SUITE["version"] == 1
CASE_LIST: list[dict[str, Any]] = SUITE["cases"]


def _policy(spec: dict[str, Any]) -> quotad.PolicyLike:
    if "name" in spec:
        return spec["name"]
    inline = spec["inline"]
    return quotad.Policy(
        inline["algorithm"], inline["limit"], inline["window_ms"], inline.get("burst")
    )


def _client_kwargs(case: dict[str, Any]) -> dict[str, Any]:
    c = case.get("client", {})
    kwargs: dict[str, Any] = {}
    if "deadline_ms" in c:
        kwargs["deadline"] = c["deadline_ms"] / 1000
    if "on_unavailable" in c:
        kwargs["on_unavailable"] = c["on_unavailable"]
    if "deny_cache" in c:
        kwargs["deny_cache"] = bool(c["deny_cache"])
    if c.get("leases"):
        kwargs["leases"] = quotad.LeaseOptions(LEASE_WANT)
    return kwargs


class Runner:
    """Runs one case's steps against one client flavour, collecting mismatches."""

    def __init__(self, case: dict[str, Any], prefix: str) -> None:
        self.case = case
        self.prefix = prefix
        # When each await_leases step began polling, by step.
        self.awaiting: dict[str, float] = {}
        # Checks allowed so far in the case, by every client.
        self.allowed_total = 0

    def count(self, step: dict[str, Any], got: Any) -> None:
        if step["call"] == "check" and isinstance(got, quotad.Decision) and got.allowed:
            self.allowed_total += 1

    def compare_total(self, where: str, step: dict[str, Any]) -> None:
        want = step.get("expect", {}).get("allowed_total")
        if want is None:
            return
        total = self.allowed_total
        ok = want["min"] <= total <= want["max"] if isinstance(want, dict) else total == want
        if not ok:
            self.fail(where, f"{total} checks allowed so far, expected {want!r}")

    def key(self, key: str) -> str:
        # An empty key stays empty: the case is about quotad refusing it.
        return f"{self.prefix}{key}" if key else key

    def leases_reached(self, where: str, step: dict[str, Any], stats: quotad.LeaseStats) -> bool:
        """Whether the lease stats have every value the step names (a background
        lease call has landed); fails the case once ``within_ms`` has passed."""
        started = self.awaiting.setdefault(where, time.monotonic())
        want: dict[str, int] = step["expect"]
        if all(getattr(stats, name) == value for name, value in want.items()):
            return True
        if (time.monotonic() - started) * 1000 > step["within_ms"]:
            self.fail(where, f"lease stats {stats} after {step['within_ms']} ms, expected {want}")
        return False

    def fail(self, where: str, what: str) -> None:
        pytest.fail(f"case {self.case['name']!r}, {where}: {what}", pytrace=False)

    def compare(self, where: str, expect: dict[str, Any], got: Any, elapsed_ms: float) -> None:
        if "within_ms" in expect and elapsed_ms > expect["within_ms"]:
            self.fail(
                where, f"answered in {elapsed_ms:.0f} ms, expected within {expect['within_ms']}"
            )
        if "error" in expect:
            want = expect["error"]
            if not isinstance(got, quotad.QuotadError):
                self.fail(where, f"expected error {want}, got {got!r}")
            code = "UNAVAILABLE" if isinstance(got, quotad.UnavailableError) else got.code.name
            if code != want["code"]:
                self.fail(where, f"expected error code {want['code']}, got {got!r}")
            if want.get("message_contains", "") not in got.message:
                self.fail(
                    where,
                    f"expected the message to contain {want['message_contains']!r}, got {got!r}",
                )
            if "field" in want and got.field != want["field"]:
                self.fail(where, f"expected the field {want['field']!r}, got {got.field!r}")
            return
        if isinstance(got, Exception):
            self.fail(where, f"expected {expect}, got the error {got!r}")
        if "decisions" in expect:
            if len(got) != len(expect["decisions"]):
                self.fail(where, f"expected {len(expect['decisions'])} decisions, got {got}")
            for i, (e, d) in enumerate(zip(expect["decisions"], got, strict=True)):
                self.compare_decision(f"{where}, decision {i}", e, d)
            return
        if expect.get("ok") or step_call_closes(expect, got):
            if got is not None:
                self.fail(where, f"expected success, got {got!r}")
            return
        self.compare_decision(where, expect, got)

    def compare_decision(self, where: str, expect: dict[str, Any], d: quotad.Decision) -> None:
        for name in ("allowed", "limit", "remaining", "retry_after_ms", "reset_after_ms", "reason"):
            if name not in expect:
                continue
            want = expect[name]
            value = getattr(d, name)
            if name == "reason":
                value = value.name
            if isinstance(want, dict):
                ok = want["min"] <= value <= want["max"]
            else:
                ok = value == want
            if not ok:
                self.fail(where, f"{name} is {value!r}, expected {want!r} (decision {d})")

    def items(self, step: dict[str, Any]) -> list[quotad.Check]:
        return [
            quotad.Check(self.key(i["key"]), _policy(i["policy"]), i.get("cost", 1))
            for i in step["items"]
        ]


def step_call_closes(expect: dict[str, Any], got: Any) -> bool:
    """A ``close`` step expects nothing: its answer is None."""
    return not expect and got is None


def _targets(step: dict[str, Any], client: Any, peer: Any, other: Any) -> list[Any]:
    via = step.get("via")
    if via is None:
        return [client]
    return {"other": [other], "peer": [peer], "both": [client, peer]}[via]


def _sync_step(runner: Runner, target: quotad.Client, step: dict[str, Any]) -> Any:
    call = step["call"]
    if call == "check":
        return target.check(
            runner.key(step["key"]), _policy(step["policy"]), cost=step.get("cost", 1)
        )
    if call == "peek":
        return target.peek(
            runner.key(step["key"]), _policy(step["policy"]), cost=step.get("cost", 1)
        )
    if call == "reset":
        return target.reset(runner.key(step["key"]), _policy(step["policy"]))
    if call == "check_batch":
        return target.check_batch(runner.items(step), mode=step.get("mode", "independent"))
    if call == "close":
        return target.close()
    raise ValueError(f"unknown call {call!r}")


async def _async_step(runner: Runner, target: quotad.AsyncClient, step: dict[str, Any]) -> Any:
    call = step["call"]
    if call == "check":
        return await target.check(
            runner.key(step["key"]), _policy(step["policy"]), cost=step.get("cost", 1)
        )
    if call == "peek":
        return await target.peek(
            runner.key(step["key"]), _policy(step["policy"]), cost=step.get("cost", 1)
        )
    if call == "reset":
        return await target.reset(runner.key(step["key"]), _policy(step["policy"]))
    if call == "check_batch":
        return await target.check_batch(runner.items(step), mode=step.get("mode", "independent"))
    if call == "close":
        return await target.close()
    raise ValueError(f"unknown call {call!r}")


def _steps(case: dict[str, Any]):
    """Every (where, step, pause before it in seconds, last repeat of the step); a
    step run ``concurrently`` comes once, its repeats sent at once."""
    for index, step in enumerate(case["steps"]):
        repeat = 1 if step.get("concurrently") else step.get("repeat", 1)
        for n in range(repeat):
            pause = step.get("pause_ms", 0) / 1000 if n > 0 else 0
            yield f"step {index} ({step['call']}, repeat {n + 1})", step, pause, n == repeat - 1


def _timed(call: Any) -> tuple[Any, float]:
    start = time.monotonic()
    try:
        got = call()
    except quotad.QuotadError as error:
        got = error
    return got, (time.monotonic() - start) * 1000


async def _timed_async(call: Any) -> tuple[Any, float]:
    start = time.monotonic()
    try:
        got = await call()
    except quotad.QuotadError as error:
        got = error
    return got, (time.monotonic() - start) * 1000


def run_sync(case: dict[str, Any], address: str) -> None:
    runner = Runner(case, f"py-sync-{uuid.uuid4().hex[:8]}:")
    with (
        quotad.Client(address, **_client_kwargs(case)) as client,
        # Another replica of the application, set up as the client under test.
        quotad.Client(address, **_client_kwargs(case)) as peer,
        quotad.Client(address, deadline=2, deny_cache=False) as other,
    ):
        for where, step, pause, last in _steps(case):
            if step["call"] == "sleep":
                time.sleep(step["ms"] / 1000)
                continue
            if step["call"] == "await_leases":
                while not runner.leases_reached(where, step, client.lease_stats()):
                    time.sleep(0.002)
                continue
            time.sleep(pause)
            calls = [
                functools.partial(_sync_step, runner, target, step)
                for target in _targets(step, client, peer, other)
            ]
            if step.get("concurrently"):
                # Concurrent callers of one client: a thread each.
                calls *= step.get("repeat", 1)
                with ThreadPoolExecutor(len(calls)) as pool:
                    outcomes = list(pool.map(_timed, calls))
            else:
                outcomes = [_timed(c) for c in calls]
            for got, elapsed in outcomes:
                runner.count(step, got)
                runner.compare(where, step.get("expect", {}), got, elapsed)
            if last:
                runner.compare_total(where, step)


async def run_async(case: dict[str, Any], address: str) -> None:
    runner = Runner(case, f"py-async-{uuid.uuid4().hex[:8]}:")
    async with (
        quotad.AsyncClient(address, **_client_kwargs(case)) as client,
        quotad.AsyncClient(address, **_client_kwargs(case)) as peer,
        quotad.AsyncClient(address, deadline=2, deny_cache=False) as other,
    ):
        for where, step, pause, last in _steps(case):
            if step["call"] == "sleep":
                await asyncio.sleep(step["ms"] / 1000)
                continue
            if step["call"] == "await_leases":
                while not runner.leases_reached(where, step, client.lease_stats()):
                    await asyncio.sleep(0.002)
                continue
            await asyncio.sleep(pause)
            calls = [
                functools.partial(_async_step, runner, target, step)
                for target in _targets(step, client, peer, other)
            ]
            if step.get("concurrently"):
                calls *= step.get("repeat", 1)
                outcomes = list(await asyncio.gather(*(_timed_async(c) for c in calls)))
            else:
                outcomes = [await _timed_async(c) for c in calls]
            for got, elapsed in outcomes:
                runner.count(step, got)
                runner.compare(where, step.get("expect", {}), got, elapsed)
            if last:
                runner.compare_total(where, step)


def _key_extractor(spec: dict[str, Any]) -> KeyExtractor:
    if "header" in spec:
        return KeyExtractor.header(spec["header"])
    if spec.get("peer_ip"):
        return KeyExtractor.peer_ip()
    if "forwarded_for" in spec:
        return KeyExtractor.forwarded_for(spec["forwarded_for"]["trusted"])
    raise ValueError(f"unknown key spec {spec}")


async def _hello(scope: Any, receive: Any, send: Any) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain")],
        }
    )
    await send({"type": "http.response.body", "body": b"hello\n"})


def _wsgi_hello(environ: Any, start_response: Any) -> list[bytes]:
    start_response("200 OK", [("content-type", "text/plain")])
    return [b"hello\n"]


def _check_response(
    runner: Runner, where: str, want: dict[str, Any], response: httpx.Response
) -> None:
    if response.status_code != want["expect_status"]:
        runner.fail(
            where,
            f"status {response.status_code}, expected {want['expect_status']} "
            f"(headers {dict(response.headers)}, body {response.text!r})",
        )
    for name, spec in want.get("expect_headers", {}).items():
        value = response.headers.get(name)
        if spec == "absent":
            ok = value is None
        elif spec == "present":
            ok = value is not None
        elif isinstance(spec, str):
            ok = value == spec
        elif "prefix" in spec or "params" in spec:
            ok = value is not None and value.startswith(spec.get("prefix", ""))
            params = _params(value or "")
            for param, want in spec.get("params", {}).items():
                got = params.get(param)
                ok = ok and got is not None and _number_matches(want, got)
        else:
            ok = value is not None and value.isdigit() and spec["min"] <= int(value) <= spec["max"]
        if not ok:
            runner.fail(where, f"header {name} is {value!r}, expected {spec!r}")


def _params(value: str) -> dict[str, int]:
    """The whole-number parameters of a structured field such as ``"login";r=2;t=1200``."""
    out = {}
    for part in value.split(";")[1:]:
        name, _, number = part.strip().partition("=")
        if number.isdigit():
            out[name] = int(number)
    return out


def _number_matches(want: Any, value: int) -> bool:
    return want["min"] <= value <= want["max"] if isinstance(want, dict) else value == want


def _http_requests(runner: Runner, case: dict[str, Any]):
    http = case["http"]
    key_header = http["key"].get("header")
    for i, request in enumerate(http["requests"]):
        headers = dict(request.get("headers", {}))
        if key_header and headers.get(key_header):
            headers[key_header] = runner.key(headers[key_header])
        yield f"request {i}", request, headers


def run_asgi(case: dict[str, Any], address: str) -> None:
    http = case["http"]
    runner = Runner(case, f"py-asgi-{uuid.uuid4().hex[:8]}:")

    async def go() -> None:
        client = quotad.AsyncClient(address, **_client_kwargs(case))
        app = RateLimitMiddleware(
            _hello,
            client=client,
            policy=http["policy"],
            key=_key_extractor(http["key"]),
            cost=(lambda _r: http["cost"]) if "cost" in http else None,
        )
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as web:
            for where, request, headers in _http_requests(runner, case):
                response = await web.get(request["path"], headers=headers)
                _check_response(runner, where, request, response)
        await client.close()

    asyncio.run(go())


def run_wsgi(case: dict[str, Any], address: str) -> None:
    http = case["http"]
    runner = Runner(case, f"py-wsgi-{uuid.uuid4().hex[:8]}:")
    with quotad.Client(address, **_client_kwargs(case)) as client:
        app = WSGIRateLimitMiddleware(
            _wsgi_hello,
            client=client,
            policy=http["policy"],
            key=_key_extractor(http["key"]),
            cost=(lambda _r: http["cost"]) if "cost" in http else None,
        )
        transport = httpx.WSGITransport(app=app, remote_addr="127.0.0.1")
        with httpx.Client(transport=transport, base_url="http://app") as web:
            for where, request, headers in _http_requests(runner, case):
                response = web.get(request["path"], headers=headers)
                _check_response(runner, where, request, response)


PARAMS = []
for case in CASE_LIST:
    flavours = ["sync", "async"]
    if "http" in case:
        flavours = ["asgi", "wsgi"] + (flavours if case["steps"] else [])
    for flavour in flavours:
        PARAMS.append(pytest.param(case, flavour, id=f"{flavour}: {case['name']}"))


@pytest.mark.parametrize(("case", "flavour"), PARAMS)
def test_case(case: dict[str, Any], flavour: str) -> None:
    # A server of its own for every case and flavour: IP-keyed HTTP cases
    # cannot be prefixed, and nothing leaks between cases.
    with server_for(case["server"]) as address:
        if flavour == "sync":
            run_sync(case, address)
        elif flavour == "async":
            asyncio.run(run_async(case, address))
        elif flavour == "asgi":
            run_asgi(case, address)
        elif flavour == "wsgi":
            run_wsgi(case, address)
        else:
            raise ValueError(f"unknown flavour {flavour!r}")


def test_the_case_file_names_every_case_once() -> None:
    names = [c["name"] for c in CASE_LIST]
    assert len(names) == len(set(names)), "case names must be unique"


KNOWN = {
    "case": {"name", "server", "client", "steps", "http"},
    "client": {"deadline_ms", "on_unavailable", "deny_cache", "leases"},
    "step": {
        "call",
        "key",
        "cost",
        "policy",
        "items",
        "mode",
        "via",
        "ms",
        "repeat",
        "pause_ms",
        "concurrently",
        "expect",
        "within_ms",
    },
    "item": {"key", "cost", "policy"},
    "expect": {
        "allowed",
        "limit",
        "remaining",
        "retry_after_ms",
        "reset_after_ms",
        "reason",
        "error",
        "decisions",
        "ok",
        "within_ms",
        "allowed_total",
        # await_leases: the lease stats to wait for.
        "acquired",
        "renewed",
        "not_leasable",
        "failed",
        "held",
    },
    "error": {"code", "message_contains", "field"},
    "header": {"prefix", "params", "min", "max"},
    "http": {"policy", "key", "cost", "requests"},
    "request": {"path", "headers", "expect_status", "expect_headers"},
}


def test_the_case_file_uses_only_fields_this_driver_knows() -> None:
    """A field added to the format must fail a driver that does not know it."""

    def check(kind: str, obj: dict[str, Any], where: str) -> None:
        unknown = set(obj) - KNOWN[kind]
        assert not unknown, f"{where}: fields this driver does not know: {sorted(unknown)}"

    for case in CASE_LIST:
        name = case["name"]
        check("case", case, name)
        check("client", case.get("client", {}), name)
        for i, step in enumerate(case["steps"]):
            check("step", step, f"{name}, step {i}")
            for item in step.get("items", []):
                check("item", item, f"{name}, step {i}")
            if "expect" in step:
                check("expect", step["expect"], f"{name}, step {i}")
                check("error", step["expect"].get("error", {}), f"{name}, step {i}")
                for d in step["expect"].get("decisions", []):
                    check("expect", d, f"{name}, step {i}")
        if "http" in case:
            check("http", case["http"], name)
            for r in case["http"]["requests"]:
                check("request", r, name)
                for spec in r.get("expect_headers", {}).values():
                    if isinstance(spec, dict):
                        check("header", spec, name)
