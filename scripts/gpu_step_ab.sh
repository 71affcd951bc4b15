#!/usr/bin/env bash
# Two builds' GPU training step side by side: nanoGPT's Shakespeare config (6 layers, 384 wide, context 256, batch 64),
# the same flags for both, alternating, ROUNDS rounds; each run's median ms/iter of iterations 11-70 (metrics.jsonl, as
# gpu_check.sh reads it).
#
#   bash scripts/gpu_step_ab.sh BEFORE/tinygpt AFTER/tinygpt [ROUNDS]   # ROUNDS: 2
#
# FLAGS="..." replaces the flag sets tried (one per line); the default: --dtype bf16 with dropout 0.2, the same
# without a CUDA graph, and dropout 0.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: bash scripts/gpu_step_ab.sh BEFORE/tinygpt AFTER/tinygpt [ROUNDS]" >&2; exit 2; }
for bin in "$1" "$2"; do [ -x "$bin" ] || { echo "error: $bin is not an executable" >&2; exit 1; }; done
before=$(realpath "$1") after=$(realpath "$2") rounds=${3:-2}
cd "$(dirname "$0")/.."
data=$(bash scripts/get_data.sh)
cfg=(--device cuda --data "$data" --n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 64 --max-iters 70
  --eval-interval 100000 --eval-iters 1 --log-interval 10)
flag_sets=${FLAGS:-"--dtype bf16 --dropout 0.2
--dtype bf16 --dropout 0.2 --no-cuda-graphs
--dtype bf16 --dropout 0"}
ms() {  # median ms/iter of one run of binary $1 with flags $2...
  local run
  run=$(mktemp -d)
  timeout 120 "$1" train "${cfg[@]}" --out "$run" "${@:2}" < /dev/null > /dev/null 2>&1
  grep -o '"ms":[0-9.e+-]*' "$run/metrics.jsonl" 2> /dev/null | cut -d: -f2 | tail -n +11 | sort -g |
    awk '{v[NR] = $1} END {if (NR) printf "%.2f", v[int((NR + 1) / 2)]; else printf "failed"}'
  rm -rf "$run"
}
while IFS= read -r flags; do
  [ -n "$flags" ] || continue
  for round in $(seq "$rounds"); do
    # shellcheck disable=SC2086  # the flags split into words
    echo "$flags | round $round | before $(ms "$before" $flags) | after $(ms "$after" $flags) ms/iter"
  done
done <<< "$flag_sets"
