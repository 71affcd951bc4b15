#!/usr/bin/env bash
# LoRA against full fine-tuning: `tinygpt sft` of SmolLM2-135M's shape (30 layers x 576, 9 heads, 3 key/value heads,
# MLP 1536, vocabulary 49,152, tied head; random weights made by transformers, bf16 as the Hub ships it, imported with
# `tinygpt import --format hf`, a ChatML template and its tokens in its tokenizer), batch B x context T, --dtype bf16,
# STEPS timed steps after one warm-up, the same flags but --lora-rank: peak resident memory by /usr/bin/time and
# ms/step from metrics.jsonl, the two runs alternated ROUNDS times. Needs a venv with torch and transformers (VENV,
# default /tmp/venv-hf) to make the model; run on an idle machine.
#   bash bench/lora_memory.sh [BUILD] [B] [T] [STEPS] [RANK] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build} batch=${2:-4} ctx=${3:-256} steps=${4:-4} rank=${5:-8} rounds=${6:-2}
py=${VENV:-/tmp/venv-hf}/bin/python
"$py" -c "import torch, transformers" 2> /dev/null || { echo "lora_memory: no torch and transformers in ${VENV:-/tmp/venv-hf}; skipped"; exit 0; }
data=../shared/data/tinyshakespeare.txt
[ -f "$data" ] || data=$(bash scripts/get_data.sh)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$build/tinygpt" tokenizer train --data "$data" --vocab-size 2048 --out "$dir/tok.json" 2> /dev/null
"$py" - "$dir/hf" "$dir/tok.json" "$data" "$dir/conversations.jsonl" <<'EOF'
import json, pathlib, random, sys
import torch, transformers
out, tokfile = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
tok = json.loads(tokfile.read_text())
n, V = len(tok["model"]["vocab"]), 49152
names = ["<|im_start|>", "<|im_end|>"] + [f"<|unused_{i}|>" for i in range(n + 2, V)]
tok["added_tokens"] += [{"id": n + i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                         "normalized": False, "special": True} for i, name in enumerate(names)]
cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                               num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                               rms_norm_eps=1e-5, rope_theta=1e5, tie_word_embeddings=True)
torch.manual_seed(0)
transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
(out / "tokenizer.json").write_text(json.dumps(tok))
chatml = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
          "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
(out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
                                                       "chat_template": chatml}))
# Conversations of a few hundred tokens of the text: every row of the batch full, as long as the context.
words = open(sys.argv[3]).read().split()
random.seed(0)
with open(sys.argv[4], "w") as f:
    for _ in range(200):
        at = random.randrange(len(words) - 400)
        f.write(json.dumps({"messages": [{"role": "user", "content": " ".join(words[at:at + 120])},
                                         {"role": "assistant", "content": " ".join(words[at + 120:at + 300])}]}) + "\n")
EOF
"$build/tinygpt" import --format hf --from "$dir/hf" --out "$dir/run" 2> /dev/null
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' '), model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | tr -d ' '), $(nproc) threads; $("$build/tinygpt" --version)"
echo "sft of SmolLM2-135M's shape, batch $batch x context $ctx, --dtype bf16, $steps timed steps after one warm-up"
for round in $(seq "$rounds"); do
  for how in full lora; do
    flags=()
    [ "$how" = lora ] && flags=(--lora-rank "$rank")
    rm -rf "$dir/$how"
    /usr/bin/time -f "%M" -o "$dir/rss" "$build/tinygpt" sft --init-from "$dir/run" --data "$dir/conversations.jsonl" \
      --out "$dir/$how" --block-size "$ctx" --batch-size "$batch" --dtype bf16 --max-iters $((steps + 1)) \
      --eval-interval 100000 --eval-iters 1 --warmup-iters 1 "${flags[@]}" 2> "$dir/$how.log" \
      || { tail -3 "$dir/$how.log"; exit 1; }
    [ "$round" = 1 ] && grep -E "^(LoRA|memory|model):" "$dir/$how.log" | cut -c1-200
    ms=$(grep -o '"ms":[0-9.]*' "$dir/$how/metrics.jsonl" | tail -n "$steps" | cut -d: -f2 | sort -g | tr '\n' ' ')
    echo "round $round  $how  peak RSS $(( $(cat "$dir/rss") / 1024 )) MiB  ms/step (sorted) $ms"
  done
done
