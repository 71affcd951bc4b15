#!/usr/bin/env bash
# Interop of the byte-level BPE: a tokenizer trained by tinygpt on mixed text (accents, CJK, emoji, code, digits) is
# loaded by Hugging Face `tokenizers` and rebuilt as a tiktoken Encoding (GPT-2's pattern, tinygpt's ranks); both must
# give tinygpt's ids on tricky text (bench/tokenizer_peers.py check), and decode must give the text back. Runs where a
# virtual environment with both exists ($TINYGPT_TOKENIZER_VENV, else ~/.cache/tinygpt/tokenizer-venv; made by
# bench/setup_tokenizer_venv.sh); exits 77 (skipped) where not.
#   tests/reference/check_tokenizer_interop.sh path/to/tinygpt SOURCE_DIR
set -uo pipefail
tinygpt=$1 src=$2
venv=${TINYGPT_TOKENIZER_VENV:-$HOME/.cache/tinygpt/tokenizer-venv}
if ! "$venv/bin/python" -c "import tokenizers, tiktoken" 2> /dev/null; then
  echo "test_tokenizer_interop: SKIPPED: no virtual environment with tokenizers and tiktoken at $venv (bash bench/setup_tokenizer_venv.sh makes one)"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for i in $(seq 200); do
  printf 'The caf\xc3\xa9 na\xc3\xafve r\xc3\xa9sum\xc3\xa9 #%d: \xe4\xb8\xad\xe6\x96\x87\xe6\x96\x87\xe6\x9c\xac \xf0\x9f\x98\x80\xf0\x9f\x91\x8d it'"'"'s   int x = %d;\n\tif (x > 42) { return "ok"; }\n\n' "$i" "$((i * 37))"
done > "$dir/mixed.txt"
"$tinygpt" tokenizer train --data "$dir/mixed.txt" "$src/README.md" --vocab-size 600 --out "$dir/tok.json" 2> /dev/null ||
  { echo "test_tokenizer_interop: tokenizer train failed"; exit 1; }
"$venv/bin/python" "$src/bench/tokenizer_peers.py" check --tokenizer "$dir/tok.json" --tinygpt "$tinygpt"
status=$?
# Each family's pre-split (GPT-2, Llama 3, Qwen2, SmolLM2), added tokens and bos against tokenizers.
"$venv/bin/python" "$src/tests/reference/check_tokenizer_families.py" --tinygpt "$tinygpt" || status=1
exit $status
