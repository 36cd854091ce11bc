#!/usr/bin/env bash
# Sets everything up and runs all tests that need no GPU (GPU tests are labelled `gpu`).
#   bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
cmake --preset default
cmake --build --preset default -j"$(nproc)"
ctest --preset default -j"$(nproc)"
