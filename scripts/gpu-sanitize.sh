#!/usr/bin/env bash
# Runs on the GPU machine (after `scripts/gpu-bundle.sh tests` here): GPU tests whose ferryds
# run under NVIDIA's compute-sanitizer, so that every CUDA call and kernel of ferryd's copy
# threads, GPU JPEG decode, gather and normalize is checked while trainers attach, take
# batches, get killed and come back. FERRY_SANITIZER_TOOL picks the tool (memcheck, the
# default; racecheck, synccheck, initcheck). Each ferryd's report goes to
# $OUT/sanitizer.<pid>.log; the script prints every error found and fails if there was one.
#   bash scripts/gpu-sanitize.sh [unittest names...]
set -uo pipefail
source scripts/gpu-env.sh
tool=${FERRY_SANITIZER_TOOL:-memcheck}
command -v compute-sanitizer >/dev/null || PATH=$PATH:/usr/local/cuda/bin
wrapper=$OUT/ferryd-under-$tool
# compute-sanitizer does not pass SIGTERM on: the wrapper hands it to ferryd, which drains
# and exits, and the tool then writes its ERROR SUMMARY.
cat > "$wrapper" <<WRAP
#!/bin/bash
compute-sanitizer --tool $tool --log-file $OUT/sanitizer.%p.log "$FERRY_DAEMON" "\$@" &
tool_pid=\$!
trap 'pkill -TERM -P \$tool_pid' TERM INT
rc=0
while kill -0 \$tool_pid 2>/dev/null; do wait \$tool_pid; rc=\$?; done
exit \$rc
WRAP
chmod +x "$wrapper"
tests=("$@")
((${#tests[@]})) || tests=(
  test_gpu_transport.GpuTransportTest.test_a_records_gathered_from_a_file_cut_short
  test_gpu_transport.GpuTransportTest.test_a_gpu_batches_kept_past_a_delete
  test_gpu_transport.GpuTransportTest.test_b_jpeg_decode_on_the_gpu_matches_the_cpus
  test_gpu_transport.GpuTransportTest.test_b_normalize
  test_gpu_transport.GpuTransportTest.test_c_two_ranks_on_one_gpu
  test_gpu_transport.GpuTransportTest.test_d_kill_gpu_trainer_and_resume
  test_gpu_kill_loop
)
rc=0
(cd tests/gpu && FERRY_DAEMON=$wrapper FERRY_GPU_KILL_CYCLES=${FERRY_GPU_KILL_CYCLES:-16} \
  python3 -m unittest -v "${tests[@]}") > "$OUT/sanitized_tests.txt" 2>&1 || rc=1
tail -6 "$OUT/sanitized_tests.txt"
pkill -f "$wrapper" 2>/dev/null
sleep 5
logs=("$OUT"/sanitizer.*.log)
echo "compute-sanitizer --tool $tool: ${#logs[@]} ferryd runs"
# Error reports, not the summary lines (memcheck's "ERROR SUMMARY: 0 errors", racecheck's
# "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)" hold "error" too); and
# each summary that counts anything. A run with no summary line did not finish.
errors=$(cat "${logs[@]}" 2>/dev/null | grep -v ' SUMMARY: ' |
  grep -c -E '^========= (Invalid|Program hit|Race|Barrier|Uninitialized|Host API|Error|.*error)' || true)
errors=$((errors + $(grep -h ' SUMMARY: ' "${logs[@]}" 2>/dev/null |
  grep -vcE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards' || true)))
summaries=$(grep -h ' SUMMARY: ' "${logs[@]}" 2>/dev/null | sort | uniq -c)
echo "${summaries:-no SUMMARY line}"
if (($(grep -l ' SUMMARY: ' "${logs[@]}" 2>/dev/null | wc -l) < ${#logs[@]})); then
  echo "compute-sanitizer: a ferryd run wrote no summary (it did not finish)"
  rc=1
fi
if ((errors > 0)); then
  echo "compute-sanitizer found $errors error report(s); the first:"
  grep -h -A12 -m1 -E '^========= (Invalid|Program hit|Race|Barrier|Uninitialized|Host API|Error)' "${logs[@]}" | head -40
  rc=1
fi
exit $rc
