#!/usr/bin/env bash
# The GPU check, run on a machine with an NVIDIA GPU: configures for that GPU, builds, runs the GPU tests,
# compute-sanitizer (memcheck and racecheck) on the attention tests, training throughput on nanoGPT's
# Shakespeare config (f32 with TF32 matmuls and attention, also with cublasLt's epilogues, TINYGPT_CUBLASLT_EPILOGUES=1;
# with f32 and bf16 attention; and --dtype bf16: bf16 matmuls, attention and storage, also with the forward's 128-row
# blocks of TINYGPT_FLASH_ROWS=128, with the one-pass backward of TINYGPT_FLASH_DQ=atomic, and on f32 storage, --storage f32, step and GPU memory) against PyTorch eager, autocast bf16 and torch.compile (when PyTorch is importable),
# the fused classifier against the separate kernels (bench_classifier, where built), the attention benchmark (f32 and
# bf16 tensor-core flash) against PyTorch's scaled_dot_product_attention and the opt-in bf16-storage kernels
# (TINYGPT_FLASH_ROWS=128, TINYGPT_FLASH_Q=smem, TINYGPT_FLASH_DQ=atomic) against the defaults, and Nsight
# Compute on the bf16 flash kernels at the training shape; then prints one summary table. Logs go to build-gpu/gpu_check/.
#
#   bash scripts/gpu_check.sh [--full] [--no-build] [--no-tests] [--no-ncu] [--quick | --attention | --step]
#
# --step checks the training step alone, for the shortest lease: the GPU tests, the training rows of --quick plus
# f32 storage without a CUDA graph and torch.compile's reduce-overhead mode, the profile of the bf16 step on bf16
# and on f32 storage, then the sanitizers on the bf16-storage kernels (last, so a run cut short has the step's
# table); no attention benchmark and no Nsight Compute.
# --attention checks the attention kernels alone: the GPU tests of attention and bf16, the sanitizers on the
# bf16-storage kernels, the bf16 attention rows on every shape against PyTorch, and Nsight Compute on the
# bf16-storage kernels at the training shape and at T 2048, head dim 128; no training rows.
# --quick keeps what a short lease can afford: the tests (the sanitizers on the bf16-storage kernel only), the
# default f32 and the bf16 training rows
# (with the baseline's and torch's bf16 ones, and --storage f32's), the bf16 profile, the bf16 attention rows on every shape, and Nsight
# Compute; it drops the rows of opt-in paths (epilogues, f32 and bf16 attention math).
#
# --no-tests leaves out the GPU tests and compute-sanitizer, and --no-ncu Nsight Compute: for a second call in one
# lease, after a first that ran them (e.g. --step, then --attention --no-tests --no-ncu).
# --no-build uses the binaries already in build-gpu (built elsewhere for this GPU, e.g. with
# -DCMAKE_CUDA_ARCHITECTURES=90 -DTINYGPT_NATIVE=OFF) instead of configuring and building here.
# Each step runs under a time limit, and the summary is also written line by line to build-gpu/gpu_check/summary.txt,
# so a run cut short still says how far it got (each section's start, in seconds, is printed). --full also trains the
# Shakespeare config for 5000 iterations on the GPU (nanoGPT's shakespeare_char recipe, dropout 0.2) and reports its
# best val loss. Set CMAKE_CUDA_ARCHITECTURES to build for another GPU.
#
# TINYGPT_BASELINE_BUILD=DIR (a build of another commit, holding tinygpt and bench/bench_attention, such as a
# worktree's build-gpu) adds that build's --dtype bf16 training row and its bf16 attention on the quick shapes,
# measured in the same run, so a change can be judged against the code before it on the same GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
full=0
quick=0
attention_only=0
step_only=0
build_here=1
run_tests=1
run_ncu=1
for arg in "$@"; do
  case $arg in
    --full) full=1 ;;
    --no-build) build_here=0 ;;
    --no-tests) run_tests=0 ;;
    --no-ncu) run_ncu=0 ;;
    --quick) quick=1 ;;
    --attention) quick=1 attention_only=1 ;;
    --step) quick=1 step_only=1 ;;
    *) echo "error: gpu_check: unknown argument '$arg' (expected --full, --no-build, --no-tests, --no-ncu, --quick, --attention or --step)" >&2; exit 2 ;;
  esac
