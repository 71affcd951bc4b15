#!/usr/bin/env bash
# Builds tinygpt and runs every test suite. GPU suites report "skipped" when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
# --timeout: a test that hangs fails after 20 minutes, naming itself, instead of holding the run.
ctest --test-dir build --output-on-failure --parallel "$(nproc)" --timeout 1200
