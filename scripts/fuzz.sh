#!/usr/bin/env bash
# Runs every libFuzzer harness (fuzz/) on a copy of its checked-in seed corpus, under
# ASan + UBSan, one harness per core at a time. Fails on any crash, leak, timeout or
# sanitizer report; the input that caused it is left in $FERRY_FUZZ_ARTIFACTS (default
# /tmp/ferry-fuzz-artifacts): add it to fuzz/corpus/<fuzzer>/ as a regression test
# (regression-<what>) once fixed. FERRY_FUZZ_JOBS harnesses run at once (default: nproc).
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
parallel=${FERRY_FUZZ_JOBS:-$(nproc)}
run_one() {
  local name=$1
  "$build/fuzz/$name" -seed="$seed" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$artifacts/$name-" "$work/$name" \
    2>"$work/$name.log"
}
names=()
for corpus in fuzz/corpus/*/; do
  name=$(basename "$corpus")
  [[ -x "$build/fuzz/$name" ]] || { echo "fuzz.sh: $build/fuzz/$name is missing; build the asan preset" >&2; exit 1; }
  cp -r "$corpus" "$work/$name"
  names+=("$name")
done
declare -A pid_of
failed=()
for name in "${names[@]}"; do
  while (($(jobs -rp | wc -l) >= parallel)); do sleep 0.5; done
  echo "== $name: ${seconds}s from seed $seed on $(ls "fuzz/corpus/$name" | wc -l) seeds"
  run_one "$name" &
  pid_of[$name]=$!
done
for name in "${names[@]}"; do
  if wait "${pid_of[$name]}"; then
    echo "$name: $(grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$work/$name.log" | tr '\n' ' ')"
  else
    tail -60 "$work/$name.log"
    echo "fuzz.sh: $name failed" >&2
    failed+=("$name")
  fi
done
((${#failed[@]} == 0)) || { echo "fuzz.sh: failed: ${failed[*]}" >&2; exit 1; }
