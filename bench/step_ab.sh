#!/usr/bin/env bash
# Two tinygpt binaries' training steps side by side: rounds alternating A and B on the same machine, each a short
# `train` run whose step times come from its metrics.jsonl (the first SKIP iterations left out: allocator and
# caches warming). Prints each round's medians and the paired ratios B / A (min, median, max over the rounds), for
# the three-minute job's model and nanoGPT's 6-layer config at --dtype bf16.
#   bench/step_ab.sh OLD_TINYGPT NEW_TINYGPT TEXT_FILE [ROUNDS]
# Environment: THREADS (2), SMALL_ITERS (60), BIG_ITERS (5), SKIP (small 10, big 1).
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: bench/step_ab.sh OLD_TINYGPT NEW_TINYGPT TEXT_FILE [ROUNDS]" >&2; exit 2; }
old=$1 new=$2 text=$3 rounds=${4:-3}
threads=${THREADS:-2} small_iters=${SMALL_ITERS:-60} big_iters=${BIG_ITERS:-5}
for b in "$old" "$new"; do [ -x "$b" ] || { echo "error: $b is not an executable" >&2; exit 1; }; done
[ -r "$text" ] || { echo "error: cannot read $text" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
small=(--n-layer 4 --n-head 4 --n-embd 128 --block-size 128 --batch-size 12 --optimizer muon --muon-lr 0.02
  --muon-weight-decay 0.05 --dtype bf16 --lr 2e-3 --min-lr 0 --cooldown 0.6 --warmup-iters 10 --dropout 0)
big=(--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 64 --dtype bf16 --dropout 0 --warmup-iters 2)

# median_ms RUN_DIR SKIP: the median "ms" of the step rows after the first SKIP.
median_ms() {
  python3 - "$1/metrics.jsonl" "$2" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ms = [r["ms"] for r in rows if "ms" in r][int(sys.argv[2]):]
print(f"{statistics.median(ms):.2f}")
PY
}

run() {  # run BINARY NAME ITERS SKIP FLAGS...
  local bin=$1 name=$2 iters=$3 skip=$4
  shift 4
  rm -rf "$dir/$name"
  "$bin" --threads "$threads" train --data "$text" --out "$dir/$name" --max-iters "$iters" --eval-interval 100000 \
    --eval-iters 1 --quiet "$@" > /dev/null
  median_ms "$dir/$name" "$skip"
}

echo "| round | model | old ms | new ms | new / old time |"
echo "|---|---|---|---|---|"
declare -A ratios
for r in $(seq "$rounds"); do
  for model in small big; do
    if [ "$model" = small ]; then iters=$small_iters skip=${SKIP:-10} flags=("${small[@]}");
    else iters=$big_iters skip=${SKIP:-1} flags=("${big[@]}"); fi
    # A then B on odd rounds, B then A on even ones: a drift over the run weighs on both alike.
    if [ $((r % 2)) -eq 1 ]; then
      a=$(run "$old" old "$iters" "$skip" "${flags[@]}"); b=$(run "$new" new "$iters" "$skip" "${flags[@]}")
    else
      b=$(run "$new" new "$iters" "$skip" "${flags[@]}"); a=$(run "$old" old "$iters" "$skip" "${flags[@]}")
    fi
    ratio=$(python3 -c "print(f'{$b / $a:.3f}')")
    ratios[$model]="${ratios[$model]:-} $ratio"
    echo "| $r | $model | $a | $b | $ratio |"
  done
done
for model in small big; do
  python3 - "$model" ${ratios[$model]} <<'PY'
import statistics, sys
v = sorted(float(x) for x in sys.argv[2:])
print(f"{sys.argv[1]}: new / old step time min {v[0]:.3f}, median {statistics.median(v):.3f}, max {v[-1]:.3f} "
      f"over {len(v)} rounds (speed ratio at the median {1 / statistics.median(v):.3f}x)")
PY
done
