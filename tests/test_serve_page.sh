#!/usr/bin/env bash
# The chat page of `tinygpt serve` in a real browser: headless Chromium driven by selenium types a message, sees the
# streamed reply, resets (tests/serve_page.py). Runs where Debian's chromium and chromium-driver are installed and a
# virtual environment with selenium exists ($TINYGPT_BENCH_VENV, else ~/.cache/tinygpt/bench-venv); exits 77
# (skipped), saying which is missing, where not.
#   tests/test_serve_page.sh path/to/tinygpt SOURCE_DIR [--screenshot FILE.png]
set -uo pipefail
tinygpt=$1 src=$2
shift 2
venv=${TINYGPT_BENCH_VENV:-$HOME/.cache/tinygpt/bench-venv}
for tool in chromium chromedriver; do
  if ! command -v $tool > /dev/null; then
    echo "test_serve_page: SKIPPED: no $tool (apt-get install chromium chromium-driver)"
    exit 77
  fi
done
if ! "$venv/bin/python" -c "import selenium" 2> /dev/null; then
  echo "test_serve_page: SKIPPED: no virtual environment with selenium at $venv ($venv/bin/pip install selenium)"
  exit 77
fi
exec "$venv/bin/python" "$src/tests/serve_page.py" "$tinygpt" "$@"
