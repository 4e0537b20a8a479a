#!/usr/bin/env bash
# Issue 33's LoRA speed rows on one GPU: qtrain LoRA (rank 16, alpha 32, every target, frozen bf16 base,
# CUDA graphs) against HF + PEFT (+ torch.compile) at the same shape, random tokens, seq 2048
# (bench/bench_qtrain.sh and bench/torch_lora_baseline.py; one JSON line per run). The adapters keep fp32
# master and moments (LoRA on the GPU refuses bf16 moments), so the bench's bf16 --opt-*-dtype are overridden.
# usage: BUILD_DIR=... bench/lora_bench.sh [MODEL] [BATCH] [TORCH_BATCH]   ONLY=qtrain | ONLY=torch runs one side;
#   QTRAIN_FLAGS="--recompute-block ..." adds qtrain flags, TORCH_FLAGS="--checkpointing" PyTorch's
# VARIANT picks qtrain's base and memory (issue 33's rows; BATCH=auto takes the largest batch `--plan-only`
# finds under the variant's limit, as the plan prints it):
#   bf16      bf16 base, resident (the default)
#   fp8       FP8 base: --matmul-dtype=e4m3 --gradient-dtype=e5m2 (only the e4m3 copies of the layer matrices)
#   bf16-24g  bf16 base under --memory-limit=24GiB with --recompute-block
#   fp8-24g   FP8 base under --memory-limit=24GiB with --recompute-block
#   fp8-stream-24g  FP8 base streamed from host (--shard-weights: e4m3 codes pinned, two device layer slots)
#             under --memory-limit=24GiB with --recompute-block --lmhead-chunks=8; no CUDA graphs (refused
#             with --shard-weights). For 14B and 32B; BATCH=auto is the plan's largest under 23 GiB (the
#             ~0.7 GiB CUDA context comes on top)
# The plan (--plan-only, this build, seq 2048, rank 16, fp32 adapter moments, CUDA graphs; plan, NOT measured):
#   model          bf16 (<=130GiB)  fp8 (<=130GiB)  bf16-24g        fp8-24g
#   Qwen2.5-7B     batch 11         batch 12        batch 4         batch 7   (batch 1: 17,174 / 11,192 MiB)
#   Llama-3.1-8B   batch 11         batch 12        batch 4         batch 7
#   Qwen3-8B       batch 10         batch 11        batch 4         batch 6 (7 under 24 GiB: over the card)
#   Qwen2.5-14B    batch 6          batch 7         does not fit    batch 2   (batch 1: 19,580 MiB)
# fp8-stream-24g (largest under 23 GiB; device / pinned MiB): Qwen2.5-32B batch 6 (23,430 / 29,761),
#   Qwen2.5-14B batch 8 (21,529 / 12,601), Qwen2.5-7B batch 13 (22,443 / 6,224); with --offload-residual
#   (QTRAIN_FLAGS) 10 / 16 / 18.
# The FP8 base keeps one e4m3 copy of the layer matrices (7B: Weights 2,080 + Quants 6,223 + a 130 MiB transpose
# scratch, against 14,526 MiB of bf16 weights): the backward transposes each matrix just in time (2026-12-04;
# the fp8 columns before it were 11 / 11 / 10 / 6 and 4 / 4 / 3 / does not fit, with two e4m3 copies).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-Qwen2.5-7B}; BATCH=${2:-4}; TORCH_BATCH=${3:-$BATCH}
export SEQ=${SEQ:-2048}
v=151643; [[ $MODEL == Llama* ]] && v=128000
GRAPHS="--use-cuda-graphs"  # (fp8-stream-24g runs without: its rows were measured so; graphs accept --shard-weights now)
case "${VARIANT:-bf16}" in
  bf16) VFLAGS=""; LIMIT=130GiB ;;
  fp8) VFLAGS="--matmul-dtype=e4m3 --gradient-dtype=e5m2"; LIMIT=130GiB ;;
  # (auto under 23.3 GiB: a 24 GiB card also holds the ~0.6-0.7 GiB CUDA context, which the plan leaves out; session 25:
  # Qwen3-8B at batch 7 planned 23.8 GiB and peaked at 24,931 MiB; 7B and Llama-3.1-8B at batch 7 plan <= 23.1 GiB and
  # peaked at 24,161 / 23,753 MiB)
  bf16-24g) VFLAGS="--memory-limit=24GiB --recompute-block"; LIMIT=23.3GiB ;;
  fp8-24g) VFLAGS="--memory-limit=24GiB --recompute-block --matmul-dtype=e4m3 --gradient-dtype=e5m2"; LIMIT=23.3GiB ;;
  fp8-stream-24g) VFLAGS="--memory-limit=24GiB --recompute-block --lmhead-chunks=8 --matmul-dtype=e4m3"
    VFLAGS+=" --gradient-dtype=e5m2 --shard-weights"; LIMIT=23GiB; GRAPHS="" ;;  # (auto: room for the context)
  *) echo "VARIANT=${VARIANT}: expected bf16, fp8, bf16-24g, fp8-24g or fp8-stream-24g" >&2; exit 2 ;;
esac
if [ "$BATCH" = auto ]; then  # the largest batch the plan fits under LIMIT (the H200 rows: 130 GiB of its 139)
  # shellcheck disable=SC2086
  BATCH=$("${BUILD_DIR:-build-gpu}/train" --model="$MODEL" --from-scratch --device=cuda --train-file=/dev/null \
    --seq-len="$SEQ" --batch-size=1 --steps=10 --model-dtype=bf16 --lora-rank=16 --lora-alpha=32 --opt-m-dtype=fp32 \
    --opt-v-dtype=fp32 $GRAPHS --plan-only $VFLAGS --memory-limit=$LIMIT ${QTRAIN_FLAGS:-} 2>&1 \
    | sed -n 's/.*with these flags --batch-size up to \([0-9]*\) fits.*/\1/p' | head -1 || true)
  [ -n "$BATCH" ] || { echo "no batch fits $LIMIT with VARIANT=${VARIANT:-bf16}" >&2; exit 1; }
  echo "# $MODEL VARIANT=${VARIANT:-bf16}: batch $BATCH (the plan's largest under $LIMIT)"
  [ "$TORCH_BATCH" = auto ] && TORCH_BATCH=$BATCH
fi
case "${ONLY:-all}" in all|qtrain)
  # shellcheck disable=SC2086
  VOCAB=$v bench/bench_qtrain.sh "$MODEL" "$BATCH" --lora-rank=16 --lora-alpha=32 --opt-m-dtype=fp32 --opt-v-dtype=fp32 \
    $GRAPHS $VFLAGS ${QTRAIN_FLAGS:-} ;;
esac
case "${ONLY:-all}" in all|torch)
  # shellcheck disable=SC2086
  # TORCH_COMPILE=--compile-layers compiles each decoder layer (regional; compiles in a layer's time)
  (cd bench && python3 torch_lora_baseline.py --model "$MODEL" --batch "$TORCH_BATCH" --seq-len "$SEQ" \
    "${TORCH_COMPILE:---compile}" ${TORCH_FLAGS:-}) ;;
esac
