#!/usr/bin/env bash
# What traces cost: quotad's server CPU per unary Check decision, in paired,
# interleaved rounds, for
#   base  BASE_BIN, a build without tracing (e.g. the commit before it);
#   off   this build, no OTLP endpoint: export off (the default);
#   1%    this build exporting to a local OTLP sink, OTEL_TRACES_SAMPLER=
#         parentbased_traceidratio, OTEL_TRACES_SAMPLER_ARG=0.01;
#   100%  the same with OTEL_TRACES_SAMPLER=always_on.
#
#   BASE_BIN=/tmp/quotad-base scripts/bench_trace.sh
#
# Each round runs every server once, in an order that rotates from round to
# round, with the same loadgen unary load (scripts/bench.sh's: CONCURRENCY
# callers over CONNECTIONS connections, KEYS keys prefilled, one worker
# thread per server); a server's CPU (utime + stime, /proc/PID/stat) is read
# around its own run. Prints a markdown table: CPU us per decision per
# server (median of the rounds) and each round's ratio to `off` (and `off`
# to `base`).
#
# The sink (scripts/otlp_sink.py, python3 with grpcio) accepts OTLP/gRPC
# trace exports and discards them; it shares the 2 cores, as a collector
# agent would. Bounded: every run has a duration and runs under `timeout`;
# the servers and the sink stop by themselves; an EXIT trap stops what
# this script started, by PID.
#
# Settings (environment): ROUNDS=5 DURATION=10 WARMUP=2 CONCURRENCY=64
# CONNECTIONS=2 KEYS=uniform:100000 SERVER_THREADS=1 LOADGEN_THREADS=1
# QUOTAD_BIN=target/release/quotad SKIP_BUILD=1 (use the binaries built).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
CONCURRENCY=${CONCURRENCY:-64}
CONNECTIONS=${CONNECTIONS:-2}
KEYS=${KEYS:-uniform:100000}
SERVER_THREADS=${SERVER_THREADS:-1}
LOADGEN_THREADS=${LOADGEN_THREADS:-1}
QUOTAD_BIN=${QUOTAD_BIN:-target/release/quotad}
BASE_BIN=${BASE_BIN:?BASE_BIN: a quotad build without tracing to compare with}

command -v jq >/dev/null || { echo "bench_trace.sh: jq is required" >&2; exit 1; }
for setting in ROUNDS DURATION WARMUP CONCURRENCY CONNECTIONS SERVER_THREADS LOADGEN_THREADS; do
  [[ ${!setting} =~ ^[0-9]+$ ]] || { echo "bench_trace.sh: $setting must be a whole number" >&2; exit 2; }
done
if [[ -z ${SKIP_BUILD:-} ]]; then
  cargo build --release --bin quotad -p quotad --bin loadgen -p quotad-bench
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/quotad-bench-trace.XXXXXX")
STARTED=()
cleanup() {
  local pid
  for pid in "${STARTED[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${STARTED[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

RUN_SECS=$((WARMUP + DURATION))
LOADGEN_LIMIT=$((RUN_SECS + 30))
SERVER_LIMIT=$(((4 * ROUNDS + 8) * LOADGEN_LIMIT + 60))
CLK_TCK=$(getconf CLK_TCK)
cpu_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }

cat >"$WORK/quotad.toml" <<EOF
# Written by scripts/bench_trace.sh.
[server]
config_poll_interval = "0s"

[policies.bench]
algorithm = "fixed_window"
limit = 1000000000000
window = "1s"
EOF

# The sink.
timeout "$SERVER_LIMIT" python3 scripts/otlp_sink.py >"$WORK/sink.out" 2>"$WORK/sink.err" &
SINK_PID=$!
STARTED+=("$SINK_PID")
for _ in $(seq 100); do [[ -s $WORK/sink.out ]] && break; sleep 0.1; done
SINK=http://127.0.0.1:$(head -n 1 "$WORK/sink.out")

# start NAME BIN ENV... : quotad NAME (BIN) with the environment ENV.
declare -A PID ADDR
start() {
  local name=$1 bin=$2 log=$WORK/$1 pid addr=
  shift 2
  env "$@" NO_COLOR=1 QUOTAD_LOG_LEVEL=warn,quotad=info timeout "$SERVER_LIMIT" "$bin" serve \
    --config "$WORK/quotad.toml" --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 \
    --worker-threads "$SERVER_THREADS" >"$log.out" 2>"$log.err" &
  pid=$!
  STARTED+=("$pid")
  for _ in $(seq 100); do
    addr=$(sed -nE 's/.*grpc_addr=([^ ]+).*/\1/p' "$log.err" | head -n 1)
    [[ -n $addr ]] && break
    sleep 0.1
  done
  [[ -n $addr ]] || { echo "bench_trace.sh: $name did not start:" >&2; cat "$log.err" >&2; exit 1; }
  ADDR[$name]=$addr
  PID[$name]=$(awk '{print $1}' "/proc/$pid/task/$pid/children")
}
start base "$BASE_BIN"
start off "$QUOTAD_BIN"
start 1pct "$QUOTAD_BIN" OTEL_EXPORTER_OTLP_ENDPOINT="$SINK" \
  OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.01
