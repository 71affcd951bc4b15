#!/usr/bin/env bash
# Training speed of tinygpt against eager PyTorch (bench/torch_gpt.py: the same model, data, optimizer and clipping)
# on the CPU, side by side in one run, then sampling speed with and without the KV cache.
#
#   bash bench/compare_torch.sh [DATA] [THREADS] [ROUNDS]     # defaults: the corpus, nproc, 3
#
# Recipes: nanoGPT's CPU recipe (4 layers, 4 heads, 128 wide, block 64, batch 12; ITERS=60 timed iterations after 5
# warm-up ones, median ms/iter) in ROUNDS alternating rounds; then nanoGPT's default 6-layer config (6 x 6 x 384,
# block 256, batch 64; BIG_ITERS=3 timed after one warm-up, median) once each (BIG_ITERS=0 skips it; its bf16 rows in
# BIG_ROUNDS alternating rounds, default 1).
#
# Peers, each measured at its best and checked before it counts:
# - Debian's python3-torch (1.13) with the OpenMP OpenBLAS (libopenblas0-openmp) first on its library path and
#   OPENBLAS_CORETYPE named from the CPU's flags (OpenBLAS 0.3.21 does not know recent Xeons: inside torch it falls
#   back to its SSE "Prescott" kernels, 4x slower here). Without libopenblas0-openmp the peer is refused above one
#   thread: the pthread OpenBLAS's threads fight torch's OpenMP threads over the cores.
# - The current PyTorch from the Python package index ($TORCH_PYTHON, else the virtual environment of
#   bench/setup_torch_venv.sh, made when the index is reachable; outside the source tree).
# Each runs at 1 and THREADS threads on the CPU recipe; the faster is its result there and its thread count for the
# 6-layer config. The pip torch also runs torch.compile'd at THREADS threads (COMPILE=0 leaves that out). bench/torch_gpt.py --describe reports, at run time, the BLAS torch really loaded (library, threading,
# kernel set), its thread count and its attention path; a peer with any problem is shown and not compared.
# bf16 (BF16=0 leaves it out): the CPU recipe again, and the 6-layer config after its f32 rows (BF16_ITERS=20 timed iterations after 5: torch's CPU autocast
# is slow without bf16 instructions), ROUNDS alternating rounds, tinygpt --dtype bf16 against the pip
# torch under torch.autocast("cpu", dtype=torch.bfloat16), eager at its best thread count and compiled; the CPU's
# bf16 instructions (AVX512-BF16, AMX-BF16) are printed first, since both sides' speed depends on them.
# MAIN_JOB=1 times the three-minute job's model and optimizer (scripts/train_shakespeare.sh: context 128, Muon with weight
# decay for the blocks' matrices, AdamW for the rest; the peer with torch.optim.Muon) in place of nanoGPT's CPU recipe,
# f32 and bf16, without the 6-layer config.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-$(bash scripts/get_data.sh)}
threads=${2:-$(nproc)}
rounds=${3:-3}
iters=${ITERS:-60}
big_iters=${BIG_ITERS:-3}
tinygpt=./build/tinygpt
[ -x "$tinygpt" ] || { echo "error: $tinygpt not found: build first (bash scripts/build.sh)" >&2; exit 1; }
small=(--n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch-size 12)
peer_small=()  # what the peer adds to torch_gpt.py's defaults (nanoGPT's CPU recipe) for the same recipe
recipe="nanoGPT's CPU recipe"
block=64
if [ "${MAIN_JOB:-0}" = 1 ]; then
  small=(--n-layer 4 --n-head 4 --n-embd 128 --block-size 128 --batch-size 12 --optimizer muon --muon-lr 0.02
    --muon-weight-decay 0.05 --lr 2e-3)
  peer_small=(--block-size 128 --optimizer muon)
  recipe="the three-minute job's model and optimizer (context 128, Muon)"
  block=128
  big_iters=0
