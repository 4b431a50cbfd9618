#!/usr/bin/env bash
# Lists the longest functions (lines from signature to closing brace) in the given folders,
# largest first: scripts/function-lengths.sh [N] [FOLDER...]. Lambdas count inside their
# enclosing function. Uses universal-ctags (Debian's universal-ctags).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-15}
shift || true
dirs=("$@")
[[ ${#dirs[@]} -eq 0 ]] && dirs=(coordinator workers actors comm)
files=$(git ls-files "${dirs[@]/%//*.cpp}" "${dirs[@]/%//*.h}")
# shellcheck disable=SC2086
ctags --c++-kinds=f --fields=+ne -f - $files |
  awk -F'\t' '$1 !~ /^__anon/ {
      line = ""; end = "";
      for (i = 4; i <= NF; i++) {
        if ($i ~ /^line:/) line = substr($i, 6);
        if ($i ~ /^end:/) end = substr($i, 5);
      }
      if (line != "" && end != "") printf "%5d  %s:%s  %s\n", end - line + 1, $2, line, $1
    }' |
  sort -rn | head -n "$n"
