#!/usr/bin/env bash
# Runs the whole test suite: the README's test command, and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."

# --- Redis: the Redis tests start their own redis-server processes on free
# loopback ports (standalone and a three-node Cluster); they need the
# binaries. Install them when missing (Debian/Ubuntu, as root or via sudo).
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "redis-server not found: installing it with apt-get" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi

# --- Python: tests/it/python_client.rs runs examples/python/quotad_check.py,
# which generates its stubs from crates/quotad-proto/proto/ with grpcio-tools.
# Install the example's requirements when they are missing.
if ! python3 -c 'import grpc, grpc_tools' >/dev/null 2>&1; then
  echo "python grpcio/grpcio-tools not found: installing examples/python/requirements.txt" >&2
  python3 -m pip install -q -r examples/python/requirements.txt
fi

# --- Node.js 20.10 or later, for the Node client's steps below: the
# machine's, or, when it is missing or older, one installed from PyPI under
# target/node (scripts/check-node.sh --install-under). Checked before the
# Rust tests, so that a missing Node fails at once.
node_bin="$(scripts/check-node.sh --install-under target/node)"
[ -z "$node_bin" ] || export PATH="$node_bin:$PATH"

cargo test --workspace --all-targets
echo "test.sh: the Rust tests done at ${SECONDS}s" >&2
# Doctests are not part of --all-targets.
cargo test --workspace --doc

# --- The clients and examples in other languages: three groups that do
# not depend on each other (Node; Python; Go then Java), run side by side,
# since most of their time is waiting on package registries and on the
# quotad processes their tests start. Each group's output goes to its own
# log, printed whole when the group ends, so that the lines of one group
# stay together; a failing group fails the run after all have ended.
# Every client step has a time bound (scripts/bounded.sh): one that hangs
# fails naming itself. (Node itself was found or installed above.)
cargo build --bin quotad

# --- Node: the TypeScript client (clients/node: its unit tests, its tests
# against a real quotad, and the conformance cases of tests/clients/) and the
# Express example, each with `node --test` against target/debug/quotad.
node_group() {
  scripts/bounded.sh 600 clients/node npm ci --no-audit --no-fund
  scripts/bounded.sh 300 clients/node npm run build
  scripts/bounded.sh 1200 clients/node npm test
  scripts/bounded.sh 600 examples/express npm ci --no-audit --no-fund
  scripts/bounded.sh 600 examples/express npm test
}

# --- The Python client (clients/python) and the FastAPI example: a venv
# under target/ (never committed), the package and its test extras from
# PyPI, then ruff, mypy (strict) and pytest against the quotad binary
# built here (the tests start it on free loopback ports; QUOTAD_BIN names
# another). The venv is made before the groups start: its fallback installs
# python3-venv with apt-get, which the Go and Java group also uses.
PY_VENV=target/pyenv
if [ ! -x "$PY_VENV/bin/python" ]; then
  if ! python3 -m venv "$PY_VENV" 2>/dev/null; then
    echo "python3 -m venv failed: installing python3-venv with apt-get" >&2
    rm -rf "$PY_VENV"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv "$PY_VENV"
  fi
fi
PY="$PWD/$PY_VENV/bin/python"
python_group() {
  scripts/bounded.sh 900 . "$PY" -m pip install -q --disable-pip-version-check "./clients/python[test]"
  scripts/bounded.sh 120 . "$PY" -m ruff check clients/python examples/fastapi
  scripts/bounded.sh 120 . "$PY" -m ruff format --check clients/python examples/fastapi
  scripts/bounded.sh 600 clients/python "$PY" -m mypy src/quotad
  scripts/bounded.sh 1800 . "$PY" -m pytest -q -p no:cacheprovider clients/python/tests examples/fastapi
}

# --- Go and Java: examples/go and examples/java, built from Debian's
# packages (Go in GOPATH mode over /usr/share/gocode, no module proxy; Java
# with javac against /usr/share/java, no Maven) and run against
# target/debug/quotad. Each build.sh installs its packages with apt-get
# when they are missing (QUOTAD_TEST_INSTALL=1), as redis-server is above;
# run alone, it says which to install (docs/clients.md, "From Go and Java").
# One after the other: both may take apt's lock.
go_java_group() {
  QUOTAD_TEST_INSTALL=1 scripts/bounded.sh 900 . examples/go/check.sh
  QUOTAD_TEST_INSTALL=1 scripts/bounded.sh 900 . examples/java/check.sh
}

logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
declare -A group_pid=()
for group in node python go_java; do
  # set -e does not reach into a function called as part of `||`, so each
  # group stops at its first failing step by its own errexit subshell.
  (set -e; "${group}_group") >"$logs/$group.log" 2>&1 &
  group_pid[$group]=$!
done
failed=()
for group in node python go_java; do
  rc=0
  wait "${group_pid[$group]}" || rc=$?
  echo "=== test.sh: the $group group (exit $rc, done at ${SECONDS}s) ===" >&2
  cat "$logs/$group.log" >&2
  [ "$rc" -eq 0 ] || failed+=("$group")
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "test.sh: failing groups: ${failed[*]} (their logs are above)" >&2
  exit 1
fi
echo "test.sh: every group passed"
