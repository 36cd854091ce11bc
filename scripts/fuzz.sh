#!/usr/bin/env bash
# Runs every libFuzzer harness (fuzz/) on a copy of its checked-in seed corpus, under
# ASan + UBSan. Fails on the first crash, leak, timeout or sanitizer report; the input that
# caused it is left in $FERRY_FUZZ_ARTIFACTS (default /tmp/ferry-fuzz-artifacts): add it to
# fuzz/corpus/<fuzzer>/ as a regression test (regression-<what>) once fixed.
#   bash scripts/fuzz.sh [BUILD_DIR] [SECONDS_PER_FUZZER]
# Each harness runs SECONDS_PER_FUZZER (default 20) from a fixed seed, so that CI starts
# every run the same way; FERRY_FUZZ_SEED=0 picks a random seed, to search further.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-asan}
seconds=${2:-20}
seed=${FERRY_FUZZ_SEED:-1}
artifacts=${FERRY_FUZZ_ARTIFACTS:-/tmp/ferry-fuzz-artifacts}
mkdir -p "$artifacts"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for corpus in fuzz/corpus/*/; do
  name=$(basename "$corpus")
  binary="$build/fuzz/$name"
  [[ -x "$binary" ]] || { echo "fuzz.sh: $binary is missing; build the asan preset" >&2; exit 1; }
  cp -r "$corpus" "$work/$name"
  echo "== $name: ${seconds}s from seed $seed on $(ls "$corpus" | wc -l) seeds"
  "$binary" -seed="$seed" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$artifacts/$name-" "$work/$name" \
    2>"$work/$name.log" || { tail -60 "$work/$name.log"; echo "fuzz.sh: $name failed" >&2; exit 1; }
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$work/$name.log" | tr '\n' ' '
  echo
done
