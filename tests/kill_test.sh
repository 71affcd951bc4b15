#!/usr/bin/env bash
# Crash safety: kills training with SIGKILL at random moments, 20 times, resuming each time, and checks that
# the run directory always holds a loadable checkpoint (the writes go to a temporary file, are flushed and
# renamed into place, so a kill mid-write leaves the previous checkpoint).
#   tests/kill_test.sh path/to/tinygpt [rounds]
set -uo pipefail
tinygpt=$1
rounds=${2:-20}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for i in $(seq 200); do echo "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer"; done > "$dir/text.txt"
flags=(--data "$dir/text.txt" --out "$dir/run" --n-layer 2 --n-head 2 --n-embd 64 --block-size 32 --batch-size 8
  --max-iters 1000000 --eval-interval 5 --eval-iters 1 --log-interval 1000000)
# The first checkpoint exists from iteration 0 on.
"$tinygpt" train "${flags[@]}" --max-iters 0 2> "$dir/log" || { echo "FAIL: first run: $(tail -2 "$dir/log")"; exit 1; }
failures=0
for round in $(seq "$rounds"); do
  "$tinygpt" train "${flags[@]}" --resume 2>> "$dir/log" &
  pid=$!
  sleep "0.$((RANDOM % 9 + 1))$((RANDOM % 10))"
  kill -KILL "$pid" 2> /dev/null
  wait "$pid" 2> /dev/null
  if ! "$tinygpt" info --ckpt "$dir/run/ckpt_latest.safetensors" > "$dir/info" 2>&1; then
    echo "FAIL: round $round: the latest checkpoint does not load: $(cat "$dir/info")"
    failures=$((failures + 1))
    "$tinygpt" train "${flags[@]}" --max-iters 0 2>> "$dir/log"  # start over so later rounds still test something
  fi
done
# metrics.jsonl: each iteration once, in order (a resume drops what the killed run wrote after its checkpoint). The
# last run may have been killed before its first iteration (slow start-up under the sanitizers): no lines is in order.
if ! { grep -o '"iter":[0-9]*,"loss"' "$dir/run/metrics.jsonl" || true; } | cut -d: -f2 | cut -d, -f1 |
  awk 'NR - 1 != $1 { bad = 1 } END { exit bad }'; then
  echo "FAIL: metrics.jsonl repeats or skips iterations after the resumes"
  failures=$((failures + 1))
fi
iter=$(sed -n 's/^iteration *//p' "$dir/info")
echo "kill_test: $rounds SIGKILLs, $failures unloadable checkpoints; the run reached iteration $iter"
exit $((failures > 0))
