#!/usr/bin/env python3
"""Ask quotad for a decision from Python, with stubs generated from the protos.

Any language with gRPC support talks to quotad the same way: generate stubs
from crates/quotad-proto/proto/quotad/v1/quota.proto and call Check.

    pip install -r examples/python/requirements.txt
    python3 examples/python/quotad_check.py --addr 127.0.0.1:50051 \
        --policy api --key user-42 --count 3

Prints one JSON line per decision and exits 0; exits 1 when quotad answers
with an error.
"""

import argparse
import importlib
import json
import pathlib
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
# The protos live in the crate that builds them, so the published crate has them.
PROTO_ROOT = HERE.parent.parent / "crates" / "quotad-proto" / "proto"


def load_stubs():
    """Generates the Python stubs into a temporary folder, imports them, and
    removes the folder (the imported modules stay loaded)."""
    from grpc_tools import protoc

    proto = PROTO_ROOT / "quotad" / "v1" / "quota.proto"
    with tempfile.TemporaryDirectory(prefix="quotad-stubs-") as out:
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{PROTO_ROOT}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                str(proto),
            ]
        )
        if code != 0:
            sys.exit(f"protoc failed on {proto} (exit {code})")
        sys.path.insert(0, out)
        try:
            return (
                importlib.import_module("quotad.v1.quota_pb2"),
                importlib.import_module("quotad.v1.quota_pb2_grpc"),
            )
        finally:
            sys.path.remove(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default="127.0.0.1:50051")
    parser.add_argument("--policy", required=True, help="a named policy")
    parser.add_argument("--key", required=True)
    parser.add_argument("--cost", type=int, default=1)
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds per call")
    args = parser.parse_args()

    import grpc

    pb, rpc = load_stubs()
    with grpc.insecure_channel(args.addr) as channel:
        stub = rpc.QuotaStub(channel)
        for _ in range(args.count):
            request = pb.CheckRequest(key=args.key, cost=args.cost, policy_name=args.policy)
            try:
                decision = stub.Check(request, timeout=args.timeout).decision
            except grpc.RpcError as err:
                print(f"quotad error: {err.code().name}: {err.details()}", file=sys.stderr)
                return 1
            print(
                json.dumps(
                    {
                        "allowed": decision.allowed,
                        "limit": decision.limit,
                        "remaining": decision.remaining,
                        "retry_after_ms": decision.retry_after_ms,
                        "reset_after_ms": decision.reset_after_ms,
                        "reason": pb.Reason.Name(decision.reason),
                    }
                ),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
