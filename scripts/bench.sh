#!/usr/bin/env bash
# Reproduces the gRPC rows of BENCHMARKS.md in one bounded command:
#
#   scripts/bench.sh                        # ~12 min after the build; prints markdown tables
#   DURATION=5 WARMUP=1 scripts/bench.sh    # a quicker, noisier pass
#
# What it does, all on this machine (127.0.0.1 and unix sockets in a
# private temporary folder):
#   1. builds the release binaries: quotad, loadgen, noop-server;
#   2. starts the floor (noop-server: quotad's APIs answering at once) and
#      quotad, each on TCP and on a unix socket (and ALT_QUOTAD_BIN on TCP,
#      when set), and fills quotad's store with every key the runs use;
#   3. runs ROUNDS rounds; in each, every row runs on the floor and then on
#      quotad (then on the alternative), so that all see the same background
#      load: unary Check; CheckBatch(BATCH_SIZE) with a named and with an
#      inline policy; unary Check over the unix sockets; CONCURRENCY callers
#      of one quotad-client, without and with coalescing; Envoy's
#      ShouldRateLimit with one and three descriptors; and, on quotad alone,
#      CONCURRENCY callers of one hot key over its limit without and with the
#      client's deny cache. Each server's CPU time (utime + stime from
#      /proc/PID/stat) is read around each of its runs;
#   4. runs the client open loop at half of quotad's uncoalesced peak,
#      without and with coalescing, ROUNDS times, for the p99; then a
#      correctness run (CORRECTNESS_REQUESTS checks on one hot key under
#      `budget`: exactly 1,000 must be allowed);
#   5. prints markdown tables: server CPU per decision (or per call) above
#      the floor, medians of the rounds with every round's difference, and
#      the targets; coalescing; the deny cache; unix socket against TCP; the
#      alternative build, when set. Only one server is under load at a time
#      (the others idle), and loadgen shares the 2 cores with it.
#
# Bounded: every loadgen run has a --duration (WARMUP + DURATION seconds, 12 s
# by default) or a request count, and runs under `timeout`; each server
# stops by itself (noop-server --max-seconds; quotad under `timeout`) even
# if this script is killed with SIGKILL. An EXIT trap stops the processes
# this script started, by PID and nothing else. A cold release build takes
# minutes more.
#
# Settings (environment):
#   DURATION=10 WARMUP=2          seconds measured / not measured, per run
#   ROUNDS=3                      rounds of alternating runs (RLS_REPEAT, the
#                                 older name, is read when ROUNDS is unset)
#   CONCURRENCY=64 CONNECTIONS=2  unary, RLS and client runs (the client uses
#                                 one connection)
#   BATCH_SIZE=100 BATCH_CONCURRENCY=8
#   KEYS=uniform:100000           loadgen --keys for the throughput runs
#   INLINE=fixed_window:1000000:1000  the inline policy of the inline row
#   HOT_LIMIT=1000                the hot key's limit per second (deny cache)
#   COALESCE_SLOTS=2              the coalescing client's calls in flight, in
#                                 the rows next to the client's default (8)
#   LOADGEN_THREADS=1             loadgen runtime threads (the box has 2 cores)
#   SERVER_THREADS=1              worker threads of every server, the same for
#                                 each: with loadgen on one core, one each
#                                 (two workers on the shared cores were
#                                 measured slower and with a worse p99)
#   CORRECTNESS_REQUESTS=5000
#   QUOTAD_BIN=target/release/quotad   NOOP_BIN=target/release/noop-server
#   ALT_QUOTAD_BIN=PATH ALT_LABEL=NAME another quotad build in the same
#                                 rounds (e.g. another allocator)
#   SKIP_BUILD=1                  use the binaries already built
#   OUT=DIR                       keep every JSON report and server log in DIR
#   REDIS_CPU_ONLY=1              only the Redis CPU table (redis-benchmark, ~1 min)
#   REDIS_CPU_REQUESTS=200000     calls per row of that table
#   REDIS_CPU_REPS=3               rounds of it (medians reported)
#   REDIS_CPU_OLD=REV             add a row for the script at git revision REV
#                                 (one that takes a deadline: 6353d61 or later)
#   LEASES_ONLY=1                 only the leases tables (~3 min after the
#                                 build): quotad-client with leases on and off,
#                                 memory and Redis, and near exhaustion
#   LEASE_ROUNDS=3 LEASE_DURATION=5 LEASE_WARMUP=1   their rounds and seconds
#   LEASE_KEYS=1000               the many-keys row's keys (at most the
#                                 client's 10,000 leased keys)
#   LEASE_MAX_UNITS=100000        lease.max_units of `leased`, and the want
#   LEASE_NEAR_LIMIT=2000 LEASE_NEAR_REQUESTS=20000   the near-exhaustion run
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
ROUNDS=${ROUNDS:-${RLS_REPEAT:-3}}
INLINE=${INLINE:-fixed_window:1000000:1000}
HOT_LIMIT=${HOT_LIMIT:-1000}
# The coalescing client's second setting: calls in flight before checks
# queue (the client's default, 8, is the first).
COALESCE_SLOTS=${COALESCE_SLOTS:-2}
QUOTAD_BIN=${QUOTAD_BIN:-target/release/quotad}
NOOP_BIN=${NOOP_BIN:-target/release/noop-server}
ALT_QUOTAD_BIN=${ALT_QUOTAD_BIN:-}
ALT_LABEL=${ALT_LABEL:-alternative}
# Batches of 1,000 that the prefill sends per namespace: about 3 x KEYS
# draws, which leave ~5% of the keys unseen.
PREFILL_BATCHES=${PREFILL_BATCHES:-300}
# Seconds of ShouldRateLimit with three descriptors, for the RLS keys.
PREFILL_RLS_SECS=${PREFILL_RLS_SECS:-8}
BUDGET=1000
# The leases section (LEASES_ONLY=1).
LEASE_ROUNDS=${LEASE_ROUNDS:-3}
LEASE_DURATION=${LEASE_DURATION:-5}
LEASE_WARMUP=${LEASE_WARMUP:-1}
LEASE_KEYS=${LEASE_KEYS:-1000}
LEASE_MAX_UNITS=${LEASE_MAX_UNITS:-100000}
LEASE_NEAR_LIMIT=${LEASE_NEAR_LIMIT:-2000}
LEASE_NEAR_REQUESTS=${LEASE_NEAR_REQUESTS:-20000}

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
  LOADGEN_THREADS SERVER_THREADS CORRECTNESS_REQUESTS ROUNDS HOT_LIMIT PREFILL_BATCHES \
  PREFILL_RLS_SECS COALESCE_SLOTS LEASE_ROUNDS LEASE_DURATION LEASE_WARMUP LEASE_KEYS \
  LEASE_MAX_UNITS LEASE_NEAR_LIMIT LEASE_NEAR_REQUESTS; do
  [[ ${!setting} =~ ^[0-9]+$ ]] || { echo "bench.sh: $setting must be a whole number" >&2; exit 2; }
