#!/usr/bin/env bash
# Sets everything up and runs ferry's demo on this machine (the README's Quick start):
# installs the Debian packages, builds what the demo runs (the `demo` target: ferryd,
# ferryctl, the Python package), writes a small synthetic ImageNet-like dataset with two
# corrupt files in it, starts ferryd on a private socket, trains a stand-in model on it
# through the Python Loader (showing `ferryctl job` while it runs), does the same with
# torch's DataLoader and prints both side by side, and stops ferryd.
#   bash scripts/demo.sh
# Knobs (environment): DEMO_CLASSES (10), DEMO_IMAGES_PER_CLASS (100), DEMO_EPOCHS (3),
# DEMO_BATCH_SIZE (64), DEMO_BASELINE_WORKERS (4, or the CPUs when fewer; 0 skips the
# baseline), DEMO_SKIP_DEPS=1
# to skip the apt step, PYTHON (/usr/bin/python3).
set -euo pipefail
cd "$(dirname "$0")/.."

classes=${DEMO_CLASSES:-10}
per_class=${DEMO_IMAGES_PER_CLASS:-100}
epochs=${DEMO_EPOCHS:-3}
batch_size=${DEMO_BATCH_SIZE:-64}
# Debian's interpreter, where python3-numpy/-torch/-pil live (a pyenv or venv python
# earlier on PATH would not see them).
python=${PYTHON:-/usr/bin/python3}

if [[ ${DEMO_SKIP_DEPS:-0} != 1 ]]; then
  bash deploy/install-deps.sh
fi
cmake --preset default
cmake --build --preset default -j"$(nproc)" --target demo

demo=build/demo
data=$demo/imagenet-${classes}x${per_class}
mkdir -p "$demo"
if [[ -d $data ]]; then
  echo "== dataset: reusing $data"
else
  echo "== dataset: writing $data"
  # Written under another name and renamed when complete, so an interrupted run is
  # redone rather than reused.
  rm -rf "$data.partial"
  "$python" examples/make_demo_dataset.py "$data.partial" --classes "$classes" \
    --images-per-class "$per_class" --seed 0
  # Two corrupt files, as real corpora have: a JPEG cut short and text named .jpg. ferryd
  # quarantines them and goes on (`ferryctl job` lists them).
  first_class=$(ls "$data.partial" | head -n 1)
  first_image=$(ls "$data.partial/$first_class" | head -n 1)
  head -c 2000 "$data.partial/$first_class/$first_image" >"$data.partial/$first_class/zz_truncated.jpg"
  echo "not a JPEG: a file that a crawler saved as one" >"$data.partial/$first_class/zz_text.jpg"
  mv "$data.partial" "$data"
fi

# A private daemon: its own socket, and a config that lets it serve only the demo's data
# (the config file format is deploy/ferryd.conf.example's).
socket=$demo/ferryd.sock
cat >"$demo/ferryd.conf" <<EOF
# Written by scripts/demo.sh. Format: ferry.v1.DaemonConfig in protobuf text format.
dataset_roots: "$(realpath "$demo")"
EOF
echo "== starting ferryd on $socket (log: $demo/ferryd.log)"
build/server/ferryd --config "$demo/ferryd.conf" --listen "$socket" >"$demo/ferryd.log" 2>&1 &
ferryd_pid=$!
stop_ferryd() {
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "== demo failed (exit $rc); last lines of $demo/ferryd.log:" >&2
    tail -n 20 "$demo/ferryd.log" >&2 || true
  fi
  if kill -0 "$ferryd_pid" 2>/dev/null; then
    kill -TERM "$ferryd_pid"
    wait "$ferryd_pid" || true
    echo "== ferryd stopped"
  fi
}
trap stop_ferryd EXIT

for _ in $(seq 100); do
  [[ -S $socket ]] && break
  if ! kill -0 "$ferryd_pid" 2>/dev/null; then
    echo "ferryd exited before it listened on $socket; its log:" >&2
    cat "$demo/ferryd.log" >&2
    exit 1
  fi
  sleep 0.1
done
[[ -S $socket ]] || { echo "ferryd did not create $socket within 10 s; see $demo/ferryd.log" >&2; exit 1; }

echo "== training: $epochs epochs, batch $batch_size, RandomResizedCrop(224, flip), host transport"
PYTHONPATH=build/python${PYTHONPATH:+:$PYTHONPATH} "$python" examples/train_demo.py "$data" \
  --address "$socket" --epochs "$epochs" --batch-size "$batch_size" \
  --ferryctl build/client/ferryctl/ferryctl \
  --baseline-workers "${DEMO_BASELINE_WORKERS:-$(($(nproc) < 4 ? $(nproc) : 4))}"
