#!/usr/bin/env bash
# The current PyTorch release from the Python package index, in a virtual environment outside the source tree: the
# second peer of bench/compare_torch.sh (the first is Debian's python3-torch). Never needed by the build or the tests.
#
#   bash bench/setup_torch_venv.sh [DIR]     # DIR: $TINYGPT_BENCH_VENV, else ~/.cache/tinygpt/bench-venv
#
# Prints the environment's python on its last line. Does nothing when DIR already has a working torch.
set -euo pipefail
venv=${1:-${TINYGPT_BENCH_VENV:-$HOME/.cache/tinygpt/bench-venv}}
here=$(cd "$(dirname "$0")/.." && pwd -P)
case "$(realpath -m "$venv")/" in
  "$here"/*) echo "error: $venv is inside the source tree; pick a directory outside it" >&2; exit 2 ;;
esac
if ! "$venv/bin/python" -c "import torch" 2> /dev/null; then
  command -v python3 > /dev/null || { echo "error: python3 not found (apt-get install python3 python3-venv)" >&2; exit 1; }
  echo "installing the current torch from the Python package index into $venv (a few minutes; the default Linux wheel brings its CUDA libraries, several GB)" >&2
  python3 -m venv "$venv" || { echo "error: could not create $venv (apt-get install python3-venv)" >&2; exit 1; }
  "$venv/bin/pip" install --quiet --upgrade pip >&2
  "$venv/bin/pip" install --quiet torch numpy >&2 ||
    { echo "error: pip could not install torch (is the Python package index reachable?)" >&2; exit 1; }
fi
echo "$venv/bin/python"
