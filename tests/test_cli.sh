#!/usr/bin/env bash
# End to end through the command line, each step its own process: train a tiny model, sample from its run
# directory twice with one seed (same text) and once with another, evaluate it, and check that bad input
# gets a one-line error and a non-zero exit.
#   tests/test_cli.sh path/to/tinygpt [project version]
set -uo pipefail
tinygpt=$1
version=${2:-}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

if [ -n "$version" ]; then
  [ "$("$tinygpt" --version)" = "tinygpt $version" ] || fail "--version says '$("$tinygpt" --version)', the CMake project $version"
fi

for i in $(seq 300); do echo "First Citizen: we are accounted poor citizens, the patricians good."; done > "$dir/text.txt"

"$tinygpt" train --data "$dir/text.txt" --out "$dir/run" --n-layer 1 --n-head 2 --n-embd 32 --block-size 32 \
  --batch-size 8 --max-iters 40 --warmup-iters 5 --lr-decay-iters 40 --eval-interval 20 --eval-iters 2 \
  --log-interval 10 2> "$dir/train.log" || fail "train exited $?: $(tail -3 "$dir/train.log")"
grep -q "step 40: train loss" "$dir/train.log" || fail "train log has no final evaluation"
[ -f "$dir/run/ckpt_best.safetensors" ] && [ -f "$dir/run/ckpt_latest.safetensors" ] || fail "checkpoints missing"
[ "$(grep -c '"tok_per_s"' "$dir/run/metrics.jsonl")" = 40 ] || fail "metrics.jsonl should have 40 iteration lines"
# MFU only against a stated peak (x86-64's probe); elsewhere none, and the log says why.
mfu_max=$(grep -o '"mfu":[0-9.e+-]*' "$dir/run/metrics.jsonl" | cut -d: -f2 | sort -g | tail -n 1)
if grep -q "MFU is against" "$dir/train.log"; then
  [ "$(grep -c '"mfu"' "$dir/run/metrics.jsonl")" = 40 ] || fail "metrics.jsonl should have an mfu on each of 40 lines"
  awk -v m="$mfu_max" 'BEGIN {exit !(m > 0 && m <= 1)}' || fail "metrics.jsonl's mfu should lie in (0, 1], its largest is $mfu_max"
else
  grep -q "^speed: .*; no MFU: the peak is none stated" "$dir/train.log" || fail "the log states no peak and says nothing of it"
  [ -z "$mfu_max" ] || fail "metrics.jsonl has an mfu ($mfu_max) against no stated peak"
fi

sample() { "$tinygpt" sample --ckpt "$dir/run" --prompt "First" "$@" 2> "$dir/sample.log"; }
a=$(sample --seed 7 --max-new-tokens 60) || fail "sample exited non-zero: $(cat "$dir/sample.log")"
b=$(sample --seed 7 --max-new-tokens 60)
c=$(sample --seed 8 --max-new-tokens 60)
[[ "$a" == First* ]] || fail "the sample does not start with the prompt: '$a'"
[ "${#a}" -eq 65 ] || fail "expected 5 prompt + 60 new characters, got ${#a}: '$a'"
[ "$a" = "$b" ] || fail "the same seed gave different text"
[ "$a" != "$c" ] || fail "different seeds gave the same text"
grep -q "tokens/s" "$dir/sample.log" || fail "sample reports nothing on stderr"
last=$("$tinygpt" sample --ckpt "$dir/run" --prompt "First" --max-new-tokens 5 2> /dev/null | tail -c 1 | od -An -c | tr -d ' ')
[ "$last" = '\n' ] || fail "the sample does not end with a newline (stderr's timing line would follow on its line)"
# bf16 storage on the CPU: sampled and evaluated from the same checkpoint (the weights stay f32 in it).
e=$(sample --seed 7 --max-new-tokens 20 --dtype bf16 --storage bf16) || fail "sample --storage bf16 failed: $(cat "$dir/sample.log")"
[[ "$e" == First* ]] || fail "sample --storage bf16 does not start with the prompt: '$e'"
"$tinygpt" eval --ckpt "$dir/run" --data "$dir/text.txt" --eval-iters 2 --batch-size 4 --dtype bf16 --storage bf16 \
  > "$dir/eval16.out" 2>&1 || fail "eval --storage bf16 failed: $(cat "$dir/eval16.out")"
