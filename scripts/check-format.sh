#!/usr/bin/env bash
# Checks that ferry's C, C++ and CUDA sources are formatted as .clang-format says (Google
# style, 100 columns), changing nothing: lists each file that clang-format would change and
# exits 1 if there is any. `clang-format -i <file>` formats one.
#   bash scripts/check-format.sh [FILE...]    (default: every tracked or new source file)
# CLANG_FORMAT picks the binary (default clang-format; Debian package clang-format, 14 or
# later).
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format=${CLANG_FORMAT:-clang-format}
command -v "$clang_format" >/dev/null ||
  { echo "check-format.sh: $clang_format not found; apt-get install clang-format" >&2; exit 2; }

if [[ $# -gt 0 ]]; then
  files=("$@")
else
  # Files git knows of or would add (build trees and other ignored paths left out), less
  # generated and third-party code.
  mapfile -t files < <(git ls-files --cached --others --exclude-standard -- \
      '*.c' '*.cc' '*.cpp' '*.h' '*.hh' '*.hpp' '*.cu' '*.cuh' |
    grep -Ev '(^|/)(build[^/]*|third_party|third-party|external)/|\.pb\.(h|cc)$' |
    while read -r f; do [[ -f $f ]] && echo "$f"; done)
fi

unformatted=$(printf '%s\0' "${files[@]}" |
  xargs -0 -r -n 8 -P "$(nproc)" sh -c '
    for f; do "$0" --dry-run --Werror "$f" >/dev/null 2>&1 || echo "$f"; done' "$clang_format" |
  sort)
if [[ -n $unformatted ]]; then
  echo "$unformatted"
  echo "check-format.sh: $(wc -l <<<"$unformatted") of ${#files[@]} files differ from" \
       ".clang-format ($("$clang_format" --version | grep -o 'version [0-9.]*'));" \
       "clang-format -i <file> formats one" >&2
  exit 1
fi
echo "check-format.sh: ${#files[@]} files formatted as .clang-format says"
