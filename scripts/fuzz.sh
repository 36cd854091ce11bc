#!/usr/bin/env bash
# Runs every libFuzzer harness (fuzz/) for a bounded time on a copy of its checked-in seed
# corpus, under ASan + UBSan. Fails on the first crash, leak, timeout or sanitizer report; the
# input that caused it is left in $FERRY_FUZZ_ARTIFACTS (default /tmp/ferry-fuzz-artifacts):
# add it to fuzz/corpus/<fuzzer>/ as a regression test once fixed.
#   bash scripts/fuzz.sh [BUILD_DIR] [SECONDS_PER_FUZZER]     (default: build-asan 20)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-asan}
seconds=${2:-20}
artifacts=${FERRY_FUZZ_ARTIFACTS:-/tmp/ferry-fuzz-artifacts}
mkdir -p "$artifacts"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for corpus in fuzz/corpus/*/; do
  name=$(basename "$corpus")
  binary="$build/fuzz/$name"
  [[ -x "$binary" ]] || { echo "fuzz.sh: $binary is missing; build the asan preset" >&2; exit 1; }
  cp -r "$corpus" "$work/$name"
  echo "== $name: ${seconds}s on $(ls "$corpus" | wc -l) seeds"
  "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$artifacts/$name-" "$work/$name" \
    2>"$work/$name.log" || { tail -60 "$work/$name.log"; echo "fuzz.sh: $name failed" >&2; exit 1; }
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$work/$name.log" | tr '\n' ' '
  echo
done
