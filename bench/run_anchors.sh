#!/usr/bin/env bash
# Runs the anchor benchmarks on the GPU machine, after `scripts/gpu-bundle.sh bench` here:
#   bash bench/run_anchors.sh [DATA_DIR]     (results: $OUT/anchors.txt and anchors.json)
# Generates the dataset if missing or an earlier corpus: bench/make_bench_dataset.py,
# 12,800 ImageNet-like JPEGs (about 105 KiB each) made from the photographs of Debian's
# python3-skimage, which `scripts/gpu-bundle.sh bench` copies into .device/photos, plus 256 MB of
# tokens; bench/corpus_stats.py describes it in $OUT/corpus.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
source .device/env.sh
export PYTHONPATH=$PWD/.device/python PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
export FERRY_LIBRARY=$PWD/.device/python/ferry/_lib/libferry.so
OUT=${OUT:-/tmp/ferry-out}; mkdir -p "$OUT"
data=${1:-/tmp/ferry-bench-data}
if [[ ! -f $data/imagefolder/n01000000/n01000000_0.JPEG ]]; then  # none, or the old corpus
  photos=()
  if [[ -d .device/photos ]]; then
    photos=(--photos .device/photos)
  else
    echo "run_anchors: no .device/photos (scripts/gpu-bundle.sh bench copies python3-skimage's" \
      "photographs there); looking for skimage's data folder here" >&2
  fi
  rm -rf "$data/imagefolder" "$data/shards"
  python3 bench/make_bench_dataset.py "$data" --images 12800 --classes 50 --tokens-mb 256 \
    "${photos[@]}" | tee "$OUT/dataset.txt"
  python3 bench/corpus_stats.py "$data/imagefolder" --limit 2000 | tee "$OUT/corpus.txt"
fi
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 bench/anchors.py --ferryd "$PWD/.device/bin/ferryd" --data "$data" \
  --json "$OUT/anchors.json" "${@:2}" 2>&1 | tee "$OUT/anchors.txt"