d=$(sample --seed 7 --no-kv-cache --max-new-tokens 20)
[ "$d" = "${a:0:25}" ] || fail "with and without the KV cache differ before the context is cropped: '$d' vs '${a:0:25}'"

"$tinygpt" eval --ckpt "$dir/run" --data "$dir/text.txt" --eval-iters 2 --batch-size 4 > "$dir/eval.out" 2>&1 \
  || fail "eval exited non-zero: $(cat "$dir/eval.out")"
grep -Eq "^train loss [0-9.]+, val loss [0-9.]+, val bits per byte [0-9.]+$" "$dir/eval.out" || fail "eval printed '$(cat "$dir/eval.out")'"

# eval splits as the run split: by default at the run's --train-fraction (0.5 here: the same line as asking for it).
"$tinygpt" train --data "$dir/text.txt" --out "$dir/half" --n-layer 1 --n-head 2 --n-embd 32 --block-size 32 \
  --batch-size 8 --max-iters 2 --eval-iters 1 --train-fraction 0.5 --quiet 2> /dev/null || fail "train --train-fraction 0.5 failed"
ev() { "$tinygpt" eval --ckpt "$dir/half" --data "$dir/text.txt" --eval-iters 2 --batch-size 4 "$@" 2>&1; }
[ "$(ev)" = "$(ev --train-fraction 0.5)" ] || fail "eval did not split at the run's --train-fraction: '$(ev)' vs '$(ev --train-fraction 0.5)'"
[ "$(ev)" != "$(ev --train-fraction 0.9)" ] || fail "eval's --train-fraction 0.9 changed nothing"
# A character model fine-tuned on one text reads it as a document, and so does its --resume: the text's few
# characters are not the checkpoint's vocabulary, which a run started from scratch would take from them.
for i in $(seq 200); do echo "accounted poor citizens"; done > "$dir/few.txt"
"$tinygpt" train --data "$dir/few.txt" --init-from "$dir/run" --out "$dir/ft" --max-iters 2 --eval-iters 1 --quiet \
  2> "$dir/ft.log" || fail "train --init-from on one text failed: $(tail -1 "$dir/ft.log")"
"$tinygpt" train --data "$dir/few.txt" --out "$dir/ft" --resume --max-iters 4 --eval-iters 1 --quiet 2> "$dir/ft.log" \
  || fail "train --resume of a fine-tuned character model failed: $(tail -1 "$dir/ft.log")"

"$tinygpt" export --ckpt "$dir/run" --format hf --out "$dir/hf" 2> "$dir/export.log" || fail "export exited non-zero: $(cat "$dir/export.log")"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
  [ -s "$dir/hf/$f" ] || fail "export wrote no $f"
done

