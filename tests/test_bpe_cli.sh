#!/usr/bin/env bash
# The byte-level BPE path end to end through the command line, each step its own process: tokenizer train, encode
# and decode (exact round trip of any bytes), train --tokenizer bpe over a directory of files (skipped files said, the
# token cache reused and re-encoded per changed file), sample and eval on text the training never saw, info, export,
# fine-tuning with --init-from, and bad input with its exit code.
#   tests/test_bpe_cli.sh path/to/tinygpt
set -uo pipefail
tinygpt=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# expect CODE PATTERN COMMAND...: the command exits with CODE and says PATTERN on one error: line.
expect() {
  local code=$1 pattern=$2
  shift 2
  local out rc
  out=$(timeout 60 "$@" 2>&1 < /dev/null)
  rc=$?
  if [ "$rc" -ne "$code" ]; then
    fail "'$*' exited $rc, expected $code: $out"
  elif ! grep -q -- "$pattern" <<< "$out"; then
    fail "'$*' said '$out'; expected '$pattern'"
  fi
}

# A corpus: text files in a tree, an empty and a binary file (skipped), a hidden directory (not walked).
mkdir -p "$dir/corpus/notes" "$dir/corpus/.git"
words=(the cat sat on a mat while dogs ran far away under blue skies "it's" "we'll" 42 1999 "caf\u00e9" "na\u00efve")
for f in 0 1 2 3 4 5 6 7 8 9; do
  for i in $(seq 150); do
    printf '%b %b %b.\n' "${words[$(((i * 7 + f) % 19))]}" "${words[$(((i * 3 + f * 5) % 19))]}" "${words[$(((i + f) % 19))]}"
  done > "$dir/corpus/notes/n$f.txt"
done
cp "$dir/corpus/notes/n0.txt" "$dir/corpus/.git/HEAD"
: > "$dir/corpus/empty.txt"
printf 'ab\0cd' > "$dir/corpus/image.bin"
printf 'Zebras \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e quietly \xf0\x9f\x98\x80 jumped over 7 fences.\n' > "$dir/other.txt"

# tokenizer train / encode / decode
"$tinygpt" tokenizer train --data "$dir/corpus" --vocab-size 300 --out "$dir/tok.json" 2> "$dir/tok.log" ||
  fail "tokenizer train failed: $(tail -1 "$dir/tok.log")"
grep -q "skipping $dir/corpus/empty.txt: empty" "$dir/tok.log" || fail "the empty file was not skipped by name"
grep -q "skipping $dir/corpus/image.bin: binary" "$dir/tok.log" || fail "the binary file was not skipped by name"
grep -q '"Regex": "'"'"'s|'"'"'t' "$dir/tok.json" || fail "tok.json does not name GPT-2's split pattern"
text=$'caf\xc3\xa9 \xf0\x9f\x98\x80 \xe4\xb8\xad\xe6\x96\x87 \xff\xfe\x01 <|endoftext|>  \t end'
ids=$("$tinygpt" tokenizer encode --tokenizer "$dir/tok.json" --text "$text")
[[ "$ids" =~ ^[0-9]+( [0-9]+)*$ ]] || fail "encode printed '$ids'"
back=$("$tinygpt" tokenizer decode --tokenizer "$dir/tok.json" --ids "$ids"; printf x)
[ "${back%x}" = "$text" ] || fail "decode(encode(text)) is '${back%x}', not the text"
"$tinygpt" tokenizer encode --tokenizer "$dir/tok.json" --data "$dir/corpus" --out "$dir/ids.bin" 2> /dev/null ||
  fail "tokenizer encode --data failed"
last=$(tail -c 4 "$dir/ids.bin" | od -An -tu4 | tr -d ' ')
[ "$last" = 299 ] || fail "the ids file ends with $last, not <|endoftext|> (299)"
# The global options in every position, sub-subcommands included: the same tokenizer and the same ids.
"$tinygpt" tokenizer train --data "$dir/corpus" --vocab-size 300 --out "$dir/tok1.json" --threads 1 2> /dev/null ||
  fail "tokenizer train --threads 1 failed"
