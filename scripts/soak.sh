#!/usr/bin/env bash
# Soak test: mixed load against a release build of quotad on 127.0.0.1,
# memory store then Redis, with its pass criteria checked
# (docs/security.md, "Soak").
#
#   scripts/soak.sh                  # 10 minutes: 5 memory, 5 Redis
#   scripts/soak.sh --duration 60    # a 60 s smoke run
#
# What runs (crates/quotad-fuzz/src/soak): the `soak` driver starts
# redis-server and quotad itself, as its children, on free loopback ports,
# and for each phase sends Check, CheckBatch (both modes), Peek and Reset
# at a paced rate, over keys that churn through twice store.max_keys; it
# rewrites the config file every 10 s (the server polls it and reloads),
# samples quotad's RSS from /proc/PID/status every 10 s, restarts Redis
# once halfway through the Redis phase, and checks a key of known limit
# back to back. It passes when, in each phase: RSS after warm-up stays
# within ±10% of its first sample after warm-up; no call fails but with
# UNAVAILABLE around the Redis restart; every rewrite is reloaded; the
# checker key admits exactly its limit in every window.
#
# Bounded: the load stops after --duration seconds (at most 3,600) and the
# driver runs under `timeout` (duration + 5 minutes, then SIGKILL); the
# processes it started are stopped by PID, and killed if it unwinds.
# Nothing but loopback is contacted.
#
# Output: a markdown table and the RSS series on stdout; soak.json,
# rss.svg, configs and logs under OUT (default: a temporary directory,
# kept and printed). Exit 0 when every phase passed.
#
# Settings (environment): OUT=DIR, RATE=2000 (calls/s), CONCURRENCY=8,
# MAX_KEYS=5000, SKIP_BUILD=1, NO_REDIS=1 (memory phase only).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=600
while [[ $# -gt 0 ]]; do
  case "$1" in
    --duration) DURATION=${2:?--duration needs seconds}; shift ;;
    -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
RATE=${RATE:-2000}
CONCURRENCY=${CONCURRENCY:-8}
MAX_KEYS=${MAX_KEYS:-5000}

REDIS_ARGS=()
if [[ -z ${NO_REDIS:-} ]]; then
  if ! command -v redis-server >/dev/null 2>&1; then
    echo "soak.sh: redis-server not found: installing it with apt-get" >&2
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
  fi
  REDIS_ARGS=(--redis-server "$(command -v redis-server)")
fi

if [[ -z ${SKIP_BUILD:-} ]]; then
  echo "soak.sh: building release binaries (quotad, soak)" >&2
  cargo build --release --locked -p quotad --bin quotad -p quotad-fuzz --bin soak
fi

if [[ -n ${OUT:-} ]]; then
  mkdir -p "$OUT"
else
  OUT=$(mktemp -d "${TMPDIR:-/tmp}/quotad-soak.XXXXXX")
fi

echo "soak.sh: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), revision $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "soak.sh: ${DURATION}s at ${RATE} calls/s over ${CONCURRENCY} workers, max_keys ${MAX_KEYS}; output in $OUT"
status=0
timeout --kill-after=10 $((DURATION + 300)) target/release/soak \
  --quotad target/release/quotad \
  "${REDIS_ARGS[@]}" \
  --duration "$DURATION" \
  --rate "$RATE" \
  --concurrency "$CONCURRENCY" \
  --max-keys "$MAX_KEYS" \
  --out "$OUT" || status=$?
echo "soak.sh: load average at the end $(cut -d' ' -f1-3 /proc/loadavg); results in $OUT (soak.json, rss.svg)"
case $status in
  0) echo "soak.sh: PASS" ;;
  1) echo "soak.sh: FAIL (see the table above and $OUT)" >&2 ;;
  *) echo "soak.sh: the run could not be made (exit $status; logs in $OUT)" >&2 ;;
esac
exit "$status"