# Bad input: a non-zero exit and one line that names the problem.
expect_error() {
  local pattern=$1
  shift
  local out
  if out=$(timeout 60 "$@" 2>&1); then
    fail "'$*' succeeded; expected an error matching '$pattern'"
  elif ! grep -q -- "$pattern" <<< "$out"; then
    fail "'$*' said '$out'; expected '$pattern'"
  fi
}
printf 'abc\xff' > "$dir/bad.txt"
: > "$dir/empty.txt"
printf 'ab\0cd' > "$dir/binary.bin"
printf 'abcdef' > "$dir/short.txt"
# More distinct characters than 16-bit token ids hold: U+20000 onwards, 70,000 of them.
perl -CS -e 'no warnings; print chr(0x20000 + $_) for 0 .. 69999' > "$dir/huge_vocab.txt"
: > "$dir/a_file"
expect_error "does not exist" "$tinygpt" train --data "$dir/nope.txt" --out "$dir/r2"
# A directory is a corpus of its text files (the binary one skipped, said so); a character model names bad UTF-8.
expect_error "skipping $dir/binary.bin: binary" "$tinygpt" train --data "$dir" --out "$dir/r2"
expect_error "bad.txt': invalid UTF-8 at byte offset 3" "$tinygpt" train --data "$dir" --out "$dir/r2"
expect_error "looks like a binary file" "$tinygpt" train --data "$dir/binary.bin" --out "$dir/r2"
expect_error "fewer than block_size + 1" "$tinygpt" train --data "$dir/short.txt" --out "$dir/r2" --block-size 8
expect_error "more than 65536: use --tokenizer bpe" "$tinygpt" train --data "$dir/huge_vocab.txt" --out "$dir/r2"
expect_error "cannot create the output directory" "$tinygpt" train --data "$dir/text.txt" --out "$dir/a_file/run"
expect_error "n_head (4) must be divisible by n_kv_head (3)" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --n-head 4 --n-embd 32 --n-kv-head 3
expect_error "n_layer must be positive" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --n-layer 0
expect_error "min-lr (0.1) must not exceed --lr" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --min-lr 0.1
expect_error "cooldown must be a fraction in \[0, 1\]" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --cooldown 1.5
expect_error "dropout must be in \[0, 1)" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --dropout 1.5
expect_error "^error: Could not convert: --max-iters = ten" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --max-iters ten
expect_error "^error: The following argument was not expected: --no-such-flag" "$tinygpt" train --data "$dir/text.txt" --no-such-flag
# Usage errors (a flag CLI11 cannot parse, or a value out of range) exit with 2; errors of the run itself with 1.
"$tinygpt" train --data "$dir/text.txt" --max-iters ten 2> /dev/null; [ $? = 2 ] || fail "a parse error should exit with 2"
"$tinygpt" train --data "$dir/text.txt" --lr -1 2> /dev/null; [ $? = 2 ] || fail "an out-of-range value should exit with 2"
"$tinygpt" train --data "$dir/nope.txt" --out "$dir/r2" 2> /dev/null; [ $? = 1 ] || fail "a missing file should exit with 1"
expect_error "flags contradict the checkpoint: block_size 64" "$tinygpt" train --data "$dir/text.txt" --out "$dir/run" --resume --block-size 64
expect_error "no CUDA\|no CUDA GPU\|not available yet" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --device cuda
expect_error "the loss is nan\|the loss is inf\|the gradient norm is" "$tinygpt" train --data "$dir/text.txt" --out "$dir/nan" \
  --n-layer 1 --n-head 2 --n-embd 32 --block-size 32 --batch-size 8 --max-iters 200 --lr 1e30 --grad-clip 0 --eval-iters 1 --quiet
# The same guard with bf16 tensors (a bf16 inf or NaN widens to one in the f32 loss and gradient norm).
expect_error "is \(nan\|inf\|-nan\|-inf\): training stopped before the update.*holds the last good checkpoint" "$tinygpt" train \
  --data "$dir/text.txt" --out "$dir/nan16" --n-layer 1 --n-head 2 --n-embd 32 --block-size 32 --batch-size 8 \
  --max-iters 200 --lr 1e30 --grad-clip 0 --eval-iters 1 --quiet --dtype bf16 --storage bf16
expect_error "must be cpu or cuda" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --device tpu
expect_error "attention-math tf32 runs attention on GPU tensor cores: it needs --device cuda" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --attention-math tf32
expect_error "attention-math must be f32, tf32 or bf16, got 'f16'" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --attention-math f16
expect_error "is empty" "$tinygpt" train --data "$dir/empty.txt" --out "$dir/r2"
expect_error "invalid UTF-8 at byte offset 3" "$tinygpt" train --data "$dir/bad.txt" --out "$dir/r2"
expect_error "must be divisible by n_head" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --n-embd 30 --n-head 4
start=$(date +%s%N)
expect_error "training this model needs about .* of host memory" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --n-layer 1000000 --n-embd 65536 --n-head 1
[ $(( ($(date +%s%N) - start) / 1000000 )) -lt 5000 ] || fail "the absurd model size took more than 5 s to be refused"
expect_error "batch-size must be positive" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --batch-size 0
expect_error "time-budget must not be negative" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --time-budget -1
expect_error "time-budget: inf is not a finite number" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --time-budget inf
expect_error "not in the model's vocabulary" "$tinygpt" sample --ckpt "$dir/run" --prompt "XYZ"
expect_error "holds no checkpoint" "$tinygpt" sample --ckpt "$dir"
head -c 100 "$dir/run/ckpt_latest.safetensors" > "$dir/truncated.safetensors"
expect_error "truncated" "$tinygpt" sample --ckpt "$dir/truncated.safetensors"
head -c 3000 /dev/urandom > "$dir/random.safetensors"
expect_error "not a valid .safetensors file" "$tinygpt" sample --ckpt "$dir/random.safetensors"
expect_error "does not exist" "$tinygpt" sample --ckpt "$dir/missing.safetensors"
expect_error "^error: --format: onnx not in {hf,gguf}" "$tinygpt" export --ckpt "$dir/run" --format onnx --out "$dir/hf2"
expect_error "does not exist" "$tinygpt" export --ckpt "$dir/missing.safetensors" --out "$dir/hf2"
expect_error "cannot create the export directory" "$tinygpt" export --ckpt "$dir/run" --out "$dir/text.txt/hf"
expect_error "max-new-tokens must not be negative" "$tinygpt" sample --ckpt "$dir/run" --max-new-tokens -1
expect_error "storage bf16 needs --dtype bf16" "$tinygpt" sample --ckpt "$dir/run" --dtype fp32 --storage bf16
expect_error "layer 5 does not exist" "$tinygpt" attention --ckpt "$dir/run" --text "First" --layer 5 --out "$dir/a.svg"
expect_error "more than the model's block size" "$tinygpt" attention --ckpt "$dir/run" --text "$(head -c 40 "$dir/text.txt")" --out "$dir/a.svg"
expect_error "not in the model's vocabulary" "$tinygpt" eval --ckpt "$dir/run" --data "$dir/huge_vocab.txt"
expect_error "attention-math must be f32, tf32 or bf16, got 'fp8'" "$tinygpt" eval --ckpt "$dir/run" --data "$dir/text.txt" --attention-math fp8
expect_error "attention-math tf32 runs attention on GPU tensor cores: it needs --device cuda" "$tinygpt" sample --ckpt "$dir/run" --attention-math tf32

