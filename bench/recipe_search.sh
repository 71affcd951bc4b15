#!/usr/bin/env bash
# Which recipe reaches the lowest val loss in a fixed time? Each candidate trains for BUDGET seconds of training steps
# (`tinygpt train --time-budget`: its cosine schedule ends when they are spent, however fast the machine runs at the
# time; the evaluations at the start and the end, 200 batches of each split, are not counted); the table gives each
# one's median ms/iter, iterations, wall time of the whole run and its final val loss. scripts/train_shakespeare.sh
# runs the winner found on a 2-core machine (docs/RESULTS.md).
#
#   bash bench/recipe_search.sh [DATA] [BUDGET] [THREADS]        # defaults: the corpus, 180, nproc
#
# Candidates: CANDIDATES="name|flags;name|flags;..." replaces the built-in list below (no dropout unless a
# candidate's flags say --dropout). TINYGPT=path runs another
# binary than ./build/tinygpt (a copy, so that the tree can be rebuilt while a long search runs).
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-$(bash scripts/get_data.sh)}
budget=${2:-180}
threads=${3:-$(nproc)}
tinygpt=${TINYGPT:-./build/tinygpt}
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
  lr=$(printf "%s\n" "${flags[@]}" | awk 'prev == "--lr" {print; exit} {prev = $0}')
  rm -rf "$out/r"
  start=$(date +%s.%N)
  "$tinygpt" --threads "$threads" train --data "$data" --out "$out/r" --dropout 0 "${flags[@]}" --time-budget "$budget" \
    --min-lr "$(awk -v l="${lr:-1e-3}" 'BEGIN {print l / 10}')" --warmup-iters 100 --eval-interval 1000000000 \
    --eval-iters 200 --quiet 2> "$out/log" || { echo "$name:" >&2; cat "$out/log" >&2; exit 1; }
  ms=$(grep -o '"ms":[0-9.e+-]*' "$out/r/metrics.jsonl" | cut -d: -f2 | median)
  iters=$(grep -c '"train_s"' "$out/r/metrics.jsonl")
  wall=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {print e - s}')
  val=$(grep '"val_loss"' "$out/r/metrics.jsonl" | tail -n 1 | grep -o '"val_loss":[0-9.e+-]*' | cut -d: -f2)
  printf "%-22s %9.1f %7d %8.1f %9.4f   %s\n" "$name" "$ms" "$iters" "$wall" "$val" "${flags[*]}"
done
