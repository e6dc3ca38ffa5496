#!/usr/bin/env bash
# Validates the files in deploy/ with the tools of their formats, offline:
#
#   - Kubernetes manifests: kubernetes-validate (PyPI; it ships the
#     Kubernetes JSON schemas), strict (unknown fields are errors), against
#     Kubernetes 1.29 (the first with native sidecars) and 1.37;
#   - alert rules and the Prometheus config: promtool (from Debian's
#     prometheus package), with the unit tests in deploy/alerts.test.yml;
#   - the compose file: the compose-spec JSON schema that check-jsonschema
#     (PyPI) vendors;
#   - quotad's config files: deploy/quotad.toml and the TOML in each
#     ConfigMap, with `quotad validate-config`;
#   - the Grafana dashboard: its structure, and that every metric it and
#     the alert rules use is exposed by a real quotad (scripts/metric-names.py
#     against one /metrics scrape of a server started here on loopback).
#
# What is missing is installed under target/deploy-tools (see
# scripts/deploy-tools.sh): the Python tools, pinned, in a virtualenv;
# promtool extracted from the Debian package. Nothing here needs a
# container engine or a cluster.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/deploy-tools.sh
K8S_VERSIONS=(1.29.0 1.37.0)
VENV="$(python_venv venv kubernetes-validate==1.37.0 check-jsonschema==0.39.0)"
PROMTOOL="$(prometheus_tool promtool)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# --- Kubernetes
for version in "${K8S_VERSIONS[@]}"; do
  "$VENV/bin/kubernetes-validate" --strict --quiet -k "$version" deploy/kubernetes/*.yaml
  echo "kubernetes: deploy/kubernetes/*.yaml valid against Kubernetes $version (strict)"
done

# --- Prometheus
"$PROMTOOL" check rules deploy/alerts.yml
"$PROMTOOL" test rules deploy/alerts.test.yml
# The config names the rule file by its path inside the container.
sed "s#/etc/prometheus/alerts.yml#$PWD/deploy/alerts.yml#" deploy/prometheus.yml >"$tmp/prometheus.yml"
"$PROMTOOL" check config "$tmp/prometheus.yml"

# --- Docker Compose
"$VENV/bin/check-jsonschema" --builtin-schema vendor.compose-spec deploy/docker-compose.yml

# --- quotad config files
"$VENV/bin/python" - "$tmp" deploy/kubernetes/*.yaml <<'PY'
"""Writes the .toml entries of every ConfigMap to the directory given."""
import pathlib
import sys

import yaml

out = pathlib.Path(sys.argv[1])
for manifest in sys.argv[2:]:
    for doc in yaml.safe_load_all(pathlib.Path(manifest).read_text()):
        if not doc or doc.get("kind") != "ConfigMap":
            continue
        for key, text in (doc.get("data") or {}).items():
            if key.endswith(".toml"):
                name = f"{pathlib.Path(manifest).stem}-{doc['metadata']['name']}-{key}"
                (out / name).write_text(text)
PY
for config in deploy/quotad.toml "$tmp"/*.toml; do
  cargo run -q -p quotad -- validate-config "$config"
done

# --- the Grafana dashboard
"$VENV/bin/python" - deploy/grafana/quotad.json <<'PY'
"""Every panel queries the dashboard's data source variable, ids are unique."""
import json
import sys

path = sys.argv[1]
dashboard = json.load(open(path))
ids = [panel["id"] for panel in dashboard["panels"]]
assert len(ids) == len(set(ids)), f"{path}: duplicate panel ids"
for panel in dashboard["panels"]:
    assert panel["targets"], f"{path}: panel {panel['title']!r} has no query"
    for target in panel["targets"]:
        assert target["datasource"]["uid"] == "${datasource}", f"{path}: panel {panel['title']!r}"
print(f"{path}: {len(ids)} panels, each on $datasource")
PY

# --- every metric the dashboard and the alerts use, a real quotad exposes:
# serve on free loopback ports, make decisions (denials included), a peek,
# batches, RLS calls, client checks and an error, scrape /metrics once, stop. (Every series quotad exports is
# registered at start, so a name is found before its first event; what this
# catches is a renamed or removed metric.)
quotad="$(quotad_binary)"
loadgen="$(loadgen_binary)"
read -r grpc_port admin_port < <(free_ports 2)
"$quotad" serve --config config/quotad.example.toml \
  --grpc-addr "127.0.0.1:$grpc_port" --admin-addr "127.0.0.1:$admin_port" >"$tmp/quotad.log" 2>&1 &
quotad_pid=$!
trap 'kill "$quotad_pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
wait_ready "http://127.0.0.1:$admin_port/readyz"
"$quotad" check --addr "127.0.0.1:$grpc_port" --policy login --key metric-names --count 7 >/dev/null
"$quotad" peek --addr "127.0.0.1:$grpc_port" --policy login --key metric-names >/dev/null
# A few batches, Envoy RLS calls and checks through quotad-client
# (coalesced), bounded by count.
for mode in batch rls client; do
  "$loadgen" --addr "http://127.0.0.1:$grpc_port" --mode "$mode" --policy login \
    --batch-size 5 -c 4 -k 1 --requests 20 --json >/dev/null
done
if "$quotad" check --addr "127.0.0.1:$grpc_port" --policy no-such-policy --key k >/dev/null 2>&1; then
  echo "an unknown policy was answered" >&2
  exit 1
fi
curl -sf "http://127.0.0.1:$admin_port/metrics" >"$tmp/metrics.txt"
kill "$quotad_pid"
wait "$quotad_pid" || true
"$VENV/bin/python" scripts/metric-names.py --exposition "$tmp/metrics.txt" \
  deploy/grafana/quotad.json deploy/alerts.yml

echo "deploy files: all valid"
