#!/usr/bin/env bash
# Fails when a tracked C++/CUDA source differs from the checked-in .clang-format (STYLE.md §12).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bad=0
while IFS= read -r f; do
  if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then echo "not formatted: $f"; bad=1; fi
done < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
[ $bad -eq 0 ] && echo "format: all files formatted"
exit $bad
