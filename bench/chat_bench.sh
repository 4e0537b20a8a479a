#!/usr/bin/env bash
# Issue 31's speed rows on one GPU: fine-tuning throughput on a chat token file (tokenize --chat: masks
# and document starts) — qtrain packed with document masking (greedy), qtrain padded (--packing=one-per-row)
# and, for what the masking costs, qtrain with --document-masking=off on the same tokens (plain causal
# rows over the token stream, same shape); then HF + torch.compile padded to the longest conversation of
# each batch (bench/torch_chat_baseline.py). bf16 weights and Adam moments, CUDA graphs (bench/bench_qtrain.sh).
# One JSON line per run; useful_tokens_per_s leaves padding out.
# usage: CHAT_TOK=train.bin BUILD_DIR=... bench/chat_bench.sh [MODEL] [SEQ] [BATCH] [HF_CONVERSATIONS]
#   ONLY=qtrain | ONLY=masking | ONLY=torch runs one part
#   RAGGED_DOCS=M adds, to the masking part, qtrain packed with cuDNN's variable-length attention
#   (--attention=cudnn --document-masking=on --max-docs-per-row=M; M at least the most documents of one row;
#   RAGGED_EXTRA=flags for that run only, e.g. --attn-bwd-chunks=2)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-Qwen2.5-0.5B}; SEQ=${2:-2048}; BATCH=${3:-16}; CONV=${4:-16}
: "${CHAT_TOK:?CHAT_TOK=the chat token file}"
export TOKENS="$CHAT_TOK" SEQ
run() { echo "# $MODEL seq $SEQ batch $BATCH: $*"; bench/bench_qtrain.sh "$MODEL" "$BATCH" --use-cuda-graphs "$@"; }
case "${ONLY:-all}" in all|qtrain)
  run --document-masking=on
  run --document-masking=on --packing=one-per-row ;;
esac
case "${ONLY:-all}" in all|qtrain|masking)
  [ "${ONLY:-all}" = masking ] && run --document-masking=on
  if [ -n "${RAGGED_DOCS:-}" ]; then
    # shellcheck disable=SC2086  # RAGGED_EXTRA: more flags, e.g. --attn-bwd-chunks=2
    run --document-masking=on --attention=cudnn --max-docs-per-row="$RAGGED_DOCS" ${RAGGED_EXTRA:-} || echo "# the cuDNN ragged run failed"
  fi
  run --document-masking=off --loss-normalization=tokens ;;
esac
case "${ONLY:-all}" in all|torch)
  (cd bench && python3 torch_chat_baseline.py --model "$MODEL" --tokens "$CHAT_TOK" --batch "$CONV" --max-len "$SEQ" --compile) ;;
esac
