#!/usr/bin/env bash
# Packs perf (Debian's linux-perf) and a ferryd that keeps its symbols into .perf/
# (git-ignored) for scripts/gpu-profile-run.sh on the lent GPU machine, which has no perf.
# Only libraries that .device/ (scripts/gpu-bundle.sh, run first) lacks go in, so both
# fit in one carry:   run with carry [".device", ".perf"].
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -d .device/lib ]] || { echo "run scripts/gpu-bundle.sh first" >&2; exit 1; }
command -v perf >/dev/null || { apt-get update && apt-get install -y --no-install-recommends linux-perf; }
rm -rf .perf
mkdir -p .perf/strip
cp "$(command -v perf)" .perf/strip/
cp -L "${BUILD_DIR:-build}/server/ferryd" .perf/strip/ferryd
strip --strip-debug .perf/strip/ferryd  # function names stay for perf report
# device-bundle warns about the size before the libraries .device/ has are taken out.
/work/shared/tools/device-bundle .perf .perf/strip/* >/dev/null 2>&1 || true
rm -rf .perf/strip
for f in .perf/lib/*; do [[ ! -e .device/lib/$(basename "$f") ]] || rm "$f"; done
du -sb .device .perf | awk '{s += $1} END {printf "carry: %.1f MiB (at most 64)\n", s / 1048576}'
