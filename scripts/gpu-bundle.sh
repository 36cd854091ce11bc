#!/usr/bin/env bash
# Builds here and packs what the GPU tests and benchmarks need into .device/ (git-ignored)
# for the lent GPU machine, which lacks gRPC, protobuf, abseil, libnuma, libjpeg-turbo and
# libspng. Everything does not fit the 60 MiB a device call carries, so pick a half:
#   bash scripts/gpu-bundle.sh tests   then, there:   bash scripts/gpu-device-run.sh tests
#   bash scripts/gpu-bundle.sh bench   then, there:   bash scripts/gpu-device-run.sh bench
# (ferryd, ferryctl and the Python package are in both.)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
case ${1:-} in
  tests) programs=(cuda/cuda_test server/kernels/kernels_test
                   server/gpu/jpeg/gpu_jpeg_decoder_test) ;;
  bench) programs=(bench/h2d_bench bench/photometric_bench bench/gpu_consume_bench
                   bench/host_pipeline_bench bench/gpu_jpeg_bench bench/reduced_scale_bench) ;;
  *) echo "usage: scripts/gpu-bundle.sh tests|bench" >&2; exit 2 ;;
esac
[[ $build != build ]] || cmake --preset default >/dev/null
targets=(ferryd ferryctl ferry_c ferry_python)
for p in "${programs[@]}"; do targets+=("$(basename "$p")"); done
cmake --build "$build" --target "${targets[@]}"
rm -rf .device
mkdir -p .device/strip
for f in server/ferryd client/ferryctl/ferryctl client/c/libferry.so.1 "${programs[@]}"; do
  cp -L "$build/$f" .device/strip/
  strip -s ".device/strip/$(basename "$f")"
done
/work/shared/tools/device-bundle .device .device/strip/*
rm -rf .device/strip
# The Python package keeps its layout; its libferry is the bundled one.
mkdir -p .device/python
cp -r "$build/python/ferry" .device/python/
cp .device/lib/libferry.so.1 .device/python/ferry/_lib/libferry.so
# The benchmark corpus's source photographs (Debian's python3-skimage), so that
# bench/run_anchors.sh makes the same corpus there as bench/make_bench_dataset.py here.
/usr/bin/python3 bench/make_bench_dataset.py --export-photos .device/photos ||
  echo "gpu-bundle: no benchmark photographs bundled (apt-get install python3-skimage);" \
    "bench/run_anchors.sh will look for them on the GPU machine" >&2
du -sh .device