cmp -s "$dir/tok.json" "$dir/tok1.json" || fail "tokenizer train --threads 1 wrote another tokenizer"
[ "$("$tinygpt" tokenizer --threads 1 encode --tokenizer "$dir/tok.json" --text "$text")" = "$ids" ] ||
  fail "tokenizer --threads 1 encode gave other ids"
[ "$("$tinygpt" --threads 1 tokenizer encode --tokenizer "$dir/tok.json" --text "$text")" = "$ids" ] ||
  fail "--threads 1 tokenizer encode gave other ids"
expect 2 "vocab-size must be in \[257, 65536\]" "$tinygpt" tokenizer train --data "$dir/corpus" --vocab-size 100 --out "$dir/t.json"
expect 2 "one of --tokenizer FILE or --ckpt RUN" "$tinygpt" tokenizer encode --text hi
expect 1 "is not a token id" "$tinygpt" tokenizer decode --tokenizer "$dir/tok.json" --ids "1 300"
printf '{"model": {"type": "BPE", "vocab": {}}}' > "$dir/broken.json"
expect 1 "broken.json' is not a byte-level BPE tokenizer" "$tinygpt" tokenizer encode --tokenizer "$dir/broken.json" --text hi
expect 1 "does not exist" "$tinygpt" tokenizer encode --tokenizer "$dir/missing.json" --text hi
mkfifo "$dir/fifo"
expect 1 "not a regular file" "$tinygpt" tokenizer train --data "$dir/fifo" --out "$dir/t.json"

# train with a BPE trained on the training documents, then again from the cache
model=(--n-layer 1 --n-head 2 --n-embd 32 --block-size 32 --batch-size 4 --eval-iters 2 --eval-interval 10)
"$tinygpt" train --data "$dir/corpus" --tokenizer bpe --vocab-size 300 --doc-mask --out "$dir/run" "${model[@]}" \
  --max-iters 20 > /dev/null 2> "$dir/train.log" || fail "train --tokenizer bpe failed: $(tail -1 "$dir/train.log")"
grep -q "10 files, .*byte-level BPE of 300.*10 files encoded, 0 mapped.*(1 whole documents held out)" "$dir/train.log" ||
  fail "train's data line: $(grep '^data:' "$dir/train.log")"
grep -q "bits per byte" "$dir/train.log" || fail "train reports no bits per byte"
grep -q '"val_bpb"' "$dir/run/metrics.jsonl" || fail "metrics.jsonl has no val_bpb"
echo "new line" >> "$dir/corpus/notes/n3.txt"
"$tinygpt" train --data "$dir/corpus" --tokenizer "$dir/run/tokenizer.json" --doc-mask --out "$dir/run" "${model[@]}" \
  --max-iters 30 --resume > /dev/null 2> "$dir/resume.log" || fail "resume failed: $(tail -1 "$dir/resume.log")"
grep -q "1 file encoded, 9 mapped" "$dir/resume.log" || fail "one changed file should be re-encoded: $(grep '^data:' "$dir/resume.log")"

# any text is a prompt and an eval file
"$tinygpt" sample --ckpt "$dir/run" --prompt $'\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80' --max-new-tokens 10 > "$dir/sample.out" 2> /dev/null ||
  fail "sample with a prompt outside the training text failed"
head -c 11 "$dir/sample.out" | grep -q $'\xe6\x97\xa5\xe6\x9c\xac' || fail "the sample does not start with the prompt"
"$tinygpt" eval --ckpt "$dir/run" --data "$dir/other.txt" --data "$dir/corpus" --batch-size 2 --eval-iters 2 > "$dir/eval.out" 2>&1 ||
  fail "eval failed: $(cat "$dir/eval.out")"
grep -Eq "val bits per byte [0-9.]+$" "$dir/eval.out" || fail "eval printed '$(cat "$dir/eval.out")'"
"$tinygpt" info --ckpt "$dir/run" | grep -q "vocabulary 300 (byte-level BPE)" || fail "info does not name the BPE"
"$tinygpt" attention --ckpt "$dir/run" --text "the cat" --out "$dir/a.svg" 2> /dev/null || fail "attention on a BPE model failed"
expect 1 "GPT-2 cannot express" "$tinygpt" export --ckpt "$dir/run" --out "$dir/hf"  # --doc-mask: refused

