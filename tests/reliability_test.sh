#!/usr/bin/env bash
# What a hostile user tries, each answered with one `error:` line and the exit status the README promises (1: bad
# data, file or checkpoint; 2: usage), never a crash, a hang or a silent change: numbers that do not fit their flag,
# usage errors on every command, a checkpoint holding NaN or a negative iteration, a named pipe where a file belongs,
# --resume that keeps the run's numerics and refuses flags that contradict them, a damaged token cache, a closed stdout.
#   tests/reliability_test.sh path/to/tinygpt
set -uo pipefail
tinygpt=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# expect STATUS PATTERN COMMAND...: exits STATUS with exactly one error line matching PATTERN, within 60 s.
expect() {
  local want=$1 pattern=$2
  shift 2
  timeout 60 "$@" > "$dir/out" 2> "$dir/err"
  local got=$?
  if [ "$got" != "$want" ]; then
    fail "'$*' exited $got, not $want: $(tail -2 "$dir/err")"
  elif [ "$(grep -c '^error:' "$dir/err")" != 1 ] || ! grep -q -- "$pattern" "$dir/err"; then
    fail "'$*' said '$(grep '^error:' "$dir/err")'; expected one error line matching '$pattern'"
  fi
}
for i in $(seq 200); do echo "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer"; done > "$dir/text.txt"
tiny=(--n-layer 1 --n-head 2 --n-embd 32 --block-size 16 --batch-size 4 --eval-iters 1)
"$tinygpt" train --data "$dir/text.txt" --out "$dir/run" "${tiny[@]}" --max-iters 4 --eval-interval 4 --dtype bf16 \
  2> "$dir/train.log" || { echo "FAIL: the first run failed: $(tail -2 "$dir/train.log")"; exit 1; }

# Numbers: one that does not fit its flag is refused, never wrapped or clamped; inf as nan.
expect 2 "seed: -1 is out of range" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r" --seed -1
expect 2 "seed: 99999999999999999999 is out of range" "$tinygpt" sample --ckpt "$dir/run" --seed 99999999999999999999
expect 2 "max-iters: 99999999999999999999999 is out of range" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r" \
  --max-iters 99999999999999999999999
expect 2 "max-new-tokens: 99999999999999999999999 is out of range" "$tinygpt" sample --ckpt "$dir/run" \
  --max-new-tokens 99999999999999999999999
expect 2 "lr: inf is not a finite number" "$tinygpt" train --data "$dir/text.txt" --out "$dir/r" --lr inf
expect 2 "temperature: inf is not a finite number" "$tinygpt" sample --ckpt "$dir/run" --temperature inf
expect 2 "temperature: 1e999 is not a finite number" "$tinygpt" sample --ckpt "$dir/run" --temperature 1e999
# Usage errors on every command.
expect 2 "device must be cpu or cuda, got 'tpu'" "$tinygpt" sample --ckpt "$dir/run" --device tpu
expect 2 "device must be cpu or cuda, got 'tpu'" "$tinygpt" eval --ckpt "$dir/run" --data "$dir/text.txt" --device tpu
expect 2 "storage bf16 needs --dtype bf16" "$tinygpt" sample --ckpt "$dir/run" --dtype fp32 --storage bf16
expect 2 "layer must not be negative" "$tinygpt" attention --ckpt "$dir/run" --text "To be" --layer -1 --out "$dir/a.svg"
expect 2 "head must not be negative" "$tinygpt" attention --ckpt "$dir/run" --text "To be" --head -2 --out "$dir/a.svg"

# --resume keeps the run's numerics (bf16 here) without the flag, and a flag that contradicts them is a usage error.
"$tinygpt" train --data "$dir/text.txt" --out "$dir/run" "${tiny[@]}" --max-iters 6 --eval-interval 2 --resume \
  2> "$dir/resume.log" || fail "--resume failed: $(tail -2 "$dir/resume.log")"
grep -q "^model: .*bf16 mat" "$dir/resume.log" || fail "--resume of a bf16 run did not compute in bf16: $(grep '^model' "$dir/resume.log")"
expect 2 "dtype fp32 (flags) vs bf16 (checkpoint)" "$tinygpt" train --data "$dir/text.txt" --out "$dir/run" \
  "${tiny[@]}" --max-iters 8 --resume --dtype fp32
