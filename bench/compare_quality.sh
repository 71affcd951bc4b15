#!/usr/bin/env bash
# Does tinygpt train as well as PyTorch? nanoGPT's CPU Shakespeare recipe (4 layers, 4 heads, 128 wide, context 64,
# batch 12, no dropout, lr 1e-3 warmed up over 100 iterations and cosine-decayed to 1e-4 at ITERS) trained for ITERS
# iterations by tinygpt and by eager PyTorch (bench/torch_gpt.py --full-run: the same model, optimizer, clipping and
# schedule), once per seed; each run's val loss is the mean over 200 batches of 12 after the last iteration. Prints
# every run, then the mean and spread (sample standard deviation) of each, and whether tinygpt's mean lies within
# one spread of PyTorch's. Val losses, not timings: the two run side by side, one thread each.
#
#   bash bench/compare_quality.sh [DATA] [SEEDS] [ITERS]        # defaults: the corpus, 3 seeds, 2000 iterations
#
# PyTorch: $TORCH_PYTHON when set; else a python3 that imports torch; else the current torch from the package index
# in a virtual environment outside the source tree (bench/setup_torch_venv.sh: $TINYGPT_BENCH_VENV, default
# ~/.cache/tinygpt/bench-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-$(bash scripts/get_data.sh)}
seeds=${2:-3}
iters=${3:-2000}
tinygpt=./build/tinygpt
[ -x "$tinygpt" ] || { echo "error: $tinygpt not found: build first (bash scripts/build.sh)" >&2; exit 1; }

py=${TORCH_PYTHON:-}
if [ -z "$py" ]; then
  if python3 -c "import torch" 2> /dev/null; then
    py=python3
  else
    py=$(bash bench/setup_torch_venv.sh | tail -n 1)
  fi
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
recipe=(--n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch-size 12 --dropout 0 --lr 1e-3 --min-lr 1e-4
  --warmup-iters 100 --lr-decay-iters "$iters")

printf "%-10s %6s %14s %14s\n" "seed" "iters" "tinygpt val" "pytorch val"
ours=() theirs=()
for seed in $(seq 1 "$seeds"); do
  "$tinygpt" --threads 1 train --data "$data" --out "$out/run$seed" "${recipe[@]}" --max-iters "$iters" --seed "$seed" \
    --eval-interval "$iters" --eval-iters 200 --log-interval 100000 --quiet 2> "$out/train$seed.log" &
  pid=$!
  torch_json=$(OMP_NUM_THREADS=1 "$py" bench/torch_gpt.py --data "$data" --threads 1 --full-run --iters "$iters" --seed "$seed")
  wait "$pid" || { cat "$out/train$seed.log" >&2; exit 1; }
  ours+=("$(grep '"val_loss"' "$out/run$seed/metrics.jsonl" | tail -n 1 | sed 's/.*"val_loss":\([0-9.e+-]*\).*/\1/')")
  theirs+=("$(echo "$torch_json" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["val_loss"])')")
  printf "%-10s %6d %14.4f %14.4f\n" "$seed" "$iters" "${ours[-1]}" "${theirs[-1]}"
done
version=$(echo "$torch_json" | "$py" -c 'import json,sys; j=json.load(sys.stdin); print(j["torch"], "threads", j["threads"])')
echo "pytorch: $version"
printf "%s\n" "${ours[*]}" "${theirs[*]}" | awk -v n="$seeds" '
  { s = 0; for (i = 1; i <= NF; i++) s += $i; m[NR] = s / NF
    v = 0; for (i = 1; i <= NF; i++) v += ($i - m[NR]) ^ 2; sd[NR] = NF > 1 ? sqrt(v / (NF - 1)) : 0 }
  END {
    printf "%-10s %6s %14s %14s\n", "mean+-sd", "", sprintf("%.4f+-%.4f", m[1], sd[1]), sprintf("%.4f+-%.4f", m[2], sd[2])
    d = m[1] - m[2]; if (d < 0) d = -d
    printf "tinygpt mean - pytorch mean = %+.4f; %s one pytorch spread (%.4f)\n", m[1] - m[2],
      (d <= sd[2]) ? "within" : "NOT within", sd[2]
  }'
