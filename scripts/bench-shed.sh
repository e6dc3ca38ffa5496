#!/usr/bin/env bash
# Load past capacity: BENCHMARKS.md, "Load past capacity".
#
#   scripts/bench-shed.sh                      # ~3 min after the build
#   LIMITS="0 256" DURATION=5 scripts/bench-shed.sh
#
# quotad (memory store, one worker thread) runs in a cgroup of its own capped
# at CPU_PERCENT of one core (cgroup v1 cpu.cfs_quota_us, or v2 cpu.max), so
# that loadgen, on the other core, can offer it 10x what it serves: a load
# generator on the same 2-core box cannot outrun a whole core of quotad by
# ten. For each transport.max_in_flight in LIMITS (0: no bound) it measures
# the capacity (closed loop), then runs an open loop at OVERLOAD x that rate
# and prints what was served, what was shed (UNAVAILABLE) and the latency of
# the calls that got a decision.
#
# Bounded: every loadgen run has a --duration and runs under `timeout`;
# quotad runs under `timeout` too. An EXIT trap stops the processes this
# script started, by PID, and removes its cgroup.
#
# Settings (environment): LIMITS="0 64 1024" CPU_PERCENT=10 OVERLOAD=10
# DURATION=10 WARMUP=2 CONCURRENCY=1024 (loadgen's most) CONNECTIONS=4 SKIP_BUILD=1
# QUOTAD_BIN=target/release/quotad LOADGEN_BIN=target/release/loadgen
set -euo pipefail
cd "$(dirname "$0")/.."

LIMITS=${LIMITS:-"0 64 1024"}
CPU_PERCENT=${CPU_PERCENT:-10}
OVERLOAD=${OVERLOAD:-10}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
CONCURRENCY=${CONCURRENCY:-1024}
CONNECTIONS=${CONNECTIONS:-4}
QUOTAD_BIN=${QUOTAD_BIN:-target/release/quotad}
LOADGEN_BIN=${LOADGEN_BIN:-target/release/loadgen}

if [[ -z ${SKIP_BUILD:-} ]]; then
  cargo build --release --bin quotad --bin loadgen -p quotad -p quotad-bench
fi

WORK=$(mktemp -d)
CGROUP=""
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [[ -n $CGROUP ]]; then rmdir "$CGROUP" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# A cgroup capping its processes at CPU_PERCENT of one core, in 10 ms
# periods (a 100 ms period freezes the server for up to 90 ms at a time,
# which would dominate every latency measured).
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
  CGROUP=/sys/fs/cgroup/quotad-shed-$$
  mkdir "$CGROUP"
  echo "$((CPU_PERCENT * 100)) 10000" >"$CGROUP/cpu.max"
else
  CGROUP=/sys/fs/cgroup/cpu/quotad-shed-$$
  mkdir "$CGROUP"
  echo 10000 >"$CGROUP/cpu.cfs_period_us"
  echo "$((CPU_PERCENT * 100))" >"$CGROUP/cpu.cfs_quota_us"
fi

cat >"$WORK/quotad.toml" <<'EOF'
[policies.bench]
algorithm = "fixed_window"
limit = 1000000000
window = "1m"
EOF

# start LIMIT: quotad with transport.max_in_flight = LIMIT in the cgroup;
# sets ADDR and PID.
start() {
  NO_COLOR=1 QUOTAD_LOG_LEVEL=warn,quotad=info timeout 600 "$QUOTAD_BIN" serve \
    --config "$WORK/quotad.toml" --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 \
    --worker-threads 1 --max-in-flight "$1" >"$WORK/quotad.out" 2>"$WORK/quotad.err" &
  local wrapper=$!
  PIDS+=("$wrapper")
  for _ in $(seq 100); do
    ADDR=$(sed -nE 's/.*grpc_addr=([0-9.:]+).*/\1/p' "$WORK/quotad.err" | head -n 1)
    [[ -n $ADDR ]] && break
    sleep 0.1
  done
  [[ -n $ADDR ]] || { cat "$WORK/quotad.err"; exit 1; }
  PID=$(awk '{print $1}' "/proc/$wrapper/task/$wrapper/children")
  echo "$PID" >"$CGROUP/cgroup.procs"
  PID=$wrapper
}

loadgen() {
  timeout $((DURATION + WARMUP + 30)) "$LOADGEN_BIN" --addr "$ADDR" --policy bench \
    --keys uniform:1000 --duration "$DURATION" --warmup "$WARMUP" --json "$@"
}

field() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'r': r}))" "$@"; }

echo "| max_in_flight | capacity (closed loop, calls/s) | offered (calls/s) | sent (calls/s) | served (calls/s) | shed (UNAVAILABLE) | other errors | p50 / p99 of served (ms) | p99 of all (ms) |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for limit in $LIMITS; do
  start "$limit"
  loadgen --concurrency 64 --connections 2 >"$WORK/capacity.json"
  capacity=$(field "$WORK/capacity.json" 'int(r["requests_per_sec"])')
  rate=$((capacity * OVERLOAD))
  loadgen --rate "$rate" --concurrency "$CONCURRENCY" --connections "$CONNECTIONS" \
    --timeout-ms 5000 >"$WORK/over.json"
  f() { field "$WORK/over.json" "$1"; }
  sent=$(f 'int(r["requests_per_sec"])')
  served=$(f 'int((r["requests"] - r["errors"]) / r["elapsed_secs"])')
  shed=$(f 'r["errors_by_code"].get("UNAVAILABLE", 0)')
  other=$(f 'r["errors"] - r["errors_by_code"].get("UNAVAILABLE", 0)')
  p=$(f '"%.1f / %.1f" % (r["decided_latency"]["p50_us"] / 1000, r["decided_latency"]["p99_us"] / 1000)')
  all=$(f '"%.1f" % (r["latency"]["p99_us"] / 1000)')
  echo "| $limit | $capacity | $rate | $sent | $served | $shed | $other | $p | $all |"
  kill "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
done