expect 2 "n_head 4 (flags) vs 2 (checkpoint)" "$tinygpt" train --data "$dir/text.txt" --out "$dir/run" \
  --n-head 4 --max-iters 8 --resume

# A checkpoint with a NaN weight, or a negative iteration, is refused by every reader, naming what is wrong.
perl -e '
  use JSON::PP; my ($in, $out) = @ARGV; local $/; open(my $f, "<:raw", $in) or die; my $b = <$f>;
  my $n = unpack("Q<", substr($b, 0, 8)); my $h = decode_json(substr($b, 8, $n));
  my $o = $h->{"transformer.h.0.attn.c_attn.weight"}{data_offsets}[0];
  substr($b, 8 + $n + $o + 8, 4) = pack("V", 0x7fc00000);
  open(my $g, ">:raw", $out) or die; print $g $b;' "$dir/run/ckpt_latest.safetensors" "$dir/nan.safetensors"
perl -e '
  use JSON::PP; my ($in, $out) = @ARGV; local $/; open(my $f, "<:raw", $in) or die; my $b = <$f>;
  my $n = unpack("Q<", substr($b, 0, 8)); my $h = decode_json(substr($b, 8, $n));
  $h->{__metadata__}{iter} = "-5"; my $t = JSON::PP->new->canonical->encode($h);
  $t .= " " x ((8 - length($t) % 8) % 8);
  open(my $g, ">:raw", $out) or die; print $g pack("Q<", length($t)) . $t . substr($b, 8 + $n);' \
  "$dir/run/ckpt_latest.safetensors" "$dir/negative.safetensors"
for cmd in "sample --ckpt $dir/nan.safetensors" "eval --ckpt $dir/nan.safetensors --data $dir/text.txt" \
  "info --ckpt $dir/nan.safetensors" "export --ckpt $dir/nan.safetensors --out $dir/hf"; do
  # shellcheck disable=SC2086
  expect 1 "weight 'transformer.h.0.attn.c_attn.weight' holds NaN at element 2" "$tinygpt" $cmd
done
expect 1 "its iteration is -5, below 0" "$tinygpt" sample --ckpt "$dir/negative.safetensors"

# A named pipe where a file belongs is refused at once, not waited on.
mkfifo "$dir/fifo.safetensors" "$dir/fifo.txt"
expect 1 "not a regular file" "$tinygpt" sample --ckpt "$dir/fifo.safetensors"
expect 1 "not a regular file" "$tinygpt" eval --ckpt "$dir/run" --data "$dir/fifo.txt"

# A token cache whose header states an absurd count is encoded again, not trusted (it crashed the next run).
cp -r "$dir/run" "$dir/run2"
# count 2^63 + the true count: count * 2 bytes wraps around to the true size.
perl -e '
  use bigint; local $/; open(my $f, "+<:raw", $ARGV[0]) or die; my $b = <$f>;
  my $n = unpack("Q<", substr($b, 8, 8)); my $h = substr($b, 16, $n);
  $h =~ s/"count":(\d+)/"\"count\":" . (2**63 + $1)/e or die "no count";
  length($h) <= 1024 or die "no room";  # the header has 1 KiB (data/token_cache.cpp)
  substr($b, 8, 8) = pack("Q<", length($h)); substr($b, 16, length($h)) = $h;
  seek($f, 0, 0); print $f $b;' "$dir/run2/tokens.bin" || fail "could not damage the token cache"
"$tinygpt" train --data "$dir/text.txt" --out "$dir/run2" "${tiny[@]}" --max-iters 8 --eval-interval 4 --resume \
  2> "$dir/cache.log" || fail "a damaged token cache was not encoded again: $(tail -2 "$dir/cache.log")"

# stdout that cannot take the output (a full device) is an error, not a silent exit 0.
if [ -w /dev/full ]; then
  "$tinygpt" sample --ckpt "$dir/run" --max-new-tokens 200 > /dev/full 2> "$dir/full.err"
  rc=$?
  [ "$rc" = 1 ] && grep -q "^error: .*\(No space left on device\|cannot write\)" "$dir/full.err" ||
    fail "sample into a full stdout exited $rc: $(cat "$dir/full.err")"
  "$tinygpt" info --ckpt "$dir/run" > /dev/full 2> "$dir/full.err"
  rc=$?
  [ "$rc" = 1 ] || fail "info into a full stdout exited $rc: $(cat "$dir/full.err")"
fi
echo "reliability_test: $failures failures"
exit $((failures > 0))