# A time budget ends the run (no --max-iters: the budget alone decides) and the log says after how many iterations.
"$tinygpt" train --data "$dir/text.txt" --out "$dir/budget" --n-layer 1 --n-head 2 --n-embd 32 --block-size 16 \
  --batch-size 4 --time-budget 0.5 --eval-iters 1 --log-interval 100000 2> "$dir/budget.log" ||
  fail "train --time-budget exited non-zero: $(tail -3 "$dir/budget.log")"
grep -q "^time budget: 0.5 s of training steps" "$dir/budget.log" || fail "train --time-budget does not announce it"
n=$(sed -n 's/^done: \([0-9]*\) iterations in [0-9.]* s of training steps (time budget 0.5 s).*/\1/p' "$dir/budget.log")
[ -n "$n" ] && [ "$n" = "$(grep -c '"train_s"' "$dir/budget/metrics.jsonl")" ] ||
  fail "the budgeted run's summary and metrics disagree: $(tail -1 "$dir/budget.log")"

# Relative positions, window, soft-cap and documents: trained, then sampled far past the block (a sliding cache), read
# back by info and eval, refused by the GPT-2 export; bad values refused.
"$tinygpt" train --data "$dir/text.txt" --out "$dir/rel" --n-layer 1 --n-head 2 --n-embd 32 --block-size 16 \
  --batch-size 4 --max-iters 4 --eval-interval 4 --eval-iters 1 --pos relative --max-relative-position 4 --window 8 \
  --softcap 20 --doc-sep $'\n' 2> "$dir/rel.log" || fail "train --pos relative exited non-zero: $(tail -3 "$dir/rel.log")"
r=$("$tinygpt" sample --ckpt "$dir/rel" --prompt "First" --max-new-tokens 60 --seed 3 2> /dev/null) || fail "sample of a relative model failed"
[ "${#r}" -eq 65 ] || fail "a relative-position model should sample past its block: got ${#r} characters"
"$tinygpt" info --ckpt "$dir/rel" 2>&1 | grep -q "relative positions (clipped at 4), window 8, soft-cap 20, documents" ||
  fail "info does not describe the relative model: $("$tinygpt" info --ckpt "$dir/rel" 2>&1 | head -3)"
"$tinygpt" eval --ckpt "$dir/rel" --data "$dir/text.txt" --eval-iters 1 --batch-size 2 > /dev/null 2>&1 || fail "eval of a relative model failed"
expect_error "positions are relative (trained with --pos relative), which GPT-2 cannot express" "$tinygpt" export --ckpt "$dir/rel" --out "$dir/hf3"
expect_error "^error: --pos: sinusoidal not in {learned,rope,relative,alibi,t5,none}" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --pos sinusoidal
expect_error "window must be >= 0" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --window -1
expect_error "softcap must be a finite number >= 0" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --softcap -5
expect_error "max_relative_position must be positive" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --pos relative --max-relative-position 0
expect_error "doc-sep: character .* is not in the data's vocabulary" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --doc-sep "@@"
expect_error "flags contradict the checkpoint: pos \"alibi\" (flags) vs \"relative\"" "$tinygpt" train --data "$dir/text.txt" --out "$dir/rel" --resume --pos alibi

