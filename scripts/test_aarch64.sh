#!/usr/bin/env bash
# tinygpt on 64-bit ARM Linux: cross-compiles with Debian's toolchain (cmake/aarch64-linux-gnu.cmake) into
# build-aarch64/ and runs the core suites (tensors and autograd, ops with their gradient checks, layers and data,
# attention, the GPT, training) under qemu-user, so the portable kernels (GCC vector extensions, NEON on ARM) are
# built and checked on every change. Installs what it needs first (scripts/setup.sh --aarch64).
#   bash scripts/test_aarch64.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --aarch64
generator=()
command -v ninja > /dev/null && [ ! -f build-aarch64/CMakeCache.txt ] && generator=(-G Ninja)
cmake -S . -B build-aarch64 "${generator[@]}" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
  -DCMAKE_BUILD_TYPE=Release -DTINYGPT_CUDA=OFF -DTINYGPT_MPI=OFF -DTINYGPT_BUILD_BENCH=OFF > /dev/null
# The kernel suites (test_kernels: GEMM and attention kernels at many sizes and thread counts) and the CUDA emulator
# suites take tens of minutes under emulation; the suites below run them through the layers in about two.
suites=(test_tensor test_ops test_nn test_attention test_gpt test_train)
cmake --build build-aarch64 --parallel "$(nproc)" --target "${suites[@]}"
readelf -h build-aarch64/tests/test_tensor | grep -q AArch64 || { echo "error: test_aarch64: the build is not for aarch64" >&2; exit 1; }
# Passive OpenMP waits: a spinning thread under emulation takes the core its partner needs.
OMP_WAIT_POLICY=passive ctest --test-dir build-aarch64 --output-on-failure --parallel "$(nproc)" \
  -R "^($(IFS='|'; echo "${suites[*]}"))\$"
