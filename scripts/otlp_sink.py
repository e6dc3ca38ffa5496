#!/usr/bin/env python3
"""An OTLP/gRPC trace sink for scripts/bench_trace.sh: accepts
TraceService/Export on a free 127.0.0.1 port (printed on stdout), answers
each with an empty ExportTraceServiceResponse (whose encoding is empty) and
discards the spans unread. On SIGTERM it prints on stderr how many exports
and bytes it took, and exits."""

import signal
import sys
import threading
from concurrent import futures

import grpc

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class Sink(grpc.GenericRpcHandler):
    def __init__(self):
        self.lock = threading.Lock()
        self.exports = 0
        self.bytes = 0

    def service(self, details):
        if details.method != EXPORT:
            return None
        return grpc.unary_unary_rpc_method_handler(self.export)

    def export(self, request, _context):
        with self.lock:
            self.exports += 1
            self.bytes += len(request)
        return b""


def main():
    sink = Sink()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((sink,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    stopped.wait()
    server.stop(1)
    print(f"{sink.exports} exports, {sink.bytes} bytes of spans received", file=sys.stderr)


if __name__ == "__main__":
    main()
