#!/usr/bin/env bash
# Sets everything up and runs all tests that need no GPU (GPU tests are labelled `gpu`).
#   bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
# The S3-compatible server the remote-dataset tests read from (testing/s3rver, npm).
npm ci --prefix testing/s3rver --no-audit --no-fund --loglevel=error
# FERRY_WERROR=ON (set by .ci/run): warnings are errors.
cmake --preset default -DFERRY_WARNINGS_AS_ERRORS="${FERRY_WERROR:-OFF}"
cmake --build --preset default -j"$(nproc)"
ctest --preset default -j"$(nproc)"