done
build=build-gpu
logs=$build/gpu_check
if ! command -v nvcc > /dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
mkdir -p "$logs"
summary=()
: > "$logs/summary.txt"
note() {
  summary+=("$(printf '%-34s %s' "$1" "$2")")
  printf '%-34s %s\n' "$1" "$2" >> "$logs/summary.txt"
}
py=python3
has_torch=0
$py -c "import torch; assert torch.cuda.is_available()" 2> /dev/null && has_torch=1

if [ $build_here = 1 ]; then
  echo "== configure and build ($build, CUDA architectures ${CMAKE_CUDA_ARCHITECTURES:-native})"
  generator=()
  command -v ninja > /dev/null && [ ! -f $build/CMakeCache.txt ] && generator=(-G Ninja)
  if ! { cmake -S . -B $build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DTINYGPT_CUDA=ON \
           -DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-native}" > "$logs/configure.log" 2>&1 &&
         cmake --build $build --parallel "$(nproc)" > "$logs/build.log" 2>&1; }; then
    tail -30 "$logs/configure.log" "$logs/build.log"
    echo "gpu_check: the build failed"
    exit 1
  fi
else
  for bin in $([ $attention_only = 0 ] && echo tinygpt) tests/test_cuda $([ $step_only = 0 ] && echo bench/bench_attention); do
    [ -x $build/$bin ] || { echo "error: gpu_check --no-build: $build/$bin is missing (build it first)"; exit 1; }
  done
  missing=$(ldd $build/tests/test_cuda | grep 'not found')
  [ -n "$missing" ] && { echo "error: gpu_check --no-build: libraries not found: $missing"; exit 1; }
fi
baseline=${TINYGPT_BASELINE_BUILD:-}
if [ -n "$baseline" ]; then
  for bin in tinygpt $([ $step_only = 0 ] && echo bench/bench_attention); do
    [ -x "$baseline/$bin" ] || { echo "error: gpu_check: TINYGPT_BASELINE_BUILD=$baseline has no $bin (build it first)"; exit 1; }
  done
fi
note "build" "ok ($(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1))"

if [ $run_tests = 1 ]; then
echo "== GPU tests (at ${SECONDS} s)"
status=0
tests=()
[ $attention_only = 1 ] && tests=(--test-case='*attention*,*flash*,*bf16*')
timeout $([ $quick = 1 ] && echo 150 || echo 240) $build/tests/test_cuda "${tests[@]}" > "$logs/test_cuda.log" 2>&1 || status=$?
tail -4 "$logs/test_cuda.log"
note "test_cuda" "$([ $status = 0 ] && echo passed || echo "FAILED (exit $status)"): $(grep -E '^\[doctest\] (test cases|assertions)' "$logs/test_cuda.log" | tr -s ' ' | paste -sd ';')"
[ $status != 0 ] && grep -B2 -A12 "ERROR" "$logs/test_cuda.log" | head -60
else
  note "test_cuda" "not run (--no-tests)"
fi

# compute-sanitizer's memcheck and racecheck on the attention tests (--quick: the bf16-storage kernels alone).
sanitize() {
[ $run_tests = 1 ] || return 0
echo "== compute-sanitizer on the attention tests (at ${SECONDS} s)"
if command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck; do
    filter='*flash attention is deterministic*,*attention op runs on the GPU*,*attention on bf16 storage*,*one-pass*,*Q from shared*'
    [ $tool = memcheck ] && filter="$filter,*naive attention matches*,*training on bf16 storage*"
    [ $quick = 1 ] && filter='*attention on bf16 storage*,*one-pass*,*Q from shared*'
    timeout $([ $quick = 1 ] && echo 120 || echo 240) compute-sanitizer --tool $tool --error-exitcode 9 $build/tests/test_cuda --test-case="$filter" \
      > "$logs/sanitizer_$tool.log" 2>&1
    rc=$?
    tail -3 "$logs/sanitizer_$tool.log"
    note "compute-sanitizer $tool" "$([ $rc = 0 ] && echo clean || echo "FAILED (exit $rc)"): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/sanitizer_$tool.log" | tail -1)"
  done
