#!/usr/bin/env bash
# Which recipe reaches the lowest val loss in a fixed time? Each candidate is timed for 30 iterations, given as many
# iterations as fit in BUDGET seconds of `tinygpt train` (the run's evaluations at the start and the end included:
# 200 batches of each split each), with its cosine schedule ending there, and trained; the table gives each one's
# ms/iter, iterations, wall time of the whole run and its final val loss. scripts/train_shakespeare.sh runs the
# winner found on a 2-core machine (see the README).
#
#   bash bench/recipe_search.sh [DATA] [BUDGET] [THREADS]        # defaults: the corpus, 180, nproc
#
# Candidates: CANDIDATES="name|flags;name|flags;..." replaces the built-in list below.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-$(bash scripts/get_data.sh)}
budget=${2:-180}
threads=${3:-$(nproc)}
tinygpt=./build/tinygpt
[ -x "$tinygpt" ] || { echo "error: $tinygpt not found: build first (bash scripts/build.sh)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

default_candidates="\
nanogpt-cpu|--n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch-size 12 --lr 1e-3;\
nanogpt-cpu-lr2e-3|--n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch-size 12 --lr 2e-3;\
4x128-block128|--n-layer 4 --n-head 4 --n-embd 128 --block-size 128 --batch-size 12 --lr 2e-3;\
6x192-block128|--n-layer 6 --n-head 6 --n-embd 192 --block-size 128 --batch-size 12 --lr 2e-3;\
4x192-block128|--n-layer 4 --n-head 4 --n-embd 192 --block-size 128 --batch-size 16 --lr 2e-3"
IFS=';' read -r -a cands <<< "${CANDIDATES:-$default_candidates}"

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
printf "%-22s %9s %7s %8s %9s   %s\n" candidate "ms/iter" iters "wall s" "val loss" flags
for c in "${cands[@]}"; do
  name=${c%%|*}
  read -r -a flags <<< "${c#*|}"
  # Speed: 30 iterations, median of the last 25.
  rm -rf "$out/t"
  "$tinygpt" --threads "$threads" train --data "$data" --out "$out/t" "${flags[@]}" --dropout 0 --max-iters 30 \
    --eval-interval 1000000 --eval-iters 1 --quiet 2> "$out/log" || { echo "$name:" >&2; cat "$out/log" >&2; exit 1; }
  ms=$(grep -o '"ms":[0-9.e+-]*' "$out/t/metrics.jsonl" | cut -d: -f2 | tail -n 25 | median)
  # An evaluation is 2 x 200 forward passes, about a third of a training step each; two of them, plus start-up.
  iters=$(awk -v b="$budget" -v ms="$ms" 'BEGIN {print int((b - 3 - 2 * 400 * ms / 3000) * 1000 / ms)}')
  if [ "$iters" -lt 100 ]; then
    printf "%-22s %9.1f   too slow: fewer than 100 iterations fit in %s s\n" "$name" "$ms" "$budget"
    continue
  fi
  lr=$(printf "%s\n" "${flags[@]}" | awk 'prev == "--lr" {print; exit} {prev = $0}')
  rm -rf "$out/r"
  start=$(date +%s.%N)
  "$tinygpt" --threads "$threads" train --data "$data" --out "$out/r" "${flags[@]}" --dropout 0 --max-iters "$iters" \
    --lr-decay-iters "$iters" --min-lr "$(awk -v l="${lr:-1e-3}" 'BEGIN {print l / 10}')" --warmup-iters 100 \
    --eval-interval "$iters" --eval-iters 200 --quiet 2> "$out/log" || { echo "$name:" >&2; cat "$out/log" >&2; exit 1; }
  wall=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {print e - s}')
  val=$(grep '"val_loss"' "$out/r/metrics.jsonl" | tail -n 1 | grep -o '"val_loss":[0-9.e+-]*' | cut -d: -f2)
  printf "%-22s %9.1f %7d %8.1f %9.4f   %s\n" "$name" "$ms" "$iters" "$wall" "$val" "${flags[*]}"
done
