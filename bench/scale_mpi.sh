#!/usr/bin/env bash
# Data-parallel scaling on one machine: nanoGPT's CPU recipe (4 layers, 4 heads, 128 wide, context 64, batch 12 per
# rank, no dropout) trained by 1 process x 1 thread, 2 MPI ranks x 1 thread (gradients reduced in buckets during
# backward, the default, and in one reduction after it, --bucket-mb 0) and 1 process x 2 threads, in rounds in
# this run. Prints tokens/s (median over iterations 10..ITERS of each run; min/median/max over the rounds), the
# ratios against 1 process x 1 thread, and the share of the 2-rank step spent in the gradient reduction (comm_ms in
# metrics.jsonl: the reduction itself plus waiting for the slower rank). The ranks run with --bind-to none: OpenMPI
# pins each rank to a core by default, which measured slower here (docs/RESULTS.md). Needs a build with MPI (scripts/build.sh
# after scripts/setup.sh).
#
#   bash bench/scale_mpi.sh [DATA] [ITERS] [ROUNDS]        # defaults: the corpus, 60, 3
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-$(bash scripts/get_data.sh)}
iters=${2:-60}
rounds=${3:-3}
tinygpt=./build/tinygpt
[ -x "$tinygpt" ] || { echo "error: $tinygpt not found: build first (bash scripts/build.sh)" >&2; exit 1; }
command -v mpirun > /dev/null || { echo "error: mpirun not found: bash scripts/setup.sh installs OpenMPI" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
recipe=(--data "$data" --n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch-size 12 --dropout 0
  --max-iters "$iters" --eval-interval 1000000 --eval-iters 1 --log-interval 1000000 --quiet)

# Median of one field over the iterations from 10 on.
median() { grep '"tok_per_s"' "$1" | tail -n +11 | sed "s/.*\"$2\":\([0-9.e+-]*\).*/\1/" | sort -g |
  awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
stats() { tr ' ' '\n' <<< "$1" | sed '/^$/d' | sort -g | awk '{v[NR] = $1} END {printf "%10.0f %10.0f %10.0f", v[1], v[int((NR + 1) / 2)], v[NR]}'; }

one=() two=() whole=() threads2=() share=() share_whole=()
for r in $(seq "$rounds"); do
  "$tinygpt" --threads 1 train "${recipe[@]}" --out "$out/one$r" 2> /dev/null
  one+=("$(median "$out/one$r/metrics.jsonl" tok_per_s)")
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$tinygpt" --threads 1 train "${recipe[@]}" --out "$out/two$r" 2> /dev/null
  two+=("$(median "$out/two$r/metrics.jsonl" tok_per_s)")
  share+=("$(awk -v c="$(median "$out/two$r/metrics.jsonl" comm_ms)" -v m="$(median "$out/two$r/metrics.jsonl" ms)" 'BEGIN {print 100 * c / m}')")
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$tinygpt" --threads 1 train "${recipe[@]}" --bucket-mb 0 --out "$out/whole$r" 2> /dev/null
  whole+=("$(median "$out/whole$r/metrics.jsonl" tok_per_s)")
  share_whole+=("$(awk -v c="$(median "$out/whole$r/metrics.jsonl" comm_ms)" -v m="$(median "$out/whole$r/metrics.jsonl" ms)" 'BEGIN {print 100 * c / m}')")
  "$tinygpt" --threads 2 train "${recipe[@]}" --out "$out/threads$r" 2> /dev/null
  threads2+=("$(median "$out/threads$r/metrics.jsonl" tok_per_s)")
done
printf "%-26s %10s %10s %10s   (tokens/s over %d rounds)\n" "configuration" "min" "median" "max" "$rounds"
printf "%-26s %s\n" "1 process x 1 thread" "$(stats "${one[*]}")"
printf "%-26s %s\n" "2 MPI ranks x 1 thread" "$(stats "${two[*]}")"
printf "%-26s %s\n" "  the same, --bucket-mb 0" "$(stats "${whole[*]}")"
printf "%-26s %s\n" "1 process x 2 threads" "$(stats "${threads2[*]}")"
med() { tr ' ' '\n' <<< "$1" | sed '/^$/d' | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
awk -v a="$(med "${one[*]}")" -v b="$(med "${two[*]}")" -v c="$(med "${threads2[*]}")" -v s="$(med "${share[*]}")" \
    -v w="$(med "${whole[*]}")" -v sw="$(med "${share_whole[*]}")" 'BEGIN {
  printf "2 ranks x 1 thread / 1 process x 1 thread:  %.2fx (%.2fx with --bucket-mb 0)\n", b / a, w / a
  printf "2 ranks x 1 thread / 1 process x 2 threads: %.2fx\n", b / c
  printf "2-rank step spent waiting on the gradient reduction after backward (median): %.1f%% (%.1f%% with --bucket-mb 0)\n", s, sw }'