# fine-tuning: the checkpoint's weights and tokenizer, a fresh schedule
"$tinygpt" train --data "$dir/other.txt" --data "$dir/corpus/notes" --init-from "$dir/run" --out "$dir/ft" "${model[@]}" \
  --max-iters 10 > /dev/null 2> "$dir/ft.log" || fail "train --init-from failed: $(tail -1 "$dir/ft.log")"
grep -q "the checkpoint's" "$dir/ft.log" || fail "--init-from did not take the checkpoint's tokenizer"
"$tinygpt" info --ckpt "$dir/ft" | grep -q "^iteration      10$" || fail "the fine-tuned run did not start at iteration 0"
expect 2 "n_embd 64 (flags) vs 32 (checkpoint)" "$tinygpt" train --data "$dir/other.txt" --init-from "$dir/run" --out "$dir/ft2" --n-head 2 --n-embd 64
expect 2 "drop --tokenizer" "$tinygpt" train --data "$dir/other.txt" --init-from "$dir/run" --out "$dir/ft2" --tokenizer bpe
expect 2 "needs --tokenizer bpe" "$tinygpt" train --data "$dir/other.txt" --out "$dir/r2" --vocab-size 300
expect 2 "vocab-size must be in" "$tinygpt" train --data "$dir/other.txt" --out "$dir/r2" --tokenizer bpe --vocab-size 70000
expect 2 "doc-mask is for BPE models" "$tinygpt" train --data "$dir/other.txt" --out "$dir/r2" --doc-mask
expect 1 "does not exist" "$tinygpt" train --data "$dir/nope/*.txt" --out "$dir/r2"

# a BPE model without document masks exports to GPT-2 with its tokenizer
"$tinygpt" train --data "$dir/corpus" --tokenizer "$dir/tok.json" --out "$dir/plain" "${model[@]}" --max-iters 2 \
  > /dev/null 2>&1 || fail "train --tokenizer FILE failed"
"$tinygpt" export --ckpt "$dir/plain" --out "$dir/hf" 2> /dev/null || fail "export of a BPE model failed"
cmp -s "$dir/hf/tokenizer.json" "$dir/tok.json" || fail "the exported tokenizer.json differs from the one trained with"
grep -q '"eos_token_id": 299' "$dir/hf/config.json" || fail "the exported config has no <|endoftext|> id"

# import reads the export back: the same greedy text and the same loss
"$tinygpt" import --format hf --from "$dir/hf" --out "$dir/imported" 2> /dev/null || fail "import of the export failed"
for run in plain imported; do
  "$tinygpt" sample --ckpt "$dir/$run" --prompt "the cat" --max-new-tokens 12 --temperature 0 > "$dir/$run.greedy" 2> /dev/null
  "$tinygpt" eval --ckpt "$dir/$run" --data "$dir/corpus" --batch-size 2 --eval-iters 2 > "$dir/$run.eval" 2> /dev/null
done
cmp -s "$dir/plain.greedy" "$dir/imported.greedy" || fail "the imported model's greedy text differs"
cmp -s "$dir/plain.eval" "$dir/imported.eval" || fail "the imported model's loss differs: $(cat "$dir/plain.eval") vs $(cat "$dir/imported.eval")"
# tokenizer_config.json's bos, eos and chat template travel: imported into the checkpoint, exported again unchanged
# (a template in chat_template.jinja too, as transformers 4.43 and later save it).
template='{% for m in messages %}<|endoftext|>{{ m["role"] }}: {{ m["content"] }}\n{% endfor %}'
python3 -c 'import json, sys; json.dump({"bos_token": "<|endoftext|>", "eos_token": {"content": "<|endoftext|>"},
  "chat_template": sys.argv[2]}, open(sys.argv[1], "w"))' "$dir/hf/tokenizer_config.json" "$template"
