#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (and AddressSanitizer + UndefinedBehaviorSanitizer) in build-fuzz/,
# replays the regression inputs kept in tests/fuzz/regressions/, then fuzzes each target for SECONDS
# (default 60) starting from the seeds in tests/fuzz/seeds/. A crash leaves its input in
# build-fuzz/crashes/: keep it under tests/fuzz/regressions/<target>/ once fixed.
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
targets=(fuzz_checkpoint fuzz_text fuzz_cli fuzz_tokenizer fuzz_token_cache fuzz_metrics)
generator=()
command -v ninja > /dev/null && [ ! -f build-fuzz/CMakeCache.txt ] && generator=(-G Ninja)
CC=clang CXX=clang++ cmake -S . -B build-fuzz "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" -DTINYGPT_FUZZ=ON \
  -DTINYGPT_SANITIZE=fuzzer-no-link,address,undefined -DTINYGPT_CUDA=OFF -DTINYGPT_BUILD_TESTS=OFF \
  -DTINYGPT_BUILD_BENCH=OFF > /dev/null
cmake --build build-fuzz --parallel "$(nproc)" --target "${targets[@]}"
mkdir -p build-fuzz/crashes
for t in "${targets[@]}"; do
  if [ -d "tests/fuzz/regressions/$t" ] && [ -n "$(ls -A "tests/fuzz/regressions/$t")" ]; then
    echo "== $t: regression inputs"
    "build-fuzz/tests/fuzz/$t" "tests/fuzz/regressions/$t"/*
  fi
  corpus="build-fuzz/corpus/$t"
  mkdir -p "$corpus"
  cp -n "tests/fuzz/seeds/$t"/* "$corpus"/ 2> /dev/null || true
  echo "== $t: fuzzing for ${seconds}s"
  "build-fuzz/tests/fuzz/$t" "$corpus" -max_total_time="$seconds" -artifact_prefix=build-fuzz/crashes/ \
    -print_final_stats=1 2>&1 | grep -E "^(stat::number_of_executed_runs|Done|==[0-9]+==ERROR|SUMMARY)|INFO: seed corpus" || true
  if [ -n "$(ls -A build-fuzz/crashes)" ]; then
    echo "fuzz: $t found a crash: $(ls build-fuzz/crashes)" >&2
    exit 1
  fi
done
echo "fuzz: ${#targets[@]} targets, ${seconds}s each, no crash"
