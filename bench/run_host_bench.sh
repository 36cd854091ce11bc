#!/usr/bin/env bash
# Host-transport JPEG pipeline benchmark on this machine (docs/benchmarks.md has its figures
# on a 2-core CI-class box).
# Generates the demo dataset if missing, builds, runs host_pipeline_bench.
#   bash bench/run_host_bench.sh [DATA_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-build/demo/imagenet}
if [[ ! -d $data ]]; then
  /usr/bin/python3 examples/make_demo_dataset.py "$data" --classes 10 --images-per-class 100
fi
cmake --preset default >/dev/null
cmake --build --preset default --target host_pipeline_bench
./build/bench/host_pipeline_bench --data "$data" --batch 64 --epochs 3
