#!/usr/bin/env python3
"""Acquire+release pairs of a concurrency limit per quotad server core-second.

    scripts/bench-concurrency.py --quotad target/release/quotad [--redis-url redis://127.0.0.1:6379] \
        [--threads 8] [--seconds 10]

Starts one `quotad serve` on free loopback ports (memory store, or Redis
with --redis-url) with one concurrency policy (limit 10,000, slots of 30 s),
then runs --threads client threads, each acquiring a slot of its own key
(so no acquire is denied) and releasing it, for --seconds. The server's CPU
time (utime + stime from /proc/PID/stat) is read around the run: pairs per
server core-second is pairs / server CPU seconds, independent of how fast
this (Python) client is, as scripts/bench.sh reads it for checks. Also
prints the pairs per wall second the client reached. Stops the server (by
its PID) at the end.
"""

import argparse
import importlib
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent / "crates" / "quotad-proto" / "proto"


def stubs():
    from grpc_tools import protoc

    out = tempfile.mkdtemp(prefix="quotad-stubs-")
    for name in ("quota", "concurrency"):
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{PROTO_ROOT}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                str(PROTO_ROOT / "quotad" / "v1" / f"{name}.proto"),
            ]
        )
        if code != 0:
            sys.exit(f"protoc failed on {name}.proto")
    sys.path.insert(0, out)
    return (
        importlib.import_module("quotad.v1.concurrency_pb2"),
        importlib.import_module("quotad.v1.concurrency_pb2_grpc"),
    )


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    # Fields 14 and 15 (utime, stime), counted after the command name's ')'.
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quotad", required=True)
    parser.add_argument("--redis-url")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    pb, rpc = stubs()
    import grpc

    store = f'[store]\nbackend = "redis"\n[store.redis]\nurl = "{args.redis_url}"\n' if args.redis_url else ""
    config = store + '[policies.jobs]\nalgorithm = "concurrency"\nlimit = 10000\nslot_ttl = "30s"\n'
    folder = tempfile.mkdtemp(prefix="quotad-bench-")
    path = pathlib.Path(folder) / "quotad.toml"
    path.write_text(config)
    grpc_port, admin_port = free_port(), free_port()
    server = subprocess.Popen(
        [args.quotad, "serve", "--config", str(path), "--grpc-addr", f"127.0.0.1:{grpc_port}",
         "--admin-addr", f"127.0.0.1:{admin_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        grpc.channel_ready_future(channel).result(timeout=10)
        stop = threading.Event()
        counts = [0] * args.threads

        def run(i):
            stub = rpc.ConcurrencyStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
            key = f"bench-{i}"
            while not stop.is_set():
                answer = stub.Acquire(pb.AcquireRequest(key=key, policy_name="jobs"))
                if not answer.decision.allowed:
                    sys.exit(f"denied: {answer}")
                stub.Release(pb.SlotRequest(key=key, policy_name="jobs", slot_id=answer.slot_id))
                counts[i] += 1

        # Warm up: connections, the script loaded (Redis).
        warm = rpc.ConcurrencyStub(channel)
        for _ in range(100):
            a = warm.Acquire(pb.AcquireRequest(key="warm", policy_name="jobs"))
            warm.Release(pb.SlotRequest(key="warm", policy_name="jobs", slot_id=a.slot_id))
        threads = [threading.Thread(target=run, args=(i,)) for i in range(args.threads)]
        cpu0, t0 = cpu_seconds(server.pid), time.monotonic()
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        stop.set()
        for t in threads:
            t.join()
        cpu1, t1 = cpu_seconds(server.pid), time.monotonic()
        pairs = sum(counts)
        cpu = cpu1 - cpu0
        backend = "redis" if args.redis_url else "memory"
        print(f"backend={backend} threads={args.threads} seconds={t1 - t0:.1f} pairs={pairs} "
              f"server_cpu_s={cpu:.2f} pairs_per_server_core_s={pairs / cpu:.0f} "
              f"pairs_per_wall_s={pairs / (t1 - t0):.0f}")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