"$tinygpt" import --format hf --from "$dir/hf" --out "$dir/imported_tc" 2> /dev/null || fail "import with a chat template failed"
"$tinygpt" export --ckpt "$dir/imported_tc" --out "$dir/hf_tc" 2> /dev/null || fail "export with a chat template failed"
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); sys.exit(not (c.get("chat_template") == sys.argv[2] and
  c.get("eos_token") == "<|endoftext|>" and c.get("bos_token") == "<|endoftext|>"))' "$dir/hf_tc/tokenizer_config.json" \
  "$template" || fail "the chat template, bos or eos did not travel: $(cat "$dir/hf_tc/tokenizer_config.json")"
rm "$dir/hf/tokenizer_config.json" && printf '%s' "$template" > "$dir/hf/chat_template.jinja"
"$tinygpt" import --format hf --from "$dir/hf" --out "$dir/imported_jinja" 2> /dev/null || fail "import with chat_template.jinja failed"
"$tinygpt" export --ckpt "$dir/imported_jinja" --out "$dir/hf_jinja" 2> /dev/null || fail "export of the jinja import failed"
python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1])).get("chat_template") != sys.argv[2])' \
  "$dir/hf_jinja/tokenizer_config.json" "$template" || fail "chat_template.jinja was not kept"
rm "$dir/hf/chat_template.jinja"
# A run inside its data folder never trains on itself: the walk skips run directories (lock or checkpoints), saying so,
# so the second run sees the one text file the first saw.
mkdir -p "$dir/notes" && cp "$dir/corpus/notes/n3.txt" "$dir/notes/notes.txt"
for run in run1 run2; do
  "$tinygpt" train --data "$dir/notes" --tokenizer "$dir/run/tokenizer.json" --out "$dir/notes/$run" "${model[@]}" \
    --max-iters 2 > /dev/null 2> "$dir/notes-$run.log" || fail "train inside its data folder failed: $(tail -1 "$dir/notes-$run.log")"
  grep -q "^data: 1 file," "$dir/notes-$run.log" || fail "$run took other files for text: $(grep '^data:' "$dir/notes-$run.log")"
done
grep -q "skipping $dir/notes/run1: a tinygpt run directory" "$dir/notes-run2.log" || fail "the skipped run directory was not said"

# The Llama family: a model trained with --arch llama (grouped-query heads, untied head) exports as LlamaForCausalLM,
# with --qkv-bias (and heads 24 wide, --head-dim) as Qwen2ForCausalLM, and imports back to the same greedy text and loss.
for arch in llama qwen2; do
  extra=(--n-kv-head 1 --untied-head --rope-theta 50000 --ffn-hidden 64)
  [ "$arch" = qwen2 ] && extra+=(--qkv-bias --head-dim 24)  # heads of their own width too
  "$tinygpt" train --data "$dir/corpus" --tokenizer "$dir/run/tokenizer.json" --arch llama "${extra[@]}" \
    --out "$dir/$arch" "${model[@]}" --max-iters 10 > /dev/null 2> "$dir/$arch.log" || fail "train --arch llama failed: $(tail -1 "$dir/$arch.log")"
  "$tinygpt" export --ckpt "$dir/$arch" --format hf --out "$dir/$arch-hf" 2> /dev/null || fail "export of --arch llama failed"
  grep -q "\"model_type\": \"$arch\"" "$dir/$arch-hf/config.json" || fail "the $arch export's config: $(head -c 300 "$dir/$arch-hf/config.json")"
  "$tinygpt" import --format hf --from "$dir/$arch-hf" --out "$dir/$arch-back" 2> /dev/null || fail "import of the $arch export failed"
  for run in "$arch" "$arch-back"; do
    "$tinygpt" sample --ckpt "$dir/$run" --prompt "the cat" --max-new-tokens 12 --temperature 0 > "$dir/$run.greedy" 2> /dev/null
    "$tinygpt" eval --ckpt "$dir/$run" --data "$dir/corpus" --batch-size 2 --eval-iters 2 > "$dir/$run.eval" 2> /dev/null
  done
  cmp -s "$dir/$arch.greedy" "$dir/$arch-back.greedy" || fail "the imported $arch model's greedy text differs"
  cmp -s "$dir/$arch.eval" "$dir/$arch-back.eval" || fail "the imported $arch model's loss differs"
