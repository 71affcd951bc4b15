#!/usr/bin/env bash
# Installs the Debian packages tinygpt needs that are not already present. Safe to run again.
# The CUDA toolkit is optional and not installed here: when nvcc is on PATH the build adds the GPU backend.
#   bash scripts/setup.sh             # what building, testing and training need
#   bash scripts/setup.sh --aarch64   # also the ARM cross toolchain, qemu-user and arm64 libfmt (scripts/test_aarch64.sh)
set -euo pipefail
aarch64=0
case "${1:-}" in
  "") ;;
  --aarch64) aarch64=1 ;;
  *) echo "error: setup.sh: unknown argument '$1' (the one option is --aarch64)" >&2; exit 2 ;;
esac

packages=(
  g++ cmake ninja-build      # toolchain
  libfmt-dev                 # formatting and printing
  doctest-dev                # tests
  libcli11-dev               # command line
  nlohmann-json3-dev         # checkpoint and config metadata
  libcpp-httplib-dev         # tinygpt serve: the HTTP server
  libopenblas-dev            # bench/bench_matmul only: the sgemm we compare against
  clang libomp-dev           # scripts/fuzz.sh only: libFuzzer targets (CI runs them)
  curl ca-certificates       # scripts/get_data.sh: fetches tiny Shakespeare when no local copy exists
  python3                    # tests: the source size limits (scripts/check_source_limits.py), the MPI test's check
  clang-format               # tests: the sources as .clang-format writes them (scripts/check_format.sh)
  openmpi-bin libopenmpi-dev # data-parallel training over several processes (mpirun)
)

# The ARM cross build: Debian's cross compiler and the arm64 fmt library from Debian's multiarch (the header-only
# dependencies are shared); qemu-user runs the test programs.
if [ $aarch64 = 1 ]; then
  packages+=(g++-aarch64-linux-gnu qemu-user libfmt-dev:arm64)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "setup: installing ${missing[*]}"
if [ $aarch64 = 1 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $sudo dpkg --add-architecture arm64
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
