#!/usr/bin/env bash
# ctest ChatVsTransformers: `tokenize --chat` against transformers' apply_chat_template on 1,000 random
# conversations per template (tests/reference/compare_chat.py: ids, masks by the rule, generation-block
# masks). Skips (exit 77) without the templates and tokenizers (scripts/test.sh fetches them) or without
# uv and the network for its packages.
#   tests/scripts/chat_compare_test.sh SOURCE_DIR TOKENIZE_EXE REFERENCE_DIR QWEN2.5_TOKENIZER_DIR
set -euo pipefail
src="$1" tokenize="$2" ref="${QTRAIN_TOKENIZER_REFERENCE_DIR:-$3}" qwen="$4"
for f in "$ref/chat-templates/qwen3.jinja" "$ref/chat-templates/qwen3-tokenizer/tokenizer.json" \
         "$ref/llama3.2/tokenizer.json" "$qwen/tokenizer_config.json"; do
  [ -s "$f" ] || { echo "skipped: no $f (scripts/test.sh fetches it)"; exit 77; }
done
python3 -c 'import jinja2' 2>/dev/null || { echo "skipped: python3 has no jinja2 (pip install jinja2)"; exit 77; }
UV=$(command -v uv || echo "$HOME/.local/bin/uv")
[ -x "$UV" ] || { echo "skipped: no uv (scripts/setup.sh installs it)"; exit 77; }
# the versions the check was run with; transformers needs no torch for tokenizers and templates
with=(--with tokenizers==0.23.3 --with transformers==5.25.0 --with jinja2==3.1.6)
if ! "$UV" run --quiet --no-project "${with[@]}" python3 -c 'import tokenizers, transformers' >/dev/null 2>&1; then
  echo "skipped: uv cannot provide tokenizers/transformers (no network?)"
  exit 77
fi
set +e
"$UV" run --quiet --no-project "${with[@]}" python3 "$src/tests/reference/compare_chat.py" \
  --tokenize "$tokenize" --ref "$ref" --qwen "$qwen" 2>&1 | grep -v 'PyTorch was not found'
exit "${PIPESTATUS[0]}"
