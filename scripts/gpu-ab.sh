#!/usr/bin/env bash
# Runs on the GPU machine after `scripts/gpu-bundle.sh bench` here: two ferryd builds side by side
# on the same lease, alternated (A B A B ...), each feeding the C++ trainer
# (bench/gpu_consume_bench) tokens and raw records against the pinned copy peak of its own
# rounds. For telling a change's effect from the lease's noise, which on a shared box moves
# these ratios by up to 0.3x between runs of one binary. Output goes to $OUT.
#   [PAIRS=3] [ROUNDS=3] bash scripts/gpu-ab.sh A_FERRYD B_FERRYD
# To build an older commit's ferryd for A, here:
#   git worktree add /tmp/old <commit> && (cd /tmp/old && cmake --preset default &&
#   cmake --build build --target ferryd) && cp /tmp/old/build/server/ferryd .device/bin/ferryd-a
set -uo pipefail
source .device/env.sh
OUT=${OUT:-/tmp/ferry-out}; mkdir -p "$OUT"
[[ $# == 2 ]] || { echo "usage: $0 A_FERRYD B_FERRYD"; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 50257, size=256 << 20, dtype=np.uint16).tofile('$dir/tokens.u16')"
for pair in $(seq "${PAIRS:-3}"); do
  for side in A B; do
    binary=$1; [[ $side == B ]] && binary=$2
    "$binary" --listen "$dir/ferryd.sock" > "$OUT/ferryd-$side-$pair.log" 2>&1 &
    daemon=$!
    for _ in $(seq 100); do [[ -S $dir/ferryd.sock ]] && break; sleep 0.05; done
    echo "== $side ($binary), pair $pair"
    gpu_consume_bench --address "$dir/ferryd.sock" --path "$dir/tokens.u16" --batches 64,256 \
      --prefetch 0 --rounds "${ROUNDS:-3}" 2>&1 | grep -E "^ferry"
    kill $daemon; wait $daemon
    rm -f "$dir/ferryd.sock"
  done
done 2>&1 | tee "$OUT/ab.txt"