done
RUN_SECS=$((WARMUP + DURATION))
# Hard bound per loadgen run: its own duration, one request timeout, slack.
LOADGEN_LIMIT=$((RUN_SECS + 30))
# Each server outlives every run this script could make (per round at most
# 27 runs and 3 open-loop runs, then the correctness and Redis runs), then
# stops by itself.
SERVER_LIMIT=$(((10 + 30 * ROUNDS) * LOADGEN_LIMIT + 60))
CLK_TCK=$(getconf CLK_TCK)

# loadgen NAME ADDR ARGS... : one run, JSON report in $WORK/NAME.json; its
# exit status. Run in the background and waited for, so that SIGINT/SIGTERM
# reach the trap at once instead of after the run.
loadgen() {
  local name=$1 addr=$2 pid status=0
  shift 2
  echo "bench.sh: $name" >&2
  [[ $addr == unix:* ]] || addr=http://$addr
  timeout "$LOADGEN_LIMIT" target/release/loadgen --addr "$addr" \
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

mkdir -p "$WORK/rls" "$WORK/uds"
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

# The deny cache: one hot key over its limit most of each second.
[policies.hot]
algorithm = "fixed_window"
limit = $HOT_LIMIT
window = "1s"
EOF

cat >>"$WORK/quotad.toml" <<EOF

# Leases far from exhaustion: a limit no run reaches; leases of up to
# LEASE_MAX_UNITS units (about what one client spends in a second here, as
# docs/leases.md advises), which also end with each minute's window.
[policies.leased]
algorithm = "fixed_window"
limit = 1000000000000
window = "1m"
lease = { max_units = $LEASE_MAX_UNITS, min_units = 100, max_ttl = "10s" }

# Leases near exhaustion: a day-long sliding log of LEASE_NEAR_LIMIT; fair
# shares fall below min_units well before the end, and the rest is direct.
[policies.near]
algorithm = "sliding_log"
limit = $LEASE_NEAR_LIMIT
window = "1d"
lease = { max_units = 100, min_units = 50, max_ttl = "10s" }
EOF

# Every run of a kind draws from the same keys (a fixed prefix), and a
# prefill puts them all in quotad's store first: each round measures the
# same steady state, a store of KEYS keys per namespace.
LOAD_UNARY=(--mode unary --concurrency "$CONCURRENCY" --connections "$CONNECTIONS"
  --keys "$KEYS" --key-prefix bench: --duration "$DURATION" --warmup "$WARMUP")
LOAD_RLS=(--mode rls --concurrency "$CONCURRENCY" --connections "$CONNECTIONS"
  --keys "$KEYS" --key-prefix bench: --duration "$DURATION" --warmup "$WARMUP")
LOAD_BATCH=(--mode batch --batch-size "$BATCH_SIZE" --concurrency "$BATCH_CONCURRENCY"
  --connections "$CONNECTIONS" --keys "$KEYS" --key-prefix bench: --duration "$DURATION"
  --warmup "$WARMUP")
# CONCURRENCY callers of one client (one connection), as in one application.
LOAD_CLIENT=(--mode client --concurrency "$CONCURRENCY" --connections 1
  --keys "$KEYS" --key-prefix bench: --duration "$DURATION" --warmup "$WARMUP")
LOAD_HOT=(--mode client --concurrency "$CONCURRENCY" --connections 1
  --keys hot --key-prefix hot: --duration "$DURATION" --warmup "$WARMUP")

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# start_noop ADDR : a noop-server listening on ADDR (HOST:PORT or
# unix:///PATH); sets STARTED_PID and STARTED_ADDR.
start_noop() {
  local log=$WORK/noop-$((${#STARTED[@]})) pid
  "$NOOP_BIN" --addr "$1" --max-seconds "$SERVER_LIMIT" \
    --threads "$SERVER_THREADS" >"$log.out" 2>"$log.err" &
  pid=$!
  STARTED+=("$pid")
  STARTED_ADDR=$(wait_for_addr "$log.out" "$pid" 's/^listening ([^ ]+)$/\1/p')
  STARTED_PID=$pid
}

# --- leases (LEASES_ONLY=1) ------------------------------------------------------
# CONCURRENCY callers of one quotad-client (one connection, no coalescing,
# no deny cache) under `leased`, with leases on (loadgen --mode lease) and
# off (--mode client: each check one unary Check), alternated in each of
# LEASE_ROUNDS rounds, on one hot key and on LEASE_KEYS keys; quotad's CPU
# (and on Redis the redis-server's) read from /proc around each run, and
# loadgen's own CPU from its report. Then near exhaustion: a hot key under
# `near` until LEASE_NEAR_REQUESTS checks, with leases on: exactly
# LEASE_NEAR_LIMIT must be allowed, and quotad's /metrics counts the Lease
# and Check calls it took. Memory backend, then Redis (when redis-server is
# installed). About 3 minutes after the build with the defaults.
lease_round_rows() { # BACKEND QUOTAD_PID REDIS_PID(or empty)
  local backend=$1 qpid=$2 rpid=$3 r keys kind name rbefore
  for r in $(seq "$LEASE_ROUNDS"); do
    for keys in hot "uniform:$LEASE_KEYS"; do
      kind=${keys%%:*}
      for mode in lease client; do
        name="${backend}_${mode}_${kind}_$r"
        if [[ -n $rpid ]]; then rbefore=$(cpu_ticks "$rpid"); fi
        measured "$name" "$QUOTAD_LEASE_ADDR" "$qpid" --mode "$mode" --lease-want "$LEASE_MAX_UNITS" \
          --policy leased --coalescing off --deny-cache off --concurrency "$CONCURRENCY" \
          --connections 1 --keys "$keys" --key-prefix "lease-$kind:" \
          --duration "$LEASE_DURATION" --warmup "$LEASE_WARMUP"
        if [[ -n $rpid ]]; then echo $(($(cpu_ticks "$rpid") - rbefore)) >"$WORK/$name.rcpu"; fi
      done
    done
  done
}

# metric ADMIN NAME_AND_LABELS : the sum of the matching series on /metrics.
metric() {
  # A series not yet written is 0 (awk, not grep, so that no match is no failure).
  curl -sf --max-time 5 "http://$1/metrics" | awk -v m="$2" 'index($0, m) == 1 { s += $2 } END { print s + 0 }'
}

lease_near() { # BACKEND ADMIN
  local backend=$1 admin=$2 m before=() after=() status=yes
  local series=('quotad_decision_duration_seconds_count{method="lease"}'
    'quotad_decision_duration_seconds_count{method="check"}'
    'quotad_leases_total{policy="near",outcome="granted"}'
    'quotad_leases_total{policy="near",outcome="direct"}')
  for m in "${series[@]}"; do before+=("$(metric "$admin" "$m")"); done
  loadgen "${backend}_near" "$QUOTAD_LEASE_ADDR" --mode lease --lease-want 100 --policy near \
    --coalescing off --deny-cache off --concurrency "$CONCURRENCY" --connections 1 --keys hot \
    --requests "$LEASE_NEAR_REQUESTS" --expect-allowed "$LEASE_NEAR_LIMIT" || status=no
  for m in "${series[@]}"; do after+=("$(metric "$admin" "$m")"); done
  printf '%s %s %s %s %s\n' "$status" $((after[0] - before[0])) $((after[1] - before[1])) \
    $((after[2] - before[2])) $((after[3] - before[3])) >"$WORK/${backend}_near.calls"
}

leases_section() {
  LEASE_LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
  QUOTAD_TIMEOUT_PIDS=()
  start_quotad "$QUOTAD_BIN" 127.0.0.1:0
  QUOTAD_LEASE_ADDR=$STARTED_ADDR
  local qpid=$STARTED_PID admin=$STARTED_ADMIN tpid=${QUOTAD_TIMEOUT_PIDS[-1]}
  lease_round_rows memory "$qpid" ""
  lease_near memory "$admin"
  stop_server "$tpid"
  local backends=(memory)
  if command -v redis-server >/dev/null; then
    start_redis "$SERVER_LIMIT" "$WORK/redis-lease.out"
    local rport=$REDIS_STARTED_PORT rtpid=$REDIS_STARTED_PID rpid
    # The redis-server itself, not the `timeout` in front of it.
    rpid=$(redis-cli -p "$rport" info server | tr -d '\r' | sed -nE 's/^process_id:([0-9]+)/\1/p')
    start_quotad "$QUOTAD_BIN" 127.0.0.1:0 --backend redis \
      --redis-url "redis://127.0.0.1:$rport/" --redis-timeout 1s
    QUOTAD_LEASE_ADDR=$STARTED_ADDR
    qpid=$STARTED_PID admin=$STARTED_ADMIN tpid=${QUOTAD_TIMEOUT_PIDS[-1]}
    lease_round_rows redis "$qpid" "$rpid"
    lease_near redis "$admin"
    stop_server "$tpid"
    stop_server "$rtpid"
    backends+=(redis)
  else
    echo "bench.sh: redis-server missing; skipping the Redis lease rows" >&2
  fi
  LEASE_LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

  # us_per NAME EXT : CPU µs per decision of run NAME from its EXT ticks.
  us_per() {
    jq -rn --argjson ticks "$(cat "$WORK/$1.$2")" --argjson hz "$CLK_TCK" --slurpfile r "$WORK/$1.json" \
      '($ticks * 1000000 / $hz) / ($r[0].requests + $r[0].warmup_requests)'
  }
  med() { printf '%s\n' "$@" | jq -s 'sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end'; }
  each() { # BACKEND MODE KIND FN ARGS... : FN of every round
    local r b=$1 m=$2 k=$3 fn=$4
    shift 4
    for r in $(seq "$LEASE_ROUNDS"); do "$fn" "${b}_${m}_${k}_$r" "$@"; done
  }
  jf() { jq -r "$2" "$WORK/$1.json"; }
  x2() { jq -n "$1 * 100 | round / 100"; }
  x3() { jq -n "$1 * 1000 | round / 1000"; }
  lst() { local v; for v in "$@"; do printf '%s, ' "$(x3 "$v")"; done | sed 's/, $//'; }
  ratios() { # BACKEND KIND EXT : unary / lease CPU per decision, each round
    local r
    for r in $(seq "$LEASE_ROUNDS"); do
      jq -n "$(us_per "$1_client_$2_$r" "$3") / $(us_per "$1_lease_$2_$r" "$3")"
    done
  }
  lease_row() { # BACKEND KIND LABEL
    local b=$1 k=$2 lcpu ucpu ratio
    lcpu=$(med $(each "$b" lease "$k" us_per cpu))
    ucpu=$(med $(each "$b" client "$k" us_per cpu))
    ratio=$(jq -n "$ucpu / $lcpu")
    printf '| %s | %s | %s | %s | %s (%s) | %s (%s) | %s x (%s) | %s | %s | %s | %s / %s |' "$b" "$3" \
      "$(jq -n "$(med $(each "$b" lease "$k" jf .decisions_per_sec)) | floor")" \
      "$(jq -n "$(med $(each "$b" client "$k" jf .decisions_per_sec)) | floor")" \
      "$(x3 "$lcpu")" "$(lst $(each "$b" lease "$k" us_per cpu))" \
      "$(x3 "$ucpu")" "$(lst $(each "$b" client "$k" us_per cpu))" \
      "$(x2 "$ratio")" "$(lst $(ratios "$b" "$k" cpu))" \
      "$(if jq -en "$ratio >= 20" >/dev/null; then echo yes; else echo '**no**'; fi)" \
      "$(x3 "$(med $(each "$b" lease "$k" jf .client_calls.calls_per_decision))")" \
      "$(x3 "$(med $(each "$b" lease "$k" jf .leases.local_share))")" \
      "$(x3 "$(med $(each "$b" lease "$k" jf .loadgen_cpu_us_per_decision))")" \
      "$(x3 "$(med $(each "$b" client "$k" jf .loadgen_cpu_us_per_decision))")"
    echo
  }
  redis_row() { # KIND LABEL
    local k=$1 lcpu ucpu
    lcpu=$(med $(each redis lease "$k" us_per rcpu))
    ucpu=$(med $(each redis client "$k" us_per rcpu))
    printf '| %s | %s (%s) | %s (%s) | %s x (%s) |\n' "$2" "$(x3 "$lcpu")" "$(lst $(each redis lease "$k" us_per rcpu))" \
      "$(x3 "$ucpu")" "$(lst $(each redis client "$k" us_per rcpu))" \
      "$(if jq -en "$lcpu > 0" >/dev/null; then x2 "$(jq -n "$ucpu / $lcpu")"; else echo "over ∞"; fi)" \
      "$(lst $(ratios redis "$k" rcpu))"
  }
  cat <<EOF

## Leases: quotad-client with leases on and off

Date: $(date -u '+%Y-%m-%d %H:%M UTC'). Machine: $(nproc) cores, $(sed -nE 's/^model name\s*:\s*//p' /proc/cpuinfo | head -n 1).
Load average before / after: $LEASE_LOAD_BEFORE / $LEASE_LOAD_AFTER. quotad: $QUOTAD_BIN, $SERVER_THREADS worker thread(s);
loadgen: $LOADGEN_THREADS runtime thread(s), $CONCURRENCY callers of one quotad-client (one connection, no coalescing,
no deny cache), leases of up to $LEASE_MAX_UNITS units (policy \`leased\`: fixed_window, 10^12 a minute,
lease = { max_units = $LEASE_MAX_UNITS, min_units = 100, max_ttl = "10s" }) against the same client with leases off (one
unary Check per decision); $LEASE_ROUNDS rounds, each alternating leases and unary on a hot key and on $LEASE_KEYS keys;
${LEASE_DURATION} s measured after ${LEASE_WARMUP} s of warmup. CPU per decision: user + system time from /proc/PID/stat over
the run (warmup included) divided by its decisions (warmup included); medians of the rounds (each round's figure in
brackets). loadgen CPU: its own process CPU clock over the run, harness included.

| backend | keys | decisions/s, leases | decisions/s, unary | quotad CPU µs per decision, leases | quotad CPU µs per decision, unary | unary / leases (rounds) | >= 20 x | calls per decision, leases | local share, leases | loadgen CPU µs per decision, leases / unary |
|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|
$(for b in "${backends[@]}"; do lease_row "$b" hot "one hot key"; lease_row "$b" uniform "$LEASE_KEYS keys"; done)
EOF
  if [[ " ${backends[*]} " == *" redis "* ]]; then
    cat <<EOF

Redis CPU per decision (the redis-server process, /proc/PID/stat), same runs:

| keys | leases | unary | unary / leases (rounds) |
|---|---:|---:|---:|
$(redis_row hot "one hot key")
$(redis_row uniform "$LEASE_KEYS keys")
EOF
  fi
  cat <<EOF

Near exhaustion: one hot key under \`near\` (sliding_log, $LEASE_NEAR_LIMIT a day, lease = { max_units = 100, min_units = 50,
max_ttl = "10s" }), $LEASE_NEAR_REQUESTS checks by $CONCURRENCY callers with leases on (want 100); calls counted from quotad's
/metrics around the run (\`quotad_decision_duration_seconds_count\` by method, \`quotad_leases_total\`):

| backend | allowed (expected $LEASE_NEAR_LIMIT) | denied | exact | Lease calls | of which granted / direct | Check calls | local admissions (client) |
|---|---:|---:|---|---:|---:|---:|---:|
$(for b in "${backends[@]}"; do
  read -r ok lc cc gr di <"$WORK/${b}_near.calls"
  echo "| $b | $(jf "${b}_near" .allowed) | $(jf "${b}_near" .denied) | $ok | $lc | $gr / $di | $cc | $(jf "${b}_near" .leases.local_admissions) |"
done)
EOF
  if [[ $KEEP_WORK == 1 ]]; then echo; echo "Reports and logs: $WORK"; fi
}

# start_quotad BIN GRPC_ADDR [ARGS...] : quotad (BIN) serving on GRPC_ADDR
# with the extra serve ARGS; sets STARTED_PID (the server, not the `timeout`
# in front of it, which forwards our SIGTERM and stops it by itself
# otherwise), STARTED_ADDR and STARTED_ADMIN (its admin HOST:PORT).
start_quotad() {
  local log=$WORK/quotad-$((${#STARTED[@]})) pid bin=$1 addr=$2
  shift 2
  NO_COLOR=1 QUOTAD_LOG_LEVEL=warn,quotad=info timeout "$SERVER_LIMIT" "$bin" serve \
    --config "$WORK/quotad.toml" --grpc-addr "$addr" --admin-addr 127.0.0.1:0 \
    --worker-threads "$SERVER_THREADS" "$@" >"$log.out" 2>"$log.err" &
  pid=$!
  STARTED+=("$pid")
  STARTED_ADDR=$(wait_for_addr "$log.err" "$pid" 's/.*grpc_addr=([^ ]+).*/\1/p')
  STARTED_ADMIN=$(sed -nE 's/.*admin_addr=([^ ]+).*/\1/p' "$log.err" | head -n 1)
  STARTED_PID=$(awk '{print $1}' "/proc/$pid/task/$pid/children")
  QUOTAD_TIMEOUT_PIDS+=("$pid")
}

if [[ -n ${LEASES_ONLY:-} ]]; then
  leases_section
  exit 0
fi

QUOTAD_TIMEOUT_PIDS=()
start_noop 127.0.0.1:0
NOOP_PID=$STARTED_PID NOOP_ADDR=$STARTED_ADDR
start_noop "unix://$WORK/uds/noop.sock"
NOOP_UDS_PID=$STARTED_PID NOOP_UDS_ADDR=$STARTED_ADDR
start_quotad "$QUOTAD_BIN" 127.0.0.1:0
QUOTAD_PID=$STARTED_PID QUOTAD_ADDR=$STARTED_ADDR
start_quotad "$QUOTAD_BIN" "unix://$WORK/uds/quotad.sock"
QUOTAD_UDS_PID=$STARTED_PID QUOTAD_UDS_ADDR=$STARTED_ADDR
SERVERS=(noop quotad)
if [[ -n $ALT_QUOTAD_BIN ]]; then
  start_quotad "$ALT_QUOTAD_BIN" 127.0.0.1:0
  ALT_PID=$STARTED_PID ALT_ADDR=$STARTED_ADDR
  SERVERS+=(alt)
fi

# Prefill (not measured): every key of every namespace the runs use.
prefill() {
  local addr=$1
  loadgen "prefill_named_$2" "$addr" --policy bench --mode batch --batch-size 1000 \
    --concurrency 4 --keys "$KEYS" --key-prefix bench: --requests "$PREFILL_BATCHES"
  loadgen "prefill_inline_$2" "$addr" --inline "$INLINE" --mode batch --batch-size 1000 \
    --concurrency 4 --keys "$KEYS" --key-prefix bench: --requests "$PREFILL_BATCHES"
  loadgen "prefill_rls_$2" "$addr" --mode rls --descriptors 3 --concurrency "$CONCURRENCY" \
    --keys "$KEYS" --key-prefix bench: --duration "$PREFILL_RLS_SECS"
}
prefill "$QUOTAD_ADDR" quotad
prefill "$QUOTAD_UDS_ADDR" quotad_uds
[[ -n $ALT_QUOTAD_BIN ]] && prefill "$ALT_ADDR" alt

# pair ROW ROUND FLOOR_ADDR FLOOR_PID QUOTAD_ADDR QUOTAD_PID ARGS... : the
# row's run on the floor, then on quotad; each server's CPU time is read
# around its own run.
pair() {
  local row=$1 round=$2 floor_addr=$3 floor_pid=$4 addr=$5 pid=$6
  shift 6
  measured "noop_${row}_$round" "$floor_addr" "$floor_pid" "$@"
  measured "quotad_${row}_$round" "$addr" "$pid" "$@"
}
# alt ROW ROUND ARGS... : the row on the alternative quotad (ALT_QUOTAD_BIN).
alt() {
  local row=$1 round=$2
  shift 2
  if [[ -n $ALT_QUOTAD_BIN ]]; then measured "alt_${row}_$round" "$ALT_ADDR" "$ALT_PID" "$@"; fi
}

# The rounds: every row alternates the floor and quotad (and the
# alternative quotad), so that all of them see the same background load.
for r in $(seq "$ROUNDS"); do
  pair unary "$r" "$NOOP_ADDR" "$NOOP_PID" "$QUOTAD_ADDR" "$QUOTAD_PID" --policy bench "${LOAD_UNARY[@]}"
  alt unary "$r" --policy bench "${LOAD_UNARY[@]}"
  pair batch "$r" "$NOOP_ADDR" "$NOOP_PID" "$QUOTAD_ADDR" "$QUOTAD_PID" --policy bench "${LOAD_BATCH[@]}"
  alt batch "$r" --policy bench "${LOAD_BATCH[@]}"
  pair inline "$r" "$NOOP_ADDR" "$NOOP_PID" "$QUOTAD_ADDR" "$QUOTAD_PID" --inline "$INLINE" "${LOAD_BATCH[@]}"
  alt inline "$r" --inline "$INLINE" "${LOAD_BATCH[@]}"
  pair uds "$r" "$NOOP_UDS_ADDR" "$NOOP_UDS_PID" "$QUOTAD_UDS_ADDR" "$QUOTAD_UDS_PID" --policy bench "${LOAD_UNARY[@]}"
  pair client "$r" "$NOOP_ADDR" "$NOOP_PID" "$QUOTAD_ADDR" "$QUOTAD_PID" --policy bench \
    --coalescing off --deny-cache off "${LOAD_CLIENT[@]}"
  pair coalesced "$r" "$NOOP_ADDR" "$NOOP_PID" "$QUOTAD_ADDR" "$QUOTAD_PID" --policy bench \
    --coalescing on --deny-cache off "${LOAD_CLIENT[@]}"
  pair fewslots "$r" "$NOOP_ADDR" "$NOOP_PID" "$QUOTAD_ADDR" "$QUOTAD_PID" --policy bench \
    --coalescing on --max-in-flight "$COALESCE_SLOTS" --deny-cache off "${LOAD_CLIENT[@]}"
  for d in 1 3; do
    pair "rls$d" "$r" "$NOOP_ADDR" "$NOOP_PID" "$QUOTAD_ADDR" "$QUOTAD_PID" "${LOAD_RLS[@]}" --descriptors "$d"
    alt "rls$d" "$r" "${LOAD_RLS[@]}" --descriptors "$d"
  done
  # The deny cache: CONCURRENCY callers of one hot key under `hot`, every
  # check its own call (no coalescing), without and with the cache.
  for cache in off on; do
    measured "quotad_hot_cache_${cache}_$r" "$QUOTAD_ADDR" "$QUOTAD_PID" --policy hot \
      --coalescing off --deny-cache "$cache" "${LOAD_HOT[@]}"
  done
done

# field NAME JQ_EXPR over rounds: the median of the rounds' values.
median() { printf '%s\n' "$@" | jq -s 'sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end'; }
# rounds SERVER ROW JQ_EXPR : the value of every round's report
rounds() {
  local r
  for r in $(seq "$ROUNDS"); do jq -r "$3" "$WORK/$1_$2_$r.json"; done
}

# p99 at half of the unary peak through the client: open loop at half of
# quotad's median peak without coalescing, without and with it.
PEAK=$(median $(rounds quotad client .requests_per_sec))
HALF=$(jq -n "($PEAK / 2) | floor")
if [[ $HALF -lt 1 ]]; then
  echo "bench.sh: quotad's unary peak through the client is $PEAK req/s; nothing to halve" >&2
  exit 1
fi
for r in $(seq "$ROUNDS"); do
  loadgen "quotad_halfoff_$r" "$QUOTAD_ADDR" --policy bench --coalescing off \
    --deny-cache off "${LOAD_CLIENT[@]}" --rate "$HALF"
  loadgen "quotad_halfon_$r" "$QUOTAD_ADDR" --policy bench --coalescing on \
    --deny-cache off "${LOAD_CLIENT[@]}" --rate "$HALF"
  loadgen "quotad_halffew_$r" "$QUOTAD_ADDR" --policy bench --coalescing on \
    --max-in-flight "$COALESCE_SLOTS" --deny-cache off "${LOAD_CLIENT[@]}" --rate "$HALF"
done

CORRECT=yes
loadgen quotad_budget "$QUOTAD_ADDR" --policy budget --keys hot \
  --concurrency "$CONCURRENCY" --connections "$CONNECTIONS" \
  --requests "$CORRECTNESS_REQUESTS" --expect-allowed "$BUDGET" || CORRECT=no

for pid in "${QUOTAD_TIMEOUT_PIDS[@]}"; do stop_server "$pid"; done
stop_server "$NOOP_PID"
stop_server "$NOOP_UDS_PID"

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
    EVALSHA "$SHA" 1 "quotad:bench|{key:__rand_int__}|2x1000" check 99999999999999 "" \
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

# --- the tables ---------------------------------------------------------------
# per_decision NAME / per_call NAME : the server's CPU µs per decision / per
# request of run NAME (its warmup included, as its CPU time is).
per_decision() {
  jq -rn --argjson ticks "$(cat "$WORK/$1.cpu")" --argjson hz "$CLK_TCK" --slurpfile r "$WORK/$1.json" \
    '($ticks * 1000000 / $hz) / (($r[0].requests + $r[0].warmup_requests) * $r[0].batch_size)'
}
per_call() {
  jq -rn --argjson ticks "$(cat "$WORK/$1.cpu")" --argjson hz "$CLK_TCK" --slurpfile r "$WORK/$1.json" \
    '($ticks * 1000000 / $hz) / ($r[0].requests + $r[0].warmup_requests)'
}
# over ROW SERVER FN : FN of every round of SERVER's runs of ROW
over() {
  local r
  for r in $(seq "$ROUNDS"); do "$3" "$2_$1_$r"; done
}
# diffs ROW FN [SERVER] : SERVER (quotad) minus the floor, each round
diffs() {
  local r
  for r in $(seq "$ROUNDS"); do
    jq -n "$("$2" "${3:-quotad}_$1_$r") - $("$2" "noop_$1_$r")"
  done
}
r2() { jq -n "$1 * 100 | round / 100"; }
r3() { jq -n "$1 * 1000 | round / 1000"; }
signed() { jq -rn "$1 * 1000 | round / 1000 | if . >= 0 then \"+\" + tostring else tostring end"; }
list() { local v; for v in "$@"; do printf '%s, ' "$(r2 "$v")"; done | sed 's/, $//'; }
met() { if jq -en "$1" >/dev/null; then echo yes; else echo "**no**"; fi; }
# rate ROW SERVER : median decisions/s
rate() { median $(rounds "$2" "$1" .decisions_per_sec); }

# row LABEL ROW FN TARGET : one line of the main table; FN per_decision or
# per_call; TARGET a jq bound on the median difference, or empty.
row() {
  local label=$1 name=$2 fn=$3 target=${4:-} floor quotad above verdict=—
  floor=$(median $(over "$name" noop "$fn"))
  quotad=$(median $(over "$name" quotad "$fn"))
  above=$(median $(diffs "$name" "$fn"))
  [[ -n $target ]] && verdict="<= $target: $(met "$above <= $target")"
  printf '| %s | %s | %s | %s (%s) | %s | %s | %s x | %s |\n' "$label" "$(r2 "$floor")" "$(r2 "$quotad")" \
    "$(signed "$above")" "$(list $(diffs "$name" "$fn"))" "$(jq -n "$(rate "$name" noop) | floor")" \
    "$(jq -n "$(rate "$name" quotad) | floor")" "$(r2 "$(rate "$name" quotad) / $(rate "$name" noop)")" "$verdict"
}

cat <<EOF

## gRPC: quotad next to the no-op floor

Date: $(date -u '+%Y-%m-%d %H:%M UTC'). Machine: $(nproc) cores, $(sed -nE 's/^model name\s*:\s*//p' /proc/cpuinfo | head -n 1).
Load average before / after: $LOAD_BEFORE / $LOAD_AFTER.
quotad: $QUOTAD_BIN$( [[ -n $ALT_QUOTAD_BIN ]] && echo "; alternative: $ALT_QUOTAD_BIN ($ALT_LABEL)").
loadgen: $LOADGEN_THREADS runtime thread(s), on the same box as the servers; servers: $SERVER_THREADS worker thread(s) each;
keys $KEYS per namespace, all stored before the first round; $ROUNDS rounds, each row alternating the floor and quotad;
closed-loop runs measure ${DURATION} s after a ${WARMUP} s warmup. Server CPU: user + system time from /proc/PID/stat
over each run (warmup included) divided by its decisions (or calls); figures are medians of the rounds, with each
round's difference in brackets.

| run | floor CPU µs | quotad CPU µs | quotad above the floor, median (rounds) | floor decisions/s | quotad decisions/s | quotad / floor | target (µs above) |
|---|---:|---:|---:|---:|---:|---:|---|
$(row "unary Check, c=$CONCURRENCY over $CONNECTIONS conns, per decision" unary per_decision 1)
$(row "CheckBatch($BATCH_SIZE), named policy, c=$BATCH_CONCURRENCY, per decision" batch per_decision 0.2)
$(row "CheckBatch($BATCH_SIZE), inline policy ($INLINE), per decision" inline per_decision 0.3)
$(row "unary Check over a unix socket, per decision" uds per_decision)
$(row "quotad-client, $CONCURRENCY callers, not coalesced, per decision" client per_decision)
$(row "quotad-client, $CONCURRENCY callers, coalesced (8 in flight, the default), per decision" coalesced per_decision)
$(row "quotad-client, $CONCURRENCY callers, coalesced ($COALESCE_SLOTS in flight), per decision" fewslots per_decision)
$(row "ShouldRateLimit, 1 descriptor, per call" rls1 per_call 1)
$(row "ShouldRateLimit, 3 descriptors, per call" rls3 per_call 1)
EOF

# Coalescing: quotad's CPU per decision and decisions per server CPU
# second (1 / CPU per decision), uncoalesced against each coalesced setting.
CPU_OFF=$(median $(over client quotad per_decision))
P99_OFF=$(median $(rounds quotad halfoff .latency.p99_us))
coalescing_row() { # ROW HALF LABEL
  local cpu p99 calls
  cpu=$(median $(over "$1" quotad per_decision))
  p99=$(median $(rounds quotad "$2" .latency.p99_us))
  calls=$(median $(rounds quotad "$1" .client_calls.calls_per_decision))
  printf '| %s | %s (%s x lower: %s) | %s (%s x: %s) | %s (%s x) | %s | %s (%s): %s |\n' "$3" \
    "$(r3 "$cpu")" "$(r2 "$CPU_OFF / $cpu")" "$(met "$CPU_OFF / $cpu >= 8")" \
    "$(jq -n "1000000 / $cpu | floor")" "$(r2 "$CPU_OFF / $cpu")" "$(met "$CPU_OFF / $cpu >= 5")" \
    "$(jq -n "$(rate "$1" quotad) | floor")" "$(r2 "$(rate "$1" quotad) / $(rate client quotad)")" \
    "$(r3 "$calls")" "$(jq -n "$p99 | floor")" "$(list $(rounds quotad "$2" .latency.p99_us))" \
    "$(met "$p99 <= $P99_OFF")"
}
cat <<EOF

Coalescing, through quotad-client (one client, one connection, $CONCURRENCY callers), quotad's figures;
the p99 is of the open loop at $HALF checks/s, half of the uncoalesced peak:

| client | server CPU µs per decision (target: >= 8 x lower) | decisions per server CPU second (target: >= 5 x) | decisions/s | calls per decision (warmup included) | p99 µs at half of the peak (rounds) (target: not worse) |
|---|---:|---:|---:|---:|---:|
| not coalesced | $(r3 "$CPU_OFF") | $(jq -n "1000000 / $CPU_OFF | floor") | $(jq -n "$(rate client quotad) | floor") | $(r3 "$(median $(rounds quotad client .client_calls.calls_per_decision))") | $(jq -n "$P99_OFF | floor") ($(list $(rounds quotad halfoff .latency.p99_us))) |
$(coalescing_row coalesced halfon "coalesced, 8 in flight (the default)")
$(coalescing_row fewslots halffew "coalesced, $COALESCE_SLOTS in flight")
EOF

HOT_OFF=$(median $(rounds quotad hot_cache_off .client_calls.calls_per_decision))
HOT_ON=$(median $(rounds quotad hot_cache_on .client_calls.calls_per_decision))
cat <<EOF

The deny cache: $CONCURRENCY callers of one client checking one hot key under a fixed window of $HOT_LIMIT a second
(no coalescing, so every call is one check), quotad's figures:

| deny cache | calls per decision (warmup included) | local denials per decision | allowed / denied (last round) | decisions/s | server CPU µs per decision |
|---|---:|---:|---:|---:|---:|
| off | $(r3 "$HOT_OFF") | $(r3 "$(median $(rounds quotad hot_cache_off '.client_calls.local_denials / (.requests + .warmup_requests)'))") | $(field "quotad_hot_cache_off_$ROUNDS" .allowed) / $(field "quotad_hot_cache_off_$ROUNDS" .denied) | $(jq -n "$(median $(rounds quotad hot_cache_off .decisions_per_sec)) | floor") | $(r3 "$(median $(for r in $(seq "$ROUNDS"); do per_decision "quotad_hot_cache_off_$r"; done))") |
| on | $(r3 "$HOT_ON") | $(r3 "$(median $(rounds quotad hot_cache_on '.client_calls.local_denials / (.requests + .warmup_requests)'))") | $(field "quotad_hot_cache_on_$ROUNDS" .allowed) / $(field "quotad_hot_cache_on_$ROUNDS" .denied) | $(jq -n "$(median $(rounds quotad hot_cache_on .decisions_per_sec)) | floor") | $(r3 "$(median $(for r in $(seq "$ROUNDS"); do per_decision "quotad_hot_cache_on_$r"; done))") |

Unix socket against TCP loopback, unary Check with the same client (loadgen), medians:

| | TCP | unix socket | unix / TCP |
|---|---:|---:|---:|
| quotad CPU µs per call | $(r2 "$(median $(over unary quotad per_call))") | $(r2 "$(median $(over uds quotad per_call))") | $(r2 "$(median $(over uds quotad per_call)) / $(median $(over unary quotad per_call))") x |
| floor CPU µs per call | $(r2 "$(median $(over unary noop per_call))") | $(r2 "$(median $(over uds noop per_call))") | $(r2 "$(median $(over uds noop per_call)) / $(median $(over unary noop per_call))") x |
| quotad requests/s | $(jq -n "$(rate unary quotad) | floor") | $(jq -n "$(rate uds quotad) | floor") | $(r2 "$(rate uds quotad) / $(rate unary quotad)") x |
| quotad p99 µs | $(jq -n "$(median $(rounds quotad unary .latency.p99_us)) | floor") | $(jq -n "$(median $(rounds quotad uds .latency.p99_us)) | floor") | — |

Correctness under load: hot key, budget $BUDGET, $CORRECTNESS_REQUESTS checks at c=$CONCURRENCY: $(field quotad_budget .allowed) allowed, $(field quotad_budget .denied) denied, $(field quotad_budget .errors) errors ($CORRECT).
EOF

if [[ -n $ALT_QUOTAD_BIN ]]; then
  alt_row() { # LABEL ROW FN
    local q a
    q=$(median $(over "$2" quotad "$3"))
    a=$(median $(over "$2" alt "$3"))
    printf '| %s | %s | %s | %s | %s (%s) | %s x |\n' "$1" "$(r2 "$(median $(over "$2" noop "$3"))")" "$(r2 "$q")" "$(r2 "$a")" \
      "$(signed "$(median $(diffs "$2" "$3" alt))")" "$(list $(diffs "$2" "$3" alt))" "$(r2 "$(rate "$2" alt) / $(rate "$2" quotad)")"
  }
  cat <<EOF

quotad against the alternative build ($ALT_LABEL, $ALT_QUOTAD_BIN), same rounds, medians:

| run | floor CPU µs | quotad CPU µs | $ALT_LABEL CPU µs | $ALT_LABEL above the floor (rounds) | $ALT_LABEL / quotad decisions/s |
|---|---:|---:|---:|---:|---:|
$(alt_row "unary Check, per decision" unary per_decision)
$(alt_row "CheckBatch($BATCH_SIZE), named, per decision" batch per_decision)
$(alt_row "CheckBatch($BATCH_SIZE), inline, per decision" inline per_decision)
$(alt_row "ShouldRateLimit, 1 descriptor, per call" rls1 per_call)
$(alt_row "ShouldRateLimit, 3 descriptors, per call" rls3 per_call)
EOF
fi

echo "$REDIS_ROWS"
if command -v redis-benchmark >/dev/null; then echo; redis_cpu_rows; fi
if [[ $KEEP_WORK == 1 ]]; then echo; echo "Reports and logs: $WORK"; fi
