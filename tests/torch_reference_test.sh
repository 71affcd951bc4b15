#!/usr/bin/env bash
# The PyTorch references run live when a torch is present: the attention and optimizer fixtures are made anew by their
# scripts (tests/reference/make_attention_fixture.py, make_score_mods_fixture.py, make_muon_fixture.py) from other
# random numbers than the committed ones, in a temporary directory, and test_attention and test_train check tinygpt
# against them. Without torch it reports
# "skipped" (exit 77) and says how to get one; the committed fixtures are checked by test_attention either way.
#
#   bash tests/torch_reference_test.sh TEST_ATTENTION_BINARY TEST_TRAIN_BINARY SOURCE_DIR
#
# The python: $TINYGPT_TORCH_PYTHON, else the venv of bench/setup_torch_venv.sh when it has torch, else python3.
set -euo pipefail
test_attention=$1
test_train=$2
src=$3
venv_python=${TINYGPT_BENCH_VENV:-$HOME/.cache/tinygpt/bench-venv}/bin/python
python=${TINYGPT_TORCH_PYTHON:-}
if [ -z "$python" ]; then
  python=python3
  [ -x "$venv_python" ] && "$venv_python" -c "import torch, numpy" 2> /dev/null && python=$venv_python
fi
if ! "$python" -c "import torch, numpy" 2> /dev/null; then
  echo "skipped: no PyTorch with numpy for $python; the committed fixtures were checked by test_attention." \
    "To run the references live: bash bench/setup_torch_venv.sh (or TINYGPT_TORCH_PYTHON=/path/to/python)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "torch $("$python" -c 'import torch; print(torch.__version__)') ($python)"
"$python" "$src/tests/reference/make_attention_fixture.py" "$tmp/attention.safetensors" 1
"$python" "$src/tests/reference/make_score_mods_fixture.py" "$tmp/score_mods.safetensors" 1
TINYGPT_ATTENTION_FIXTURE=$tmp/attention.safetensors TINYGPT_SCORE_MODS_FIXTURE=$tmp/score_mods.safetensors \
  "$test_attention" --test-case="*agree* with PyTorch*"
if ! "$python" -c "import torch; torch.optim.Muon" 2> /dev/null; then
  echo "the Muon reference not run live: this torch has no torch.optim.Muon (PyTorch 2.9 or newer has); the" \
    "committed fixture was checked by test_train"
  exit 0
fi
"$python" "$src/tests/reference/make_muon_fixture.py" "$tmp/muon.safetensors" 1
TINYGPT_MUON_FIXTURE=$tmp/muon.safetensors "$test_train" --test-case="*agree with PyTorch*"
