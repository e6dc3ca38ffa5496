#!/usr/bin/env bash
# Builds the Java example (build.sh) and runs it against a real quotad
# (target/debug/quotad, or $QUOTAD_BIN) with tests/clients/quotad.toml:
# three admissions counting down, a denial with its retry time, and quotad's
# refusals naming the field. scripts/test.sh runs it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
classes="$repo/target/java-check"
"$here/build.sh" "$classes"
check() { java -cp "$classes:$(cat "$classes.classpath")" QuotadCheck "$addr" "$@"; }

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

fail() { echo "examples/java: $*" >&2; exit 1; }
key="java-$$"
for remaining in 2 1 0; do
  out="$(check login "$key")" || fail "check $remaining: exit $?"
  [[ $out == "allowed=true limit=3 remaining=$remaining "*"reason=REASON_WITHIN_LIMIT" ]] || fail "got: $out"
done
rc=0
out="$(check login "$key")" || rc=$?
[ "$rc" -eq 1 ] && [[ $out == "allowed=false limit=3 remaining=0 retry_after_ms="*"reason=REASON_LIMIT_EXCEEDED" ]] ||
  fail "the fourth check: exit $rc, got: $out"
rc=0
err="$(check login "$key" 0 2>&1 >/dev/null)" || rc=$?
[ "$rc" -eq 2 ] && [[ $err == "INVALID_ARGUMENT: cost: "* ]] || fail "cost 0: exit $rc, got: $err"
rc=0
err="$(check nope "$key" 2>&1 >/dev/null)" || rc=$?
[ "$rc" -eq 2 ] && [[ $err == "NOT_FOUND: policy_name: "* ]] || fail "unknown policy: exit $rc, got: $err"
echo "examples/java: decisions and refusals as quotad answered them"
