#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, prepares reference data for the
# tokenizer tests, and runs every test with ctest. GPU tests (label gpu) skip without a GPU.
# Extra arguments go to ctest (e.g. scripts/test.sh -L gpu, or -R Tokenizer).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j"$(nproc)" "$@"