done
# GGUF: the Llama run as llama.cpp's llama, the Qwen2 one as qwen2, the GPT-2 one as gpt2, at each weight type; read
# back by tests/read_gguf.py (Python's standard library: header, tokens, offsets, values against the checkpoint).
for pair in llama:llama qwen2:qwen2 plain:gpt2; do
  run=${pair%%:*} arch=${pair##*:}
  for type in f32 f16 bf16 q8_0; do
    "$tinygpt" export --ckpt "$dir/$run" --format gguf --type "$type" --out "$dir/$run-$type.gguf" 2> "$dir/gguf.log" ||
      fail "export --format gguf of $run at $type failed: $(cat "$dir/gguf.log")"
    grep -q "llama.cpp's $arch architecture" "$dir/gguf.log" || fail "the $run export is not $arch: $(cat "$dir/gguf.log")"
    python3 "$(dirname "$0")/read_gguf.py" "$dir/$run-$type.gguf" "$dir/$run/ckpt_best.safetensors" "$arch" "$type" \
      > "$dir/gguf-read.log" || fail "the $run GGUF at $type: $(cat "$dir/gguf-read.log")"
  done
done
# GGUF in: each of those files imported (into a run of the same name, which the export names the model by) and
# exported again at its type gives the same file byte for byte; the f32 one's greedy text is the original run's.
for pair in llama:llama qwen2:qwen2 plain:gpt2; do
  run=${pair%%:*}
  for type in f32 f16 bf16 q8_0; do
    rm -rf "$dir/in/$run"
    "$tinygpt" import --format gguf --from "$dir/$run-$type.gguf" --out "$dir/in/$run" 2> "$dir/gguf-in.log" ||
      fail "import --format gguf of $run at $type failed: $(cat "$dir/gguf-in.log")"
    "$tinygpt" export --ckpt "$dir/in/$run" --format gguf --type "$type" --out "$dir/in/$run-$type.gguf" 2> /dev/null ||
      fail "export of the imported $run at $type failed"
    cmp -s "$dir/$run-$type.gguf" "$dir/in/$run-$type.gguf" || fail "$run at $type: imported and exported again, the file differs"
    if [ "$type" = f32 ]; then
      for r in "$dir/$run" "$dir/in/$run"; do
        "$tinygpt" sample --ckpt "$r" --prompt "the cat" --max-new-tokens 12 --temperature 0 2> /dev/null > "$r.gguf-greedy"
      done
      cmp -s "$dir/$run.gguf-greedy" "$dir/in/$run.gguf-greedy" || fail "the GGUF-imported $run model's greedy text differs"
    fi
  done
done
# A damaged or foreign GGUF: one error line, exit 1, nothing in --out.
gguf_edit() {  # gguf_edit SRC DST PYTHON-EXPRESSION-OF-data
  python3 -c "import sys; data = open(sys.argv[1], 'rb').read(); open(sys.argv[2], 'wb').write($3)" "$1" "$2"
}
s() { python3 -c "import struct, sys; sys.stdout.write(repr(struct.pack('<Q', len(sys.argv[1])) + sys.argv[1].encode()))" "$1"; }
gguf_edit "$dir/llama-f32.gguf" "$dir/cut.gguf" "data[:len(data) // 2]"
gguf_edit "$dir/llama-f32.gguf" "$dir/arch.gguf" "data.replace($(s llama), $(s llamb), 1)"
gguf_edit "$dir/llama-f32.gguf" "$dir/pre.gguf" "data.replace($(s gpt-2), $(s gpt-3), 1)"
gguf_edit "$dir/llama-f32.gguf" "$dir/spm.gguf" "data.replace($(s gpt2), $(s bert), 1)"
for case in "cut:lies past its end" "arch:its architecture is llamb" "pre:its pre-tokenizer is gpt-3" \
            "spm:its tokenizer is bert"; do
  name=${case%%:*}
  expect 1 "error: .*${case#*:}" "$tinygpt" import --format gguf --from "$dir/$name.gguf" --out "$dir/in/$name"
  [ ! -e "$dir/in/$name" ] || fail "a refused GGUF import ($name) left $dir/in/$name"
done
expect 1 "error: cannot open '$dir/none.gguf'" "$tinygpt" import --format gguf --from "$dir/none.gguf" --out "$dir/in/none"
expect 1 "is not a GGUF file" "$tinygpt" import --format gguf --from "$dir/corpus/notes/n0.txt" --out "$dir/in/text"
"$tinygpt" train --data "$dir/corpus" --out "$dir/chars" "${model[@]}" --max-iters 1 > /dev/null 2> "$dir/chars.log" ||
  fail "a character run failed: $(tail -1 "$dir/chars.log")"
expect 1 "this model's tokenizer is characters, which GGUF's tokenizers" "$tinygpt" export --ckpt "$dir/chars" --format gguf \
  --out "$dir/chars.gguf"
[ ! -e "$dir/chars.gguf" ] || fail "a refused GGUF export left a file"
expect 1 "GPT-2 cannot express" "$tinygpt" export --ckpt "$dir/run" --format gguf --out "$dir/run.gguf"  # --doc-mask
expect 2 "--type is for --format gguf" "$tinygpt" export --ckpt "$dir/llama" --out "$dir/x-hf" --type q8_0
expect 2 "--type: q4_k not in {f32,f16,bf16,q8_0}" "$tinygpt" export --ckpt "$dir/llama" --format gguf --type q4_k --out "$dir/x.gguf"
expect 1 "is a directory; a GGUF export is one file" "$tinygpt" export --ckpt "$dir/llama" --format gguf --out "$dir/llama"
# An embedding padded past its tokenizer (as Qwen2.5's: 151,936 rows for 151,665 tokens): the Llama export with as many
# rows again, the head's new rows ten times real ones (they would win every argmax): imported, its greedy text is the
# unpadded model's (the padding is never drawn), info says so, and GGUF holds a [PADn] token per row.
python3 - "$dir/llama-hf" "$dir/padded-hf" <<'PY' || fail "padding the Llama export failed"
import json, shutil, struct, sys
src, dst = sys.argv[1], sys.argv[2]
shutil.copytree(src, dst)
data = open(f"{src}/model.safetensors", "rb").read()
(n,) = struct.unpack_from("<Q", data, 0)
header = json.loads(data[8:8 + n])
meta = header.pop("__metadata__", None)
out, blobs, offset = {}, [], 0
for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    a, b = info["data_offsets"]
    blob = data[8 + n + a:8 + n + b]
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        rows, cols = info["shape"]
        values = struct.unpack(f"<{rows * cols}f", blob)
        pad = [0.0] * (rows * cols) if name == "model.embed_tokens.weight" else [10 * v for v in values]
        blob += struct.pack(f"<{rows * cols}f", *pad)
        info["shape"] = [2 * rows, cols]
    info["data_offsets"] = [offset, offset + len(blob)]
    out[name] = info
    blobs.append(blob)
    offset += len(blob)
if meta is not None:
    out["__metadata__"] = meta
text = json.dumps(out).encode()
text += b" " * (-len(text) % 8)
with open(f"{dst}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
config = json.load(open(f"{src}/config.json"))
config["vocab_size"] *= 2
json.dump(config, open(f"{dst}/config.json", "w"))
PY
"$tinygpt" import --format hf --from "$dir/padded-hf" --out "$dir/padded" 2> "$dir/padded.log" ||
  fail "import of a padded vocabulary failed: $(tail -1 "$dir/padded.log")"
"$tinygpt" info --ckpt "$dir/padded" | grep -q "vocabulary 600 (byte-level BPE, 300 tokens and 300 rows of padding)" ||
  fail "info of the padded model: $("$tinygpt" info --ckpt "$dir/padded" | sed -n 2p)"
"$tinygpt" sample --ckpt "$dir/padded" --prompt "the cat" --max-new-tokens 12 --temperature 0 > "$dir/padded.greedy" 2> /dev/null ||
  fail "sampling the padded model failed"
cmp -s "$dir/llama.greedy" "$dir/padded.greedy" || fail "the padded model's greedy text differs from the unpadded one's"
"$tinygpt" export --ckpt "$dir/padded" --format gguf --out "$dir/padded.gguf" 2> /dev/null || fail "GGUF of the padded model failed"
python3 "$(dirname "$0")/read_gguf.py" "$dir/padded.gguf" "$dir/padded/ckpt_latest.safetensors" llama f32 > "$dir/gguf-read.log" ||
  fail "the padded model's GGUF: $(cat "$dir/gguf-read.log")"
grep -c "PAD" "$dir/padded.gguf" > /dev/null || fail "the padded model's GGUF has no [PADn] tokens"
"$tinygpt" info --ckpt "$dir/qwen2-back" | grep -q "SwiGLU MLP (64 wide), RMSNorm (eps 1e-05), RoPE theta 50000, q/k/v biases, untied head" ||
  fail "info of the imported Qwen2: $("$tinygpt" info --ckpt "$dir/qwen2-back" | sed -n 2p)"
# Fine-tuning an imported Llama on a shorter context (no weight depends on it); longer, or with a position table, is refused.
"$tinygpt" train --data "$dir/corpus" --init-from "$dir/llama-back" --out "$dir/llama-ft" --block-size 16 --batch-size 4 \
  --max-iters 2 --eval-interval 2 --eval-iters 1 > /dev/null 2> "$dir/llama-ft.log" || fail "fine-tuning the imported Llama failed: $(tail -1 "$dir/llama-ft.log")"
grep -q "block 16" "$dir/llama-ft.log" || fail "the fine-tune did not train on 16 positions: $(grep '^model' "$dir/llama-ft.log")"
expect 2 "block_size 64 (flags) vs 32 (checkpoint)" "$tinygpt" train --data "$dir/corpus" --init-from "$dir/llama-back" \
  --out "$dir/ft2" --block-size 64
expect 2 "block_size 16 (flags) vs 32 (checkpoint)" "$tinygpt" train --data "$dir/corpus" --init-from "$dir/run" \
  --out "$dir/ft2" --block-size 16
# Bad Llama directories: one error line naming what is wrong, nothing left in --out.
cp -r "$dir/llama-hf" "$dir/bad-hf"
sed -i 's/"hidden_act": "silu"/"hidden_act": "gelu"/' "$dir/bad-hf/config.json"
expect 1 "its MLP's activation is gelu" "$tinygpt" import --format hf --from "$dir/bad-hf" --out "$dir/imp2"
sed -i 's/"hidden_act": "gelu"/"hidden_act": "silu"/; s/"intermediate_size": 64/"intermediate_size": 96/' "$dir/bad-hf/config.json"
expect 1 "mlp.gate_proj.weight is (64, 32) where the model its config.json describes has (96, 32)" \
  "$tinygpt" import --format hf --from "$dir/bad-hf" --out "$dir/imp2"
sed -i 's/"intermediate_size": 96/"intermediate_size": 64/; s/"rope_scaling": null/"rope_scaling": {"rope_type": "llama3"}/' "$dir/bad-hf/config.json"
expect 1 "its rope_scaling: factor must be a number" "$tinygpt" import --format hf --from "$dir/bad-hf" --out "$dir/imp2"
sed -i 's/"rope_scaling": {"rope_type": "llama3"}/"rope_scaling": {"type": "linear", "factor": 2.0}/' "$dir/bad-hf/config.json"
expect 1 "its rope_scaling: rope_type \"linear\" is not Llama 3's" "$tinygpt" import --format hf --from "$dir/bad-hf" --out "$dir/imp2"
sed -i 's/"rope_scaling": {"type": "linear", "factor": 2.0}/"rope_scaling": null/' "$dir/bad-hf/config.json"
mv "$dir/bad-hf/model.safetensors" "$dir/bad-hf/model-00001-of-00002.safetensors"
printf '{"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors", "lm_head.weight": "model-00002-of-00002.safetensors"}}' \
  > "$dir/bad-hf/model.safetensors.index.json"
expect 1 "shard model-00002-of-00002.safetensors is missing" "$tinygpt" import --format hf --from "$dir/bad-hf" --out "$dir/imp2"
rm "$dir/bad-hf/model.safetensors.index.json" && mv "$dir/bad-hf/model-00001-of-00002.safetensors" "$dir/bad-hf/model.safetensors"
sed -i 's/"hidden_size": 32/"hidden_size": 320000/; s/"num_attention_heads": 2/"num_attention_heads": 20000/' "$dir/bad-hf/config.json"
expect 1 "its config.json describes a model of [0-9]* parameters but the weights hold" \
  "$tinygpt" import --format hf --from "$dir/bad-hf" --out "$dir/imp2"
[ ! -e "$dir/imp2" ] || fail "a failed import left $dir/imp2 behind"
mkdir -p "$dir/mistral" && printf '{"model_type": "gemma"}' > "$dir/mistral/config.json"
expect 1 "its config.json says model_type \"gemma\" (tinygpt imports gpt2, llama and qwen2)" \
  "$tinygpt" import --format hf --from "$dir/mistral" --out "$dir/imp2"
expect 1 "has no config.json" "$tinygpt" import --format hf --from "$dir/corpus" --out "$dir/imp2"
expect 2 "from is required" "$tinygpt" import --format hf --out "$dir/imp2"

# A vocabulary over 65,536 (Llama 3's is 128,256): the token cache holds 32-bit ids, training and sampling run, and a
# chat's special tokens in a prompt are matched whole. tok.json with 70,000 added tokens, <|im_start|> the last.
python3 - "$dir/tok.json" "$dir/wide.json" <<'PY' || fail "could not write the wide tokenizer"
import json, sys
tok = json.load(open(sys.argv[1], encoding="utf-8"))
n = len(tok["model"]["vocab"])
tok["added_tokens"] += [{"id": i, "content": f"<t{i}>", "special": False} for i in range(n, 69999)]
tok["added_tokens"].append({"id": 69999, "content": "<|im_start|>", "special": True})
json.dump(tok, open(sys.argv[2], "w", encoding="utf-8"))
PY
printf 'ab <t69998> cd <t65536> ef\n%.0s' $(seq 200) > "$dir/wide.txt"
"$tinygpt" train --data "$dir/wide.txt" --tokenizer "$dir/wide.json" --out "$dir/wide" --n-layer 1 --n-head 2 \
  --n-embd 16 --block-size 16 --batch-size 2 --max-iters 3 --eval-interval 3 --eval-iters 1 --quiet 2> "$dir/wide.log" ||
  fail "training with a 70,000-token vocabulary failed: $(tail -2 "$dir/wide.log")"
grep -q '"id_bytes":4' "$dir/wide/tokens.bin" || fail "the token cache of a 70,000-token vocabulary does not hold 32-bit ids"
[ "$("$tinygpt" tokenizer encode --ckpt "$dir/wide" --text "<|im_start|><t69998>")" = "69999 69998" ] ||
  fail "a special and an ordinary added token past 65,535 were not matched whole"
"$tinygpt" sample --ckpt "$dir/wide" --prompt "<|im_start|>ab" --max-new-tokens 4 > /dev/null 2> "$dir/wide_sample.log" ||
  fail "sampling a 70,000-token model failed: $(tail -1 "$dir/wide_sample.log")"

# a corrupt tokenizer inside a checkpoint is refused by name (the same length, so only the tokenizer is wrong)
cp "$dir/plain/ckpt_latest.safetensors" "$dir/bad.safetensors"
perl -0777 -pi -e 's/\\"type\\": \\"BPE\\"/\\"type\\": \\"XPE\\"/' "$dir/bad.safetensors"
expect 1 "its tokenizer' is not a byte-level BPE tokenizer tinygpt can read: its model is not" \
  "$tinygpt" sample --ckpt "$dir/bad.safetensors"

if [ "$failures" -eq 0 ]; then echo "test_bpe_cli: all checks passed"; fi
exit $((failures > 0))
