#!/usr/bin/env bash
# Issue 33's LoRA speed rows on one GPU: qtrain LoRA (rank 16, alpha 32, every target, frozen bf16 base,
# CUDA graphs) against HF + PEFT (+ torch.compile) at the same shape, random tokens, seq 2048
# (bench/bench_qtrain.sh and bench/torch_lora_baseline.py; one JSON line per run). The adapters keep fp32
# master and moments (LoRA on the GPU refuses bf16 moments), so the bench's bf16 --opt-*-dtype are overridden.
# usage: BUILD_DIR=... bench/lora_bench.sh [MODEL] [BATCH] [TORCH_BATCH]   ONLY=qtrain | ONLY=torch runs one side;
#   QTRAIN_FLAGS="--recompute-block ..." adds qtrain flags, TORCH_FLAGS="--checkpointing" PyTorch's
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-Qwen2.5-7B}; BATCH=${2:-4}; TORCH_BATCH=${3:-$BATCH}
export SEQ=${SEQ:-2048}
v=151643; [[ $MODEL == Llama* ]] && v=128000
case "${ONLY:-all}" in all|qtrain)
  # shellcheck disable=SC2086
  VOCAB=$v bench/bench_qtrain.sh "$MODEL" "$BATCH" --lora-rank=16 --lora-alpha=32 --opt-m-dtype=fp32 --opt-v-dtype=fp32 \
    --use-cuda-graphs ${QTRAIN_FLAGS:-} ;;
esac
case "${ONLY:-all}" in all|torch)
  # shellcheck disable=SC2086
  (cd bench && python3 torch_lora_baseline.py --model "$MODEL" --batch "$TORCH_BATCH" --seq-len "$SEQ" --compile ${TORCH_FLAGS:-}) ;;
esac