else
  note "compute-sanitizer" "not found, not run"
fi
}
[ $step_only = 0 ] && sanitize

if [ $attention_only = 0 ]; then
echo "== (at ${SECONDS} s) training throughput, nanoGPT Shakespeare config (6 layers, 6 heads, 384 wide, block 256, batch 64)"
data=$(bash scripts/get_data.sh)
cfg=(--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 64 --dropout 0.2)
iters=60
# Median ms/iter of a short training run with extra flags $@ (the first 10 iterations warm up and are dropped).
ours_train_ms() {
  local run
  run=$(mktemp -d)
  timeout 120 "${tinygpt_bin:-./$build/tinygpt}" train --device cuda --data "$data" --out "$run" "${cfg[@]}" --max-iters $((iters + 10)) \
    --eval-interval 100000 --eval-iters 1 --log-interval 10 "$@" >> "$logs/train_throughput.log" 2>&1
  grep -o '"ms":[0-9.e+-]*' "$run/metrics.jsonl" | cut -d: -f2 | tail -n +11 | sort -g |
    awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'
  grep -o '"host_syncs":[0-9]*' "$run/metrics.jsonl" | cut -d: -f2 | sort -n | tail -1 > "$logs/host_syncs"
  grep -o '"gpu_peak_mib":[0-9.e+-]*' "$run/metrics.jsonl" | cut -d: -f2 | sort -g | tail -1 > "$logs/gpu_peak_mib"
  rm -rf "$run"
}
: > "$logs/train_throughput.log"
ours_ms=$(ours_train_ms)
note "host syncs per training step" "$(cat "$logs/host_syncs") at most (aim: 1; metrics.jsonl host_syncs)"
# With cublasLt's epilogues (the MLP's bias and GELU, GELU's derivative; f32 products only, not the default until
# measured faster here).
[ $quick = 0 ] && ours_epi_ms=$(TINYGPT_CUBLASLT_EPILOGUES=1 ours_train_ms)
[ $quick = 0 ] && ours_f32_attn_ms=$(ours_train_ms --attention-math f32)
[ $quick = 0 ] && ours_bf16_attn_ms=$(ours_train_ms --attention-math bf16)
ours_bf16_ms=$(ours_train_ms --dtype bf16)
# The step is captured as a CUDA graph and replayed, dropout included; --no-cuda-graphs queues the same work op by op.
# And without dropout.
nodrop=(--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 64 --dropout 0)
ours_graph_ms=$(cfg=("${nodrop[@]}"); ours_train_ms --dtype bf16)
note "host syncs per step, dropout 0" "$(cat "$logs/host_syncs") at most (aim: 1)"
graph_mib=$(cat "$logs/gpu_peak_mib")
# f32 storage (bf16 products over f32 activations, --dtype bf16's default on the GPU before bf16 storage): with
# dropout 0.2 and with dropout 0.
ours_bf16f_ms=$(ours_train_ms --dtype bf16 --storage f32)
ours_bf16f_graph_ms=$(cfg=("${nodrop[@]}"); ours_train_ms --dtype bf16 --storage f32)
f32s_mib=$(cat "$logs/gpu_peak_mib")
[ -n "$ours_bf16f_graph_ms" ] && [ -n "$ours_graph_ms" ] && [ -n "$graph_mib" ] && [ -n "$f32s_mib" ] &&
  note "--storage bf16 vs f32, dropout 0" "$(awk "BEGIN {printf \"bf16 storage %.2fx faster a step (%.2f against %.2f ms), %.2fx the GPU memory (%.0f against %.0f MiB peak)\", $ours_bf16f_graph_ms / $ours_graph_ms, $ours_graph_ms, $ours_bf16f_graph_ms, $graph_mib / $f32s_mib, $graph_mib, $f32s_mib}")"
