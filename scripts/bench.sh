#!/usr/bin/env bash
# Reproduces the gRPC rows of BENCHMARKS.md in one bounded command:
#
#   scripts/bench.sh                        # ~75 s after the build; prints a markdown table
#   DURATION=5 WARMUP=1 scripts/bench.sh    # a quicker, noisier pass
#
# What it does, all on 127.0.0.1:
#   1. builds the release binaries: quotad, loadgen, noop-server;
#   2. starts noop-server (quotad's API answering at once: the floor) and runs
#      loadgen against it: unary Check closed loop at CONCURRENCY over
#      CONNECTIONS, then CheckBatch(BATCH_SIZE);
#   3. starts quotad with a temporary config (policy `bench`: a fixed window
#      no run can exhaust; policy `budget`: 1,000 per day) and runs the same
#      two loads, then a correctness run (CORRECTNESS_REQUESTS checks on one
#      hot key under `budget`: exactly 1,000 must be allowed);
#   4. runs an open-loop load at half of quotad's unary peak (loadgen --rate,
#      latency measured from each request's scheduled send time, so queueing
#      is not hidden) against quotad, stops quotad, then runs the same rate
#      against noop-server for the floor;
#   5. runs Envoy's ShouldRateLimit (loadgen --mode rls) with one and with
#      three descriptors against both servers (quotad with RLS rules no run
#      can exhaust), RLS_REPEAT times, alternating noop and quotad so that
#      both see the same background load, reading each server's CPU time
#      (utime + stime from /proc/PID/stat) around each run: server CPU per
#      call, quotad's above the floor's (median of the pairs), is the RLS
#      cost figure;
#   6. prints markdown tables with quotad / noop ratios and the targets.
#      Only one server is under load at a time (the other idles), and
#      loadgen shares the 2 cores with it.
#
# Bounded: every loadgen run has a --duration (WARMUP + DURATION seconds, 12 s
# by default; 6 + 4 x RLS_REPEAT timed runs and one short correctness run) and runs under
# `timeout`; each server stops by itself (noop-server --max-seconds; quotad
# under `timeout`) even if this script is killed with SIGKILL. An EXIT trap
# stops the processes this script started, by PID and nothing else. A cold
# release build takes minutes more.
#
# Settings (environment):
#   DURATION=10 WARMUP=2          seconds measured / not measured, per run
#   CONCURRENCY=64 CONNECTIONS=2  unary and open-loop runs
#   BATCH_SIZE=100 BATCH_CONCURRENCY=8
#   KEYS=uniform:100000           loadgen --keys for the throughput runs
#   LOADGEN_THREADS=1             loadgen runtime threads (the box has 2 cores)
#   SERVER_THREADS=1              worker threads of both servers, the same for
#                                 each: with loadgen on one core, one each
#                                 (two workers on the shared cores were
#                                 measured slower and with a worse p99)
#   CORRECTNESS_REQUESTS=5000
#   RLS_REPEAT=3                  alternating noop/quotad ShouldRateLimit pairs
#   SKIP_BUILD=1                  use the binaries already in target/release
#   OUT=DIR                       keep every JSON report and server log in DIR
#   REDIS_CPU_ONLY=1              only the Redis CPU table (redis-benchmark, ~1 min)
#   REDIS_CPU_REQUESTS=200000     calls per row of that table
#   REDIS_CPU_REPS=3               rounds of it (medians reported)
#   REDIS_CPU_OLD=REV             add a row for the script at git revision REV
#                                 (one that takes a deadline: 6353d61 or later)
#
# Requires: cargo, jq; for the Redis rows redis-server, redis-cli and
# redis-benchmark (skipped, with a message, when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
CONCURRENCY=${CONCURRENCY:-64}
CONNECTIONS=${CONNECTIONS:-2}
BATCH_SIZE=${BATCH_SIZE:-100}
BATCH_CONCURRENCY=${BATCH_CONCURRENCY:-8}
KEYS=${KEYS:-uniform:100000}
LOADGEN_THREADS=${LOADGEN_THREADS:-1}
SERVER_THREADS=${SERVER_THREADS:-1}
CORRECTNESS_REQUESTS=${CORRECTNESS_REQUESTS:-5000}
RLS_REPEAT=${RLS_REPEAT:-3}
BUDGET=1000

command -v jq >/dev/null || { echo "bench.sh: jq is required" >&2; exit 1; }

if [[ -n ${OUT:-} ]]; then
  mkdir -p "$OUT"
  WORK=$(cd "$OUT" && pwd)
  KEEP_WORK=1
