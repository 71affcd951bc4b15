#!/usr/bin/env bash
# Which recipe reaches the lowest val loss in a fixed time? Each candidate trains for BUDGET seconds of training steps
# (`tinygpt train --time-budget`: its schedule ends when they are spent, however fast the machine runs at the time;
# the evaluations at the start and the end, 200 batches of each split, are not counted) once per seed, and the table
# gives each candidate's median ms/iter, mean iterations, mean wall time of a whole run and its final val loss over
# the seeds: mean, min and max, then each seed's. scripts/train_shakespeare.sh runs the winner found on a 2-core
# machine (docs/RESULTS.md).
#
#   bash bench/recipe_search.sh [DATA] [BUDGET] [THREADS]        # defaults: the corpus, 180, nproc
#
# SEEDS="0 1 2" (the default) are the seeds each candidate runs with; one seed screens faster.
# Candidates: CANDIDATES="name|flags;name|flags;..." replaces the built-in list below. Every run gets
# `--dropout 0 --warmup-iters 100 --min-lr LR/10` (LR: the candidate's --lr, else 1e-3) before the candidate's flags,
# which override them. TINYGPT=path runs another binary than ./build/tinygpt (a copy, so that the tree can be rebuilt
# while a long search runs).
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-$(bash scripts/get_data.sh)}
budget=${2:-180}
threads=${3:-$(nproc)}
read -r -a seeds <<< "${SEEDS:-0 1 2}"
tinygpt=${TINYGPT:-./build/tinygpt}
[ -x "$tinygpt" ] || { echo "error: $tinygpt not found: build first (bash scripts/build.sh)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

default_candidates="\
main-job-before|--n-layer 4 --n-head 4 --n-embd 128 --block-size 128 --batch-size 12 --optimizer muon --muon-lr 0.02 --dtype bf16 --lr 2e-3 --min-lr 2e-4;\
wd0.05-cd0.6|--n-layer 4 --n-head 4 --n-embd 128 --block-size 128 --batch-size 12 --optimizer muon --muon-lr 0.02 --dtype bf16 --lr 2e-3 --muon-weight-decay 0.05 --cooldown 0.6 --min-lr 0;\
wd0.05-cd0.6-batch16|--n-layer 4 --n-head 4 --n-embd 128 --block-size 128 --batch-size 16 --optimizer muon --muon-lr 0.02 --dtype bf16 --lr 2e-3 --muon-weight-decay 0.05 --cooldown 0.6 --min-lr 0"
IFS=';' read -r -a cands <<< "${CANDIDATES:-$default_candidates}"

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
printf "%-22s %9s %7s %8s %8s %8s %8s   %-*s %s\n" candidate "ms/iter" iters "wall s" "val mean" "min" "max" \
  $((7 * ${#seeds[@]})) "seeds ${seeds[*]}" flags
for c in "${cands[@]}"; do
  name=${c%%|*}
  read -r -a flags <<< "${c#*|}"
  lr=$(printf "%s\n" "${flags[@]}" | awk 'prev == "--lr" {print; exit} {prev = $0}')
  : > "$out/ms" && : > "$out/runs"
  for seed in "${seeds[@]}"; do
    rm -rf "$out/r"
    start=$(date +%s.%N)
    "$tinygpt" --threads "$threads" train --data "$data" --out "$out/r" --seed "$seed" --dropout 0 --warmup-iters 100 \
      --min-lr "$(awk -v l="${lr:-1e-3}" 'BEGIN {print l / 10}')" --eval-interval 1000000000 --eval-iters 200 \
      "${flags[@]}" --time-budget "$budget" --quiet 2> "$out/log" || { echo "$name, seed $seed:" >&2; cat "$out/log" >&2; exit 1; }
    grep -o '"ms":[0-9.e+-]*' "$out/r/metrics.jsonl" | cut -d: -f2 | median >> "$out/ms"
    iters=$(grep -c '"train_s"' "$out/r/metrics.jsonl")
    wall=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {print e - s}')
    val=$(grep '"val_loss"' "$out/r/metrics.jsonl" | tail -n 1 | grep -o '"val_loss":[0-9.e+-]*' | cut -d: -f2)
    echo "$iters $wall $val" >> "$out/runs"
  done
  read -r iters wall mean lo hi each < <(awk '{i += $1; w += $2; v += $3; lo = (NR == 1 || $3 < lo) ? $3 : lo;
    hi = (NR == 1 || $3 > hi) ? $3 : hi; each = each sprintf("%.4f ", $3)}
    END {printf "%d %.1f %.4f %.4f %.4f %s\n", i / NR, w / NR, v / NR, lo, hi, each}' "$out/runs")
  printf "%-22s %9.1f %7d %8.1f %8.4f %8.4f %8.4f   %-*s %s\n" "$name" "$(median < "$out/ms")" "$iters" "$wall" "$mean" \
    "$lo" "$hi" $((7 * ${#seeds[@]})) "$(awk '{printf "%.4f ", $3}' "$out/runs")" "${flags[*]}"
done
