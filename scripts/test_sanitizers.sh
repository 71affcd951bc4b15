#!/usr/bin/env bash
# Builds the test suite with AddressSanitizer and UndefinedBehaviorSanitizer in build-sanitize/ (CPU only:
# the sanitizers check host code) and runs it; any report fails the run. Optimized at -O1 with line tables only
# (-g1), the usual sanitizer setting: half the compile time of -O2 -g, and reports still name file and line.
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
command -v ninja > /dev/null && [ ! -f build-sanitize/CMakeCache.txt ] && generator=(-G Ninja)
cmake -S . -B build-sanitize "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DTINYGPT_SANITIZE=address,undefined \
  -DTINYGPT_CUDA=OFF -DTINYGPT_BUILD_BENCH=OFF > /dev/null
cmake --build build-sanitize --parallel "$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# test_install (the package installed and examples/ built against it: CMake's work, 2 minutes here) runs in the main
# suite; the rest of the suite runs here.
ctest --test-dir build-sanitize --output-on-failure --parallel "$(nproc)" -E '^test_install$'
