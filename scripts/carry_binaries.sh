#!/usr/bin/env bash
# Builds here and packs what the GPU machine runs into build-carry/carry.tar.xz (git-ignored, ~21 MB with
# the data), so the device tool carries it (carry: ["build-carry"]) instead of building there:
#   bin/       train, tokenize, the dump tools and benches, tests/qtrain_gpu_tests (stripped), bin/COMMIT
#   lib/       the Debian libraries they link that the GPU machine lacks (OpenBLAS and its Fortran runtime, fmt)
#   kjv/       the demo's KJV token files (train.bin, eval.bin) and data/chat_train.bin, the chat set in
#              Qwen2.5 tokens, when DATA=1: what bench/lora_loss_parity.sh and tests/reference need
# On the GPU machine `source scripts/gpu_carry_env.sh` unpacks it once into /tmp/gc and sets BUILD_DIR,
# QTRAIN_TRAIN_EXE and LD_LIBRARY_PATH; then e.g. PREBUILT=/tmp/gc/bin scripts/gpu_check.sh tests ref.
# The whole build/ folder, and even the unpacked binaries, are larger than the device tool's 64 MiB carry limit.
# CARRY_NAME=x writes build-carry/x.tar.xz and build-carry/x.COMMIT instead (a second set of binaries, e.g. of a
# branch, to run beside the head's in one call: unpack it by hand, `xz -dc ... | tar -C /tmp/gcx -xf -`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
BUILD=${BUILD_DIR:-build}
ninja -C "$BUILD" tests/qtrain_gpu_tests >/dev/null
S=$(mktemp -d); trap 'rm -rf "$S"' EXIT
mkdir -p "$S/bin/tests" "$S/lib" build-carry
for b in train tokenize qtrain_dump qtrain_lora_dump attention_bench pinned_alloc_bench step_floor_bench overlap_bench lora_overlap_bench lora_fused_bench \
         comm_bench dp_step_bench; do
  [ -x "$BUILD/$b" ] && cp "$BUILD/$b" "$S/bin/"
done
cp "$BUILD/tests/qtrain_gpu_tests" "$S/bin/tests/"
strip "$S/bin"/* "$S/bin/tests"/* 2>/dev/null || true
git rev-parse HEAD > "$S/bin/COMMIT"
git diff --quiet HEAD -- src apps tests || echo "(with uncommitted changes)" >> "$S/bin/COMMIT"
for l in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libfmt.so.9; do
  # (awk reads to the end: exiting at the first match could end ldconfig by SIGPIPE, which pipefail makes fatal)
  p=$(ldconfig -p | awk -v l="$l" '$1 == l && !f {f = $NF} END {print f}')
  [ -n "$p" ] && cp -L "$p" "$S/lib/"
done
parts=(bin lib)
if [ "${DATA:-0}" = 1 ]; then
  mkdir -p "$S/kjv" "$S/data"
  scripts/kjv_corpus.sh "$S/kjv.txt"
  tok=../shared/data/qwen2.5-tokenizer
  "$BUILD/tokenize" --tokenizer="$tok/tokenizer.json" --input="$S/kjv.txt" --doc-separator=blank-line \
    --eval-documents=1 --out-dir="$S/kjv" >/dev/null
  scripts/chat_dataset.sh "$S/chat" >/dev/null
  "$BUILD/tokenize" --chat --tokenizer="$tok" --input="$S/chat/train.jsonl" --out-dir="$S/chattok" >/dev/null
  cp "$S/chattok/train.bin" "$S/data/chat_train.bin"
  parts+=(kjv data)
fi
NAME=${CARRY_NAME:-carry}
tar -C "$S" -cf - "${parts[@]}" | xz -T0 -6 > "build-carry/$NAME.tar.xz"
if [ "$NAME" = carry ]; then cp "$S/bin/COMMIT" build-carry/COMMIT; else cp "$S/bin/COMMIT" "build-carry/$NAME.COMMIT"; fi
ls -la "build-carry/$NAME.tar.xz"
