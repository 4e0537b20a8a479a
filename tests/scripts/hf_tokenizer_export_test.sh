#!/usr/bin/env bash
# ctest TokenizerHfExport: HF `tokenizers` and transformers load what `train --tokenizer` writes,
# with qtrain's ids (tests/scripts/hf_tokenizer_export_check.py). Skips (exit 77) without the
# reference data (scripts/test.sh prepares it) or without uv and the network for its packages.
#   tests/scripts/hf_tokenizer_export_test.sh SOURCE_DIR TRAIN_EXE TOKENIZE_EXE REFERENCE_DIR
set -euo pipefail
src="$1" train="$2" tokenize="$3" ref="${QTRAIN_TOKENIZER_REFERENCE_DIR:-$4}"
for f in qwen.tiktoken reference.bin; do
  [ -s "$ref/$f" ] || { echo "skipped: no $ref/$f (scripts/test.sh makes it)"; exit 77; }
done
UV=$(command -v uv || echo "$HOME/.local/bin/uv")
[ -x "$UV" ] || { echo "skipped: no uv (scripts/setup.sh installs it)"; exit 77; }
# the versions the check was written against; transformers needs no torch for its tokenizers
with=(--with tokenizers==0.23.3 --with transformers==5.24.0)
if ! "$UV" run --quiet --no-project "${with[@]}" python3 -c 'import tokenizers, transformers' >/dev/null 2>&1; then
  echo "skipped: uv cannot provide tokenizers/transformers (no network?)"
  exit 77
fi
set +e  # the check's own exit code is the result; transformers' note that torch is absent is noise
"$UV" run --quiet --no-project "${with[@]}" python3 "$src/tests/scripts/hf_tokenizer_export_check.py" \
  --train "$train" --tokenize "$tokenize" --reference-dir "$ref" 2>&1 | grep -v 'PyTorch was not found'
exit "${PIPESTATUS[0]}"
