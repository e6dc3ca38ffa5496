"""The example app served by uvicorn on a loopback port, in front of a real quotad:
real HTTP requests see 200s, then 429s with the right headers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from app import create_app

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


@pytest.fixture(scope="module")
def quotad_address() -> Iterator[str]:
    binary = Path(os.environ.get("QUOTAD_BIN", REPO / "target" / "debug" / "quotad"))
    assert binary.is_file(), f"no quotad at {binary}: run `cargo build --bin quotad`"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUOTAD_")}
    env["RUST_LOG"] = "info"
    process = subprocess.Popen(
        [str(binary), "serve", "-c", str(HERE / "quotad.toml"), "--grpc-addr", "127.0.0.1:0",
         "--admin-addr", "127.0.0.1:0"],
        env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if "quotad serving" in line:
                grpc = next(w for w in line.split() if w.startswith("grpc_addr="))
                break
        else:
            pytest.fail("quotad exited before serving")
        threading.Thread(target=process.stderr.read, daemon=True).start()
        yield "http://" + grpc.split("=", 1)[1]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(10)


@pytest.fixture(scope="module")
def app_url(quotad_address: str) -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(quotad_address), log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def test_real_requests_see_200s_then_429s_with_retry_after_and_ratelimit_headers(
    app_url: str,
) -> None:
    with httpx.Client(base_url=app_url) as web:
        for remaining in (2, 1, 0):
            ok = web.get("/api/hello", headers={"x-api-key": "alice"})
            assert ok.status_code == 200 and ok.json() == {"hello": "world"}
            assert ok.headers["ratelimit-policy"] == '"api";q=3'
            assert ok.headers["ratelimit"].startswith(f'"api";r={remaining};t=')
            assert ok.headers["x-ratelimit-remaining"] == str(remaining)
            assert "retry-after" not in ok.headers
        for _ in range(2):
            limited = web.get("/api/hello", headers={"x-api-key": "alice"})
            assert limited.status_code == 429
            assert limited.text == "too many requests\n"
            # One token back every 20 s: the wait is at most 20 s, at least 1.
            assert 1 <= int(limited.headers["retry-after"]) <= 21
            assert limited.headers["x-ratelimit-remaining"] == "0"
            assert limited.headers["ratelimit"].startswith('"api";r=0;t=')
        # Another key has its own budget; no key at all is the client's error.
        assert web.get("/api/hello", headers={"x-api-key": "bob"}).status_code == 200
        assert web.get("/api/hello").status_code == 400
