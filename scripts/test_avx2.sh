#!/usr/bin/env bash
# The CPU kernels pick their vector code at compile time: with -march=native on an AVX-512 machine the GEMM and
# attention kernels use AVX-512, elsewhere AVX2 (most laptops), and without either the portable loops (the
# sanitizer build). This builds the numeric suites for AVX2 (x86-64-v3) in build-avx2/ and runs them, so the AVX2
# paths are checked on an AVX-512 machine too. Skipped, saying so, where the CPU cannot run AVX2 code.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! grep -qw avx2 /proc/cpuinfo || ! grep -qw fma /proc/cpuinfo; then
  echo "test_avx2: this CPU has no AVX2/FMA; skipped"
  exit 0
fi
generator=()
command -v ninja > /dev/null && [ ! -f build-avx2/CMakeCache.txt ] && generator=(-G Ninja)
cmake -S . -B build-avx2 "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DTINYGPT_NATIVE=OFF \
  -DCMAKE_CXX_FLAGS="-march=x86-64-v3" -DTINYGPT_CUDA=OFF -DTINYGPT_BUILD_BENCH=OFF > /dev/null
suites=(test_kernels test_tensor test_ops test_attention test_nn test_gpt)
cmake --build build-avx2 --parallel "$(nproc)" --target "${suites[@]}"
ctest --test-dir build-avx2 --output-on-failure --parallel "$(nproc)" -R "^($(IFS='|'; echo "${suites[*]}"))\$"
