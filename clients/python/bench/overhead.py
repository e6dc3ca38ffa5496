"""The Python client's cost per check above a bare generated stub, same server.

Starts quotad (``$QUOTAD_BIN``, else ``target/debug/quotad``) on a loopback
port with a policy that never denies, then times sequential checks on one
connection each: the generated ``QuotaStub.Check`` with a 5 s timeout, the
clients' deadline here (the floor any Python caller pays), then
``quotad.Client.check``; and a bare ``grpc.aio`` stub, then
``quotad.AsyncClient.check``. Rounds alternate so drift in the machine hits
every variant alike; each figure is the median of the rounds' means. Last,
the client's own work around a call, timed without the network.

    python clients/python/bench/overhead.py [--calls 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import grpc
import grpc.aio

import quotad
from quotad.v1 import quota_pb2 as pb
from quotad.v1 import quota_pb2_grpc

REPO = Path(__file__).resolve().parents[3]
CONFIG = """
[policies.bench]
algorithm = "fixed_window"
limit = 1_000_000_000
window = "1h"
"""


def start_quotad(config: Path) -> tuple[subprocess.Popen[str], str]:
    binary = os.environ.get("QUOTAD_BIN", str(REPO / "target" / "debug" / "quotad"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUOTAD_")}
    env["RUST_LOG"] = "info"
    process = subprocess.Popen(
        [binary, "serve", "-c", str(config), "--grpc-addr", "127.0.0.1:0",
         "--admin-addr", "127.0.0.1:0"],
        env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert process.stderr is not None
    for line in process.stderr:
        if "quotad serving" in line:
            addr = next(w for w in line.split() if w.startswith("grpc_addr=")).split("=", 1)[1]
            return process, addr
    raise RuntimeError("quotad exited before serving")


def per_call_us(fn, calls: int) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - start) / calls * 1e6


async def per_call_us_async(fn, calls: int) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    for i in range(calls):
        await fn(i)
    return (time.perf_counter() - start) / calls * 1e6


def client_side_work(calls: int) -> tuple[float, float]:
    """What quotad.Client.check adds around the stub call, timed without the network
    (the figure the round trips above are too noisy to show): the client's own check
    path around the call (``CheckCore.local`` with its deny cache lookup, the call
    guard, ``CheckCore.answered`` reading the decision and recording it). And the
    cost of a check the deny cache answers."""
    from quotad._deny_cache import DenyCache

    cache = DenyCache(10_000)
    answer = pb.Decision(allowed=True, limit=10, remaining=9, reset_after_ms=1000, reason=1)
    # Never called: its port is closed, and only its local path runs here.
    offline = quotad.Client("http://127.0.0.1:9")
    offline._settings.cache = cache

    def around(i: int) -> None:
        ask = offline._core.local(f"k{i}", "bench", 1)
        assert not isinstance(ask, quotad.Decision)
        sent_ms = offline._clock()
        with offline._call():
            pass
        offline._core.answered(ask, answer, sent_ms)

    denied = quotad.Decision(False, 10, 0, 60_000, 60_000, quotad.Reason.LIMIT_EXCEEDED)
    hot = offline._core.local("hot", "bench", 1)
    assert not isinstance(hot, quotad.Decision)
    cache.record(hot.key, 1, denied, cache.sent(offline._clock()), offline._clock())

    def local(_i: int) -> None:
        offline.check("hot", "bench")

    return per_call_us(around, calls), per_call_us(local, calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "bench.toml"
        config.write_text(CONFIG)
        process, addr = start_quotad(config)
        try:
            results = run(addr, args.calls, args.rounds)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(10)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, grpcio {grpc.__version__}")  # fmt: skip
    print(f"{args.rounds} rounds x {args.calls} sequential checks, one key per call")
    for name, rounds in results.items():
        print(f"{name:<28} {statistics.median(rounds):8.1f} us/check")
    sync = statistics.median(results["quotad.Client"]) - statistics.median(results["bare stub"])
    aio = statistics.median(results["quotad.AsyncClient"]) - statistics.median(
        results["bare grpc.aio stub"]
    )
    print(f"overhead, sync:  {sync:+.1f} us/check")
    print(f"overhead, async: {aio:+.1f} us/check")
    work, local = client_side_work(args.calls * 10)
    print(f"the client's own work around a call (no network): {work:.2f} us/check")
    print(f"a denial answered from the deny cache: {local:.2f} us/check")


def run(addr: str, calls: int, rounds: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {
        "bare stub": [],
        "quotad.Client": [],
        "bare grpc.aio stub": [],
        "quotad.AsyncClient": [],
    }
    channel = grpc.insecure_channel(addr)
    stub = quota_pb2_grpc.QuotaStub(channel)
    client = quotad.Client(f"http://{addr}", deadline=5.0)

    def bare(i: int) -> None:
        stub.Check(pb.CheckRequest(key=f"b{i}", cost=1, policy_name="bench"), timeout=5.0)

    def ours(i: int) -> None:
        client.check(f"c{i}", "bench")

    async def run_async() -> None:
        achannel = grpc.aio.insecure_channel(addr)
        astub = quota_pb2_grpc.QuotaStub(achannel)
        aclient = quotad.AsyncClient(f"http://{addr}", deadline=5.0)

        async def abare(i: int) -> None:
            request = pb.CheckRequest(key=f"ab{i}", cost=1, policy_name="bench")
            await astub.Check(request, timeout=5.0)

        async def aours(i: int) -> None:
            await aclient.check(f"ac{i}", "bench")

        await per_call_us_async(abare, 200)  # warm up
        await per_call_us_async(aours, 200)
        for _ in range(rounds):
            results["bare grpc.aio stub"].append(await per_call_us_async(abare, calls))
            results["quotad.AsyncClient"].append(await per_call_us_async(aours, calls))
        await aclient.close()
        await achannel.close()

    per_call_us(bare, 200)  # warm up: connect, first calls
    per_call_us(ours, 200)
    for _ in range(rounds):
        results["bare stub"].append(per_call_us(bare, calls))
        results["quotad.Client"].append(per_call_us(ours, calls))
    asyncio.run(run_async())
    client.close()
    channel.close()
    return results


if __name__ == "__main__":
    main()