# The modern options: trained, described by info, refused by the GPT-2 export where GPT-2 cannot hold them.
"$tinygpt" train --data "$dir/text.txt" --out "$dir/modern" --n-layer 1 --n-head 2 --n-embd 32 --block-size 16 \
  --batch-size 4 --max-iters 4 --eval-interval 4 --eval-iters 1 --mlp relu2 --logit-softcap 10 --zero-init-proj \
  --untied-head --qk-norm --optimizer muon 2> "$dir/modern.log" || fail "train with the modern options exited non-zero: $(tail -3 "$dir/modern.log")"
"$tinygpt" info --ckpt "$dir/modern" 2>&1 | grep -q "^optimizer      Muon and AdamW, 4 steps$" ||
  fail "info does not name the optimizer: $("$tinygpt" info --ckpt "$dir/modern" 2>&1 | grep optimizer)"
# Without --optimizer a resumed run takes the checkpoint's; naming the other one is refused.
"$tinygpt" train --data "$dir/text.txt" --out "$dir/modern" --resume --max-iters 6 --eval-interval 6 --eval-iters 1 \
  2> "$dir/modern_resume.log" || fail "resuming a Muon run without --optimizer failed: $(tail -2 "$dir/modern_resume.log")"
grep -q "at iteration 4 .*--optimizer muon)" "$dir/modern_resume.log" ||
  fail "the resumed run does not say it took Muon: $(grep resuming "$dir/modern_resume.log")"
expect_error "was trained with --optimizer muon, not adamw: resume with --optimizer muon or without the flag" "$tinygpt" \
  train --data "$dir/text.txt" --out "$dir/modern" --resume --max-iters 8 --optimizer adamw
# --dtype bf16 on the CPU: said in the model line, recorded in the checkpoint, used by eval; a bad value refused.
"$tinygpt" train --data "$dir/text.txt" --out "$dir/bf16" --n-layer 1 --n-head 2 --n-embd 32 --block-size 16 \
  --batch-size 4 --max-iters 4 --eval-interval 4 --eval-iters 1 --dtype bf16 2> "$dir/bf16.log" ||
  fail "train --dtype bf16 exited non-zero: $(tail -3 "$dir/bf16.log")"
grep -Eq "^model: .*, bf16 (matmuls and attention on (AMX-BF16|AVX512-BF16)|matmul operands rounded for f32 units)" "$dir/bf16.log" ||
  fail "the model line does not say bf16: $(grep '^model' "$dir/bf16.log")"
# Attention takes bf16 operands, and activations are stored in bf16, by default where the CPU's bf16 products run on a
# bf16 unit (AMX-BF16, AVX512-BF16; else f32: rounding alone only costs time); the model line says which, the
# checkpoint records it, and --attention-math bf16 asks for it on any CPU.
if grep -Eq "and attention on (AMX-BF16|AVX512-BF16)" "$dir/bf16.log"; then
  want_attention=bf16
  grep -q "^model: .*, bf16 activations" "$dir/bf16.log" ||
    fail "the model line does not say bf16 activations on a bf16 unit: $(grep '^model' "$dir/bf16.log")"
else
  want_attention=f32
  if grep -q "bf16 activations" "$dir/bf16.log"; then fail "bf16 activations on the f32 units: $(grep '^model' "$dir/bf16.log")"; fi
fi
"$tinygpt" info --ckpt "$dir/bf16" 2>&1 | grep -q "^numerics       bf16 matmul operands (--dtype bf16), $want_attention attention operands; on the GPU: bf16 matmuls" ||
  fail "info does not report bf16 with $want_attention attention: $("$tinygpt" info --ckpt "$dir/bf16" 2>&1 | grep numerics)"
TINYGPT_CPU_BF16=f32 "$tinygpt" train --data "$dir/text.txt" --out "$dir/bf16_attn" --n-layer 1 --n-head 2 --n-embd 32 \
  --block-size 16 --batch-size 4 --max-iters 2 --eval-interval 2 --eval-iters 1 --dtype bf16 --attention-math bf16 \
  > /dev/null 2>&1 || fail "train --attention-math bf16 on the f32 units exited non-zero"
