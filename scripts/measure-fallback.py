"""How long `on_error = "local"` takes to start and to end, measured
(docs/redis.md): one quotad on a Redis of its own, checked one call at a
time; Redis is SIGKILLed (until the first LOCAL_FALLBACK decision) and then
started again (until the first decision Redis made), three times.

    python3 scripts/measure-fallback.py target/release/quotad

Needs redis-server on PATH and grpcio-tools; everything is on 127.0.0.1 and
the processes it started are stopped by PID.
"""
import os, shutil, signal, subprocess, sys, tempfile, time, socket
import grpc
from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO = os.path.join(ROOT, "crates", "quotad-proto", "proto")
STUBS = tempfile.mkdtemp()
protoc.main(["protoc", f"-I{PROTO}", f"--python_out={STUBS}", f"--grpc_python_out={STUBS}", "quotad/v1/quota.proto"])
sys.path.insert(0, STUBS)
from quotad.v1 import quota_pb2 as pb, quota_pb2_grpc as rpc

QUOTAD = sys.argv[1]
CONFIG = os.path.join(STUBS, "quotad.toml")
def free():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
rport, gport, aport = free(), free(), free()
def redis():
    return subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
r = redis(); time.sleep(0.3)
cfg = f"""
[server]
grpc_addr = "127.0.0.1:{gport}"
admin_addr = "127.0.0.1:{aport}"
[store]
backend = "redis"
[store.redis]
url = "redis://127.0.0.1:{rport}/"
[store.fallback]
replicas = 3
[policies.api]
algorithm = "fixed_window"
limit = 1000000
window = "1d"
on_error = "local"
"""
open(CONFIG, "w").write(cfg)
q = subprocess.Popen([QUOTAD, "serve", "--config", CONFIG], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(0.5)
stub = rpc.QuotaStub(grpc.insecure_channel(f"127.0.0.1:{gport}"))
req = pb.CheckRequest(key="k", policy_name="api")
def reason():
    return stub.Check(req, timeout=2).decision.reason
for _ in range(20): reason()
results = []
for run in range(3):
    r.send_signal(signal.SIGKILL); r.wait(); killed = time.monotonic()
    while reason() != pb.REASON_LOCAL_FALLBACK: pass
    to_local = time.monotonic() - killed
    time.sleep(0.5)
    r = redis(); started = time.monotonic()
    n = 0
    while reason() != pb.REASON_WITHIN_LIMIT: n += 1
    to_redis = time.monotonic() - started
    results.append((to_local, to_redis))
    time.sleep(0.3)
q.send_signal(signal.SIGTERM); q.wait(); r.send_signal(signal.SIGKILL); r.wait()
for a, b in results:
    print(f"kill -> first LOCAL_FALLBACK {a*1000:.1f} ms; redis-server started -> first WITHIN_LIMIT {b*1000:.1f} ms")
shutil.rmtree(STUBS)
