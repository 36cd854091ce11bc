#!/usr/bin/env bash
# Runs the anchor benchmarks on the GPU machine, after scripts/gpu-bundle.sh here:
#   bash bench/run_anchors.sh [DATA_DIR]     (results: $OUT/anchors.txt and anchors.json)
# Generates the dataset (bench/make_bench_dataset.py: 12,800 JPEGs cut from the sample
# photographs that scikit-image and matplotlib ship, plus 256 MB of tokens) if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source .device/env.sh
export PYTHONPATH=$PWD/.device/python PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
export FERRY_LIBRARY=$PWD/.device/python/ferry/_lib/libferry.so
OUT=${OUT:-/tmp/ferry-out}; mkdir -p "$OUT"
data=${1:-/tmp/ferry-bench-data}
if [[ ! -d $data/imagefolder ]]; then
  python3 bench/make_bench_dataset.py "$data" --classes 50 --images-per-class 256 \
    --tokens-mb 256 | tee "$OUT/dataset.txt"
fi
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 bench/anchors.py --ferryd "$PWD/.device/bin/ferryd" --data "$data" \
  --json "$OUT/anchors.json" "${@:2}" 2>&1 | tee "$OUT/anchors.txt"
