#!/usr/bin/env bash
# Puts qwen.tiktoken (Qwen's BPE ranks in tiktoken format) into DIR, default
# build/tokenizer-reference, for tests/tokenizer/reference_test.cpp. It comes from the qwen-agent
# wheel on PyPI (qwen_agent/utils/qwen.tiktoken); the file is never committed.
#   scripts/tokenizer_fetch_tiktoken.sh [DIR]
set -euo pipefail
out="${1:-build/tokenizer-reference}"
version="0.0.34"
mkdir -p "$out"
if [[ -s "$out/qwen.tiktoken" ]]; then
  echo "$out/qwen.tiktoken already there"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --no-deps --quiet --dest "$tmp" "qwen-agent==$version"
python3 - "$tmp" "$out/qwen.tiktoken" <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "qwen_agent-*.whl"))[0]
data = zipfile.ZipFile(wheel).read("qwen_agent/utils/qwen.tiktoken")
tmp = sys.argv[2] + ".tmp"
with open(tmp, "wb") as f:
    f.write(data)
os.replace(tmp, sys.argv[2])
ranks = data.count(b"\n")
print(f"wrote {sys.argv[2]} ({ranks} ranks) from {os.path.basename(wheel)}")
PY
