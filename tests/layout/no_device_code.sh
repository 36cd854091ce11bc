#!/usr/bin/env bash
# Fails when one of FILEs (shared libraries, static archives, objects) holds CUDA device code
# or ferryd's kernel launchers: a section nvcc puts in every object with kernels
# (.nv_fatbin, .nvFatBinSegment, __nv_module_id), a kernel's host stub (__device_stub__*),
# or a launcher of server/kernels/ (ferry::Launch{NormalizeImages,WidenTokens,GatherRows*},
# ferry::cuda_internal::Enqueue*). CONTROL, a file that does hold ferryd's kernels, must show
# them all, so a pass means the markers were looked for where this toolchain puts them.
#   no_device_code.sh CONTROL FILE...
set -euo pipefail
sections='\] (\.nv_fatbin|\.nvFatBinSegment|__nv_module_id) '
symbols='__device_stub__|ferry::Launch(NormalizeImages|WidenTokens|GatherRows)'
symbols+='|ferry::cuda_internal::Enqueue'

# Prints what of the markers FILE holds, one line each; nothing when it holds none.
markers() {
  readelf -SW "$1" 2>/dev/null | grep -oE "$sections" | sort -u \
    | sed -e 's/^\] /section /' -e 's/ $//' || true
  # The symbol table and, for a stripped library, the dynamic one.
  { nm -C "$1" 2>/dev/null || true; nm -C -D "$1" 2>/dev/null || true; } \
    | grep -oE "$symbols" | sort -u | sed 's/^/symbol /' || true
}

control=$1
shift
control_markers=$(markers "$control")
for want in "section .nv_fatbin" "symbol __device_stub__" "symbol ferry::LaunchNormalizeImages"; do
  if ! grep -qxF "$want" <<<"$control_markers"; then
    echo "control $control lacks '$want': the check no longer sees device code where" \
         "this toolchain puts it; update the markers in $0" >&2
    exit 2
  fi
done

rc=0
for f in "$@"; do
  found=$(markers "$f")
  if [[ -n $found ]]; then
    echo "$f holds device code or ferryd's kernels (the client libraries link cuda/," \
         "never server/kernels/):" >&2
    sed 's/^/  /' <<<"$found" >&2
    rc=1
  else
    echo "ok: $f"
  fi
done
exit $rc