ours_nograph_ms=$(ours_train_ms --dtype bf16 --no-cuda-graphs)
[ $step_only = 1 ] && ours_bf16f_nograph_ms=$(ours_train_ms --dtype bf16 --storage f32 --no-cuda-graphs)
[ -n "$baseline" ] && base_bf16_ms=$(tinygpt_bin=$baseline/tinygpt ours_train_ms --dtype bf16)
# The flash forward's 128-row blocks (not the default until measured faster).
ours_rows128_ms=$(TINYGPT_FLASH_ROWS=128 ours_train_ms --dtype bf16)
# The one-pass backward (dQ by atomics; not the default until measured faster).
ours_dq_atomic_ms=$(TINYGPT_FLASH_DQ=atomic ours_train_ms --dtype bf16)
note "CUDA graph capture" "$(grep -m1 -o 'could not be captured.*' "$logs/train_throughput.log" || echo 'captured and replayed (no fallback logged)')"
tokens=$((64 * 256))
tok() { awk "BEGIN {printf \"%.0f\", $tokens * 1000 / $1}"; }
# One row of the training table, when its time was measured (--quick leaves some out).
row() { [ -n "${2:-}" ] && printf "%-36s %10.2f %12s\n" "$1" "$2" "$(tok "$2")" | tee -a "$logs/train.log"; return 0; }
printf "%-36s %10s %12s\n" "implementation" "ms/iter" "tokens/s" | tee "$logs/train.log"
row "tinygpt f32 (TF32 matmuls, attention)" "$ours_ms"
row "  TINYGPT_CUBLASLT_EPILOGUES=1" "${ours_epi_ms:-}"
row "tinygpt, f32 attention (CUDA cores)" "${ours_f32_attn_ms:-}"
row "tinygpt, bf16 tensor-core attention" "${ours_bf16_attn_ms:-}"
row "tinygpt --dtype bf16" "$ours_bf16_ms"
row "  the baseline build" "${base_bf16_ms:-}"
row "  TINYGPT_FLASH_ROWS=128" "${ours_rows128_ms:-}"
row "  TINYGPT_FLASH_DQ=atomic" "${ours_dq_atomic_ms:-}"
row "  --no-cuda-graphs" "${ours_nograph_ms:-}"
row "  dropout 0" "$ours_graph_ms"
row "  --storage f32" "${ours_bf16f_ms:-}"
row "  --storage f32 --no-cuda-graphs" "${ours_bf16f_nograph_ms:-}"
row "  --storage f32, dropout 0" "${ours_bf16f_graph_ms:-}"
if [ $has_torch = 1 ]; then
  note "pytorch" "$($py -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())' 2>&1 | tail -1)"
  torch_ms() {
    timeout 180 $py bench/torch_gpt.py --device cuda --data "$data" "${cfg[@]}" --iters 40 "$@" |
      $py -c 'import json,sys; print(json.load(sys.stdin)["ms"])'
  }
  [ $quick = 0 ] && t32=$(torch_ms)
  row "pytorch eager f32 (TF32 matmuls)" "${t32:-}"
  tbf=$(torch_ms --dtype bf16)
  printf "%-36s %10.2f %12s\n" "pytorch eager bf16 autocast" "$tbf" "$(tok "$tbf")" | tee -a "$logs/train.log"
  if tcomp=$(timeout 300 $py bench/torch_gpt.py --device cuda --data "$data" "${cfg[@]}" --iters 40 --dtype bf16 --compile \
               2> "$logs/torch_compile.log" | $py -c 'import json,sys; print(json.load(sys.stdin)["ms"])'); then
    printf "%-36s %10.2f %12s\n" "pytorch torch.compile bf16 autocast" "$tcomp" "$(tok "$tcomp")" | tee -a "$logs/train.log"
  else
    echo "pytorch torch.compile bf16: did not run here (see $logs/torch_compile.log)" | tee -a "$logs/train.log"
  fi
  if [ $step_only = 1 ]; then  # torch.compile's CUDA-graph mode (max-autotune's search is too long for a short lease)
    if tro=$(timeout 300 $py bench/torch_gpt.py --device cuda --data "$data" "${cfg[@]}" --iters 40 --dtype bf16 --compile \
               --compile-mode reduce-overhead 2> "$logs/torch_compile_ro.log" | $py -c 'import json,sys; print(json.load(sys.stdin)["ms"])'); then
      printf "%-36s %10.2f %12s\n" "  mode reduce-overhead" "$tro" "$(tok "$tro")" | tee -a "$logs/train.log"
      tcomp=$(awk "BEGIN {print (\"${tcomp:-}\" == \"\" || $tro < ${tcomp:-0} ? $tro : ${tcomp:-0})}")  # the peer at its best
    else
      echo "pytorch torch.compile reduce-overhead: did not run here (see $logs/torch_compile_ro.log)" | tee -a "$logs/train.log"
    fi
  fi
  [ $quick = 0 ] && note "training tok/s vs torch eager f32" "$(awk "BEGIN {printf \"%.2fx (tinygpt %.1f ms/iter, torch %.1f)\", $t32 / $ours_ms, $ours_ms, $t32}")"
  if [ $quick = 0 ]; then
    note "  TINYGPT_CUBLASLT_EPILOGUES=1" "$(awk "BEGIN {printf \"%.2fx (tinygpt %.1f ms/iter)\", $t32 / $ours_epi_ms, $ours_epi_ms}")"
    note "  with --attention-math f32" "$(awk "BEGIN {printf \"%.2fx (tinygpt %.1f ms/iter)\", $t32 / $ours_f32_attn_ms, $ours_f32_attn_ms}")"
    note "  with --attention-math bf16" "$(awk "BEGIN {printf \"%.2fx (tinygpt %.1f ms/iter)\", $t32 / $ours_bf16_attn_ms, $ours_bf16_attn_ms}")"
  fi
  note "--dtype bf16 vs torch autocast bf16" "$(awk "BEGIN {printf \"%.2fx (tinygpt %.1f ms/iter, torch %.1f)\", $tbf / $ours_bf16_ms, $ours_bf16_ms, $tbf}")"
  [ -n "$baseline" ] && note "  the baseline build" "$(awk "BEGIN {printf \"%.2fx autocast (baseline %.1f ms/iter; this build %.2fx it)\", $tbf / $base_bf16_ms, $base_bf16_ms, $base_bf16_ms / $ours_bf16_ms}")"
  [ -n "${tcomp:-}" ] && note "--dtype bf16 vs torch.compile bf16" "$(awk "BEGIN {printf \"%.2fx (aim 1.0x; torch at its best of the modes run %.1f ms/iter)\", $tcomp / $ours_bf16_ms, $tcomp}")"
  [ -n "${tcomp:-}" ] && [ -n "${ours_bf16f_ms:-}" ] && note "  --storage f32 vs torch.compile" "$(awk "BEGIN {printf \"%.2fx (tinygpt %.2f ms/iter, torch %.2f)\", $tcomp / $ours_bf16f_ms, $ours_bf16f_ms, $tcomp}")"
