#!/usr/bin/env bash
# Training throughput of tinygpt against eager PyTorch (bench/torch_gpt.py: the same model, data and
# optimizer) on nanoGPT's CPU Shakespeare recipe, measured one after the other in this run; and sampling
# speed with and without the KV cache. Needs a build (scripts/build.sh) and, for the PyTorch side, Debian's
# python3-torch with libopenblas0-openmp (without it torch uses the slow reference BLAS).
#
#   bash bench/compare_torch.sh [DATA] [THREADS] [ITERS]
#
# PyTorch runs at the same thread count as tinygpt and also at one thread (Debian's torch defaults to one
# here, and on two cores it is often faster that way); the ratio is taken against the faster of the two.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-$(bash scripts/get_data.sh)}
threads=${2:-$(nproc)}
iters=${3:-60}
tinygpt=./build/tinygpt
py=/usr/bin/python3
recipe=(--n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch-size 12)
calc() { awk "BEGIN {print $1}"; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Median iteration time, leaving out the first 5 (allocator and cache warm-up), from metrics.jsonl.
"$tinygpt" --threads "$threads" train --data "$data" --out "$out/run" "${recipe[@]}" --max-iters $((iters + 5)) \
  --dropout 0 --eval-interval 100000 --eval-iters 1 --log-interval 100000 2> "$out/train.log"
ours_ms=$(grep -o '"ms":[0-9.e+-]*' "$out/run/metrics.jsonl" | cut -d: -f2 | tail -n +6 | sort -g |
  awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}')
tokens=$((12 * 64))

printf "%-28s %8s %10s %12s\n" "implementation" "threads" "ms/iter" "tokens/s"
printf "%-28s %8d %10.1f %12.0f\n" "tinygpt" "$threads" "$ours_ms" "$(calc "$tokens * 1000 / $ours_ms")"
best_ms=""
if $py -c "import torch" 2> /dev/null; then
  for t in $(echo "$threads 1" | tr ' ' '\n' | sort -un); do
    ms=$($py bench/torch_gpt.py --data "$data" --threads "$t" --iters "$iters" | $py -c 'import json,sys; print(json.load(sys.stdin)["ms"])')
    printf "%-28s %8d %10.1f %12.0f\n" "pytorch $($py -c 'import torch; print(torch.__version__)') eager" "$t" "$ms" \
      "$(calc "$tokens * 1000 / $ms")"
    if [ -z "$best_ms" ] || [ "$(calc "$ms < $best_ms")" = 1 ]; then best_ms=$ms; fi
  done
  printf "tinygpt / fastest pytorch tokens/s: %.2fx\n" "$(calc "$best_ms / $ours_ms")"
else
  echo "pytorch: not installed (apt-get install python3-torch libopenblas0-openmp), no comparison"
fi

# Sampling 500 tokens from the trained run: KV cache against rerunning the context for every token.
secs() { "$tinygpt" --threads "$threads" sample --ckpt "$out/run" --max-new-tokens 500 --seed 1 "$@" 2>&1 > /dev/null |
  sed -n 's/^500 tokens in \([0-9.]*\)s.*/\1/p'; }
best() { local b=""; for _ in 1 2 3; do s=$(secs "$@"); if [ -z "$b" ] || [ "$(calc "$s < $b")" = 1 ]; then b=$s; fi; done; echo "$b"; }
kv=$(best --kv-cache)
full=$(best --no-kv-cache)
printf "sampling 500 tokens: KV cache %.3f s, full recompute %.3f s, speed-up %.1fx\n" "$kv" "$full" "$(calc "$full / $kv")"
