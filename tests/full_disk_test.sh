#!/usr/bin/env bash
# A full disk during training: the run directory on a small tmpfs, filled while training writes metrics and
# checkpoints. The run must end with one `error:` line and exit 1, leaving its latest checkpoint loadable, no half
# line in metrics.jsonl and no temporary file; --resume then continues once space is freed. Then a token cache larger
# than the disk: one error line, exit 1, nothing of it left. Needs a mount namespace
# (root, or unprivileged user namespaces): skipped (exit 77), said so, where it cannot mount one.
#   tests/full_disk_test.sh path/to/tinygpt
set -uo pipefail
tinygpt=$(realpath "$1")
if [ "${TINYGPT_IN_NAMESPACE:-}" != 1 ]; then
  # A private mount namespace, so the tmpfs is seen by this test alone and vanishes with it.
  if [ "$(id -u)" = 0 ]; then ns=(unshare --mount); else ns=(unshare --user --map-root-user --mount); fi
  if ! "${ns[@]}" true 2> /dev/null; then
    echo "full_disk_test: SKIPPED: cannot make a mount namespace here (${ns[*]} failed)"
    exit 77
  fi
  exec "${ns[@]}" env TINYGPT_IN_NAMESPACE=1 bash "$0" "$tinygpt"
fi
dir=$(mktemp -d)
trap 'umount "$dir/small" 2> /dev/null; rm -rf "$dir"' EXIT
mkdir "$dir/small"
if ! mount -t tmpfs -o size=2m tmpfs "$dir/small" 2> "$dir/mount.err"; then
  echo "full_disk_test: SKIPPED: cannot mount a small tmpfs: $(cat "$dir/mount.err")"
  exit 77
fi
fail() { echo "FAIL: $*"; exit 1; }
for i in $(seq 300); do echo "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer"; done > "$dir/text.txt"
run="$dir/small/run"
flags=(--data "$dir/text.txt" --out "$run" --n-layer 1 --n-head 2 --n-embd 32 --block-size 16 --batch-size 4
  --eval-iters 1 --log-interval 1000000)
"$tinygpt" train "${flags[@]}" --max-iters 20 --eval-interval 20 2> "$dir/first.log" || fail "the first run failed: $(tail -2 "$dir/first.log")"
# Fill the filesystem, then leave a little: room for some metrics lines (a line an iteration), the next checkpoint far
# off. The run must stop when a line does not fit, not train on without its log.
dd if=/dev/zero of="$dir/small/filler" bs=4k 2> /dev/null
truncate -s -8k "$dir/small/filler"
"$tinygpt" train "${flags[@]}" --max-iters 3000 --eval-interval 3000 --resume > /dev/null 2> "$dir/full.log"
status=$?
[ "$status" = 1 ] || fail "training on a full disk exited $status, not 1: $(tail -3 "$dir/full.log")"
[ "$(grep -c '^error:' "$dir/full.log")" = 1 ] || fail "not one error line: $(grep '^error:' "$dir/full.log")"
grep -Eq "^error: .*(disk full|No space left on device)" "$dir/full.log" ||
  fail "the error does not say the disk is full: $(grep '^error:' "$dir/full.log")"
"$tinygpt" info --ckpt "$run/ckpt_latest.safetensors" > "$dir/info" 2>&1 ||
  fail "the latest checkpoint does not load after the disk filled: $(cat "$dir/info")"
[ -z "$(tail -c 1 "$run/metrics.jsonl")" ] || fail "metrics.jsonl ends in a half line: $(tail -c 80 "$run/metrics.jsonl")"
leftovers=$(find "$run" -name '*.tmp')
[ -z "$leftovers" ] || fail "temporary files left behind: $leftovers"
# Space again: the run resumes from its latest checkpoint.
rm -f "$dir/small/filler"
iter=$(sed -n 's/^iteration *//p' "$dir/info")
[ -n "$iter" ] || fail "info names no iteration: $(cat "$dir/info")"
"$tinygpt" train "${flags[@]}" --max-iters $((iter + 20)) --eval-interval 20 --resume 2> "$dir/again.log" ||
  fail "--resume after freeing space failed: $(tail -2 "$dir/again.log")"
lines=$(wc -l < "$run/metrics.jsonl")
# A full disk while the token cache is written (3 MB of text, 6 MB of ids, on 2 MB): one error line, exit 1, no
# temporary file and no tokens.bin left behind, never half a cache.
for i in $(seq 30000); do echo "line $i: the quick brown fox jumps over the lazy dog, and the dog sleeps on"; done > "$dir/big.txt"
"$tinygpt" train --data "$dir/big.txt" --out "$dir/small/cache-run" --n-layer 1 --n-head 2 --n-embd 32 --block-size 16 \
  --batch-size 4 --eval-iters 1 --max-iters 2 > /dev/null 2> "$dir/cache.log"
status=$?
[ "$status" = 1 ] || fail "writing a token cache on a full disk exited $status, not 1: $(tail -3 "$dir/cache.log")"
[ "$(grep -c '^error:' "$dir/cache.log")" = 1 ] && grep -Eq "^error: .*(disk full|No space left on device)" "$dir/cache.log" ||
  fail "a token cache on a full disk said: $(grep '^error:' "$dir/cache.log")"
leftovers=$(find "$dir/small/cache-run" -name '*.tmp' -o -name tokens.bin)
[ -z "$leftovers" ] || fail "a token cache that did not fit left: $leftovers"
echo "full_disk_test: the disk filled after $lines metrics lines: one error line, exit 1, the checkpoint (iteration ${iter:-?}) and log intact, resumed; a token cache that did not fit: $(grep '^error:' "$dir/cache.log" | cut -c1-100)"
