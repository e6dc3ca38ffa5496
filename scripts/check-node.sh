#!/usr/bin/env bash
# Fails, saying how to get it, unless `node` is Node.js 20.10 or later (the
# Node client's tests use `node --test --test-concurrency`, new in 20.10)
# with npm beside it. scripts/test.sh runs it before the Node client's steps.
set -euo pipefail

how_to="install Node.js 20.10 or later with npm: https://nodejs.org/en/download (or \`nvm install 20 && nvm use 20\`; on Debian/Ubuntu the NodeSource packages, https://github.com/nodesource/distributions), then run scripts/test.sh again"

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
