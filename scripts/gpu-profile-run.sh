#!/usr/bin/env bash
# Runs on the GPU machine after scripts/gpu-bundle.sh and scripts/gpu-profile-bundle.sh
# here: a C++ trainer (bench/gpu_consume_bench) takes small GPU batches as fast as it can
# while perf samples ferryd; per-symbol and per-thread profiles go to $OUT.
#   bash scripts/gpu-profile-run.sh [batch rows, default 64] [prefetch, default 0]
set -uo pipefail
source .device/env.sh
source .perf/env.sh
OUT=${OUT:-/tmp/ferry-out}; mkdir -p "$OUT"
batch=${1:-64}
prefetch=${2:-0}
dir=$(mktemp -d)
python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 50257, size=256 << 20, dtype=np.uint16).tofile('$dir/tokens.u16')"
.perf/bin/ferryd --listen "$dir/ferryd.sock" > "$OUT/ferryd.log" 2>&1 &
daemon=$!
sleep 1
for kind in records tokens; do
  gpu_consume_bench --address "$dir/ferryd.sock" --path "$dir/tokens.u16" --batches "$batch" \
    --prefetch "$prefetch" --rounds 1 --epochs 150 --kinds "$kind" > "$OUT/consume-$kind.txt" 2>&1 &
  trainer=$!
  sleep 2  # past job creation and warm-up
  perf record -e cpu-clock -F 4000 -p "$daemon" -o "$dir/perf.data" -- sleep 2 \
    > "$OUT/perf-record-$kind.txt" 2>&1
  wait $trainer
  tail -1 "$OUT/consume-$kind.txt"
  { perf report -i "$dir/perf.data" --stdio --no-children --sort comm 2>/dev/null
    perf report -i "$dir/perf.data" --stdio --no-children --sort comm,dso,sym 2>/dev/null
  } | grep -v '^#' | grep -v '^$' | head -80 > "$OUT/profile-$kind.txt"
  head -8 "$OUT/profile-$kind.txt"
done
kill $daemon
rm -rf "$dir"