fi
big=(--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 64)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
calc() { awk "BEGIN {print $1}"; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
stats() { sort -g | awk '{v[NR] = $1} END {m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
  printf "%.1f %.1f %.1f", v[1], m, v[NR]}'; }

# --- the peers: name, python, environment --------------------------------------------------------------------------
names=() pys=() envs=() extra=() tcounts=()
both_counts=$(printf "%s\n" 1 "$threads" | sort -un | tr '\n' ' ')
if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import torch" 2> /dev/null; then
  env_deb=""
  omp_dir=$(ls -d /usr/lib/*/openblas-openmp 2> /dev/null | head -n 1 || true)
  [ -n "$omp_dir" ] && env_deb="LD_LIBRARY_PATH=$omp_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
  core=""
  if [[ $flags == *avx512_bf16* ]]; then core=Cooperlake; elif [[ $flags == *avx512f* ]]; then core=SkylakeX;
  elif [[ $flags == *avx2* ]]; then core=Haswell; fi
  [ -n "$core" ] && env_deb="$env_deb OPENBLAS_CORETYPE=$core"
  names+=("torch-debian") pys+=(/usr/bin/python3) envs+=("$env_deb") extra+=("") tcounts+=("$both_counts")
else
  echo "Debian's PyTorch: not installed (apt-get install python3-torch libopenblas0-openmp), not compared"
fi
py_pip=${TORCH_PYTHON:-}
if [ -z "$py_pip" ]; then py_pip=$(bash bench/setup_torch_venv.sh 2> "$out/venv.log" | tail -n 1) || py_pip=""; fi
if [ -n "$py_pip" ] && "$py_pip" -c "import torch" 2> /dev/null; then
  names+=("torch-pip") pys+=("$py_pip") envs+=("") extra+=("") tcounts+=("$both_counts")
  if [ "${COMPILE:-1}" = 1 ]; then  # torch.compile (inductor's C++ kernels); ~30 s of compiling per run
    names+=("torch-pip-compile") pys+=("$py_pip") envs+=("") extra+=("--compile") tcounts+=("$threads")
  fi
else
  echo "PyTorch from the package index: not available ($(tail -n 1 "$out/venv.log" 2> /dev/null)), not compared"
fi

# Each peer at each thread count: what it really runs with; refused when torch_gpt.py finds a problem.
echo "== peers, as configured at run time"
declare -A ok
for i in "${!names[@]}"; do
  for t in ${tcounts[$i]}; do
    if ! desc=$(env ${envs[$i]} "${pys[$i]}" bench/torch_gpt.py --data "$data" --threads "$t" --describe "${peer_small[@]}" \
      2> "$out/describe.err"); then
      printf "%-13s %s: PROBLEM: torch_gpt.py --describe failed: %s\n" "${names[$i]}" "$t thr" "$(tail -n 1 "$out/describe.err")"
      continue
    fi
    line=$(echo "$desc" | python3 -c 'import json,sys; d=json.load(sys.stdin)
print("torch %s, %d threads, BLAS: %s, attention: %s" % (d["torch"], d["threads"], d["blas"], d["attention"]))
for p in d["problems"]: print("  PROBLEM: " + p)')
    printf "%-13s %s: %s\n" "${names[$i]}" "$t thr" "$line"
    [ -n "${envs[$i]}" ] && [ "$t" = "$threads" ] && echo "              environment: ${envs[$i]}"
    if [[ $line != *PROBLEM* ]]; then ok[$i,$t]=1; fi
  done
done

# --- nanoGPT's CPU recipe, ROUNDS alternating rounds ---------------------------------------------------------------
ours() {  # median ms/iter of tinygpt over the given recipe, leaving out the first `skip` iterations
  local skip=$1 n=$2
  shift 2
  rm -rf "$out/run"
  "$tinygpt" --threads "$threads" train --data "$data" --out "$out/run" "$@" --max-iters $((n + skip)) --dropout 0 \
    --eval-interval 1000000 --eval-iters 1 --log-interval 1000000 --quiet 2> "$out/train.log" ||
    { cat "$out/train.log" >&2; exit 1; }
  grep -o '"ms":[0-9.e+-]*' "$out/run/metrics.jsonl" | cut -d: -f2 | tail -n +$((skip + 1)) | median
}
theirs() {  # median ms/iter of peer $1 at $2 threads
  local i=$1 t=$2 n=$3 warm=$4
  shift 4
  env ${envs[$i]} "${pys[$i]}" bench/torch_gpt.py --data "$data" --threads "$t" --iters "$n" --warmup "$warm" "$@" \
    > "$out/torch.json" 2> "$out/torch.err" || { cat "$out/torch.err" >&2; exit 1; }
  python3 -c 'import json,sys; d = json.load(open(sys.argv[1])); print(d["ms"]); print(d.get("adamw", "?"), file=sys.stderr)' \
    "$out/torch.json" 2> "$out/adamw.$i"
}
tokens=$((12 * block))
echo
echo "== $recipe ($tokens tokens/iter), $threads threads for tinygpt, $rounds rounds, ms/iter"
for r in $(seq "$rounds"); do
  ours 5 "$iters" "${small[@]}" >> "$out/ours.ms"
  for i in "${!names[@]}"; do
    for t in ${tcounts[$i]}; do
      [ -n "${ok[$i,$t]:-}" ] && theirs "$i" "$t" "$iters" 5 ${extra[$i]} "${peer_small[@]}" >> "$out/peer$i.$t.ms"
    done
  done
done
for i in "${!names[@]}"; do  # which AdamW each peer ran (torch_gpt.py asks for the fused one)
  if [ -f "$out/adamw.$i" ]; then echo "${names[$i]}: AdamW $(cat "$out/adamw.$i")"; fi
done
printf "%-22s %8s %8s %8s %8s %10s\n" "implementation" "threads" "min" "median" "max" "tokens/s"
row() { read -r lo med hi <<< "$(stats < "$3")"
  printf "%-22s %8s %8.1f %8.1f %8.1f %10.0f\n" "$1" "$2" "$lo" "$med" "$hi" "$(calc "$tokens * 1000 / $med")"; }
row tinygpt "$threads" "$out/ours.ms"
declare -A best_t
for i in "${!names[@]}"; do
  for t in ${tcounts[$i]}; do
    [ -f "$out/peer$i.$t.ms" ] || continue
    row "${names[$i]}" "$t" "$out/peer$i.$t.ms"
    med=$(median < "$out/peer$i.$t.ms")
    if [ -z "${best_t[$i]:-}" ] || [ "$(calc "$med < $(median < "$out/peer$i.${best_t[$i]}.ms")")" = 1 ]; then
      best_t[$i]=$t
    fi
  done
done
for i in "${!names[@]}"; do
  [ -n "${best_t[$i]:-}" ] || continue
  # Ratio per round (the peer's time over ours in the same round), so noise that hits a round hits both.
  paste "$out/peer$i.${best_t[$i]}.ms" "$out/ours.ms" | awk '{print $1 / $2}' > "$out/ratio$i"
  printf "tinygpt / %s at %s threads, tokens/s per round: min %.2fx, median %.2fx, max %.2fx\n" "${names[$i]}" \
    "${best_t[$i]}" "$(sort -g "$out/ratio$i" | head -n 1)" "$(median < "$out/ratio$i")" "$(sort -g "$out/ratio$i" | tail -n 1)"
done

# --- the CPU recipe in bf16: tinygpt --dtype bf16 against torch's CPU autocast -------------------------------------
pip_i="" bf_names=()
for i in "${!names[@]}"; do [ "${names[$i]}" = torch-pip ] && pip_i=$i; done
if [ "${BF16:-1}" = 1 ] && [ -n "$pip_i" ] && [ -n "${best_t[$pip_i]:-}" ]; then
  cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
  has() { [[ " $cpu_flags " == *" $1 "* ]] && echo yes || echo no; }
  echo
  echo "== $recipe in bf16, $rounds rounds, ms/iter (this CPU: AVX512-BF16 $(has avx512_bf16), AMX-BF16 $(has amx_bf16))"
  bf_names=("torch-pip bf16") bf_threads=("${best_t[$pip_i]}") bf_extra=("--dtype bf16")
  if [ "${COMPILE:-1}" = 1 ]; then
    bf_names+=("torch-pip-compile bf16") bf_threads+=("$threads") bf_extra+=("--dtype bf16 --compile")
  fi
  for r in $(seq "$rounds"); do
    ours 5 "${BF16_ITERS:-20}" "${small[@]}" --dtype bf16 >> "$out/ours_bf16.ms"
    for j in "${!bf_names[@]}"; do
      theirs "$pip_i" "${bf_threads[$j]}" "${BF16_ITERS:-20}" 5 ${bf_extra[$j]} "${peer_small[@]}" >> "$out/bf$j.ms"
    done
  done
  printf "%-22s %8s %8s %8s %8s %10s\n" "implementation" "threads" "min" "median" "max" "tokens/s"
  row "tinygpt --dtype bf16" "$threads" "$out/ours_bf16.ms"
  for j in "${!bf_names[@]}"; do row "${bf_names[$j]}" "${bf_threads[$j]}" "$out/bf$j.ms"; done
  for j in "${!bf_names[@]}"; do
    paste "$out/bf$j.ms" "$out/ours_bf16.ms" | awk '{print $1 / $2}' > "$out/bf_ratio$j"
    printf "tinygpt bf16 / %s, tokens/s per round: min %.2fx, median %.2fx, max %.2fx\n" "${bf_names[$j]}" \
      "$(sort -g "$out/bf_ratio$j" | head -n 1)" "$(median < "$out/bf_ratio$j")" "$(sort -g "$out/bf_ratio$j" | tail -n 1)"
  done
fi

# --- nanoGPT's 6-layer config, once each ---------------------------------------------------------------------------
if [ "$big_iters" -gt 0 ]; then
  big_tokens=$((64 * 256))
  echo
  echo "== nanoGPT's default config, 6 x 6 x 384, block 256, batch 64 ($big_tokens tokens/iter), $big_iters timed iterations after 1"
  printf "%-22s %8s %10s %10s\n" "implementation" "threads" "s/iter" "tokens/s"
  ms=$(ours 1 "$big_iters" "${big[@]}")
  printf "%-22s %8s %10.2f %10.0f\n" tinygpt "$threads" "$(calc "$ms / 1000")" "$(calc "$big_tokens * 1000 / $ms")"
  for i in "${!names[@]}"; do
    [ -n "${best_t[$i]:-}" ] || continue
    pms=$(theirs "$i" "${best_t[$i]}" "$big_iters" 1 ${extra[$i]} --n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch-size 64)
    printf "%-22s %8s %10.2f %10.0f   tinygpt is %.2fx\n" "${names[$i]}" "${best_t[$i]}" "$(calc "$pms / 1000")" \
      "$(calc "$big_tokens * 1000 / $pms")" "$(calc "$pms / $ms")"
  done
  if [ -n "${bf_names[*]:-}" ]; then  # the same in bf16: tinygpt --dtype bf16 against torch's CPU autocast
    # BIG_ROUNDS alternating rounds (default 1); with more, each row is the median round and the ratios per round follow.
    for r in $(seq "${BIG_ROUNDS:-1}"); do
      ours 1 "$big_iters" "${big[@]}" --dtype bf16 >> "$out/big_ours_bf16.ms"
      for j in "${!bf_names[@]}"; do
        theirs "$pip_i" "${bf_threads[$j]}" "$big_iters" 1 ${bf_extra[$j]} --n-layer 6 --n-head 6 --n-embd 384 \
          --block-size 256 --batch-size 64 >> "$out/big_bf$j.ms"
      done
    done
    ms=$(median < "$out/big_ours_bf16.ms")
    printf "%-22s %8s %10.2f %10.0f\n" "tinygpt --dtype bf16" "$threads" "$(calc "$ms / 1000")" "$(calc "$big_tokens * 1000 / $ms")"
    for j in "${!bf_names[@]}"; do
      pms=$(median < "$out/big_bf$j.ms")
      printf "%-22s %8s %10.2f %10.0f   tinygpt bf16 is %.2fx\n" "${bf_names[$j]}" "${bf_threads[$j]}" \
        "$(calc "$pms / 1000")" "$(calc "$big_tokens * 1000 / $pms")" "$(calc "$pms / $ms")"
    done
    if [ "${BIG_ROUNDS:-1}" -gt 1 ]; then
      paste "$out"/big_bf*.ms | awk '{m = $1; for (i = 2; i <= NF; ++i) if ($i < m) m = $i; print m}' > "$out/big_fastest.ms"
      paste "$out/big_fastest.ms" "$out/big_ours_bf16.ms" | awk '{print $1 / $2}' > "$out/big_ratio"
      printf "tinygpt bf16 / the fastest PyTorch bf16 of each round, %s rounds: min %.2fx, median %.2fx, max %.2fx\n" \
        "${BIG_ROUNDS}" "$(sort -g "$out/big_ratio" | head -n 1)" "$(median < "$out/big_ratio")" "$(sort -g "$out/big_ratio" | tail -n 1)"
    fi
  fi
fi

# --- sampling 500 tokens from a CPU-recipe run: KV cache against rerunning the context for every token ----------------
ours 5 "$iters" "${small[@]}" > /dev/null
secs() { "$tinygpt" --threads "$threads" sample --ckpt "$out/run" --max-new-tokens 500 --seed 1 "$@" 2>&1 > /dev/null |
  sed -n 's/^500 tokens in \([0-9.]*\)s.*/\1/p'; }
best() { local b=""; for _ in 1 2 3; do s=$(secs "$@"); if [ -z "$b" ] || [ "$(calc "$s < $b")" = 1 ]; then b=$s; fi; done; echo "$b"; }
kv=$(best --kv-cache)
full=$(best --no-kv-cache)
echo
printf "sampling 500 tokens: KV cache %.3f s, full recompute %.3f s, speed-up %.1fx\n" "$kv" "$full" "$(calc "$full / $kv")"
