#!/usr/bin/env bash
# Coverage-guided fuzzing of quotad's untrusted inputs with libFuzzer, on
# the stable toolchain (crates/quotad-fuzz; docs/security.md, "Fuzzing").
#
#   scripts/fuzz.sh --short              # CI: every target, 90 s in all
#   scripts/fuzz.sh --long               # every target, 10 minutes in all
#   scripts/fuzz.sh --time 300 --target store   # one target, 5 minutes
#
# How: the targets are plain functions in crates/quotad-fuzz; its
# `libfuzzer` feature builds one binary per target (fuzz_targets/) linked
# with libFuzzer (the libfuzzer-sys crate compiles it from source with the
# C++ compiler). Coverage comes from LLVM's SanitizerCoverage pass, which
# stable rustc runs when asked with -C flags (what `cargo fuzz build
# --sanitizer none` passes, without needing cargo-fuzz or nightly); debug
# assertions and overflow checks stay on, so an overflow is a crash. It
# builds with the workspace's `fuzz` profile (opt-level 1: quick to build,
# docs/security.md says what it costs in speed). The build goes to
# target/fuzz, away from the ordinary builds, with an explicit --target so
# build scripts and proc macros are not instrumented.
#
# Each target runs for its share of the time, one after the other (the
# box has 2 cores), from its evolving corpus (target/fuzz/corpus/NAME), the
# committed seeds (crates/quotad-fuzz/seeds/NAME) and the saved regression
# inputs (crates/quotad-fuzz/regressions/NAME), in an empty working
# directory with no standard input. An input that panics, takes more than
# FUZZ_TIMEOUT seconds or more than FUZZ_RSS_MB of memory is a failure:
# libFuzzer writes it to target/fuzz/artifacts/NAME/, this script prints
# how to reproduce it and exits 1 after the remaining targets ran. Save a
# fixed one under crates/quotad-fuzz/regressions/NAME/ so that
# `cargo test -p quotad-fuzz` keeps it fixed.
#
# The last lines are a table: executions, coverage (libFuzzer's `cov`,
# edges of the instrumented code reached, and `ft`, features), corpus size
# and failures, per target.
#
# Settings (environment): FUZZ_TIMEOUT=10 (s per input), FUZZ_RSS_MB=2048,
# SKIP_BUILD=1 (use the binaries already built).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

ALL_TARGETS=(wire server config rls decide store)
TOTAL=""
PER_TARGET=""
TARGETS=()
usage() {
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --short) TOTAL=90 ;;
    --long) TOTAL=600 ;;
    --time) PER_TARGET=${2:?--time needs seconds}; shift ;;
    --target) TARGETS+=("${2:?--target needs a name}"); shift ;;
    -h|--help) usage ;;
    *) echo "fuzz.sh: unknown argument $1" >&2; usage ;;
  esac
  shift
done
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=("${ALL_TARGETS[@]}")
for t in "${TARGETS[@]}"; do
  [[ " ${ALL_TARGETS[*]} " == *" $t "* ]] || { echo "fuzz.sh: no target $t (${ALL_TARGETS[*]})" >&2; exit 2; }
