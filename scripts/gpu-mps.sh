#!/usr/bin/env bash
# Runs on the GPU machine after `scripts/gpu-bundle.sh bench` here: ferry under NVIDIA MPS, with a
# private nvidia-cuda-mps-control started here and stopped at the end. For
# docs/operations.md's "Sharing the GPU with MPS". Output goes to $OUT.
#   bash scripts/gpu-mps.sh tests   the GPU transport tests with ferryd and the trainers
#                                   as clients of one MPS server; then a trainer under MPS
#                                   fed by a ferryd outside it, and the reverse
#   [ROUNDS=2] [STEPS=200] bash scripts/gpu-mps.sh step
#                                   bench/gpu_step_bench.py without MPS, then under it
set -uo pipefail
source scripts/gpu-env.sh
command -v nvidia-cuda-mps-control >/dev/null || { echo "no nvidia-cuda-mps-control here"; exit 1; }
nvidia-smi --query-gpu=name,pci.bus_id,driver_version,compute_mode --format=csv,noheader \
  | tee "$OUT/gpu.txt"
work=$(mktemp -d)
mps_env="CUDA_MPS_PIPE_DIRECTORY=$work/pipe CUDA_MPS_LOG_DIRECTORY=$work/log"
mkdir -p "$work/pipe" "$work/log"
start_mps() { env $mps_env nvidia-cuda-mps-control -d || { echo "cannot start MPS"; exit 1; }; }
stop_mps() { echo quit | env $mps_env nvidia-cuda-mps-control; sleep 1; }
trap 'stop_mps >/dev/null 2>&1; cp "$work"/log/*.log "$OUT"/ 2>/dev/null; rm -rf "$work"' EXIT
rc=0

# A trainer: one epoch of uint16 tokens widened on the GPU, every row checked against the
# file. Arguments: ferryd's address, the token file.
cat > "$work/trainer.py" <<'PY'
import sys, time, numpy as np, torch, ferry
address, path = sys.argv[1], sys.argv[2]
want = torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64))
t = time.time()
try:
    loader = ferry.Loader(ferry.Tokens(path, seq_len=1023, dtype="uint16"), batch_size=16,
                          shuffle=False, device="cuda:0", address=address, timeout=30)
    n = 0
    for b in loader:
        for row, i in zip(b["tokens"].cpu(), b["index"].cpu().tolist()):
            assert torch.equal(row, want[i * 1023:i * 1023 + 1024]), i
        n += 1
    loader.close()
    print("ok: %d batches checked in %.1f s" % (n, time.time() - t))
except ferry.FerryError as e:
    print("FerryError after %.1f s: %s" % (time.time() - t, e))
    sys.exit(1)
PY
python3 -c "import numpy as np; np.arange(1 << 22, dtype=np.uint16).tofile('$work/tokens.u16')"
# $1: "mps" or "plain" for ferryd, $2 likewise for the trainer.
pairing() {
  local d=$work/ferryd-$1-$2 prefix=""
  mkdir -p "$d"
  [[ $1 == mps ]] && prefix="env $mps_env"
  $prefix "$FERRY_DAEMON" --listen "$d/ferryd.sock" > "$OUT/ferryd-$1-$2.log" 2>&1 &
  local daemon=$!
  for _ in $(seq 100); do [[ -S $d/ferryd.sock ]] && break; sleep 0.05; done
  prefix=""; [[ $2 == mps ]] && prefix="env $mps_env"
  echo "== ferryd $1, trainer $2"
  $prefix timeout 120 python3 "$work/trainer.py" "$d/ferryd.sock" "$work/tokens.u16" || rc=1
  kill $daemon; wait $daemon
}

case ${1:-} in
tests)
  start_mps
  echo "== GPU transport tests, ferryd and trainers under MPS"
  (cd tests/gpu && env $mps_env python3 -m unittest -v test_gpu_transport) \
    > "$OUT/gpu_transport-mps.txt" 2>&1 || rc=1
  grep -E "ok$|FAIL|ERROR|^Ran|^OK|pinned bytes" "$OUT/gpu_transport-mps.txt" | tail -15
  pairing mps mps
  pairing plain mps
  pairing mps plain
  echo "MPS servers: $(echo get_server_list | env $mps_env nvidia-cuda-mps-control | tr '\n' ' ')"
  ;;
step)
  bench() {
    python3 bench/gpu_step_bench.py --ferryd "$FERRY_DAEMON" --rounds "${ROUNDS:-2}" \
      --steps "${STEPS:-200}" 2>&1 | tee "$OUT/gpu_step_bench-$1.txt"
  }
  echo "== without MPS (each process its own CUDA context; the GPU time-slices between them)"
  bench plain
  start_mps
  echo "== under MPS (ferryd and the trainer share one MPS server)"
  export CUDA_MPS_PIPE_DIRECTORY=$work/pipe CUDA_MPS_LOG_DIRECTORY=$work/log
  bench mps
  ;;
*) echo "usage: $0 tests|step"; exit 2 ;;
esac
exit $rc
