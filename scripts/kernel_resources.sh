#!/usr/bin/env bash
# Registers, spills and stack of the attention kernels as ptxas compiles them for one GPU architecture, without a
# GPU: compiles kernels/cuda/attention.cu (about 5 minutes on 2 cores) with ptxas's report on and prints one line a
# kernel. A spill is a value ptxas found no register for, stored to local memory and loaded back (in a loop, each pass).
#
#   bash scripts/kernel_resources.sh [--arch 90] [--filter REGEX]
#
# --arch: the compute capability compiled for (default 90, the H100's and H200's); --filter: an extended regular
# expression over the kernel's name (default: flash_bf16, the kernels on bf16 storage).
set -euo pipefail
cd "$(dirname "$0")/.."

arch=90
filter=flash_bf16
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch="${2:?--arch needs a compute capability, e.g. 90}"; shift 2 ;;
    --filter) filter="${2:?--filter needs a regular expression}"; shift 2 ;;
    -h | --help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
[[ "$arch" =~ ^[0-9]+a?$ ]] || { echo "error: --arch takes a compute capability such as 90 or 90a, not '$arch'" >&2; exit 2; }
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$nvcc" ] || { echo "error: nvcc not found (install the CUDA toolkit: bash scripts/setup.sh)" >&2; exit 1; }
command -v c++filt > /dev/null || { echo "error: c++filt not found (install binutils)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "compiling kernels/cuda/attention.cu for sm_$arch with ptxas -v (minutes)..." >&2
"$nvcc" -DTINYGPT_HAS_CUDA=1 -I. -O3 -DNDEBUG -std=c++17 --expt-relaxed-constexpr \
  -gencode "arch=compute_$arch,code=sm_$arch" -Xptxas -v -c kernels/cuda/attention.cu -o "$work/attention.o" \
  > "$work/ptxas.log" 2>&1 || { tail -20 "$work/ptxas.log" >&2; echo "error: the compile failed" >&2; exit 1; }

# ptxas prints, per kernel: "Compiling entry function '<mangled>'", then the stack and spill line, then "Used N
# registers". One line a kernel: registers, spill stores, spill loads, stack frame, and the demangled name without
# its namespaces and parameter list.
awk '
  /Compiling entry function/ { match($0, /\x27[^\x27]+\x27/); name = substr($0, RSTART + 1, RLENGTH - 2) }
  /bytes stack frame/ { stack = $1; stores = $5; loads = $9 }
  /Used [0-9]+ registers/ && name != "" {
    match($0, /Used [0-9]+ registers/); regs = substr($0, RSTART + 5, RLENGTH - 15)
    print regs, stores, loads, stack, name; name = ""
  }' "$work/ptxas.log" > "$work/table"
printf '%9s %12s %11s %6s  %s\n' registers "spill stores" "spill loads" stack kernel
while read -r regs stores loads stack name; do
  short=$(echo "$name" | c++filt | sed -E 's/\(anonymous namespace\):://g; s/^void //; s/\(.*//; s/^([A-Za-z0-9_]+::)+//')
  [[ "$short" =~ $filter ]] || continue
  printf '%9s %12s %11s %6s  %s\n' "$regs" "$stores" "$loads" "$stack" "$short"
done < "$work/table" | sort -k5
