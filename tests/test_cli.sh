#!/usr/bin/env bash
# End to end through the command line, each step its own process: train a tiny model, sample from its run
# directory twice with one seed (same text) and once with another, evaluate it, and check that bad input
# gets a one-line error and a non-zero exit.
#   tests/test_cli.sh path/to/tinygpt
set -uo pipefail
tinygpt=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

for i in $(seq 300); do echo "First Citizen: we are accounted poor citizens, the patricians good."; done > "$dir/text.txt"

"$tinygpt" train --data "$dir/text.txt" --out "$dir/run" --n-layer 1 --n-head 2 --n-embd 32 --block-size 32 \
  --batch-size 8 --max-iters 40 --warmup-iters 5 --lr-decay-iters 40 --eval-interval 20 --eval-iters 2 \
  --log-interval 10 2> "$dir/train.log" || fail "train exited $?: $(tail -3 "$dir/train.log")"
grep -q "step 40: train loss" "$dir/train.log" || fail "train log has no final evaluation"
[ -f "$dir/run/ckpt_best.safetensors" ] && [ -f "$dir/run/ckpt_latest.safetensors" ] || fail "checkpoints missing"
[ "$(grep -c '"tok_per_s"' "$dir/run/metrics.jsonl")" = 40 ] || fail "metrics.jsonl should have 40 iteration lines"

sample() { "$tinygpt" sample --ckpt "$dir/run" --prompt "First" "$@" 2> "$dir/sample.log"; }
a=$(sample --seed 7 --max-new-tokens 60) || fail "sample exited non-zero: $(cat "$dir/sample.log")"
b=$(sample --seed 7 --max-new-tokens 60)
c=$(sample --seed 8 --max-new-tokens 60)
[[ "$a" == First* ]] || fail "the sample does not start with the prompt: '$a'"
[ "${#a}" -eq 65 ] || fail "expected 5 prompt + 60 new characters, got ${#a}: '$a'"
[ "$a" = "$b" ] || fail "the same seed gave different text"
[ "$a" != "$c" ] || fail "different seeds gave the same text"
grep -q "tokens/s" "$dir/sample.log" || fail "sample reports nothing on stderr"
d=$(sample --seed 7 --no-kv-cache --max-new-tokens 20)
[ "$d" = "${a:0:25}" ] || fail "with and without the KV cache differ before the context is cropped: '$d' vs '${a:0:25}'"

"$tinygpt" eval --ckpt "$dir/run" --data "$dir/text.txt" --eval-iters 2 --batch-size 4 > "$dir/eval.out" 2>&1 \
  || fail "eval exited non-zero: $(cat "$dir/eval.out")"
grep -Eq "^train loss [0-9.]+, val loss [0-9.]+$" "$dir/eval.out" || fail "eval printed '$(cat "$dir/eval.out")'"

# Bad input: a non-zero exit and one line that names the problem.
expect_error() {
  local pattern=$1
  shift
  local out
  if out=$("$@" 2>&1); then
    fail "'$*' succeeded; expected an error matching '$pattern'"
  elif ! grep -q -- "$pattern" <<< "$out"; then
    fail "'$*' said '$out'; expected '$pattern'"
  fi
}
printf 'abc\xff' > "$dir/bad.txt"
: > "$dir/empty.txt"
expect_error "does not exist" "$tinygpt" train --data "$dir/nope.txt" --out "$dir/r2"
expect_error "is empty" "$tinygpt" train --data "$dir/empty.txt" --out "$dir/r2"
expect_error "invalid UTF-8 at byte offset 3" "$tinygpt" train --data "$dir/bad.txt" --out "$dir/r2"
expect_error "must be divisible by n_head" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --n-embd 30 --n-head 4
expect_error "batch-size must be positive" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r2" --batch-size 0
expect_error "not in the model's vocabulary" "$tinygpt" sample --ckpt "$dir/run" --prompt "XYZ"
expect_error "holds no checkpoint" "$tinygpt" sample --ckpt "$dir"
head -c 100 "$dir/run/ckpt_latest.safetensors" > "$dir/truncated.safetensors"
expect_error "truncated" "$tinygpt" sample --ckpt "$dir/truncated.safetensors"

if [ "$failures" -eq 0 ]; then echo "test_cli: all checks passed"; fi
exit $((failures > 0))
