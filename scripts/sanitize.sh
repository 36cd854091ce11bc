#!/usr/bin/env bash
# The unit tests under ASan + UBSan (clang, host transport, preset asan), every fuzzer for a
# bounded time on its seed corpus, then the unit tests under TSan (preset tsan). CI runs it
# after scripts/test.sh. The Python and integration tests run only in the plain build (they
# load libferry into Debian's Python, which is not built with a sanitizer).
#   bash scripts/sanitize.sh            FERRY_FUZZ_SECONDS=20 by default
# TSan: Debian's abseil and gRPC are not built with it. testing/tsan/ annotates abseil's locks
# for TSan; the two tests that run a gRPC server in the test process (label grpc-server) are
# left out, because gRPC's callback machinery is ordered by its uninstrumented core.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cmake --preset asan
cmake --build --preset asan -j"$jobs"
ctest --preset asan -j"$jobs"
bash scripts/fuzz.sh build-asan "${FERRY_FUZZ_SECONDS:-20}"

cmake --preset tsan
cmake --build --preset tsan -j"$jobs"
ctest --preset tsan -j"$jobs"   # TSAN_OPTIONS come from the preset
