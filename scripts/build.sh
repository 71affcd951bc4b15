#!/usr/bin/env bash
# Configures and builds tinygpt in ./build (Release; the CUDA backend when nvcc is found, except for named targets on
# a machine without a GPU), on all cores.
#   bash scripts/build.sh                     # everything: the library, the command, tests, benchmarks
#   bash scripts/build.sh --target tinygpt    # only the command line tool (what training and sampling need)
# Other arguments go to the CMake configure step, e.g. scripts/build.sh -DTINYGPT_CUDA=OFF
set -euo pipefail
cd "$(dirname "$0")/.."
targets=() configure=()
while [ $# -gt 0 ]; do
  case "$1" in
    --target)
      [ $# -ge 2 ] || { echo "error: build.sh: --target needs a target name (e.g. tinygpt)" >&2; exit 2; }
      targets+=(--target "$2"); shift 2 ;;
    *) configure+=("$1"); shift ;;
  esac
done
generator=()
command -v ninja >/dev/null && [ ! -f build/CMakeCache.txt ] && generator=(-G Ninja)
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
# Named targets only (the quick start's `--target tinygpt`) on a machine with nvcc but no GPU to run it: the CPU build,
# minutes sooner. A full build (the tests) compiles the CUDA backend whenever nvcc is found, GPU or not, as CI does;
# -DTINYGPT_CUDA=... given here decides in both cases.
if command -v nvcc >/dev/null && [[ " ${configure[*]} " != *" -DTINYGPT_CUDA="* ]]; then
  if [ ${#targets[@]} -gt 0 ] && ! nvidia-smi -L > /dev/null 2>&1; then
    echo "build.sh: nvcc is here but no GPU is visible: building without the CUDA backend (-DTINYGPT_CUDA=ON builds it)" >&2
    configure+=(-DTINYGPT_CUDA=OFF)
  else
    configure+=(-DTINYGPT_CUDA=AUTO)
  fi
fi
cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${configure[@]}"
cmake --build build --parallel "$(nproc)" "${targets[@]}"