else
  note "training tok/s" "$(tok "$ours_ms") (no PyTorch to compare)"
fi

echo "== (at ${SECONDS} s) where the GPU time goes (TINYGPT_CUDA_PROFILE=1: 20 iterations; by op and by kernel, the top 14 of each)"
for math in $([ $quick = 0 ] && echo f32 tf32) bf16 $([ $step_only = 1 ] && echo bf16f); do
  run=$(mktemp -d)
  flags=(--attention-math ${math%f})
  [ $math = bf16 ] && flags+=(--dtype bf16)
  [ $math = bf16f ] && flags+=(--dtype bf16 --storage f32)
  TINYGPT_CUDA_PROFILE=1 timeout 120 ./$build/tinygpt train --device cuda --data "$data" --out "$run" "${cfg[@]}" \
    --max-iters 20 --eval-interval 100000 --eval-iters 1 --quiet "${flags[@]}" > /dev/null 2> "$logs/profile_$math.log"
  rm -rf "$run"
  echo "-- ${flags[*]}"
  awk '/^TINYGPT_CUDA_PROFILE/ {n = 16} n-- > 0' "$logs/profile_$math.log"  # each table the costliest first
done
fi  # attention_only

# The fused classifier (loss and logits' gradient from one read) against the separate kernels, at 65 and 50304 classes.
if [ $attention_only = 0 ] && [ -x $build/bench/bench_classifier ]; then
  echo "== (at ${SECONDS} s) the classifier's loss and gradient, fused and separate (bench_classifier)"
  timeout 90 $build/bench/bench_classifier --device cuda | tee "$logs/classifier.log"
  for v in 65 50304; do
    note "fused classifier, bf16, V $v" "$(awk -F'|' -v v="x $v " 'index($2, v) && $3 ~ /bf16/ {printf "%s faster than separate kernels; fused %s GB/s, a copy %s GB/s", $7, $8, $9}' "$logs/classifier.log")"
  done
