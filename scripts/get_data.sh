#!/usr/bin/env bash
# Prints the path of the default corpus (tiny Shakespeare): the shared copy beside the repository when
# present, otherwise data/tinyshakespeare.txt, downloaded once.
set -euo pipefail
cd "$(dirname "$0")/.."
shared="../shared/data/tinyshakespeare.txt"
local_copy="data/tinyshakespeare.txt"
if [ -s "$shared" ]; then
  echo "$shared"
  exit 0
fi
if [ ! -s "$local_copy" ]; then
  url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
  echo "get_data: downloading tiny Shakespeare to $local_copy" >&2
  curl -fsSL "$url" -o "$local_copy.tmp" && mv "$local_copy.tmp" "$local_copy"
fi
echo "$local_copy"
