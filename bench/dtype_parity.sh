#!/usr/bin/env bash
# Does --dtype bf16 train as well as fp32? The three-minute job's recipe (scripts/train_shakespeare.sh: 4 layers, 4 heads,
# 128 wide, context 128, batch 12, Muon at 0.02 for the blocks' matrices and AdamW at 2e-3 for the rest, no dropout)
# trained for ITERS iterations (a fixed count, so both see the same steps; cosine to a tenth at ITERS) in fp32 and in
# bf16, once per seed, the two side by side with one thread each. Each val loss is the mean over 200 batches after
# the last iteration. Prints every pair, the mean and spread of each dtype and of their differences, and whether the
# mean difference is within the issue's 0.01. Val losses, not timings.
#
#   bash bench/dtype_parity.sh [DATA] [SEEDS] [ITERS]        # defaults: the corpus, 3 seeds, 1500 iterations
#   STORAGE=bf16 bash bench/dtype_parity.sh ...              # the bf16 runs with --storage bf16 (default: the CLI's)
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-$(bash scripts/get_data.sh)}
seeds=${2:-3}
iters=${3:-1500}
tinygpt=${TINYGPT:-./build/tinygpt}
[ -x "$tinygpt" ] || { echo "error: $tinygpt not found: build first (bash scripts/build.sh)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
recipe=(--n-layer 4 --n-head 4 --n-embd 128 --block-size 128 --batch-size 12 --optimizer muon --muon-lr 0.02
  --lr 2e-3 --min-lr 2e-4 --warmup-iters 100 --lr-decay-iters "$iters" --dropout 0)

val_of() { grep '"val_loss"' "$1/metrics.jsonl" | tail -n 1 | grep -o '"val_loss":[0-9.e+-]*' | cut -d: -f2; }
printf "%-6s %6s %10s %10s %11s\n" seed iters fp32 bf16 "bf16-fp32"
rows=()
for seed in $(seq 1 "$seeds"); do
  for dtype in fp32 bf16; do
    storage=()
    [ "$dtype" = bf16 ] && [ -n "${STORAGE:-}" ] && storage=(--storage "$STORAGE")
    "$tinygpt" --threads 1 train --data "$data" --out "$out/$dtype$seed" "${recipe[@]}" --max-iters "$iters" \
      --seed "$seed" --dtype "$dtype" "${storage[@]}" --eval-interval "$iters" --eval-iters 200 \
      --log-interval 100000 --quiet 2> "$out/$dtype$seed.log" &
  done
  wait || { cat "$out"/*"$seed".log >&2; exit 1; }
  f=$(val_of "$out/fp32$seed") b=$(val_of "$out/bf16$seed")
  printf "%-6s %6d %10.4f %10.4f %+11.4f\n" "$seed" "$iters" "$f" "$b" "$(awk -v f="$f" -v b="$b" 'BEGIN {print b - f}')"
  rows+=("$f $b")
done
printf "%s\n" "${rows[@]}" | awk '
  { f[NR] = $1; b[NR] = $2; d[NR] = $2 - $1; sf += $1; sb += $2; sd += $2 - $1 }
  END {
    n = NR; mf = sf / n; mb = sb / n; md = sd / n
    for (i = 1; i <= n; ++i) { vf += (f[i] - mf) ^ 2; vb += (b[i] - mb) ^ 2; vd += (d[i] - md) ^ 2 }
    sp = n > 1 ? 1 / (n - 1) : 0
    printf "mean   %6s %10.4f %10.4f %+11.4f\n", "", mf, mb, md
    printf "spread %6s %10.4f %10.4f %11.4f   (sample standard deviations)\n", "", sqrt(vf * sp), sqrt(vb * sp), sqrt(vd * sp)
    printf "bf16 is %s fp32: mean difference %+.4f (aim: within 0.01)\n", (md < 0.01 && md > -0.01) ? "within 0.01 of" : "NOT within 0.01 of", md
  }'