start 100pct "$QUOTAD_BIN" OTEL_EXPORTER_OTLP_ENDPOINT="$SINK" OTEL_TRACES_SAMPLER=always_on
SERVERS=(base off 1pct 100pct)

loadgen() {
  local name=$1 addr=$2
  shift 2
  echo "bench_trace.sh: $name" >&2
  timeout "$LOADGEN_LIMIT" target/release/loadgen --addr "http://$addr" \
    --threads "$LOADGEN_THREADS" --json "$@" >"$WORK/$name.json"
}

for s in "${SERVERS[@]}"; do
  loadgen "prefill_$s" "${ADDR[$s]}" --policy bench --mode batch --batch-size 1000 \
    --concurrency 4 --keys "$KEYS" --key-prefix bench: --requests 300
done

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq "$ROUNDS"); do
  # Rotate the order, so that no server always runs first or last.
  for i in 0 1 2 3; do
    s=${SERVERS[$(((i + round) % 4))]}
    before=$(cpu_ticks "${PID[$s]}")
    loadgen "${s}_$round" "${ADDR[$s]}" --policy bench --mode unary \
      --concurrency "$CONCURRENCY" --connections "$CONNECTIONS" --keys "$KEYS" \
      --key-prefix bench: --duration "$DURATION" --warmup "$WARMUP"
    echo $(($(cpu_ticks "${PID[$s]}") - before)) >"$WORK/${s}_$round.cpu"
  done
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# us of server CPU per decision over a run (its warmup included, as its CPU
# time is; as scripts/bench.sh counts).
per_decision() {
  jq -rn --argjson ticks "$(cat "$WORK/$1.cpu")" --argjson hz "$CLK_TCK" --slurpfile r "$WORK/$1.json" \
    '($ticks * 1000000 / $hz) / ($r[0].requests + $r[0].warmup_requests) * 100 | round / 100'
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for s in "${SERVERS[@]}"; do
  for round in $(seq "$ROUNDS"); do per_decision "${s}_$round" >"$WORK/${s}_$round.us"; done
done
ratios() { # NAME OF_NAME : NAME / OF_NAME per round
  local out=() round
  for round in $(seq "$ROUNDS"); do
    out+=("$(awk -v a="$(cat "$WORK/${1}_$round.us")" -v b="$(cat "$WORK/${2}_$round.us")" 'BEGIN { printf "%.3f", a / b }')")
  done
  echo "${out[*]}"
}
med_us() { for round in $(seq "$ROUNDS"); do cat "$WORK/${1}_$round.us"; echo; done | median; }
med_rps() { for round in $(seq "$ROUNDS"); do jq -r '.decisions_per_sec | floor' "$WORK/${1}_$round.json"; done | median; }
med_ratio() { tr ' ' '\n' <<<"$(ratios "$1" "$2")" | median; }

kill -TERM "$SINK_PID" 2>/dev/null || true
for _ in $(seq 50); do kill -0 "$SINK_PID" 2>/dev/null || break; sleep 0.1; done

cat <<EOF
Date: $(date -u '+%Y-%m-%d %H:%M UTC'). Machine: $(nproc) cores, $(sed -nE 's/^model name\s*:\s*//p' /proc/cpuinfo | head -n 1).
Load average before / after: $LOAD_BEFORE / $LOAD_AFTER. $ROUNDS rounds of ${DURATION} s measured after ${WARMUP} s warmup;
unary Check, $CONCURRENCY callers over $CONNECTIONS connections, $KEYS keys; $SERVER_THREADS worker thread(s) per server.
Sink: $(cat "$WORK/sink.err" 2>/dev/null | tail -n 1)

| server | decisions/s (median) | CPU µs per decision (median) | ratio per round | median ratio |
|---|---|---|---|---|
| base (no tracing) | $(med_rps base) | $(med_us base) | — | — |
| off (no endpoint) | $(med_rps off) | $(med_us off) | off / base: $(ratios off base) | $(med_ratio off base) |
| sampled 1% | $(med_rps 1pct) | $(med_us 1pct) | 1% / off: $(ratios 1pct off) | $(med_ratio 1pct off) |
| sampled 100% | $(med_rps 100pct) | $(med_us 100pct) | 100% / off: $(ratios 100pct off) | $(med_ratio 100pct off) |
EOF
