#!/usr/bin/env bash
# The test suite writes only under temporary directories: `snapshot` (run by CTest before every other test) lists the
# source tree's files with their sizes and modification times, `compare` (run after every other test) fails naming
# each file the suite created, changed or removed. Build directories (build*/ at the top) and .git are left out.
#   tests/source_tree_check.sh snapshot|compare SOURCE_DIR STATE_FILE
set -euo pipefail
mode=$1 src=$2 state=$3
list() { (cd "$src" && find . \( -path ./.git -o -path './build*' \) -prune -o -type f -printf '%p %s %T@\n' | sort); }
case "$mode" in
  snapshot) list > "$state" ;;
  compare)
    changes=$(diff <(cat "$state") <(list) | sed -n 's/^\([<>]\) \(.*\) [0-9]* [0-9.]*$/\1 \2/p' | sort -k2 -u) || true
    if [ -n "$changes" ]; then
      echo "FAIL: the test suite wrote into the source tree $src (< before, > after):"
      echo "$changes"
      exit 1
    fi
    echo "source tree unchanged by the test suite"
    ;;
  *) echo "usage: $0 snapshot|compare SOURCE_DIR STATE_FILE" >&2; exit 2 ;;
esac
