#!/usr/bin/env bash
# Issue 33's loss-parity row: a LoRA fine-tune of a small model on the chat set ends within 1% of PEFT's
# held-out loss from the same initial adapter. No downloads:
#   1. the base: qtrain pretrains a small Qwen2-shaped model from scratch on the KJV token files of
#      scripts/demo.sh (BASE_CONFIG, PRE_STEPS steps) and exports it as an HF model ($WORK/base)
#   2. the chat files: CHAT_EVAL given, or CHAT_TRAIN split, every 20th conversation to eval
#      (bench/lora_loss_parity.py split: masks and document starts kept)
#   3. the starting adapter: PEFT's, rank 16, alpha 32, every target, dropout 0, B ~ N(0, 0.01), saved by peft
#   4. qtrain fine-tunes it (--lora-from, packed rows with document masking, the default for chat files) and
#      HF + peft fine-tune it on the same rows in the same order, same loss normalisation, learning-rate
#      schedule, AdamW and clipping (bench/lora_loss_parity.py's docstring says how and what differs:
#      on the GPU the arithmetic — qtrain's bf16 base and bf16 adapter GEMMs, PEFT's bf16 base under autocast)
#   5. both final adapters (and the starting one) are evaluated through transformers + peft on the eval
#      conversations; one JSON line: the losses, their relative difference, PASS when < 1%; also both runs'
#      first step loss (the same adapter on the same batch: the check that the batches are the same)
# usage: BUILD_DIR=build-gpu bench/lora_loss_parity.sh KJV_DIR CHAT_TRAIN.bin [CHAT_EVAL.bin]
#   KJV_DIR: train*.bin and eval.bin of scripts/demo.sh; CHAT_TRAIN: tokenize --chat's train.bin (Qwen2.5 tokens)
#   DEVICE=cuda|cpu (default: cuda when nvidia-smi sees a GPU). WORK (default /tmp/qtrain-lora-parity).
#   REUSE_BASE=1 keeps an existing $WORK/base; EVAL_DOCS=N evaluates only the first N eval documents (CPU tests). STEPS, SEQ, BATCH, LR, WARMUP: the fine-tune (defaults below);
#   PRE_STEPS, BASE_CONFIG: the pretraining. PYTHON (default python3) needs torch, transformers, peft, safetensors.
# On the H200 with the defaults (demo-gpu, 600 pretraining steps, 200 fine-tuning steps of 8 x 2048): a few
# minutes, not yet timed. The CPU run here (tiny config, DEVICE=cpu, see docs/benchmarks.md) is the end-to-end test.
set -euo pipefail
cd "$(dirname "$0")/.."
KJV=${1:?KJV_DIR (train*.bin, eval.bin of scripts/demo.sh)}; CHAT_TRAIN=${2:?CHAT_TRAIN.bin (tokenize --chat)}
CHAT_EVAL=${3:-}
BUILD=${BUILD_DIR:-build-gpu}
PY=${PYTHON:-python3}
WORK=${WORK:-/tmp/qtrain-lora-parity}
if [ -z "${DEVICE:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then DEVICE=cuda; else DEVICE=cpu; fi
fi
if [ "$DEVICE" = cuda ]; then
  BASE_CONFIG=${BASE_CONFIG:-configs/demo-gpu}; DTYPE=bf16
  PRE=(--batch-size=16 --seq-len=512 --steps="${PRE_STEPS:-600}" --learning-rate=1e-3 --warmup=50 --model-dtype=bf16)
  STEPS=${STEPS:-200}; SEQ=${SEQ:-2048}; BATCH=${BATCH:-8}
else
  BASE_CONFIG=${BASE_CONFIG:-configs/demo-cpu}; DTYPE=fp32
  PRE=(--batch-size=8 --seq-len=128 --steps="${PRE_STEPS:-200}" --learning-rate=2e-3 --warmup=20 --lmhead-chunks=8)
  STEPS=${STEPS:-20}; SEQ=${SEQ:-512}; BATCH=${BATCH:-2}
fi
LR=${LR:-2e-4}; WARMUP=${WARMUP:-$(( STEPS / 10 ))}
# the fine-tune's optimizer, given to both sides explicitly (qtrain's defaults)
FINAL=0.1 WD=0.1 CLIP=1.0 B1=0.9 B2=0.95 EPS=1e-8 SEED=42
mkdir -p "$WORK"

# 1. the base
if [ "${REUSE_BASE:-0}" = 1 ] && [ -f "$WORK/base/config.json" ]; then
  echo "== base: $WORK/base (kept)"
else
  echo "== pretraining $BASE_CONFIG on $KJV ($DEVICE)"
  "$BUILD/train" --device="$DEVICE" --model="$BASE_CONFIG" --from-scratch --train-file="$KJV/train*.bin" \
    --eval-file="$KJV/eval.bin" --eval-every-n-steps=0 --final-lr-fraction=0.1 --weight-decay=0.1 --grad-clip=1.0 \
    --out-dir="$WORK/base" --log-file="$WORK/pretrain.jsonl" --overwrite "${PRE[@]}" > "$WORK/pretrain.out" 2>&1 \
    || { tail -20 "$WORK/pretrain.out"; exit 1; }
  grep -E '"log": *"step"' "$WORK/pretrain.jsonl" | tail -1 | cut -c1-200
fi

# 2. the chat files
if [ -n "$CHAT_EVAL" ]; then
  TRAIN=$CHAT_TRAIN; EVAL=$CHAT_EVAL
else
  "$PY" bench/lora_loss_parity.py split "$CHAT_TRAIN" "$WORK/chat"
  TRAIN=$WORK/chat/train.bin; EVAL=$WORK/chat/eval.bin
fi

# 3. the starting adapter
"$PY" bench/lora_loss_parity.py adapter "$WORK/base" "$WORK/start"

# 4. the two fine-tunes
OPT=(--seq-len="$SEQ" --batch-size="$BATCH" --steps="$STEPS" --warmup="$WARMUP" --seed="$SEED")
echo "== qtrain LoRA: $STEPS steps of $BATCH x $SEQ"
"$BUILD/train" --device="$DEVICE" --model="$WORK/base" --model-dtype="$DTYPE" --train-file="$TRAIN" \
  --lora-rank=16 --lora-alpha=32 --lora-from="$WORK/start" --grad-accumulation=1 "${OPT[@]}" \
  --learning-rate="$LR" --final-lr-fraction=$FINAL --weight-decay=$WD --grad-clip=$CLIP --beta-1=$B1 --beta-2=$B2 \
  --adam-epsilon=$EPS --eval-every-n-steps=0 --out-dir="$WORK/qtrain" --log-file="$WORK/qtrain.jsonl" --overwrite \
  > "$WORK/qtrain.out" 2>&1 || { tail -20 "$WORK/qtrain.out"; exit 1; }
echo "== HF + peft: the same"
"$PY" bench/lora_loss_parity.py train "$WORK/base" "$WORK/start" "$TRAIN" "$WORK/peft" --log "$WORK/peft.jsonl" \
  --device "$DEVICE" --dtype "$DTYPE" "${OPT[@]}" --lr="$LR" --final-lr-fraction=$FINAL --weight-decay=$WD \
  --grad-clip=$CLIP --beta1=$B1 --beta2=$B2 --eps=$EPS

# 5. held-out loss of both (and of the start), through transformers + peft
"$PY" bench/lora_loss_parity.py eval "$WORK/base" "$EVAL" --seq-len="$SEQ" --device "$DEVICE" \
  --max-pieces="${EVAL_DOCS:-0}" start="$WORK/start" qtrain="$WORK/qtrain" peft="$WORK/peft" --qtrain-log "$WORK/qtrain.jsonl" --torch-log "$WORK/peft.jsonl"
