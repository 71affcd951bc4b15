#!/usr/bin/env bash
# Builds, on a machine with the CUDA toolkit but no GPU, what scripts/gpu_check.sh --no-build runs on a GPU machine
# that has no compilers: this checkout's tinygpt, tests/test_cuda, bench/bench_attention and bench/bench_classifier
# for one GPU architecture (in build-gpu/), with --baseline COMMIT also that commit's tinygpt and bench/bench_attention
# (the TINYGPT_BASELINE_BUILD of gpu_check, measured in the same run), stripped, and the shared libraries they link
# that are neither CUDA's nor the C and C++ runtime's (libfmt, libgomp), in one archive laid out as build-gpu/.
#
#   bash scripts/gpu_bundle.sh [--arch 90] [--baseline COMMIT] [--out build-gpu/gpu_bundle.tgz]
#
# Then, on the GPU machine, in a checkout of the same commit (the scripts and bench/*.py come from it), with the
# archive copied to the same place:
#
#   tar xzf build-gpu/gpu_bundle.tgz && LD_LIBRARY_PATH=$PWD/build-gpu/lib:/usr/local/cuda/lib64 \
#     TINYGPT_BASELINE_BUILD=build-gpu/baseline bash scripts/gpu_check.sh --no-build --step
set -euo pipefail
cd "$(dirname "$0")/.."

arch=90
baseline=
out=build-gpu/gpu_bundle.tgz
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch="${2:?--arch needs a compute capability, e.g. 90}"; shift 2 ;;
    --baseline) baseline="${2:?--baseline needs a commit}"; shift 2 ;;
    --out) out="${2:?--out needs a file name}"; shift 2 ;;
    -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
[[ "$arch" =~ ^[0-9]+a?$ ]] || { echo "error: --arch takes a compute capability such as 90, not '$arch'" >&2; exit 2; }
if [ -n "$baseline" ]; then
  git rev-parse --verify --quiet "$baseline^{commit}" > /dev/null ||
    { echo "error: --baseline: '$baseline' is not a commit of this repository" >&2; exit 2; }
fi
command -v nvcc > /dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  { echo "error: nvcc not found (install the CUDA toolkit: bash scripts/setup.sh)" >&2; exit 1; }
if ! command -v nvcc > /dev/null; then export PATH="/usr/local/cuda/bin:$PATH"; fi
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac

# Configures and builds `targets` of the checkout in $1 into its build-gpu/.
build() {
  local src=$1
  shift
  local generator=()
  command -v ninja > /dev/null && [ ! -f "$src/build-gpu/CMakeCache.txt" ] && generator=(-G Ninja)
  cmake -S "$src" -B "$src/build-gpu" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DTINYGPT_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch-real" -DTINYGPT_NATIVE=OFF -DTINYGPT_MPI=OFF > /dev/null
  cmake --build "$src/build-gpu" --parallel "$(nproc)" --target "$@"
}

stage=$(mktemp -d)
worktree=
cleanup() {
  rm -rf "$stage"
  [ -n "$worktree" ] && git worktree remove --force "$worktree" 2> /dev/null
  return 0
}
trap cleanup EXIT

echo "== this checkout ($(git rev-parse --short HEAD)) for sm_$arch in build-gpu/ (minutes)" >&2
build . tinygpt test_cuda bench_attention bench_classifier
bins=(tinygpt tests/test_cuda bench/bench_attention bench/bench_classifier)
for bin in "${bins[@]}"; do install -D -m 755 "build-gpu/$bin" "$stage/build-gpu/$bin"; done
if [ -n "$baseline" ]; then
  worktree=$(mktemp -d)
  git worktree add --detach --quiet "$worktree" "$baseline"
  echo "== the baseline ($(git rev-parse --short "$baseline")) for sm_$arch (minutes)" >&2
  build "$worktree" tinygpt bench_attention
  for bin in tinygpt bench/bench_attention; do
    install -D -m 755 "$worktree/build-gpu/$bin" "$stage/build-gpu/baseline/$bin"
  done
fi
find "$stage" -type f -exec strip --strip-unneeded {} +

# The libraries a bare CUDA machine may lack: whatever the binaries link outside the CUDA toolkit and the C and C++
# runtime.
mkdir -p "$stage/build-gpu/lib"
for bin in "${bins[@]}"; do ldd "build-gpu/$bin"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -Ev '/cuda|lib(c|m|dl|rt|pthread|stdc\+\+|gcc_s)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/build-gpu/lib/"; done

tar czf "$out" -C "$stage" build-gpu
echo "wrote $out ($(du -h "$out" | cut -f1)): $(cd "$stage" && find build-gpu -type f | sort | paste -sd ' ')"
