#!/usr/bin/env bash
# Builds the Go example (build.sh) and runs it against a real quotad
# (target/debug/quotad, or $QUOTAD_BIN) with tests/clients/quotad.toml:
# three admissions counting down, a denial with its retry time, and quotad's
# refusals naming the field. scripts/test.sh runs it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
bin="$repo/target/go-check"
"$here/build.sh" "$bin"

quotad="${QUOTAD_BIN:-$repo/target/debug/quotad}"
log="$(mktemp)"
RUST_LOG=info "$quotad" serve -c "$repo/tests/clients/quotad.toml" \
  --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 2>"$log" &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -f "$log"' EXIT
addr=""
for _ in $(seq 200); do
  addr="$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -o 'quotad serving grpc_addr=[0-9.:]*' | cut -d= -f2 || true)"
  [ -n "$addr" ] && break
  sleep 0.1
done
[ -n "$addr" ] || { echo "quotad did not start:" >&2; cat "$log" >&2; exit 1; }

fail() { echo "examples/go: $*" >&2; exit 1; }
key="go-$$"
for remaining in 2 1 0; do
  out="$("$bin" -addr "$addr" -policy login -key "$key" -deadline 2s)" || fail "check $remaining: exit $?"
  [[ $out == "allowed=true limit=3 remaining=$remaining "*"reason=REASON_WITHIN_LIMIT" ]] || fail "got: $out"
done
rc=0
out="$("$bin" -addr "$addr" -policy login -key "$key" -deadline 2s)" || rc=$?
[ "$rc" -eq 1 ] && [[ $out == "allowed=false limit=3 remaining=0 retry_after_ms="*"reason=REASON_LIMIT_EXCEEDED" ]] ||
  fail "the fourth check: exit $rc, got: $out"
for args in "-policy login -cost 0:InvalidArgument: cost: " "-policy nope:NotFound: policy_name: "; do
  rc=0
  err="$("$bin" -addr "$addr" -key "$key" -deadline 2s ${args%%:*} 2>&1 >/dev/null)" || rc=$?
  [ "$rc" -eq 2 ] && [[ $err == "${args#*:}"* ]] || fail "${args%%:*}: exit $rc, got: $err"
done
echo "examples/go: decisions and refusals as quotad answered them"