"$tinygpt" info --ckpt "$dir/bf16_attn" 2>&1 | grep -q "bf16 attention operands" ||
  fail "info does not report --attention-math bf16: $("$tinygpt" info --ckpt "$dir/bf16_attn" 2>&1 | grep numerics)"
# TINYGPT_CPU_BF16 picks the CPU's bf16 kernel: f32 works everywhere; a name it does not know is refused.
TINYGPT_CPU_BF16=f32 "$tinygpt" train --data "$dir/text.txt" --out "$dir/bf16_f32" --n-layer 1 --n-head 2 --n-embd 32 \
  --block-size 16 --batch-size 4 --max-iters 2 --eval-interval 2 --eval-iters 1 --dtype bf16 2> "$dir/bf16_f32.log" ||
  fail "train --dtype bf16 with TINYGPT_CPU_BF16=f32 exited non-zero: $(tail -3 "$dir/bf16_f32.log")"
grep -q "^model: .*, bf16 matmul operands rounded for f32 units" "$dir/bf16_f32.log" ||
  fail "TINYGPT_CPU_BF16=f32 is not in the model line: $(grep '^model' "$dir/bf16_f32.log")"
expect_error "^error: TINYGPT_CPU_BF16 must be amx, avx512 or f32, got 'tiles'" env TINYGPT_CPU_BF16=tiles "$tinygpt" \
  train --data "$dir/text.txt" --out "$dir/r2" --max-iters 1 --dtype bf16
