#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (and AddressSanitizer + UndefinedBehaviorSanitizer) in build-fuzz/,
# replays the regression inputs kept in tests/fuzz/regressions/, then fuzzes each target for SECONDS (default 60), as
# many at once as there are cores, starting from the seeds in tests/fuzz/seeds/. A crash leaves its input in
# build-fuzz/crashes/ (the target's log in build-fuzz/logs/): keep it under tests/fuzz/regressions/<target>/ once fixed.
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
targets=(fuzz_checkpoint fuzz_text fuzz_cli fuzz_tokenizer fuzz_token_cache fuzz_metrics fuzz_gguf fuzz_chat_template
  fuzz_serve_request)
generator=()
command -v ninja > /dev/null && [ ! -f build-fuzz/CMakeCache.txt ] && generator=(-G Ninja)
CC=clang CXX=clang++ cmake -S . -B build-fuzz "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" -DTINYGPT_FUZZ=ON \
  -DTINYGPT_SANITIZE=fuzzer-no-link,address,undefined -DTINYGPT_CUDA=OFF -DTINYGPT_BUILD_TESTS=OFF \
  -DTINYGPT_BUILD_BENCH=OFF > /dev/null
cmake --build build-fuzz --parallel "$(nproc)" --target "${targets[@]}"
rm -rf build-fuzz/logs
mkdir -p build-fuzz/crashes build-fuzz/logs
# The regression inputs first, then the targets fuzzed side by side, one a core (each is one process and thread).
for t in "${targets[@]}"; do
  if [ -d "tests/fuzz/regressions/$t" ] && [ -n "$(ls -A "tests/fuzz/regressions/$t")" ]; then
    echo "== $t: regression inputs"
    "build-fuzz/tests/fuzz/$t" "tests/fuzz/regressions/$t"/*
  fi
done
fuzz_one() {
  local t=$1 corpus="build-fuzz/corpus/$1"
  mkdir -p "$corpus"
  cp -n "tests/fuzz/seeds/$t"/* "$corpus"/ 2> /dev/null || true
  "build-fuzz/tests/fuzz/$t" "$corpus" -max_total_time="$seconds" -artifact_prefix="build-fuzz/crashes/$t-" \
    -print_final_stats=1 > "build-fuzz/logs/$t.log" 2>&1 || echo "$?" > "build-fuzz/logs/$t.failed"
}
jobs=$(nproc)
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  echo "== $t: fuzzing for ${seconds}s"
  fuzz_one "$t" &
done
wait
for t in "${targets[@]}"; do
  echo "== $t:"
  grep -E "^(stat::number_of_executed_runs|Done|==[0-9]+==ERROR|SUMMARY)|INFO: seed corpus" "build-fuzz/logs/$t.log" || true
done
if [ -n "$(ls -A build-fuzz/crashes)" ]; then
  echo "fuzz: a target found a crash: $(ls build-fuzz/crashes) (logs in build-fuzz/logs/)" >&2
  exit 1
fi
# A target that died before fuzzing (its set-up threw, say) leaves no crash input: its exit status tells.
for t in "${targets[@]}"; do
  if [ -e "build-fuzz/logs/$t.failed" ] || ! grep -q "^Done [0-9]* runs" "build-fuzz/logs/$t.log"; then
    echo "fuzz: $t did not run to the end: $(tail -3 "build-fuzz/logs/$t.log")" >&2
    exit 1
  fi
done
echo "fuzz: ${#targets[@]} targets, ${seconds}s each, ${jobs} at a time, no crash"
