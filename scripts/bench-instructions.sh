#!/usr/bin/env bash
# Server instructions per call, counted by valgrind (callgrind), for quotad
# builds side by side: a figure that the machine's other load does not
# move (the same binary, inputs and environment count the same), for "does
# this change cost anything" questions that CPU time on a shared box is too
# noisy to answer.
#
#   scripts/bench-instructions.sh [LABEL=BINARY ...]
#   # e.g. scripts/bench-instructions.sh before=/tmp/quotad-old now=target/release/quotad
#
# With no arguments it measures target/release/quotad (built first) as "now".
# For each build, and for the floor (noop-server: quotad's APIs answering
# at once), and for each row (unary Check of a named fixed window over
# KEYS keys; Envoy's ShouldRateLimit with 1 and with 3 descriptors), it:
#   1. starts the server under callgrind, one worker thread, on loopback;
#   2. sends WARM requests (the store fills with the keys);
#   3. zeroes the counters (callgrind_control -z), sends N requests with
#      loadgen, dumps the counters (callgrind_control -d);
#   4. prints the instructions per call (Ir / N), and per call above the
#      floor.
# Counts include everything the server process did in that time: its
# runtime, HTTP/2, the background tasks. Loadgen runs natively beside it.
#
# Bounded: every loadgen run has a request count and runs under timeout;
# each server runs under timeout; an EXIT trap stops what this script
# started, by PID. Settings (environment): N=2000 WARM=3000 KEYS=1000
# CONCURRENCY=8 NOOP_BIN=target/release/noop-server SKIP_BUILD=1.
# Requires valgrind (callgrind, callgrind_control), jq, and the release
# loadgen and noop-server (cargo build --release -p quotad-bench --bins).
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-2000}
WARM=${WARM:-3000}
KEYS=${KEYS:-1000}
CONCURRENCY=${CONCURRENCY:-8}
NOOP_BIN=${NOOP_BIN:-target/release/noop-server}
for setting in N WARM KEYS CONCURRENCY; do
  [[ ${!setting} =~ ^[0-9]+$ ]] || { echo "bench-instructions.sh: $setting must be a whole number" >&2; exit 2; }
done
for tool in valgrind callgrind_control jq; do
  command -v "$tool" >/dev/null || { echo "bench-instructions.sh: needs $tool (apt-get install valgrind jq)" >&2; exit 2; }
done

BUILDS=("$@")
if [[ ${#BUILDS[@]} -eq 0 ]]; then
  BUILDS=("now=target/release/quotad")
fi
if [[ -z ${SKIP_BUILD:-} ]]; then
  cargo build --release --quiet -p quotad --bin quotad
  cargo build --release --quiet -p quotad-bench --bins
fi

WORK=$(mktemp -d)
STARTED=()
cleanup() {
  for pid in "${STARTED[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

mkdir -p "$WORK/rls"
cat >"$WORK/rls/bench.yaml" <<EOF
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
[server]
config_poll_interval = "0s"

[rls]
config_dir = "rls"

[policies.bench]
algorithm = "fixed_window"
limit = 1000000000000
window = "1s"
EOF

# start LOG BINARY ARGS... : the server under callgrind; sets PID and ADDR.
start() {
  local log=$1
  shift
  NO_COLOR=1 QUOTAD_LOG_LEVEL=warn,quotad=info timeout 900 valgrind --tool=callgrind \
    --callgrind-out-file="$WORK/cg.%p" "$@" >"$log.out" 2>"$log.err" &
  local timeout_pid=$!
  STARTED+=("$timeout_pid")
  ADDR=
  for _ in $(seq 600); do
    ADDR=$(sed -nE 's/.*grpc_addr=([^ ]+).*/\1/p; s/^listening ([0-9.:]+).*/\1/p' "$log.err" "$log.out" 2>/dev/null | head -n 1)
    [[ -n $ADDR ]] && break
    kill -0 "$timeout_pid" 2>/dev/null || break
    sleep 0.2
  done
  [[ -n $ADDR ]] || { echo "bench-instructions.sh: server did not come up:" >&2; cat "$log.err" "$log.out" >&2; exit 1; }
  PID=$(pgrep -P "$timeout_pid" | head -n 1)
}

# run ADDR ROW REQUESTS : one bounded loadgen run of ROW.
run() {
  local addr=$1 row=$2 requests=$3 args
  case $row in
    unary) args=(--mode unary --policy bench) ;;
    rls1) args=(--mode rls --descriptors 1) ;;
    rls3) args=(--mode rls --descriptors 3) ;;
  esac
  timeout 600 target/release/loadgen --addr "http://$addr" --threads 1 --json \
    --concurrency "$CONCURRENCY" --connections 1 --keys "uniform:$KEYS" --key-prefix bench: \
    --timeout-ms 60000 --requests "$requests" "${args[@]}" >"$WORK/last.json"
  local errors
  errors=$(jq '.errors // 0' "$WORK/last.json")
  [[ $errors == 0 ]] || { echo "bench-instructions.sh: $row had $errors errors" >&2; cat "$WORK/last.json" >&2; exit 1; }
}

# measure LABEL BINARY ROW : sets IR, the instructions per call.
measure() {
  local label=$1 bin=$2 row=$3 log
  log=$WORK/$label-$row
  if [[ $label == floor ]]; then
    start "$log" "$bin" --addr 127.0.0.1:0 --max-seconds 900 --threads 1
  else
    start "$log" "$bin" serve --config "$WORK/quotad.toml" --grpc-addr 127.0.0.1:0 \
      --admin-addr 127.0.0.1:0 --worker-threads 1
  fi
  run "$ADDR" "$row" "$WARM"
  rm -f "$WORK"/cg."$PID".*
  callgrind_control -z "$PID" >/dev/null
  run "$ADDR" "$row" "$N"
  callgrind_control -d "$PID" >/dev/null
  local dump ir
  dump=$(ls "$WORK"/cg."$PID".* | head -n 1)
  ir=$(sed -nE 's/^(summary|totals): ([0-9]+).*/\2/p' "$dump" | head -n 1)
  kill -TERM "$PID" 2>/dev/null || true
  wait 2>/dev/null || true
  IR=$((ir / N))
}

printf 'Date: %s. Machine: %s cores, %s. valgrind %s. N=%s WARM=%s KEYS=%s CONCURRENCY=%s.\n\n' \
  "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(nproc)" \
  "$(sed -nE 's/^model name\s*:\s*//p' /proc/cpuinfo | head -n 1)" "$(valgrind --version)" \
  "$N" "$WARM" "$KEYS" "$CONCURRENCY"
header="| row | floor |"
rule="|---|---|"
for build in "${BUILDS[@]}"; do
  header+=" ${build%%=*} (above floor) |"
  rule+="---|"
done
echo "Server instructions per call:"
echo
echo "$header"
echo "$rule"
for row in unary rls1 rls3; do
  measure floor "$NOOP_BIN" "$row"
  floor=$IR
  line="| $row | $floor |"
  for build in "${BUILDS[@]}"; do
    measure "${build%%=*}" "${build#*=}" "$row"
    line+=" $IR (+$((IR - floor))) |"
  done
  echo "$line"
done
