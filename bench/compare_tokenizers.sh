#!/usr/bin/env bash
# The three-minute job (scripts/train_shakespeare.sh: 180 s of training steps) over characters and over byte-level BPEs
# of a few vocabulary sizes, each for a few seeds, compared in validation bits per byte (the loss per token turned
# into bits per byte of the held-out text, so tokenizers compare). Prints one row a run and a summary a tokenizer.
#   bash bench/compare_tokenizers.sh [TEXT_FILE] [SEEDS] [VOCABS]   # defaults: tiny Shakespeare, "0 1 2", "512 2048"
# Runs one after another (about 3.5 minutes each); run on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-$(bash scripts/get_data.sh)}
seeds=${2:-0 1 2}
vocabs=${3:-512 2048}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' '); commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $(date -u +%F)"
printf '%-12s %5s %11s %10s %9s\n' tokenizer seed iterations "val loss" "val bpb"
results=()
for tok in char $vocabs; do
  for seed in $seeds; do
    flags=(--seed "$seed")
    [ "$tok" = char ] || flags+=(--tokenizer bpe --vocab-size "$tok")
    OUT="$work/run" bash scripts/train_shakespeare.sh "$data" "${flags[@]}" --quiet > /dev/null 2> "$work/log" ||
      { cat "$work/log" >&2; exit 1; }
    line=$(grep '"val_bpb"' "$work/run/metrics.jsonl" | tail -1)
    loss=$(sed 's/.*"val_loss":\([0-9.e+-]*\).*/\1/' <<< "$line")
    bpb=$(sed 's/.*"val_bpb":\([0-9.e+-]*\).*/\1/' <<< "$line")
    iters=$(sed 's/.*"iter":\([0-9]*\).*/\1/' <<< "$line")
    printf '%-12s %5s %11s %10.4f %9.4f\n' "$([ "$tok" = char ] && echo char || echo "bpe $tok")" "$seed" "$iters" "$loss" "$bpb"
    results+=("$tok $bpb")
    rm -rf "$work/run"
  done
done
echo
printf '%s\n' "${results[@]}" | awk '{n[$1]++; s[$1]+=$2; if (!($1 in lo) || $2 < lo[$1]) lo[$1]=$2; if ($2 > hi[$1]) hi[$1]=$2}
  END {for (k in n) printf "%-12s mean val bpb %.4f (min %.4f, max %.4f, %d seeds)\n", (k == "char" ? "char" : "bpe " k), s[k]/n[k], lo[k], hi[k], n[k]}'
