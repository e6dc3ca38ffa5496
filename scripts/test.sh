#!/usr/bin/env bash
# Runs the whole test suite: the README's test command, and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace --all-targets
# Doctests are not part of --all-targets.
cargo test --workspace --doc
