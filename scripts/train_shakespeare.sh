#!/usr/bin/env bash
# The three-minute job: a character-level GPT on Shakespeare, then a 500-character sample from the best checkpoint.
#   scripts/train_shakespeare.sh [TEXT_FILE] [--nanogpt] [extra `tinygpt train` flags...]
# Without a file: ../shared/data/tinyshakespeare.txt when it exists, else tiny Shakespeare, fetched once.
# The recipe is the one that reached the lowest val loss in 180 s of training on a 2-core machine
# (bench/recipe_search.sh; the search is in docs/RESULTS.md), trained for 180 s of steps (--time-budget) whatever the
# machine's speed. --nanogpt runs nanoGPT's CPU recipe instead (4 layers,
# 4 heads, 128 wide, context 64, batch 12, 2000 iterations), for comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ge 1 ] && [[ "$1" != --* ]]; then
  data=$1
  shift
else
  data=$(bash scripts/get_data.sh)
fi
# 180 s of training steps, whatever the machine's speed; Muon for the blocks' matrices (a little weight decay), AdamW
# for the rest; the peak rate held, then linear to zero over the last 60% (warmup-stable-decay); bf16 matmuls (on
# AMX-BF16 or AVX512-BF16, whichever the CPU does fastest; elsewhere rounded for the f32 units, as fast as fp32).
recipe=(--n-layer 4 --n-head 4 --n-embd 128 --block-size 128 --batch-size 12 --optimizer muon --muon-lr 0.02
  --muon-weight-decay 0.05 --dtype bf16 --time-budget 180 --lr 2e-3 --min-lr 0 --cooldown 0.6 --warmup-iters 100
  --eval-interval 1000)
if [ "${1:-}" = --nanogpt ]; then
  shift
  recipe=(--n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch-size 12 --max-iters 2000 --lr 1e-3 --min-lr 1e-4
    --warmup-iters 100 --lr-decay-iters 2000 --eval-interval 250)
fi
out=${OUT:-out-shakespeare-char}
./build/tinygpt train --data "$data" --out "$out" "${recipe[@]}" --dropout 0 --log-interval 100 "$@"
./build/tinygpt sample --ckpt "$out" --prompt "ROMEO:" --max-new-tokens 500 --seed 1337
