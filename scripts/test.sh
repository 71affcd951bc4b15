#!/usr/bin/env bash
# Builds tinygpt and runs every test suite. GPU suites report "skipped" when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
ctest --test-dir build --output-on-failure --parallel "$(nproc)"
