#!/usr/bin/env bash
# The unit tests under ASan + UBSan (clang, host transport, preset asan), then every fuzzer for
# a bounded time on its seed corpus. CI runs it after scripts/test.sh. The Python and
# integration tests run only in the plain build (they load libferry into Debian's Python).
#   bash scripts/sanitize.sh            FERRY_FUZZ_SECONDS=20 by default
# No TSan run: Debian's abseil and gRPC are not built with it, so TSan sees no ordering in
# absl::Mutex and reports races under every lock.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cmake --preset asan
cmake --build --preset asan -j"$jobs"
ctest --preset asan -j"$jobs"
bash scripts/fuzz.sh build-asan "${FERRY_FUZZ_SECONDS:-20}"
