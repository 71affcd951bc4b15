#!/usr/bin/env bash
# Data parallelism is gradient accumulation spread over processes: 2 MPI ranks with --grad-accum 1 (and 2, and 1 with
# --optimizer muon) against one process with --grad-accum 2 (and 4, and 2 with Muon), 50 iterations of a small model with dropout (a micro-batch gets the same
# masks wherever it is computed), one thread each. Every iteration's loss (within 1e-5 relative) and every tensor of
# the final checkpoints (largest difference within 1e-5 of the tensor's largest value) agree; two 2-rank runs are
# bit-identical, one of them reducing the gradients in small buckets during backward; a rank killed with SIGKILL ends the whole job with a non-zero status within 10 s and leaves a
# loadable checkpoint.
#   tests/mpi_test.sh path/to/tinygpt
set -uo pipefail
tinygpt=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# Under the sanitizer build the ranks run without LeakSanitizer: OpenMPI keeps allocations to the end from plugins
# it has unloaded by then, which cannot be told apart from ours. AddressSanitizer and UBSan stay on.
mpirun=(mpirun --allow-run-as-root --oversubscribe -np 2 -x "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0")

for i in $(seq 300); do echo "First Citizen: we are accounted poor citizens, the patricians good."; done > "$dir/text.txt"
small=(--data "$dir/text.txt" --n-layer 2 --n-head 2 --n-embd 32 --block-size 32 --batch-size 4 --max-iters 50
  --warmup-iters 5 --lr-decay-iters 50 --eval-interval 25 --eval-iters 4 --dropout 0.1 --quiet)

"$tinygpt" --threads 1 train "${small[@]}" --out "$dir/one" --grad-accum 2 || fail "one process exited $?"
"${mpirun[@]}" "$tinygpt" --threads 1 train "${small[@]}" --out "$dir/two" --grad-accum 1 || fail "2 ranks exited $?"
# Again, with the gradients reduced in ~60 small buckets while backward runs (the first run's model fits one bucket,
# started once backward is done): the same sums, so the same bits.
"${mpirun[@]}" "$tinygpt" --threads 1 train "${small[@]}" --out "$dir/again" --grad-accum 1 --bucket-mb 0.002 ||
  fail "2 ranks (again, small buckets) exited $?"
# Muon: every rank orthogonalizes the same summed momentum, so the ranks take one process's steps.
"$tinygpt" --threads 1 train "${small[@]}" --out "$dir/one_muon" --grad-accum 2 --optimizer muon ||
  fail "one process (Muon) exited $?"
"${mpirun[@]}" "$tinygpt" --threads 1 train "${small[@]}" --out "$dir/two_muon" --grad-accum 1 --optimizer muon ||
  fail "2 ranks (Muon) exited $?"
# Resume: a 2-rank run stopped at 25 and resumed with 2 ranks, or with one process accumulating 2, continues as the
# uninterrupted run did.
"${mpirun[@]}" "$tinygpt" --threads 1 train "${small[@]}" --out "$dir/half" --max-iters 25 || fail "2 ranks (to 25) exited $?"
cp -r "$dir/half" "$dir/half1"
"${mpirun[@]}" "$tinygpt" --threads 1 train "${small[@]}" --out "$dir/half" --resume || fail "2 ranks (resumed) exited $?"
"$tinygpt" --threads 1 train "${small[@]}" --out "$dir/half1" --resume --grad-accum 2 || fail "one process (resumed) exited $?"
# With accumulation on each rank too: rank r computes micro-steps 2r, 2r + 1 of one process's 4.
"$tinygpt" --threads 1 train "${small[@]}" --out "$dir/one4" --grad-accum 4 || fail "one process (accumulating 4) exited $?"
# (and without buckets: one reduction of the whole buffer after backward)
"${mpirun[@]}" "$tinygpt" --threads 1 train "${small[@]}" --out "$dir/two2" --grad-accum 2 --bucket-mb 0 ||
  fail "2 ranks (accumulating 2) exited $?"

python3 - "$dir" <<'PY' || fail "2 ranks differ from one process with twice the accumulation"
import json, struct, sys
d = sys.argv[1]

def losses(run):
    rows = [json.loads(l) for l in open(f"{d}/{run}/metrics.jsonl")]
    return [(r["iter"], r.get("loss", r.get("val_loss"))) for r in rows]

def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        blob = raw[8 + n + a:8 + n + b]
        out[name] = struct.unpack(f"<{len(blob) // 4}f", blob)
    return out

