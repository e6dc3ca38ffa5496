#!/usr/bin/env bash
# bounded.sh SECONDS DIR COMMAND...: runs COMMAND in DIR, stopped (SIGTERM,
# then SIGKILL 10 s later) when it runs longer than SECONDS; a step that
# hangs fails, naming itself, instead of holding the whole run.
set -uo pipefail
secs=$1 dir=$2
shift 2
start=$SECONDS
(cd "$dir" && exec timeout -k 10 "$secs" "$@")
rc=$?
echo "bounded: $* (in $dir) took $((SECONDS - start))s of ${secs}s" >&2
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "timed out after ${secs}s (in $dir): $*" >&2
fi
exit "$rc"
