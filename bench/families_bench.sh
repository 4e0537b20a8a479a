#!/usr/bin/env bash
# Issue 30's speed rows on one GPU, seq 1024, random tokens (bench/bench_qtrain.sh: bf16 weights and
# Adam moments, llm.q's settings): Qwen3-0.6B, Qwen3-1.7B and Llama-3.2-1B in bf16 and FP8 (e4m3
# matmuls, e5m2 gradients, fast accumulation, CUDA graphs), and the Qwen3 shapes without their q/k norm
# (bench/family_configs.py) to measure what it costs. TORCH=1 runs the PyTorch stack instead (HF model
# + torchao float8 + torch.compile, bench/torch_baseline.py). One JSON line per run.
# usage: BUILD_DIR=build-gpu bench/families_bench.sh [BATCH]   (ONLY="Llama-3.2-1B" runs one preset's pair)
set -euo pipefail
cd "$(dirname "$0")/.."
BATCH=${1:-16}
FP8=(--matmul-dtype=e4m3 --gradient-dtype=e5m2 --fp8-fast-accum=all --use-cuda-graphs)
if [ -n "${TORCH:-}" ]; then
  for m in ${ONLY:-Qwen3-0.6B Qwen3-1.7B Llama-3.2-1B}; do
    python3 bench/torch_baseline.py --model "$m" --batch "$BATCH" --seq-len 1024 --compile --float8
  done
  exit 0
fi
CFG=${BENCH_DIR:-/tmp/qtrain-bench}/configs
python3 bench/family_configs.py "$CFG" >/dev/null
for m in ${ONLY:-Qwen3-0.6B Qwen3-1.7B Llama-3.2-1B}; do
  v=151643; [[ $m == Llama* ]] && v=128000
  VOCAB=$v bench/bench_qtrain.sh "$m" "$BATCH" --use-cuda-graphs
  VOCAB=$v bench/bench_qtrain.sh "$m" "$BATCH" "${FP8[@]}"
done
[ -n "${ONLY:-}" ] && exit 0
for m in Qwen3-0.6B Qwen3-1.7B; do
  for v in "$m" "$m-no-qk-norm"; do
    echo "# $v"
    bench/bench_qtrain.sh "$CFG/$v" "$BATCH" "${FP8[@]}"
    bench/bench_qtrain.sh "$CFG/$v" "$BATCH" --use-cuda-graphs
  done
done