fi

if [ $step_only = 1 ]; then
  sanitize
else
echo "== attention benchmark (at ${SECONDS} s)"
if [ $has_torch = 1 ]; then
  timeout 240 $py bench/compare_attention_cuda.py --bench $build/bench/bench_attention $([ $quick = 1 ] && echo --bf16) |
    tee "$logs/attention.log"
  # The ratios of every shape in log $3 (attention.log unless given), sorted: fields NF-2, NF-1 and NF are forward,
  # backward and forward+backward.
  ratios() {
    awk -v impl="$1" -v f="$2" '$1 == impl {print $(NF - f)}' "$logs/${3:-attention.log}" | tr -d x | sort -g | paste -sd ' '
  }
  if [ $quick = 0 ]; then
    note "f32 flash fwd vs torch sdpa f32" "$(ratios tinygpt:flash 2)"
    note "f32 flash f+b vs torch sdpa f32" "$(ratios tinygpt:flash 0)"
    note "tf32 flash fwd vs torch sdpa f32" "$(ratios tinygpt:flash_tf32 2)"
    note "tf32 flash f+b vs torch sdpa f32" "$(ratios tinygpt:flash_tf32 0)"
  fi
  note "bf16 flash fwd vs torch sdpa bf16" "$(ratios tinygpt:flash_bf16 2)"
  note "bf16 flash bwd vs torch sdpa bf16" "$(ratios tinygpt:flash_bf16 1)"
  note "bf16 flash f+b vs torch sdpa bf16" "$(ratios tinygpt:flash_bf16 0)"
  note "bf16 storage fwd vs sdpa bf16" "$(ratios tinygpt:flash_bf16_storage 2)"
  note "bf16 storage f+b vs sdpa bf16" "$(ratios tinygpt:flash_bf16_storage 0)"
  # The opt-in kernels against the defaults, the bf16-storage rows of every shape, one run after the other; the
  # switches touch different kernels, so one run takes them all: the forward's 128-row blocks at head dim 64
  # (TINYGPT_FLASH_ROWS=128) and Q from shared memory at head dim 128 (TINYGPT_FLASH_Q=smem) in the forward's times,
  # the one-pass backward (TINYGPT_FLASH_DQ=atomic) in the backward's (forward + backward less forward).
  timeout 120 $build/bench/bench_attention --device cuda --json --bf16 > "$logs/default.jsonl" 2> /dev/null
  TINYGPT_FLASH_ROWS=128 TINYGPT_FLASH_Q=smem TINYGPT_FLASH_DQ=atomic timeout 120 $build/bench/bench_attention \
    --device cuda --json --bf16 > "$logs/opt_in.jsonl" 2> /dev/null
  $py - "$logs/default.jsonl" "$logs/opt_in.jsonl" << 'PY' | tee "$logs/opt_in.log"
