#!/usr/bin/env bash
# Configures and builds tinygpt in ./build (Release; CUDA backend when nvcc is found).
# Extra arguments go to the CMake configure step, e.g. scripts/build.sh -DTINYGPT_CUDA=OFF
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
command -v ninja >/dev/null && [ ! -f build/CMakeCache.txt ] && generator=(-G Ninja)
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build --parallel "$(nproc)"
