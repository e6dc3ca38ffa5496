#!/usr/bin/env bash
# Draws docs/img/dashboard.png: the panels of deploy/grafana/quotad.json over
# data scraped from a real quotad under load.
#
#   scripts/dashboard-picture.sh [OUTPUT.png]        (about two minutes)
#
# Grafana cannot be installed from the package registries this project
# uses, so the panels' own queries run against a real Prometheus (from
# Debian's prometheus package) and scripts/dashboard-picture.py draws them
# with matplotlib, where the dashboard places them.
#
# Everything listens on 127.0.0.1 and stops by itself: quotad (memory store,
# config/quotad.example.toml), Prometheus scraping it every second, and 90 s
# of paced load from quotad-bench's loadgen (440 requests/s in all), with a
# policy reload, a rejected reload and a few refused requests on the way.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deploy-tools.sh

out="${1:-docs/img/dashboard.png}"
LOAD_SECONDS=90
VENV="$(python_venv plot-venv matplotlib==3.11.2)"
PROMETHEUS="$(prometheus_tool prometheus)"
quotad="$(quotad_binary)"
cargo build -q -p quotad-bench --bin loadgen
loadgen="$(dirname "$quotad")/loadgen"

tmp="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

read -r grpc_port admin_port prom_port < <(free_ports 3)
cp config/quotad.example.toml "$tmp/quotad.toml"
"$quotad" serve --config "$tmp/quotad.toml" \
  --grpc-addr "127.0.0.1:$grpc_port" --admin-addr "127.0.0.1:$admin_port" \
  --config-poll-interval 1s >"$tmp/quotad.log" 2>&1 &
pids+=($!)
wait_ready "http://127.0.0.1:$admin_port/readyz"

cat >"$tmp/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: quotad
    static_configs:
      - targets: ["127.0.0.1:$admin_port"]
YAML
"$PROMETHEUS" --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" >"$tmp/prometheus.log" 2>&1 &
pids+=($!)
wait_ready "http://127.0.0.1:$prom_port/-/ready"

start="$(date +%s)"
echo "load: ${LOAD_SECONDS}s against quotad at 127.0.0.1:$grpc_port" >&2
load() {
  "$loadgen" --addr "http://127.0.0.1:$grpc_port" --duration "$LOAD_SECONDS" \
    --concurrency 8 --threads 1 "$@" >"$tmp/loadgen-$2.txt" 2>&1 &
  pids+=($!)
}
load --policy api --keys zipf:2000 --rate 250   # sliding_window 100/min: hot keys denied
load --policy login --keys uniform:50 --rate 40  # fixed_window 5/min: mostly denied
load --policy per_day --keys uniform:100000 --rate 150 # a day's state per key: live keys grow
refuse() {
  "$quotad" check --addr "127.0.0.1:$grpc_port" --policy no-such-policy --key k >/dev/null 2>&1 || true
}
sleep 25
refuse
printf '\n[policies.extra]\nalgorithm = "fixed_window"\nlimit = 10\nwindow = "1s"\n' >>"$tmp/quotad.toml"
sleep 20
refuse
cp "$tmp/quotad.toml" "$tmp/good.toml"
printf '\n[policies.broken]\nalgorithm = "fixed_window"\nlimit = 0\nwindow = "1s"\n' >>"$tmp/quotad.toml"
sleep 20
refuse
cp "$tmp/good.toml" "$tmp/quotad.toml"
sleep "$((LOAD_SECONDS - 67))"
# Draw up to just before the load ends, from when the rates have settled.
end="$(date +%s)"
sleep 4
"$VENV/bin/python" scripts/dashboard-picture.py \
  --prometheus "http://127.0.0.1:$prom_port" --dashboard deploy/grafana/quotad.json \
  --start "$((start + 5))" --end "$end" --job quotad \
  --caption "panels drawn from a real quotad under ${LOAD_SECONDS}s of load (scripts/dashboard-picture.sh)" \
  --out "$out"