"$tinygpt" eval --ckpt "$dir/bf16" --data "$dir/text.txt" --eval-iters 2 --dtype fp32 > /dev/null 2>&1 || fail "eval --dtype fp32 of a bf16 run failed"
# The meter's peak: the CPU's clock and unit rates are measured once and cached, so later runs state the same figure
# (and say where it came from), except that a clock read clearly faster than the cached one replaces it (the peak only
# rises, to the fastest clock read); a damaged cache is measured again and rewritten, never trusted.
peak_of() { grep -o "MFU is against [0-9]* GFLOP/s" "$1"; }
cached_train() {  # run $1, over the cache in $2, else $dir/cache
  TINYGPT_CACHE_DIR="${2:-$dir/cache}" "$tinygpt" train --data "$dir/text.txt" --out "$dir/peak$1" --n-layer 1 --n-head 2 \
    --n-embd 32 --block-size 16 --batch-size 4 --max-iters 2 --eval-interval 2 --eval-iters 1 2> "$dir/peak$1.log" ||
    fail "train with a cache directory exited non-zero: $(tail -3 "$dir/peak$1.log")"
}
cached_train 1
if grep -q "clock and rate measured" "$dir/peak1.log"; then  # x86-64: the probe ran (elsewhere a matmul is timed)
  [ -f "$dir/cache/cpu-rates.txt" ] || fail "train did not cache the CPU's rates in TINYGPT_CACHE_DIR"
  # A cached clock no core reaches (9.5 GHz) is kept: the same peak in two runs, from the cache.
  sed -i 's/^ghz .*/ghz 9.5/' "$dir/cache/cpu-rates.txt"
  cached_train 2
  cached_train 4
  grep -q "x 9.50 GHz x .*cached in $dir/cache/cpu-rates.txt" "$dir/peak2.log" ||
    fail "the second run did not use the cache: $(grep '^speed' "$dir/peak2.log")"
  [ "$(peak_of "$dir/peak2.log")" = "$(peak_of "$dir/peak4.log")" ] ||
    fail "the cached peak moved: $(peak_of "$dir/peak2.log") then $(peak_of "$dir/peak4.log")"
  # A cached clock far below the cores' (0.5 GHz, as a busy moment could read) is replaced by the one read now.
  sed -i 's/^ghz .*/ghz 0.5/' "$dir/cache/cpu-rates.txt"
  cached_train 5
  if grep -q "x 0.50 GHz" "$dir/peak5.log"; then fail "a slow cached clock was kept: $(grep '^speed' "$dir/peak5.log")"; fi
  if grep -q "^ghz 0.5$" "$dir/cache/cpu-rates.txt"; then fail "the faster clock was not saved: $(cat "$dir/cache/cpu-rates.txt")"; fi
  sed -i 's/^ghz .*/ghz -3/' "$dir/cache/cpu-rates.txt"
  cached_train 3
  if grep -q "cached in" "$dir/peak3.log"; then fail "a damaged rate cache was used: $(grep '^speed' "$dir/peak3.log")"; fi
  grep -q "^ghz [0-9]" "$dir/cache/cpu-rates.txt" || fail "a damaged rate cache was not rewritten: $(cat "$dir/cache/cpu-rates.txt")"
  # Contention on purpose: beside twice as many busy processes as cores a fresh probe can read a unit a half or a
  # quarter of its rate (seen here); a later quiet run over that cache once logged an MFU above 100%. The unit's rate
  # is a ceiling now: a step that passes it raises it (train/speed.h), so neither run logs an MFU above 1.
  mfu_ok() {  # the run directory $1: every iteration has an mfu, none above 1
    local max; max=$(grep -o '"mfu":[0-9.e+-]*' "$1/metrics.jsonl" | cut -d: -f2 | sort -g | tail -n 1)
    awk -v m="$max" 'BEGIN {exit !(m > 0 && m <= 1)}' || fail "$1: an mfu above 1 or none: $max"
  }
  busy=()
  for _ in $(seq $((2 * $(nproc)))); do timeout 120 bash -c 'while :; do :; done' & busy+=($!); done
  cached_train _loaded "$dir/cache_loaded"
  kill "${busy[@]}" 2> /dev/null; wait "${busy[@]}" 2> /dev/null
  cached_train _quiet "$dir/cache_loaded"
  mfu_ok "$dir/peak_loaded" && mfu_ok "$dir/peak_quiet"
  # The worst such cache, made on purpose: the f32 units at 2 FLOPs a cycle. The first step passes that peak and raises
  # it; no logged MFU is above 1, and the cache keeps the raised rate.
  sed -i 's/^f32 [0-9.]*$/f32 2/' "$dir/cache_loaded/cpu-rates.txt"
  TINYGPT_CACHE_DIR="$dir/cache_loaded" "$tinygpt" train --data "$dir/text.txt" --out "$dir/peak_low" --n-layer 2 \
    --n-head 4 --n-embd 128 --block-size 32 --batch-size 8 --max-iters 4 --eval-interval 4 --eval-iters 1 \
    2> "$dir/peak_low.log" || fail "train over a low cached rate exited non-zero: $(tail -3 "$dir/peak_low.log")"
  grep -q "x 2 FLOP a cycle" "$dir/peak_low.log" || fail "the low cached rate was not used: $(grep '^speed' "$dir/peak_low.log")"
  mfu_ok "$dir/peak_low"
  # A step faster than that peak (any optimized build: 30-40 GFLOP/s against about 5 here) raises it and caches the
  # raised rate; a build too slow to pass it (the sanitizers' -O1) has nothing to raise.
  low=$(peak_of "$dir/peak_low.log" | head -n 1 | grep -o "[0-9]* GFLOP" | cut -d' ' -f1)
  fastest=$(grep -o '"gflops":[0-9.e+-]*' "$dir/peak_low/metrics.jsonl" | cut -d: -f2 | sort -g | tail -n 1)
  if awk -v f="$fastest" -v l="$low" 'BEGIN {exit !(f > l + 1)}'; then
    grep -q "^speed: iteration [0-9]* ran at .* above the peak: MFU is now against .* the probe read the unit low" \
      "$dir/peak_low.log" || fail "a step above the peak did not raise it: $(grep '^speed' "$dir/peak_low.log")"
    if grep -q "^f32 2$" "$dir/cache_loaded/cpu-rates.txt"; then fail "the raised rate was not cached"; fi
  fi
fi
expect_error "^error: --dtype: fp16 not in {fp32,bf16}" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --dtype fp16
expect_error "^error: --optimizer: sgd not in {adamw,muon}" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --optimizer sgd
expect_error "muon-momentum must be in \[0, 1), got 1" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --optimizer muon --muon-momentum 1
"$tinygpt" info --ckpt "$dir/modern" 2>&1 | grep -q "relu^2 MLP, logits soft-capped at 10, output projections initialized to zero, untied head, QK-norm" ||
  fail "info does not describe the modern options: $("$tinygpt" info --ckpt "$dir/modern" 2>&1 | sed -n 2p)"
