#!/usr/bin/env bash
# The peers of tinygpt's byte-level BPE tokenizer, from the Python package index, in a virtual environment outside the
# source tree: Hugging Face tokenizers, tiktoken and rustbpe (plus regex, numpy and unicodedata2), for
# bench/tokenizer_peers.py. Never needed by the build or the tests.
#
#   bash bench/setup_tokenizer_venv.sh [DIR]     # DIR: $TINYGPT_TOKENIZER_VENV, else ~/.cache/tinygpt/tokenizer-venv
#
# Prints the environment's python on its last line. Does nothing when DIR already has working tokenizers and tiktoken.
# rustbpe is optional: when pip cannot install it, the script says so and goes on (tokenizer_peers.py then skips it).
set -euo pipefail
venv=${1:-${TINYGPT_TOKENIZER_VENV:-$HOME/.cache/tinygpt/tokenizer-venv}}
here=$(cd "$(dirname "$0")/.." && pwd -P)
case "$(realpath -m "$venv")/" in
  "$here"/*) echo "error: $venv is inside the source tree; pick a directory outside it" >&2; exit 2 ;;
esac
if ! "$venv/bin/python" -c "import tokenizers, tiktoken, regex, numpy, unicodedata2; assert unicodedata2.unidata_version == \"16.0.0\"" 2> /dev/null; then
  command -v python3 > /dev/null || { echo "error: python3 not found (apt-get install python3 python3-venv)" >&2; exit 1; }
  echo "installing tokenizers, tiktoken, rustbpe, regex, numpy and unicodedata2 from the Python package index into $venv" >&2
  python3 -m venv "$venv" || { echo "error: could not create $venv (apt-get install python3-venv)" >&2; exit 1; }
  "$venv/bin/pip" install --quiet --upgrade pip >&2
  "$venv/bin/pip" install --quiet tokenizers tiktoken regex numpy unicodedata2==16.0.0 >&2 ||
    { echo "error: pip could not install the tokenizer peers (is the Python package index reachable?)" >&2; exit 1; }
  "$venv/bin/pip" install --quiet rustbpe >&2 ||
    echo "warning: pip could not install rustbpe; bench/tokenizer_peers.py will skip that peer" >&2
fi
echo "$venv/bin/python"
