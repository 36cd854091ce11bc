#!/usr/bin/env bash
# Runs on the GPU machine from the checkout root, after `scripts/gpu-bundle.sh tests` (or
# `bench`) here: the CUDA unit tests and the GPU transport tests, or the GPU benchmarks;
# `multi` (a tests bundle, on a machine of 2 or more GPUs) runs the multi-GPU tests
# (tests/gpu/test_multi_gpu.py; FERRY_MULTI_GPU_ROUNDS rounds); `node` (a bench bundle, on
# a machine of several GPUs) makes the benchmark corpus and runs bench/node_bench.py over
# every GPU (NODE_BENCH_ARGS adds its options). Logs go to $OUT.
set -uo pipefail
source scripts/gpu-env.sh
nvidia-smi --query-gpu=name,pci.bus_id,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
rc=0
# Argument: "tests" or "bench", the half the bundle holds.
[[ ${1:-} == tests || ${1:-} == bench || ${1:-} == multi || ${1:-} == node ]] ||
  { echo "usage: gpu-device-run.sh tests|bench|multi|node" >&2; exit 2; }
if [[ $1 == node ]]; then
  data=/tmp/ferry-node-data
  if [[ ! -d $data/imagefolder ]]; then
    python3 bench/make_bench_dataset.py "$data" --images 12800 --classes 50 --no-shards \
      --photos .device/photos > "$OUT/dataset.txt" 2>&1 || { tail "$OUT/dataset.txt"; exit 1; }
    tail -3 "$OUT/dataset.txt"
  fi
  # shellcheck disable=SC2086
  python3 bench/node_bench.py --ferryd "$FERRY_DAEMON" --ferryctl "$FERRYCTL" --data "$data" \
    --json "$OUT/node_bench.json" ${NODE_BENCH_ARGS:-} 2>&1 | tee "$OUT/node_bench.txt" || rc=1
fi
if [[ $1 == multi ]]; then
  (cd tests/gpu && python3 -m unittest -v test_multi_gpu) > "$OUT/multi_gpu.txt" 2>&1 || rc=1
  tail -25 "$OUT/multi_gpu.txt"
fi
if [[ $1 == tests ]]; then
  for t in cuda_test kernels_test gpu_jpeg_decoder_test; do
    $t > "$OUT/$t.txt" 2>&1 || rc=1
    grep -E "FAILED|Failure|PASSED" -A3 "$OUT/$t.txt" | tail -20
  done
  (cd tests/gpu && python3 -m unittest -v test_gpu_transport) > "$OUT/gpu_transport.txt" 2>&1 || rc=1
  tail -25 "$OUT/gpu_transport.txt"
  (cd tests/gpu && python3 -m unittest -v test_gpu_kill_loop) > "$OUT/gpu_kill_loop.txt" 2>&1 || rc=1
  tail -8 "$OUT/gpu_kill_loop.txt"
fi
if [[ $1 == bench ]]; then
  h2d_bench > "$OUT/h2d_bench.txt" 2>&1 || rc=1
  sed -n '/^H2D cudaMemcpyAsync/,/^D2D/p' "$OUT/h2d_bench.txt" | grep -v '^D2D'
  python3 examples/make_demo_dataset.py /tmp/ferry-images --classes 20 --images-per-class 100 \
    >/dev/null
  python3 bench/gpu_bench.py --ferryd "$FERRY_DAEMON" --images /tmp/ferry-images --prefetch 0,8 2>&1 \
    | tee "$OUT/gpu_bench.txt"
  python3 bench/gpu_step_bench.py --ferryd "$FERRY_DAEMON" 2>&1 | tee "$OUT/gpu_step_bench.txt"
  python3 bench/make_scale_corpora.py /tmp/ferry-scale --photos .device/photos >/dev/null &&
    reduced_scale_bench /tmp/ferry-scale/photos /tmp/ferry-scale/detailed /tmp/ferry-scale/camera \
      2>&1 | tee "$OUT/reduced_scale_bench.txt"
fi
exit $rc