expect_error "relu^2 MLP (--mlp relu2): GPT-2's MLP is GELU" "$tinygpt" export --ckpt "$dir/modern" --out "$dir/hf4"
expect_error "^error: --mlp: relu3 not in {gelu,relu2,swiglu}" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --mlp relu3
expect_error "logit_softcap must be a finite number >= 0" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --logit-softcap -1

# Info and pictures.
"$tinygpt" info --ckpt "$dir/run" > "$dir/info.out" 2>&1 || fail "info exited non-zero: $(cat "$dir/info.out")"
grep -q "^iteration      40$" "$dir/info.out" || fail "info did not report iteration 40: $(cat "$dir/info.out")"
# The run's numerics are recorded in its checkpoints: full f32 for a run on the CPU (whatever --tf32 says).
grep -q "^numerics       fp32, f32 attention operands; on the GPU: f32 matmuls$" "$dir/info.out" \
  || fail "info did not report the training numerics: $(cat "$dir/info.out")"
"$tinygpt" plot --run "$dir/run" --out "$dir/loss.svg" 2> /dev/null || fail "plot exited non-zero"
grep -q "<polyline" "$dir/loss.svg" && grep -q "</svg>" "$dir/loss.svg" || fail "loss.svg has no curve"
"$tinygpt" attention --ckpt "$dir/run" --text "First Citizen" --layer 0 --head 1 --out "$dir/attn.svg" 2> /dev/null \
  || fail "attention exited non-zero"
grep -q "head 1" "$dir/attn.svg" && grep -q "</svg>" "$dir/attn.svg" || fail "attn.svg has no heatmap"

# A SIGINT during training saves the latest checkpoint, exits 130, and the run resumes from it.
"$tinygpt" train --data "$dir/text.txt" --out "$dir/sig" --n-layer 1 --n-head 2 --n-embd 32 --block-size 32 \
  --batch-size 8 --max-iters 1000000 --eval-interval 1000000 --eval-iters 1 --log-interval 1000000 2> "$dir/sig.log" &
pid=$!
for _ in $(seq 100); do grep -q "^model:" "$dir/sig.log" 2> /dev/null && break; sleep 0.1; done
for _ in $(seq 100); do [ -f "$dir/sig/ckpt_latest.safetensors" ] && break; sleep 0.1; done
# One writer per run directory: a second train into it refuses at once; readers keep working.
expect_error "is being trained into by another tinygpt train (pid $pid)" "$tinygpt" train --data "$dir/text.txt" --out "$dir/sig" --resume
"$tinygpt" info --ckpt "$dir/sig" > /dev/null 2>&1 || fail "info cannot read a directory being trained into"
"$tinygpt" sample --ckpt "$dir/sig" --max-new-tokens 5 > /dev/null 2>&1 || fail "sample cannot read a directory being trained into"
"$tinygpt" eval --ckpt "$dir/sig" --data "$dir/text.txt" --eval-iters 1 --batch-size 2 > /dev/null 2>&1 ||
  fail "eval cannot read a directory being trained into"
sleep 0.5
kill -INT "$pid"
wait "$pid"
rc=$?
[ "$rc" = 130 ] || fail "SIGINT: expected exit code 130, got $rc"
grep -q "stopped by a signal after iteration" "$dir/sig.log" || fail "SIGINT: no message: $(tail -2 "$dir/sig.log")"
"$tinygpt" info --ckpt "$dir/sig/ckpt_latest.safetensors" > /dev/null 2>&1 || fail "SIGINT: the saved checkpoint does not load"

# A run killed outright leaves no stale lock: the next train into its directory resumes.
"$tinygpt" train --data "$dir/text.txt" --out "$dir/crash" --n-layer 1 --n-head 2 --n-embd 32 --block-size 32 \
  --batch-size 8 --max-iters 1000000 --eval-interval 1000000 --eval-iters 1 --log-interval 1000000 2> /dev/null &
pid=$!
for _ in $(seq 100); do [ -f "$dir/crash/ckpt_latest.safetensors" ] && break; sleep 0.1; done
kill -KILL "$pid"
wait "$pid" 2> /dev/null
"$tinygpt" train --data "$dir/text.txt" --out "$dir/crash" --resume --max-iters 2 --eval-iters 1 > /dev/null 2> "$dir/crash.log" ||
  fail "resuming after a SIGKILL failed: $(tail -1 "$dir/crash.log")"

if [ "$failures" -eq 0 ]; then echo "test_cli: all checks passed"; fi
exit $((failures > 0))
