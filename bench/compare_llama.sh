#!/usr/bin/env bash
# A fine-tuning step of SmolLM2-135M's shape (30 layers x 576, 9 heads, 3 key/value heads, MLP 1536, vocabulary
# 49,152, tied head), batch B x context T, tinygpt against PyTorch + transformers' LlamaForCausalLM side by side in one
# run. The model is made by transformers with random weights (bf16, as the Hub ships it) and imported with
# `tinygpt import --format hf`; its tokenizer is a BPE trained here, padded with unused special tokens to 49,152.
# tinygpt: `train --init-from` with --dtype bf16 and with fp32, STEPS timed steps after one warm-up (metrics.jsonl's
# ms); PyTorch: bench/torch_llama.py (eager and torch.compile, f32 and autocast bf16, fused AdamW, SDPA; its
# configuration printed at run time). Peak resident memory of each by /usr/bin/time. Needs a venv with torch and
# transformers (VENV, default /tmp/venv-hf); run on an idle machine.
#   [PEER_TIMEOUT=SECONDS] bash bench/compare_llama.sh [BUILD] [B] [T] [STEPS] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build} batch=${2:-4} ctx=${3:-512} steps=${4:-3} threads=${5:-2}
py=${VENV:-/tmp/venv-hf}/bin/python
"$py" -c "import torch, transformers" 2> /dev/null || { echo "compare_llama: no torch and transformers in ${VENV:-/tmp/venv-hf}; skipped"; exit 0; }
data=../shared/data/tinyshakespeare.txt
[ -f "$data" ] || data=$(bash scripts/get_data.sh)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$build/tinygpt" tokenizer train --data "$data" --vocab-size 2048 --out "$dir/tok.json" 2> /dev/null
"$py" - "$dir/hf" "$dir/tok.json" <<'EOF'
import json, pathlib, sys
import torch, transformers
out, tokfile = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
tok = json.loads(tokfile.read_text())
n, V = len(tok["model"]["vocab"]), 49152
tok["added_tokens"] += [{"id": i, "content": f"<|unused_{i}|>", "single_word": False, "lstrip": False, "rstrip": False,
                         "normalized": False, "special": True} for i in range(n, V)]
cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                               num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                               rms_norm_eps=1e-5, rope_theta=1e5, tie_word_embeddings=True)
torch.manual_seed(0)
transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
(out / "tokenizer.json").write_text(json.dumps(tok))
(out / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
EOF
"$build/tinygpt" import --format hf --from "$dir/hf" --out "$dir/run" 2> /dev/null
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' '), model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | tr -d ' '), $threads threads"
for dtype in bf16 fp32; do
  /usr/bin/time -f "%M" -o "$dir/rss" "$build/tinygpt" --threads "$threads" train --init-from "$dir/run" --data "$data" \
    --out "$dir/ft-$dtype" --block-size "$ctx" --batch-size "$batch" --dtype "$dtype" --max-iters $((steps + 1)) \
    --eval-interval 100000 --eval-iters 1 --warmup-iters 1 --quiet 2> "$dir/ft-$dtype.log"
  grep -m1 "^speed" "$dir/ft-$dtype.log" | cut -c1-200 || true
  ms=$(grep -o '"ms":[0-9.]*' "$dir/ft-$dtype/metrics.jsonl" | tail -n "$steps" | cut -d: -f2 | sort -g | tr '\n' ' ')
  echo "tinygpt $dtype  ms/step (sorted) $ms  peak RSS $(( $(cat "$dir/rss") / 1024 )) MiB"
done
first=1
for conf in eager-f32 eager-bf16 compile-f32 compile-bf16; do
  # The peer's configuration (torch and transformers versions, threads, MKL, oneDNN, attention) once, as it ran.
  # PEER_TIMEOUT seconds (0: none) bounds each configuration: on a CPU without bf16 instructions autocast bf16 can
  # take half an hour a step.
  : > "$dir/rss"
  OMP_NUM_THREADS=$threads /usr/bin/time -f "%M" -o "$dir/rss" timeout "${PEER_TIMEOUT:-0}" "$py" \
    bench/torch_llama.py --batch "$batch" --context "$ctx" --steps "$steps" --threads "$threads" --only "$conf" \
    2> "$dir/torch.err" | if [ "$first" = 1 ]; then cat; else grep -v "^torch "; fi ||
    { echo "$conf: stopped or failed (PEER_TIMEOUT=${PEER_TIMEOUT:-0} s)"; tail -3 "$dir/torch.err"; }
  first=0
  rss=$(grep -E '^[0-9]+$' "$dir/rss" || true)
  if [ -n "$rss" ]; then echo "   peak RSS $(( rss / 1024 )) MiB"; fi
done
