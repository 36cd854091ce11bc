#!/usr/bin/env bash
# Compiles ferry's CUDA host code with clang, so that its lock annotations (ABSL_GUARDED_BY,
# ABSL_EXCLUSIVE_LOCKS_REQUIRED ...) are checked: -Wthread-safety is an error under clang,
# and the asan and tsan presets build without CUDA. Compile only (preset clang-cuda, no
# link, no tests): every .cc of the folders below, as the build compiles it. CI runs it.
# Needs the CUDA toolkit (/usr/local/cuda); without one it says so and fails.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset clang-cuda -DFERRY_WARNINGS_AS_ERRORS=ON >/dev/null
build=build-clang-cuda
mapfile -t objects < <(python3 - "$build" <<'PY'
import json, os, re, sys
build = sys.argv[1]
root = os.getcwd() + "/"
folders = ("cuda/", "server/gpu/", "server/gpu/jpeg/", "server/kernels/",
           "client/cpp/internal/cuda_ring")
for entry in json.load(open(os.path.join(build, "compile_commands.json"))):
    source = entry["file"].replace(root, "")
    if source.startswith(folders) and source.endswith(".cc"):
        print(re.search(r" -o (\S+)", entry["command"]).group(1))
PY
)
if ((${#objects[@]} < 10)); then
  echo "check-cuda-locks.sh: ${#objects[@]} CUDA host sources in the build: the clang-cuda" \
    "preset found no CUDA toolkit (nvcc); install one (/usr/local/cuda) to check them" >&2
  exit 1
fi
echo "check-cuda-locks.sh: ${#objects[@]} CUDA host sources under clang -Wthread-safety -Werror"
ninja -C "$build" -j"$(nproc)" "${objects[@]}"
