#!/usr/bin/env bash
# Sets everything up and runs all tests that need no GPU (GPU tests are labelled `gpu`).
#   bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
# FERRY_WERROR=ON (set by .ci/run): warnings are errors.
cmake --preset default -DFERRY_WARNINGS_AS_ERRORS="${FERRY_WERROR:-OFF}"
cmake --build --preset default -j"$(nproc)"
ctest --preset default -j"$(nproc)"