import json, sys
runs = [[json.loads(l) for l in open(f) if l.startswith("{")] for f in sys.argv[1:3]]
pick = lambda rows: {(r["B"], r["NH"], r["T"], r["E"], r["causal"]): (r["fwd_ms"], r["fwd_bwd_ms"] - r["fwd_ms"])
                     for r in rows if r["impl"] == "flash_bf16_storage"}
a, b = (pick(r) for r in runs)
print("B x NH x T x E, causal      fwd ms default   opt-in   ratio    bwd ms default   opt-in   ratio")
for k in sorted(a):
    if k in b:
        (fa, ba), (fb, bb) = a[k], b[k]
        print(f"{k[0]} x {k[1]} x {k[2]} x {k[3]}, {'causal' if k[4] else 'full':<6} {fa:>14.3f} {fb:>8.3f} {fa / fb:>6.2f}x"
              f" {ba:>16.3f} {bb:>8.3f} {ba / bb:>6.2f}x")
PY
  # The default's time over the opt-in's at one head dim: the forward's ratios (field 11), the backward's (14).
  ratios_at() { awk -v e="$1" -v c="$2" 'NR > 1 && $7 == e"," {print $c}' "$logs/opt_in.log" | tr -d x | sort -g | paste -sd ' '; }
  note "bf16 fwd 128 vs 64 rows (E 64)" "$(ratios_at 64 11) (the default's time over TINYGPT_FLASH_ROWS=128's)"
  note "bf16 fwd Q smem vs regs (E 128)" "$(ratios_at 128 11) (the default's time over TINYGPT_FLASH_Q=smem's)"
  note "bf16 bwd one pass vs two" "$(ratios_at 64 14) at E 64; $(ratios_at 128 14) at E 128 (the default's over TINYGPT_FLASH_DQ=atomic's)"
  if [ -n "$baseline" ]; then  # the baseline build's kernels on the quick shapes
    timeout 180 $py bench/compare_attention_cuda.py --quick --bench "$baseline/bench/bench_attention" \
      > "$logs/attention_baseline.log" 2>&1
    note "baseline bf16 f+b vs sdpa bf16" "$(ratios tinygpt:flash_bf16 0 attention_baseline.log) (quick shapes)"
  fi
else
  $build/bench/bench_attention --device cuda | tee "$logs/attention.log"
  note "attention benchmark" "ran without PyTorch (no comparison)"
fi

echo "== (at ${SECONDS} s) Nsight Compute on the bf16 tensor-core flash kernels at the training shape"
ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
if [ $run_ncu = 0 ]; then
  note "ncu" "not run (--no-ncu)"
