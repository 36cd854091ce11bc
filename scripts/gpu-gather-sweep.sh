#!/usr/bin/env bash
# Runs on the GPU machine after `scripts/gpu-bundle.sh bench` here: raw int64 records delivered to
# a C++ trainer (bench/gpu_consume_bench) by ferryd's page-cache gather, for several
# gather_streams / gather_thread_blocks settings side by side, each against the pinned
# cudaMemcpyAsync peak of its own rounds; then h2d_bench's gather-kernel table. For
# choosing those settings' defaults (docs/benchmarks.md). Output goes to $OUT.
#   [ROUNDS=3] [PREFETCH=0] [H2D=1] [EXTRA_CONFIG='gather_every_batch: true']
#     bash scripts/gpu-gather-sweep.sh ["streams:blocks streams:blocks ..."]
set -uo pipefail
source .device/env.sh
OUT=${OUT:-/tmp/ferry-out}; mkdir -p "$OUT"
settings=${1:-"4:16 2:64 8:8 3:32"}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 50257, size=256 << 20, dtype=np.uint16).tofile('$dir/tokens.u16')"
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
for setting in $settings; do
  streams=${setting%%:*}
  blocks=${setting##*:}
  printf 'gather_streams: %s\ngather_thread_blocks: %s\n%s\n' "$streams" "$blocks" \
    "${EXTRA_CONFIG:-}" > "$dir/ferryd.conf"
  ferryd --config "$dir/ferryd.conf" --listen "$dir/ferryd.sock" > "$OUT/ferryd-$streams-$blocks.log" 2>&1 &
  daemon=$!
  for _ in $(seq 100); do [[ -S $dir/ferryd.sock ]] && break; sleep 0.05; done
  echo "== gather_streams $streams, gather_thread_blocks $blocks ${EXTRA_CONFIG:-}"
  gpu_consume_bench --address "$dir/ferryd.sock" --path "$dir/tokens.u16" --batches 64,256 \
    --prefetch "${PREFETCH:-0}" --rounds "${ROUNDS:-3}" --kinds records 2>&1 | grep -E "peak|records"
  # Batches gathered of those copied, over every job of this ferryd (status).
  ferryctl --address "$dir/ferryd.sock" --json status | python3 -c '
import json, sys
ranks = [r for j in json.load(sys.stdin).get("jobs", []) for r in j.get("ranks", [])]
print("gathered %d of %d batches" % (sum(int(r.get("batches_gathered", 0)) for r in ranks),
                                     sum(int(r.get("batches_copied", 0)) for r in ranks)))'

  kill $daemon; wait $daemon
  rm -f "$dir/ferryd.sock"
done 2>&1 | tee "$OUT/sweep.txt"
[[ ${H2D:-1} == 1 ]] || exit 0
h2d_bench > "$OUT/h2d_bench.txt" 2>&1
sed -n '/^Gather kernel/,/^D2D/p' "$OUT/h2d_bench.txt" | grep -v '^D2D'