def close(x, y):
    return abs(x - y) <= 1e-5 * max(abs(x), abs(y), 1e-3)

for single, ranks, accum in (("one", "two", 2), ("one4", "two2", 4), ("one_muon", "two_muon", 2)):
    one, two = losses(single), losses(ranks)
    assert len(one) == len(two) == 53, (len(one), len(two))  # 50 iterations, evaluations at 0, 25 and 50
    bad = [(i, x, y) for (i, x), (_, y) in zip(one, two) if not close(x, y)]
    assert not bad, f"{ranks} vs {single}: losses differ: {bad[:3]}"
    a, b = tensors(f"{d}/{single}/ckpt_latest.safetensors"), tensors(f"{d}/{ranks}/ckpt_latest.safetensors")
    assert a.keys() == b.keys()
    worst = 0  # per tensor: the largest difference relative to the tensor's largest magnitude
    for name in a:
        scale = max(max(abs(x) for x in a[name]), 1e-30)
        worst = max(worst, max(abs(x - y) for x, y in zip(a[name], b[name])) / scale)
    assert worst <= 1e-5, f"{ranks} vs {single}: a tensor differs by {worst} relative"
    print(f"2 ranks = 1 process with --grad-accum {accum}: {len(one)} losses and {len(a)} tensors within 1e-5 "
          f"(largest difference {worst:.1e} of a tensor's largest value)")

two = tensors(f"{d}/two/ckpt_latest.safetensors")
assert tensors(f"{d}/half/ckpt_latest.safetensors") == two, "2 ranks stopped at 25 and resumed differ from the whole run"
assert losses("half") == losses("two"), "the resumed 2-rank run logged other losses"
resumed1 = tensors(f"{d}/half1/ckpt_latest.safetensors")
worst = max(max(abs(x - y) for x, y in zip(resumed1[n], two[n])) / max(max(abs(x) for x in two[n]), 1e-30) for n in two)
assert worst <= 1e-5, f"resumed by one process with --grad-accum 2: a tensor differs by {worst}"
print(f"resumed with 2 ranks: bit-identical; resumed by one process accumulating 2: within {worst:.1e}")
PY
# The same bytes but for the seconds the steps took (train_seconds, which --time-budget counts).
python3 - "$dir/two/ckpt_latest.safetensors" "$dir/again/ckpt_latest.safetensors" <<'PY' ||
import json, struct, sys
def parts(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    assert float(header["__metadata__"].pop("train_seconds")) > 0
    return header, raw[8 + n:]
assert parts(sys.argv[1]) == parts(sys.argv[2])
PY
  fail "two 2-rank runs gave different checkpoints"
[ "$(grep -o '"loss":[^,]*' "$dir/two/metrics.jsonl")" = "$(grep -o '"loss":[^,]*' "$dir/again/metrics.jsonl")" ] ||
  fail "two 2-rank runs logged different losses"
grep -q '"world_size":2' <("$tinygpt" info --ckpt "$dir/two") || fail "the checkpoint does not record the world size"

# Faults: SIGKILL one rank mid-run; the job ends, non-zero, within 10 s, and the latest checkpoint loads.
"${mpirun[@]}" "$tinygpt" --threads 1 train "${small[@]}" --out "$dir/kill" --max-iters 1000000 --eval-interval 20 \
  > "$dir/kill.log" 2>&1 &
job=$!
for _ in $(seq 300); do [ -f "$dir/kill/ckpt_latest.safetensors" ] && break; sleep 0.1; done
victim=$(pgrep -f "tinygpt --threads 1 train .*--out $dir/kill" | tail -n 1)
[ -n "$victim" ] && kill -KILL "$victim"
start=$(date +%s)
while kill -0 "$job" 2> /dev/null && [ $(($(date +%s) - start)) -lt 15 ]; do sleep 0.2; done
if kill -0 "$job" 2> /dev/null; then
  fail "the job still runs 15 s after one rank was killed"
  pkill -KILL -f "tinygpt --threads 1 train .*--out $dir/kill"
else
  wait "$job"
  rc=$?
  [ "$rc" != 0 ] || fail "the job exited 0 after a rank was killed"
  [ $(($(date +%s) - start)) -le 10 ] || fail "the job took more than 10 s to end after a rank was killed"
fi
"$tinygpt" info --ckpt "$dir/kill/ckpt_latest.safetensors" > /dev/null 2>&1 || fail "the latest checkpoint does not load after the kill"

if [ "$failures" -eq 0 ]; then echo "mpi_test: all checks passed"; fi
exit $((failures > 0))
