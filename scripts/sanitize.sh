#!/usr/bin/env bash
# The unit tests under ASan + UBSan (clang, host transport, preset asan), every fuzzer for a
# bounded time on its seed corpus, then the unit tests under TSan (preset tsan). CI runs it
# after scripts/test.sh. The Python and integration tests run only in the plain build (they
# load libferry into Debian's Python, which is not built with a sanitizer).
#   bash scripts/sanitize.sh [asan|fuzz|tsan]...   all three by default, in that order;
#                                                  FERRY_FUZZ_SECONDS=20 by default
# `fuzz` builds the asan preset when `asan` did not run before it.
# TSan: Debian's abseil and gRPC are not built with it. testing/tsan/ annotates abseil's locks
# for TSan; the two tests that run a gRPC server in the test process (label grpc-server) are
# left out, because gRPC's callback machinery is ordered by its uninstrumented core.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

build_asan() {
  cmake --preset asan -DFERRY_WARNINGS_AS_ERRORS="${FERRY_WERROR:-OFF}"
  cmake --build --preset asan -j"$jobs"
}

parts=("$@")
((${#parts[@]})) || parts=(asan fuzz tsan)
for part in "${parts[@]}"; do
  case $part in
    asan)
      build_asan
      ctest --preset asan -j"$jobs"
      ;;
    fuzz)
      build_asan
      bash scripts/fuzz.sh build-asan "${FERRY_FUZZ_SECONDS:-20}"
      ;;
    tsan)
      cmake --preset tsan -DFERRY_WARNINGS_AS_ERRORS="${FERRY_WERROR:-OFF}"
      cmake --build --preset tsan -j"$jobs"
      ctest --preset tsan -j"$jobs"   # TSAN_OPTIONS come from the preset
      ;;
    *)
      echo "sanitize.sh: unknown part '$part' (asan, fuzz or tsan)" >&2
      exit 2
      ;;
  esac
done
