#!/usr/bin/env bash
# The main job: nanoGPT's CPU recipe for character-level Shakespeare (about two minutes on two cores), then a
# 500-character sample from the best checkpoint.
#   scripts/train_shakespeare.sh [TEXT_FILE] [extra `tinygpt train` flags...]
# Without a file: ../shared/data/tinyshakespeare.txt when it exists, else tiny Shakespeare, fetched once.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ge 1 ] && [[ "$1" != --* ]]; then
  data=$1
  shift
else
  data=$(bash scripts/get_data.sh)
fi
out=${OUT:-out-shakespeare-char}
./build/tinygpt train --data "$data" --out "$out" --n-layer 4 --n-head 4 --n-embd 128 --block-size 64 \
  --batch-size 12 --max-iters 2000 --lr 1e-3 --min-lr 1e-4 --warmup-iters 100 --lr-decay-iters 2000 \
  --dropout 0 --log-interval 100 "$@"
./build/tinygpt sample --ckpt "$out" --prompt "ROMEO:" --max-new-tokens 500 --seed 1337
