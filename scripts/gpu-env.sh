# Sourced by the scripts that run on the GPU machine (after scripts/gpu-bundle.sh here),
# from the checkout root: the bundle's programs and libraries on the paths, the Python
# package and its libferry, the binaries the GPU tests start, and $OUT for their output.
source .device/env.sh
export PYTHONPATH=$PWD/.device/python PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
export FERRY_DAEMON=$PWD/.device/bin/ferryd FERRYCTL=$PWD/.device/bin/ferryctl
export FERRY_LIBRARY=$PWD/.device/python/ferry/_lib/libferry.so
OUT=${OUT:-/tmp/ferry-out}; mkdir -p "$OUT"
# nvJPEG (loaded at run time): CUDA's copy when the loader does not know one.
if [[ -z ${FERRY_NVJPEG_LIBRARY:-} ]] && ! ldconfig -p | grep -q 'libnvjpeg\.so\.1[123] '; then
  for f in /usr/local/cuda*/targets/x86_64-linux/lib/libnvjpeg.so.1[123]; do
    [[ -e $f ]] && { export FERRY_NVJPEG_LIBRARY=$f; break; }
  done
fi
