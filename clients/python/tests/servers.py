"""Real quotad processes and dead ports for the tests, on free loopback ports."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[3]
CASES = REPO / "tests" / "clients" / "cases.json"
CONFIG = REPO / "tests" / "clients" / "quotad.toml"


def quotad_binary() -> Path:
    """``QUOTAD_BIN``, else the repository's ``target/debug/quotad``; building it is the
    caller's job (``scripts/test.sh`` builds first)."""
    path = Path(os.environ.get("QUOTAD_BIN", REPO / "target" / "debug" / "quotad"))
    if not path.is_file():
        raise RuntimeError(
            f"no quotad binary at {path}: run `cargo build --bin quotad` (scripts/test.sh does),"
            " or set QUOTAD_BIN"
        )
    return path


class Quotad:
    """A running ``quotad serve`` on a free loopback port."""

    def __init__(
        self, config: Path = CONFIG, extra: list[str] | None = None, grpc_addr: str = "127.0.0.1:0"
    ) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUOTAD_")}
        env["RUST_LOG"] = "info"
        args = [str(quotad_binary()), "serve", "-c", str(config)]
        args += ["--grpc-addr", grpc_addr, "--admin-addr", "127.0.0.1:0", *(extra or [])]
        self.process = subprocess.Popen(
            args, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
        )
        lines: queue.Queue[str] = queue.Queue()
        assert self.process.stderr is not None
        stderr = self.process.stderr
        self.log: list[str] = []

        def pump() -> None:
            for line in stderr:
                lines.put(line)
            lines.put("")

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + 20
        while True:
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                self.stop()
                raise RuntimeError("quotad did not log that it was serving within 20 s") from None
            self.log.append(line)
            if line == "":
                raise RuntimeError("quotad exited before serving:\n" + "".join(self.log))
            if "quotad serving" in line:
                fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
                self.grpc_addr = fields["grpc_addr"]
                self.admin_addr = fields.get("admin_addr", "").strip()
                unix = self.grpc_addr.startswith("unix:")
                self.address = self.grpc_addr if unix else f"http://{self.grpc_addr}"
                return

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextmanager
def real_quotad(
    config: Path = CONFIG, extra: list[str] | None = None, grpc_addr: str = "127.0.0.1:0"
) -> Iterator[Quotad]:
    server = Quotad(config, extra, grpc_addr)
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def closed_port() -> Iterator[str]:
    """A loopback port with nothing listening: bound, never listened on, so connecting is
    refused and nobody else can take it meanwhile."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


@contextmanager
def stalled_port() -> Iterator[str]:
    """A loopback port that accepts connections and never sends a byte."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
                held.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        sock.close()


@contextmanager
def server_for(kind: str) -> Iterator[str]:
    """The address of a conformance case's server: ``real``, ``closed`` or ``stalled``."""
    if kind == "real":
        with real_quotad() as server:
            yield server.address
    elif kind == "closed":
        with closed_port() as address:
            yield address
    elif kind == "stalled":
        with stalled_port() as address:
            yield address
    else:
        raise ValueError(f"unknown server kind {kind!r}")


def deciding_calls(server: Quotad) -> int:
    """The Check and CheckBatch calls ``server`` decided so far: one store call each,
    read from its ``quotad_store_operations_total`` metric."""
    text = httpx.get(f"http://{server.admin_addr}/metrics", timeout=5).text
    total = 0
    for line in text.splitlines():
        if line.startswith("quotad_store_operations_total{") and (
            'op="check"' in line or 'op="check_batch"' in line
        ):
            total += int(float(line.split()[-1]))
    return total