elif [ -n "$ncu_bin" ]; then
  # The value of ncu's line named $1 in the kernel's log (names start at column 5).
  field() { awk -v f="$1" 'index($0, f) == 5 {print $NF; exit}' "$logs/ncu_$kernel.log"; }
  # Each kernel's seventh launch (the second step's first layer), with the sections that say where its time goes: the
  # bf16-operand kernels on f32 storage (--storage f32).
  for kernel in $([ $quick = 0 ] && echo forward dkdv dq); do
    run=$(mktemp -d)
    timeout 90 "$ncu_bin" --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
      --section LaunchStats --section Occupancy --section WarpStateStats --print-units base \
      -k "regex:flash_mma_${kernel}_kernel" -s 6 -c 1 ./$build/tinygpt train --device cuda --data "$data" --out "$run" \
      "${cfg[@]}" --dtype bf16 --storage f32 --max-iters 3 --eval-interval 100000 --eval-iters 1 --quiet \
      > "$logs/ncu_$kernel.log" 2>&1
    rm -rf "$run"
    note "ncu bf16 flash $kernel" "$(field Duration) ns, $(field 'Registers Per Thread') registers, occupancy $(field 'Achieved Occupancy')%, IPC $(field 'Executed Ipc Active'), $(field 'Warp Cycles Per Issued Instruction') cycles an issue"
  done
  # The kernels on bf16 storage (bf16 tensors, what --dtype bf16 trains on), in the attention
  # benchmark (--bf16): its first shape is the training one (B 64, 6 heads, T 256, head dim 64, causal), its 14th
  # T 2048, head dim 128, causal. A shape launches the forward 14 times and the backward's 8; each kernel's third
  # (forward) or second (backward) launch of the shape is profiled.
  for shape in "training 0" "T2048_E128 13"; do
    set -- $shape
    for kernel in forward dq dkdv; do
      skip=$(( $2 * 8 + 1 ))
      [ $kernel = forward ] && skip=$(( $2 * 14 + 2 ))
      timeout 75 "$ncu_bin" --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
        --print-units base --kill yes -k "regex:flash_bf16_${kernel}_kernel" -s $skip -c 1 \
        ./$build/bench/bench_attention --device cuda --json --bf16 > "$logs/ncu_bf16_storage_${kernel}_$1.log" 2>&1
      kernel=bf16_storage_${kernel}_$1
      note "ncu $kernel" "$(field Duration) ns, $(field 'Registers Per Thread') registers, occupancy $(field 'Achieved Occupancy')%, IPC $(field 'Executed Ipc Active'), $(field 'Warp Cycles Per Issued Instruction') cycles an issue"
    done
  done
  # The one-pass backward's dK/dV kernel (which adds dQ too) at the training shape.
  TINYGPT_FLASH_DQ=atomic timeout 75 "$ncu_bin" --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
    --print-units base --kill yes -k "regex:flash_bf16_dkdv_kernel" -s 1 -c 1 \
    ./$build/bench/bench_attention --device cuda --json --bf16 > "$logs/ncu_bf16_storage_dkdv_atomic_training.log" 2>&1
  kernel=bf16_storage_dkdv_atomic_training
  note "ncu $kernel" "$(field Duration) ns, $(field 'Registers Per Thread') registers, occupancy $(field 'Achieved Occupancy')%, IPC $(field 'Executed Ipc Active'), $(field 'Warp Cycles Per Issued Instruction') cycles an issue"
else
  note "ncu" "not found, not run"
fi
fi  # step_only

if [ $full = 1 ]; then
  echo "== 5000 iterations of the Shakespeare config on the GPU"
  rm -rf out-gpu-shakespeare
  ./$build/tinygpt train --device cuda --data "$data" --out out-gpu-shakespeare --log-interval 500 2>&1 |
    tee "$logs/train_full.log" | grep -E "^step|^done|error"
  note "5000 iterations: best val loss" "$(sed -n 's/.*best val loss \([0-9.]*\).*/\1/p' "$logs/train_full.log" | tail -1) (target <= 1.48)"
  final=$(grep -o '"iter":5000,"train_loss":[0-9.]*,"val_loss":[0-9.]*' out-gpu-shakespeare/metrics.jsonl | sed 's/.*val_loss"://')
  if [ $has_torch = 1 ]; then
    torch_final=$($py bench/torch_gpt.py --device cuda --data "$data" "${cfg[@]}" --iters 5000 --full-run |
      $py -c 'import json,sys; print(round(json.load(sys.stdin)["val_loss"], 4))')
    note "val loss at iteration 5000" "tinygpt $final, pytorch eager f32 $torch_final (same recipe; both overfit after ~2000)"
  else
    note "val loss at iteration 5000" "tinygpt $final"
  fi
  ./$build/tinygpt sample --device cuda --ckpt out-gpu-shakespeare --max-new-tokens 300 --seed 1 2> /dev/null | tee "$logs/sample.txt"
fi

note "gpu_check took" "$SECONDS s"
echo
echo "== gpu_check summary"
printf '%s\n' "${summary[@]}"
