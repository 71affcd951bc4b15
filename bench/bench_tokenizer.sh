#!/usr/bin/env bash
# tinygpt's byte-level BPE against its peers, side by side in one run on the same corpus and threads: training a
# vocabulary (tinygpt tokenizer train; Hugging Face tokenizers' BpeTrainer; rustbpe) and encoding the corpus with it
# (tinygpt tokenizer encode; tiktoken with tinygpt's pattern and ranks; tokenizers), the ids compared.
#   bash bench/bench_tokenizer.sh [CORPUS_DIR] [VOCAB] [REPEATS]
# CORPUS_DIR: made by bench/make_text_corpus.sh when absent (default /tmp/tinygpt-text-corpus, 100 MB of the
# machine's source code and documentation). Peers from bench/setup_tokenizer_venv.sh. Run on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
corpus=${1:-/tmp/tinygpt-text-corpus} vocab=${2:-4096} repeats=${3:-3}
threads=${OMP_NUM_THREADS:-$(nproc)}
[ -d "$corpus" ] || bash bench/make_text_corpus.sh "$corpus" 100 >&2
py=$(bash bench/setup_tokenizer_venv.sh | tail -n 1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' '); $threads threads; commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
# min/median/max of a list of seconds
stats() { sort -g | awk '{a[NR]=$1} END {printf "%8.2f %9.2f %8.2f", a[1], a[int((NR+1)/2)], a[NR]}'; }
time_it() {  # seconds of one run of the command (its output to $work/log)
  local t0 t1
  t0=$(date +%s.%N)
  "$@" > "$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}
train_times=() encode_times=()
for _ in $(seq "$repeats"); do
  train_times+=("$(OMP_NUM_THREADS=$threads time_it ./build/tinygpt tokenizer train --data "$corpus" --vocab-size "$vocab" --out "$work/tok.json")")
done
for _ in $(seq "$repeats"); do
  encode_times+=("$(OMP_NUM_THREADS=$threads time_it ./build/tinygpt tokenizer encode --tokenizer "$work/tok.json" --data "$corpus" --out "$work/ids.bin")")
done
mb=$(find "$corpus" -type f -printf "%s\n" | awk '{s += $1} END {print s}')  # file bytes, not the directories'
printf '\ntinygpt                            detail                    min s  median s    max s\n'
printf 'tinygpt tokenizer train            vocab %-18s %s\n' "$vocab" "$(printf '%s\n' "${train_times[@]}" | stats)"
printf 'tinygpt tokenizer encode           %-24s %s\n' "$((mb / 1000000)) MB" "$(printf '%s\n' "${encode_times[@]}" | stats)"
echo
"$py" bench/tokenizer_peers.py train --data "$corpus" --vocab-size "$vocab" --threads "$threads" --repeats "$repeats"
echo
"$py" bench/tokenizer_peers.py encode --tokenizer "$work/tok.json" --data "$corpus" --ids "$work/ids.bin" --repeats "$repeats"