else
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/quotad-bench.XXXXXX")
  KEEP_WORK=0
fi

STARTED=()
cleanup() {
  local pid
  for pid in "${STARTED[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${STARTED[@]}"; do
    # Up to 5 s for a graceful stop, then SIGKILL; bounded either way.
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [[ $KEEP_WORK == 0 ]]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Drops a PID from STARTED once its process has been waited for.
forget() {
  local rest=() p
  for p in "${STARTED[@]}"; do [[ $p == "$1" ]] || rest+=("$p"); done
  STARTED=("${rest[@]}")
}

# Stops one server this script started.
stop_server() {
  local pid=$1
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  forget "$pid"
}

# Waits (at most 10 s) until FILE has a line matching the extended regex
# PATTERN; prints the first capture of SED_EXPR on that line.
wait_for_addr() {
  local file=$1 pid=$2 sed_expr=$3 addr=
  for _ in $(seq 100); do
    addr=$(sed -nE "$sed_expr" "$file" 2>/dev/null | head -n 1)
    [[ -n $addr ]] && { echo "$addr"; return 0; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "bench.sh: server did not come up; its output:" >&2
  cat "$file" >&2
  return 1
}

for setting in DURATION WARMUP CONCURRENCY CONNECTIONS BATCH_SIZE BATCH_CONCURRENCY \
  LOADGEN_THREADS SERVER_THREADS CORRECTNESS_REQUESTS RLS_REPEAT; do
  [[ ${!setting} =~ ^[0-9]+$ ]] || { echo "bench.sh: $setting must be a whole number" >&2; exit 2; }
done
RUN_SECS=$((WARMUP + DURATION))
# Hard bound per loadgen run: its own duration, one request timeout, slack.
LOADGEN_LIMIT=$((RUN_SECS + 30))
# Each server outlives every run this script could make, then stops by itself.
SERVER_LIMIT=$(((7 + 4 * RLS_REPEAT) * LOADGEN_LIMIT + 60))
CLK_TCK=$(getconf CLK_TCK)

# loadgen NAME ADDR ARGS... : one run, JSON report in $WORK/NAME.json; its
# exit status. Run in the background and waited for, so that SIGINT/SIGTERM
# reach the trap at once instead of after the run.
loadgen() {
  local name=$1 addr=$2 pid status=0
  shift 2
  echo "bench.sh: $name" >&2
  timeout "$LOADGEN_LIMIT" target/release/loadgen --addr "http://$addr" \
    --threads "$LOADGEN_THREADS" --json "$@" >"$WORK/$name.json" &
  pid=$!
  STARTED+=("$pid")
  wait "$pid" || status=$?
  forget "$pid"
  return "$status"
}

# cpu_ticks PID : the process's user + system CPU time so far, in clock
# ticks (fields 14 and 15 of /proc/PID/stat, counted after the command name,
# which may hold spaces).
cpu_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }

# measured NAME ADDR PID ARGS... : a loadgen run (as `loadgen`) with the CPU
# time server PID spent during it written to $WORK/NAME.cpu, in ticks.
measured() {
  local name=$1 addr=$2 pid=$3 before status=0
  shift 3
  before=$(cpu_ticks "$pid")
  loadgen "$name" "$addr" "$@" || status=$?
  echo $(( $(cpu_ticks "$pid") - before )) >"$WORK/$name.cpu"
  return "$status"
}

# cpu_per_call NAME : server CPU µs per request of run NAME (its warmup
# requests included, as its CPU time is).
cpu_per_call() {
  jq -rn --argjson ticks "$(cat "$WORK/$1.cpu")" --argjson hz "$CLK_TCK" \
    --slurpfile r "$WORK/$1.json" \
    '($ticks * 1000000 / $hz) / ($r[0].requests + $r[0].warmup_requests) * 100 | round / 100'
}

# field NAME JQ_EXPR : a value from a report.
field() { jq -r "$2" "$WORK/$1.json"; }
fmt0() { jq -r "$2 | floor" "$WORK/$1.json"; }

# start_redis SECONDS LOG: a redis-server on a free loopback port that stops
# by itself after SECONDS; sets REDIS_STARTED_PORT and REDIS_STARTED_PID.
start_redis() {
  REDIS_STARTED_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  timeout "$1" redis-server --port "$REDIS_STARTED_PORT" --bind 127.0.0.1 --save '' \
    --appendonly no >"$2" 2>&1 &
  REDIS_STARTED_PID=$!
  STARTED+=("$REDIS_STARTED_PID")
  for _ in $(seq 100); do
    [[ $(redis-cli -p "$REDIS_STARTED_PORT" ping 2>/dev/null) == PONG ]] && break
    sleep 0.1
  done
}

# --- Redis CPU per check (REDIS_CPU=1, or alone with REDIS_CPU_ONLY=1) ------
# Side by side on one fresh redis-server: redis-benchmark sends each command
# REDIS_CPU_REQUESTS times over 50 connections with random keys, and the
# Redis process's CPU time (and INFO commandstats' usec_per_call) gives the
# Redis CPU per call. Every row is measured REDIS_CPU_REPS times, the rows
# interleaved and the database emptied before each round, and the median is
# reported with the range: on a shared box single runs move by 10-15%.
# Rows: INCR; a minimal fixed-window script (TIME + INCRBY + PEXPIRE); the
# script at an older revision (git show REV:src/backend/redis/quota.lua)
# when REDIS_CPU_OLD=REV is set; quotad's script for each algorithm; the
# sliding log at its cap of 10,000 entries; and one ALL_OR_NOTHING script
# over 1,000 full logs, the longest script quotad can send (INFO's usec for
# one call).
redis_cpu_rows() {
  local port pid sha sha_min rows=""
  start_redis 1800 "$WORK/redis-cpu.out"
  port=$REDIS_STARTED_PORT pid=$REDIS_STARTED_PID
  local n=${REDIS_CPU_REQUESTS:-200000} reps=${REDIS_CPU_REPS:-3}
  [[ $reps =~ ^[1-9][0-9]*$ ]] || { echo "bench.sh: REDIS_CPU_REPS must be a whole number" >&2; exit 2; }
  # "process µs commandstats µs" per call of redis-benchmark ARGS...: the
  # redis-server process's CPU time (user + system, from /proc, network and
  # protocol included) over the calls, and INFO's usec_per_call of COMMAND
  # (the command's execution alone).
  local server_pid
  server_pid=$(redis-cli -p "$port" info server | tr -d '\r' | sed -nE 's/^process_id:([0-9]+)/\1/p')
  ticks() { awk '{ print $14 + $15 }' "/proc/$server_pid/stat"; }
  cpu() {
    local cmd=$1 before after exec
    shift
    redis-cli -p "$port" config resetstat >/dev/null
    before=$(ticks)
    timeout 300 redis-benchmark -p "$port" -c 50 -n "$n" -r 100000 -q "$@" >/dev/null
    after=$(ticks)
    exec=$(redis-cli -p "$port" info commandstats | tr -d '\r' |
      sed -nE "s/^cmdstat_$cmd:.*usec_per_call=([0-9.]+).*/\1/p")
    echo "$(jq -n "($after - $before) * 1000000 / $(getconf CLK_TCK) / $n * 100 | round / 100") $exec"
  }
  local minimal='local t = redis.call("TIME") local n = redis.call("INCRBY", KEYS[1], ARGV[1]) if n == tonumber(ARGV[1]) then redis.call("PEXPIRE", KEYS[1], 60000) end return n'
  sha_min=$(redis-cli -p "$port" script load "$minimal")
  sha=$(redis-cli -p "$port" script load "$(cat src/backend/redis/quota.lua)")
  local deadline=99999999999999 big=1000000000000
  # The rows: a label, the commandstats name, and redis-benchmark's command.
  local labels=() names=() count=0
  add_row() {
    labels+=("$1")
    names+=("$2")
    shift 2
    eval "row_args_$count=(\"\$@\")"
    count=$((count + 1))
  }
  add_row "INCR" incr INCR "bench:__rand_int__"
  add_row "minimal fixed-window script: TIME + INCRBY + PEXPIRE" evalsha EVALSHA "$sha_min" 1 "bench:__rand_int__" 1
  if [[ -n ${REDIS_CPU_OLD:-} ]]; then
    local old_sha
    old_sha=$(redis-cli -p "$port" script load "$(git show "$REDIS_CPU_OLD:src/backend/redis/quota.lua")")
    add_row "the script at $REDIS_CPU_OLD, fixed_window, Check" evalsha EVALSHA "$old_sha" 1 \
      "old:{__rand_int__}|1x60000" check "$deadline" "" 1 "$big" 60000 "$big" 1
  fi
  local alg name
  for alg in 1 2 3 4 5; do
    name=$(echo "fixed_window sliding_window token_bucket leaky_bucket sliding_log" | cut -d' ' -f"$alg")
    local limit=$big
    [[ $alg == 5 ]] && limit=10000
    add_row "quotad, $name, Check" evalsha EVALSHA "$sha" 1 "quotad:bench$alg|{__rand_int__}|2x60000" \
      check "$deadline" "" "$alg" "$limit" 60000 "$limit" 1
  done
  # A sliding log at its cap: 10,000 entries (one per millisecond) of a
  # day-long window, limit 10,000: every check is denied after a search.
  add_row "quotad, sliding_log at 10,000 entries, Check (denied)" evalsha EVALSHA "$sha" 1 \
    "quotad:full|{log}|2G86400000" check "$deadline" "" 5 10000 86400000 10000 1
  local fill='local now = tonumber(ARGV[1]) for i = 0, 9999 do redis.call("ZADD", KEYS[1], i, string.format("%d:1", now - 10000 + i)) end redis.call("PEXPIRE", KEYS[1], 86400000) return 1'
  local now_ms rep i
  for rep in $(seq "$reps"); do
    redis-cli -p "$port" flushall >/dev/null
    now_ms=$(redis-cli -p "$port" time | head -n 1)000
    redis-cli -p "$port" eval "$fill" 1 "quotad:full|{log}|2G86400000" "$now_ms" >/dev/null
    for ((i = 0; i < count; i++)); do
      local -n row="row_args_$i"
      echo "$(cpu "${names[i]}" "${row[@]}")" >>"$WORK/redis-cpu-row-$i"
      unset -n row
    done
  done
  # "median (min-max)" of column COLUMN of row I's measurements.
  median() { sort -g -k"$2","$2" "$WORK/redis-cpu-row-$1" | awk -v c="$2" '{ v[NR] = $c } END { printf "%s (%s-%s)", v[int((NR + 1) / 2)], v[1], v[NR] }'; }
  mid() { sort -g -k1,1 "$WORK/redis-cpu-row-$1" | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
  local base
  base=$(mid 1)
  for ((i = 0; i < count; i++)); do
    local ratio="—"
    ((i >= 1)) && ratio="$(jq -n "$(mid "$i") / $base * 100 | round / 100") x"
    rows+="| ${labels[i]} | $(median "$i" 1) | $(median "$i" 2) | $ratio |\n"
  done
  # The longest single scripts: N sliding logs in one script of MODE
  # ("all": ALL_OR_NOTHING, "check": an independent batch's chunk), each
  # log filled by FILL with WINDOW; Redis time of that one call.
  one_script() {
    local label=$1 mode=$2 n=$3 fill=$4 window=$5 keys=() args=() v i
    redis-cli -p "$port" flushall >/dev/null
    for ((i = 0; i < n; i++)); do
      redis-cli -p "$port" eval "$fill" 1 "quotad:full|{t}$i|2G$window" "$now_ms" >/dev/null
      keys+=("quotad:full|{t}$i|2G$window")
      args+=(5 10000 "$window" 10000 1)
    done
    redis-cli -p "$port" config resetstat >/dev/null
    redis-cli -p "$port" evalsha "$sha" "$n" "${keys[@]}" "$mode" "$deadline" "" "${args[@]}" >/dev/null
    v=$(redis-cli -p "$port" info commandstats | tr -d '\r' | sed -nE 's/^cmdstat_evalsha:.*usec=([0-9]+),.*/\1/p')
    rows+="| $label | — | $v (one call) | — |\n"
  }
  # 9,999 entries that left a 10 s window, and one that has not: the next
  # check removes the 9,999 (each paid for by the check that added it).
  local expired='local now = tonumber(ARGV[1]) for i = 0, 9998 do redis.call("ZADD", KEYS[1], i, string.format("%d:1", now - 20000 + i)) end redis.call("ZADD", KEYS[1], 9999, string.format("%d:1", now - 1)) redis.call("PEXPIRE", KEYS[1], 86400000) return 1'
  now_ms=$(redis-cli -p "$port" time | head -n 1)000
  one_script "one ALL_OR_NOTHING script, 1,000 sliding logs at 10,000 entries (max_atomic_items raised to 1,000)" all 1000 "$fill" 86400000
  one_script "one ALL_OR_NOTHING script, 16 sliding logs (the most max_atomic_items allows by default) at 10,000 entries" all 16 "$fill" 86400000
  one_script "one script of an independent batch (16 sliding logs, its most), at 10,000 entries" check 16 "$fill" 86400000
  # Half left, half not: the search for the first live entry is longest.
  local half='local now = tonumber(ARGV[1]) for i = 0, 9999 do redis.call("ZADD", KEYS[1], i, string.format("%d:1", now - 15000 + i)) end redis.call("PEXPIRE", KEYS[1], 86400000) return 1'
  now_ms=$(redis-cli -p "$port" time | head -n 1)000
  one_script "one script of an independent batch (16 sliding logs), whose 9,999 of 10,000 entries left at once" check 16 "$expired" 10000
  now_ms=$(redis-cli -p "$port" time | head -n 1)000
  one_script "one ALL_OR_NOTHING script, 16 sliding logs whose 9,999 of 10,000 entries left at once" all 16 "$expired" 10000
  now_ms=$(redis-cli -p "$port" time | head -n 1)000
  one_script "one script of an independent batch (16 sliding logs), whose 5,000 of 10,000 entries left at once" check 16 "$half" 10000
  now_ms=$(redis-cli -p "$port" time | head -n 1)000
  one_script "one ALL_OR_NOTHING script, 16 sliding logs whose 5,000 of 10,000 entries left at once" all 16 "$half" 10000
  stop_server "$pid"
  printf '## Redis CPU per check: quotad next to a minimal script\n\n'
  printf 'Date: %s. Machine: %s cores, %s. redis-server %s. Load average before: %s.\n' "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(nproc)" \
    "$(sed -nE 's/^model name\s*:\s*//p' /proc/cpuinfo | head -n 1)" "$(redis-server --version | sed -nE 's/.*v=([0-9.]+).*/\1/p')" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"
  printf 'redis-benchmark -c 50 -n %s -r 100000 per row, %s rounds, rows interleaved; median (range).\n\n' "$n" "$reps"
  printf '| command | Redis process CPU µs per call | command µs per call (commandstats) | process CPU / minimal script (medians) |\n|---|---:|---:|---:|\n'
  printf "$rows"
}

if [[ -n ${REDIS_CPU_ONLY:-} ]]; then
  redis_cpu_rows
  exit 0
fi

if [[ -z ${SKIP_BUILD:-} ]]; then
  cargo build --release --quiet -p quotad --bin quotad
  cargo build --release --quiet -p quotad-bench --bins
fi

mkdir -p "$WORK/rls"
cat >"$WORK/rls/bench.yaml" <<EOF
# Written by scripts/bench.sh: limits no run can exhaust, one per
# descriptor key loadgen --mode rls sends (d0, d1, d2).
domain: bench
descriptors:
  - key: d0
    rate_limit: {unit: second, requests_per_unit: 4294967295}
  - key: d1
    rate_limit: {unit: second, requests_per_unit: 4294967295}
  - key: d2
    rate_limit: {unit: second, requests_per_unit: 4294967295}
EOF

cat >"$WORK/quotad.toml" <<EOF
# Written by scripts/bench.sh.
[server]
config_poll_interval = "0s"

[rls]
config_dir = "rls"

# Throughput: a fixed window whose limit no run reaches (10^12 per second).
[policies.bench]
algorithm = "fixed_window"
limit = 1000000000000
window = "1s"

# Correctness under load: a known budget on a hot key. An exact sliding
# log over a day: no window boundary can hand out a second budget.
[policies.budget]
algorithm = "sliding_log"
limit = $BUDGET
window = "1d"
EOF

LOAD_UNARY=(--mode unary --concurrency "$CONCURRENCY" --connections "$CONNECTIONS"
  --keys "$KEYS" --duration "$DURATION" --warmup "$WARMUP")
LOAD_RLS=(--mode rls --concurrency "$CONCURRENCY" --connections "$CONNECTIONS"
  --keys "$KEYS" --duration "$DURATION" --warmup "$WARMUP")
LOAD_BATCH=(--mode batch --batch-size "$BATCH_SIZE" --concurrency "$BATCH_CONCURRENCY"
  --connections "$CONNECTIONS" --keys "$KEYS" --duration "$DURATION" --warmup "$WARMUP")

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# --- the floor: noop-server -------------------------------------------------
target/release/noop-server --addr 127.0.0.1:0 --max-seconds "$SERVER_LIMIT" \
  --threads "$SERVER_THREADS" >"$WORK/noop.out" 2>"$WORK/noop.err" &
NOOP_PID=$!
STARTED+=("$NOOP_PID")
NOOP_ADDR=$(wait_for_addr "$WORK/noop.out" "$NOOP_PID" 's/^listening ([0-9.:]+)$/\1/p')

measured noop_unary "$NOOP_ADDR" "$NOOP_PID" --policy bench "${LOAD_UNARY[@]}"
loadgen noop_batch "$NOOP_ADDR" --policy bench "${LOAD_BATCH[@]}"

# --- quotad -----------------------------------------------------------------
# `timeout` forwards our SIGTERM to quotad, and stops it by itself otherwise.
NO_COLOR=1 QUOTAD_LOG_LEVEL=warn,quotad=info timeout "$SERVER_LIMIT" target/release/quotad serve \
  --config "$WORK/quotad.toml" --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 \
  --worker-threads "$SERVER_THREADS" >"$WORK/quotad.out" 2>"$WORK/quotad.err" &
QUOTAD_PID=$!
STARTED+=("$QUOTAD_PID")
QUOTAD_ADDR=$(wait_for_addr "$WORK/quotad.err" "$QUOTAD_PID" 's/.*grpc_addr=([0-9.:]+).*/\1/p')
# The server itself, not the `timeout` in front of it.
QUOTAD_SERVER_PID=$(awk '{print $1}' "/proc/$QUOTAD_PID/task/$QUOTAD_PID/children")

measured quotad_unary "$QUOTAD_ADDR" "$QUOTAD_SERVER_PID" --policy bench "${LOAD_UNARY[@]}"
loadgen quotad_batch "$QUOTAD_ADDR" --policy bench "${LOAD_BATCH[@]}"
for i in $(seq "$RLS_REPEAT"); do
  for d in 1 3; do
    measured "noop_rls${d}_$i" "$NOOP_ADDR" "$NOOP_PID" "${LOAD_RLS[@]}" --descriptors "$d"
    measured "quotad_rls${d}_$i" "$QUOTAD_ADDR" "$QUOTAD_SERVER_PID" "${LOAD_RLS[@]}" --descriptors "$d"
  done
done
CORRECT=yes
loadgen quotad_budget "$QUOTAD_ADDR" --policy budget --keys hot \
  --concurrency "$CONCURRENCY" --connections "$CONNECTIONS" \
  --requests "$CORRECTNESS_REQUESTS" --expect-allowed "$BUDGET" || CORRECT=no

PEAK=$(field quotad_unary '.requests_per_sec')
HALF=$(jq -n "($PEAK / 2) | floor")
if [[ $HALF -lt 1 ]]; then
  echo "bench.sh: quotad's unary peak is $PEAK req/s; nothing to halve" >&2
  exit 1
fi
loadgen quotad_half "$QUOTAD_ADDR" --policy bench "${LOAD_UNARY[@]}" --rate "$HALF"
stop_server "$QUOTAD_PID"

# The floor at the same rate, on the same noop-server (idle while quotad ran).
loadgen noop_half "$NOOP_ADDR" --policy bench "${LOAD_UNARY[@]}" --rate "$HALF"
stop_server "$NOOP_PID"

# --- the Redis backend (when redis-server and redis-benchmark exist) ---------
# quotad on a Redis of its own, next to redis-benchmark running quotad's own
# script by EVALSHA on that Redis: the floor for any Redis-backed decision.
REDIS_ROWS=""
if command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null; then
  start_redis "$SERVER_LIMIT" "$WORK/redis.out"
  REDIS_PORT=$REDIS_STARTED_PORT REDIS_PID=$REDIS_STARTED_PID
  NO_COLOR=1 QUOTAD_LOG_LEVEL=warn,quotad=info timeout "$SERVER_LIMIT" target/release/quotad serve \
    --config "$WORK/quotad.toml" --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 \
    --worker-threads "$SERVER_THREADS" --backend redis \
    --redis-url "redis://127.0.0.1:$REDIS_PORT/" --redis-timeout 1s \
    >"$WORK/quotad-redis.out" 2>"$WORK/quotad-redis.err" &
  QUOTAD_REDIS_PID=$!
  STARTED+=("$QUOTAD_REDIS_PID")
  QUOTAD_REDIS_ADDR=$(wait_for_addr "$WORK/quotad-redis.err" "$QUOTAD_REDIS_PID" 's/.*grpc_addr=([0-9.:]+).*/\1/p')
  loadgen redis_unary "$QUOTAD_REDIS_ADDR" --policy bench "${LOAD_UNARY[@]}"
  REDIS_CORRECT=yes
  loadgen redis_budget "$QUOTAD_REDIS_ADDR" --policy budget --keys hot \
    --concurrency "$CONCURRENCY" --connections "$CONNECTIONS" \
    --requests "$CORRECTNESS_REQUESTS" --expect-allowed "$BUDGET" || REDIS_CORRECT=no
  stop_server "$QUOTAD_REDIS_PID"

  SHA=$(redis-cli -p "$REDIS_PORT" script load "$(cat src/backend/redis/quota.lua)")
  REDIS_REQUESTS=$(( $(field redis_unary .requests_per_sec | cut -d. -f1) * DURATION ))
  [[ $REDIS_REQUESTS -gt 10000 ]] || REDIS_REQUESTS=10000
  timeout $((DURATION * 5 + 30)) redis-benchmark -p "$REDIS_PORT" -c "$CONCURRENCY" \
    -n "$REDIS_REQUESTS" -r 100000 --csv \
    EVALSHA "$SHA" 1 "quotad:bench|{key:__rand_int__}" check "" \
    1 1000000000000 1000 1000000000000 1 >"$WORK/redis-benchmark.csv"
  stop_server "$REDIS_PID"
  # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
  IFS=, read -r _ RB_RPS _ _ RB_P50 _ RB_P99 _ < <(tail -n 1 "$WORK/redis-benchmark.csv" | tr -d '"')
  us() { jq -n "$1 * 1000 | floor"; }
  REDIS_RATIO=$(jq -n "$(field redis_unary .requests_per_sec) / $RB_RPS * 100 | round / 100")
  REDIS_ROWS="
## Redis backend: quotad next to EVALSHA of its script

| run | requests/s | p50 µs | p99 µs | errors |
|---|---:|---:|---:|---:|
| quotad on Redis, unary Check, c=$CONCURRENCY over $CONNECTIONS conns | $(fmt0 redis_unary .requests_per_sec) | $(fmt0 redis_unary .latency.p50_us) | $(fmt0 redis_unary .latency.p99_us) | $(field redis_unary .errors) |
| redis-benchmark EVALSHA quota.lua, c=$CONCURRENCY, random keys | ${RB_RPS%.*} | $(us "$RB_P50") | $(us "$RB_P99") | — |

quotad on Redis / EVALSHA floor: $REDIS_RATIO x. Hot key, budget $BUDGET, $CORRECTNESS_REQUESTS checks through quotad on Redis: $(field redis_budget .allowed) allowed ($REDIS_CORRECT)."
else
  echo "bench.sh: redis-server or redis-benchmark missing; skipping the Redis rows" >&2
fi
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# --- the table --------------------------------------------------------------
row() { # label server report
  printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$1" "$2" \
    "$(fmt0 "$3" .requests_per_sec)" "$(fmt0 "$3" .decisions_per_sec)" \
    "$(fmt0 "$3" .latency.p50_us)" "$(fmt0 "$3" .latency.p99_us)" \
    "$(fmt0 "$3" .latency.p999_us)" "$(field "$3" '.errors')"
}
met() { if jq -en "$1" >/dev/null; then echo yes; else echo "**no**"; fi; }

UNARY_RATIO=$(jq -n "$(field quotad_unary .requests_per_sec) / $(field noop_unary .requests_per_sec) * 100 | round / 100")
BATCH_RATIO=$(jq -n "$(field quotad_batch .decisions_per_sec) / $(field noop_batch .decisions_per_sec) * 100 | round / 100")
BATCH_DPS=$(fmt0 quotad_batch .decisions_per_sec)
HALF_P99=$(fmt0 quotad_half .latency.p99_us)

cat <<EOF

## gRPC: quotad next to the no-op floor

Date: $(date -u '+%Y-%m-%d %H:%M UTC'). Machine: $(nproc) cores, $(sed -nE 's/^model name\s*:\s*//p' /proc/cpuinfo | head -n 1).
Load average before / after: $LOAD_BEFORE / $LOAD_AFTER.
loadgen: $LOADGEN_THREADS runtime thread(s), on the same box as the server; servers: $SERVER_THREADS worker thread(s) each; keys $KEYS;
closed-loop runs measure ${DURATION} s after a ${WARMUP} s warmup.

| run | server | requests/s | decisions/s | p50 µs | p99 µs | p99.9 µs | errors |
|---|---|---:|---:|---:|---:|---:|---:|
$(row "unary Check, c=$CONCURRENCY over $CONNECTIONS conns" noop noop_unary)
$(row "unary Check, c=$CONCURRENCY over $CONNECTIONS conns" quotad quotad_unary)
$(row "CheckBatch($BATCH_SIZE), c=$BATCH_CONCURRENCY over $CONNECTIONS conns" noop noop_batch)
$(row "CheckBatch($BATCH_SIZE), c=$BATCH_CONCURRENCY over $CONNECTIONS conns" quotad quotad_batch)
$(row "unary at $HALF req/s (half of quotad's peak), open loop" noop noop_half)
$(row "unary at $HALF req/s (half of quotad's peak), open loop" quotad quotad_half)

Open-loop latencies count from each request's scheduled send time. Of that,
the time before a request left loadgen (send lag: a busy worker, timer slack,
loadgen's own CPU) was at p99 $(fmt0 noop_half .send_lag.p99_us) µs against noop and $(fmt0 quotad_half .send_lag.p99_us) µs against quotad.

| target (issue 6) | measured | met? |
|---|---:|---|
| unary Check >= 0.90 x the no-op floor | $UNARY_RATIO x | $(met "$UNARY_RATIO >= 0.90") |
| CheckBatch($BATCH_SIZE) >= 1,000,000 decisions/s | $BATCH_DPS (quotad / noop = $BATCH_RATIO x) | $(met "$BATCH_DPS >= 1000000") |
| p99 at half of peak <= 1 ms | $HALF_P99 µs | $(met "$HALF_P99 <= 1000") |
| hot key, budget $BUDGET, $CORRECTNESS_REQUESTS checks at c=$CONCURRENCY: allowed = $BUDGET | $(field quotad_budget .allowed) allowed, $(field quotad_budget .denied) denied, $(field quotad_budget .errors) errors | $CORRECT |
EOF
# rls_row LABEL SERVER REPORT
rls_row() {
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$1" "$2" \
    "$(fmt0 "$3" .requests_per_sec)" "$(fmt0 "$3" .latency.p50_us)" \
    "$(fmt0 "$3" .latency.p99_us)" "$(cpu_per_call "$3")" "$(field "$3" '.errors')"
}
above() { jq -n "($(cpu_per_call "$1") - $(cpu_per_call "$2")) * 100 | round / 100"; }
ratio() { jq -n "$(field "$1" .requests_per_sec) / $(field "$2" .requests_per_sec) * 100 | round / 100"; }
median() { printf '%s\n' "$@" | jq -s 'sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end | . * 100 | round / 100'; }
# rls_pairs D : "median-above median-ratio" over the pairs of D descriptors
rls_pairs() {
  local d=$1 i aboves=() ratios=()
  for i in $(seq "$RLS_REPEAT"); do
    aboves+=("$(above "quotad_rls${d}_$i" "noop_rls${d}_$i")")
    ratios+=("$(ratio "quotad_rls${d}_$i" "noop_rls${d}_$i")")
  done
  echo "$(median "${aboves[@]}") $(median "${ratios[@]}")"
}
read -r RLS1_ABOVE RLS1_RATIO < <(rls_pairs 1)
read -r RLS3_ABOVE RLS3_RATIO < <(rls_pairs 3)
UNARY_ABOVE=$(above quotad_unary noop_unary)
RLS_ROWS=$(for i in $(seq "$RLS_REPEAT"); do
  for d in 1 3; do
    rls_row "ShouldRateLimit, $d descriptor(s), c=$CONCURRENCY, pair $i" noop "noop_rls${d}_$i"
    rls_row "ShouldRateLimit, $d descriptor(s), c=$CONCURRENCY, pair $i" quotad "quotad_rls${d}_$i"
  done
done)
cat <<EOF

## Envoy RLS: ShouldRateLimit next to the no-op floor

Same servers and settings as above; quotad serves one rule per descriptor key
(fixed window, memory store), the no-op server answers every descriptor OK at
once with a status of the same size. Server CPU is the server process's user
+ system time over the whole run (warmup included) divided by its requests.
Runs alternate noop and quotad, $RLS_REPEAT pairs per descriptor count.

| run | server | requests/s | p50 µs | p99 µs | server CPU µs/call | errors |
|---|---|---:|---:|---:|---:|---:|
$(rls_row "unary Check, c=$CONCURRENCY over $CONNECTIONS conns" noop noop_unary)
$(rls_row "unary Check, c=$CONCURRENCY over $CONNECTIONS conns" quotad quotad_unary)
$RLS_ROWS

| target | measured | met? |
|---|---:|---|
| RLS, 1 descriptor: server CPU per call within 1 µs of the floor (median of $RLS_REPEAT pairs) | +$RLS1_ABOVE µs (throughput quotad / noop = $RLS1_RATIO x) | $(met "$RLS1_ABOVE <= 1") |
| RLS, 3 descriptors: server CPU per call within 1 µs of the floor (median of $RLS_REPEAT pairs) | +$RLS3_ABOVE µs (throughput quotad / noop = $RLS3_RATIO x) | $(met "$RLS3_ABOVE <= 1") |
| (for comparison) unary Check, server CPU above the floor | +$UNARY_ABOVE µs (throughput $UNARY_RATIO x) | — |
EOF
echo "$REDIS_ROWS"
if command -v redis-benchmark >/dev/null; then echo; redis_cpu_rows; fi
if [[ $KEEP_WORK == 1 ]]; then echo; echo "Reports and logs: $WORK"; fi
