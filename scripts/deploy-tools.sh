# Sourced by scripts/validate-deploy.sh and scripts/dashboard-picture.sh:
# the tools they use, installed under target/deploy-tools when missing.
# Call from the repository root.

DEPLOY_TOOLS="$PWD/target/deploy-tools"

# python_venv NAME REQUIREMENT...: prints the path of a virtualenv at
# $DEPLOY_TOOLS/NAME holding exactly these pinned requirements, made anew
# when they change.
python_venv() {
  local venv="$DEPLOY_TOOLS/$1"
  shift
  if [ "$(cat "$venv/requirements" 2>/dev/null)" != "$*" ]; then
    echo "installing $* into $venv" >&2
    rm -rf "$venv"
    mkdir -p "$DEPLOY_TOOLS"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "$@" >&2
    echo "$*" >"$venv/requirements"
  fi
  echo "$venv"
}

# prometheus_tool NAME: prints the path of `promtool` or `prometheus`: the
# one on the PATH, or else the one from Debian's prometheus package,
# downloaded and extracted (never installed: installing it would start a
# Prometheus server).
prometheus_tool() {
  local found
  found="$(command -v "$1" || true)"
  if [ -n "$found" ]; then
    echo "$found"
    return
  fi
  local extracted="$DEPLOY_TOOLS/prometheus/usr/bin/$1"
  if [ ! -x "$extracted" ]; then
    echo "$1 not found: extracting it from Debian's prometheus package" >&2
    local sudo="" download
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq >&2
    download="$(mktemp -d)"
    (cd "$download" && apt-get download -qq -o APT::Sandbox::User=root prometheus >&2)
    mkdir -p "$DEPLOY_TOOLS"
    dpkg-deb -x "$download"/prometheus_*.deb "$DEPLOY_TOOLS/prometheus"
    rm -rf "$download"
  fi
  echo "$extracted"
}

# free_ports N: prints N free TCP ports on 127.0.0.1.
free_ports() {
  python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))' "$1"
}

# quotad_binary: builds the server (debug) and prints its path.
quotad_binary() { cargo_bin quotad quotad; }

# loadgen_binary: builds quotad-bench's load generator (debug), prints its path.
loadgen_binary() { cargo_bin quotad-bench loadgen; }

# cargo_bin PACKAGE BIN: builds BIN of PACKAGE (debug), prints its path.
cargo_bin() {
  cargo build -q -p "$1" --bin "$2" >&2
  echo "$(cargo metadata -q --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/debug/$2"
}

# wait_ready URL: waits up to 10 s for URL to answer 200.
wait_ready() {
  local _
  for _ in $(seq 50); do
    curl -sf "$1" >/dev/null && return 0
    sleep 0.2
  done
  echo "no answer from $1 after 10 s" >&2
  return 1
}
