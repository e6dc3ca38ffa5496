#!/usr/bin/env bash
# Chaos run: three quotad replicas on Redis (primary + replica + three
# sentinels, then a three-master Cluster with replicas), load on every
# algorithm, both batch modes, leases and concurrency slots, while a
# seeded schedule of faults plays; every answer is judged (docs/chaos.md).
#
#   scripts/chaos.sh --seconds 60 --seed 7     # what CI runs (seed varies)
#   scripts/chaos.sh --seconds 600 --seed 1    # the longer run
#
# The seed makes the fault schedule (printed first, one line a fault:
# `t=12.3s SIGSTOP redis-primary for 1.8s`) and the load's choices; a
# failure prints the seed and its first failing window, so it replays with
# the same --seed and --seconds. Without --seed the date (YYYYMMDD, UTC)
# is the seed, printed.
#
# What runs (crates/quotad-fuzz/src/chaos): the `chaos` driver starts
# redis-server, the sentinels and quotad itself, as its children, on free
# loopback ports; faults are SIGSTOP/SIGCONT and SIGKILL + restart of Redis
# nodes (append-only files), SIGKILL + restart of quotad replicas and of
# sentinels, SENTINEL FAILOVER / CLUSTER FAILOVER, blackholes through the
# driver's proxies, config reloads (SIGHUP) and one 4 s stall of a primary
# under the full load. It fails on: admissions beyond a policy's bound
# outside a measured loss window; a gRPC code other than UNAVAILABLE,
# DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED; a fallback reason the policy's
# on_error cannot give; a quotad key in Redis without a TTL or with one
# longer than its policy needs (scanned after each quotad SIGKILL and at
# the end); quotad's RSS growing more than 10% + 4 MiB during the stall.
#
# Bounded: the load stops after --seconds (30 to 3,600) and the driver runs
# under `timeout` (seconds + 5 minutes, then SIGKILL); the processes it
# started are stopped by PID, and killed if it unwinds. Nothing but
# loopback is contacted.
#
# Output: the schedule, then a summary per phase on stdout; chaos.json,
# configs and every process's log under OUT (default: a temporary
# directory, kept and printed). Exit 0 when every phase passed, 1 when one
# failed, 2 when the run could not be made.
#
# Settings (environment): OUT=DIR, RATE=2000 (calls/s offered),
# RELEASE=1 (release builds; default debug, which CI has built already),
# SKIP_BUILD=1, ONLY=sentinel|cluster.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_=60
SEED=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) SECONDS_=${2:?--seconds needs a number}; shift ;;
    --seed) SEED=${2:?--seed needs a number}; shift ;;
    -h|--help) sed -n '2,42p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "chaos.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
SEED=${SEED:-$(date -u +%Y%m%d)}
RATE=${RATE:-2000}

for tool in redis-server redis-cli; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "chaos.sh: $tool not found: installing redis-server with apt-get" >&2
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
  fi
done

PROFILE=debug
BUILD_FLAGS=()
if [[ -n ${RELEASE:-} ]]; then
  PROFILE=release
  BUILD_FLAGS=(--release)
fi
if [[ -z ${SKIP_BUILD:-} ]]; then
  echo "chaos.sh: building $PROFILE binaries (quotad, chaos)" >&2
  cargo build "${BUILD_FLAGS[@]}" --locked -p quotad --bin quotad -p quotad-fuzz --bin chaos
fi

if [[ -n ${OUT:-} ]]; then
  mkdir -p "$OUT"
else
  OUT=$(mktemp -d "${TMPDIR:-/tmp}/quotad-chaos.XXXXXX")
fi
ONLY_ARGS=()
if [[ -n ${ONLY:-} ]]; then
  ONLY_ARGS=(--only "$ONLY")
fi

echo "chaos.sh: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), revision $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $PROFILE build"
echo "chaos.sh: --seconds $SECONDS_ --seed $SEED at $RATE calls/s; output in $OUT"
status=0
timeout --kill-after=10 $((SECONDS_ + 300)) "target/$PROFILE/chaos" \
  --quotad "target/$PROFILE/quotad" \
  --redis-server "$(command -v redis-server)" \
  --seconds "$SECONDS_" \
  --seed "$SEED" \
  --rate "$RATE" \
  "${ONLY_ARGS[@]}" \
  --out "$OUT" || status=$?
echo "chaos.sh: load average at the end $(cut -d' ' -f1-3 /proc/loadavg); results in $OUT (chaos.json)"
case $status in
  0) echo "chaos.sh: PASS (seed $SEED)" ;;
  1) echo "chaos.sh: FAIL (seed $SEED; replay: scripts/chaos.sh --seconds $SECONDS_ --seed $SEED)" >&2 ;;
  *) echo "chaos.sh: the run could not be made (exit $status; seed $SEED; logs in $OUT)" >&2 ;;
esac
exit "$status"