done
if [[ -z $PER_TARGET ]]; then
  [[ -n $TOTAL ]] || usage
  PER_TARGET=$((TOTAL / ${#TARGETS[@]}))
fi
FUZZ_TIMEOUT=${FUZZ_TIMEOUT:-10}
FUZZ_RSS_MB=${FUZZ_RSS_MB:-2048}

# --- libFuzzer is C++: libfuzzer-sys compiles it with the system's C++
# compiler. Install one when missing (Debian/Ubuntu, as root or via sudo).
if ! command -v c++ >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1; then
  echo "fuzz.sh: no C++ compiler (needed to build libFuzzer): installing g++ with apt-get" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq g++ >/dev/null
fi

HOST=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR="$ROOT/target/fuzz"
BIN_DIR="$CARGO_TARGET_DIR/$HOST/fuzz"
if [[ -z ${SKIP_BUILD:-} ]]; then
  echo "fuzz.sh: building the instrumented targets (target/fuzz; minutes when cold)" >&2
  build_start=$(date +%s)
  RUSTFLAGS="-Cpasses=sancov-module \
-Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares \
-Cdebug-assertions -Coverflow-checks" \
    cargo build --profile fuzz --locked -p quotad-fuzz --features libfuzzer --target "$HOST" \
      $(printf -- '--bin fuzz_%s ' "${ALL_TARGETS[@]}")
  echo "fuzz.sh: built in $(( $(date +%s) - build_start )) s" >&2
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/quotad-fuzz.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# The config target's seeds: the committed ones and the repository's files.
mkdir -p "$WORK/config-files"
cp config/*.toml deploy/quotad.toml "$WORK/config-files/"

declare -A MAX_LEN=([wire]=4096 [server]=4096 [config]=16384 [rls]=16384 [decide]=4096 [store]=8192)
SUMMARY=()
FAILED=()
for t in "${TARGETS[@]}"; do
  corpus="$CARGO_TARGET_DIR/corpus/$t"
  artifacts="$CARGO_TARGET_DIR/artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  dirs=("$corpus")
  for d in "crates/quotad-fuzz/seeds/$t" "crates/quotad-fuzz/regressions/$t"; do
    [[ -d $d ]] && dirs+=("$ROOT/$d")
  done
  [[ $t == config ]] && dirs+=("$WORK/config-files")
  log="$WORK/$t.log"
  run_dir="$WORK/run-$t"
  mkdir -p "$run_dir"
  echo "fuzz.sh: $t for ${PER_TARGET}s" >&2
  status=0
  (cd "$run_dir" && "$BIN_DIR/fuzz_$t" \
    -max_total_time="$PER_TARGET" \
    -timeout="$FUZZ_TIMEOUT" \
    -rss_limit_mb="$FUZZ_RSS_MB" \
    -max_len="${MAX_LEN[$t]}" \
    -artifact_prefix="$artifacts/" \
    -print_final_stats=1 \
    "${dirs[@]}" </dev/null >"$log" 2>&1) || status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  done_line=$(grep -E '^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED)' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$done_line")
  corp=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$done_line")
  rate=$(sed -n 's/.* exec\/s: \([0-9]*\).*/\1/p' <<<"$done_line")
  if [[ $status -ne 0 ]]; then
    FAILED+=("$t")
    echo "fuzz.sh: $t FAILED (exit $status); what it says:" >&2
    grep -m1 -A6 "panicked at" "$log" >&2 || true
    grep -E "^(==[0-9]+== ERROR|SUMMARY|artifact_prefix)" "$log" >&2 || tail -20 "$log" >&2
    found=$(grep -o "Test unit written to .*" "$log" | sed 's/Test unit written to //' | tail -1 || true)
    if [[ -n $found ]]; then
      echo "fuzz.sh: reproduce with: $BIN_DIR/fuzz_$t $found" >&2
    fi
  fi
  SUMMARY+=("| $t | ${PER_TARGET} s | ${execs:-?} | ${rate:-?} | ${cov:-?} | ${ft:-?} | ${corp:-?} | $([[ $status -eq 0 ]] && echo 0 || echo "1 (exit $status)") |")
done

echo
echo "| target | time | executions | exec/s | cov (edges) | ft | corpus | failures |"
echo "|---|---|---|---|---|---|---|---|"
printf '%s\n' "${SUMMARY[@]}"
if [[ ${#FAILED[@]} -gt 0 ]]; then
  echo "fuzz.sh: failing targets: ${FAILED[*]} (inputs under target/fuzz/artifacts/)" >&2
  exit 1
fi
echo "fuzz.sh: ${#TARGETS[@]} targets, no failure"
