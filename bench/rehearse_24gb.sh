#!/usr/bin/env bash
# Issue 5's memory rehearsal: train models on the H200 as if it were a 24 GB card
# (--memory-limit=24GiB fails before allocating when the plan is larger), with the recompute and
# offload flags each needs. Prints one JSON line per configuration (bench/bench_qtrain.sh: tokens/s,
# device plan, pinned host memory); the plan matches what is allocated within 0.2%
# (CudaModel.PlanMatchesTheDeviceMemoryReallyUsed).
# usage: bench/rehearse_24gb.sh [STEPS]   (default 6 steps per configuration; BUILD_DIR as bench_qtrain.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
export STEPS=${1:-6}
LIMIT=--memory-limit=24GiB
n=0
OFFLOAD="--offload-master --offload-opt-m --offload-opt-v"
run() {
  local model=$1 batch=$2; shift 2
  echo "== $model batch $batch: $*"
  timeout 200 bench/bench_qtrain.sh "$model" "$batch" $LIMIT "$@" 2>&1 | tail -1
  n=$((n + 1)); [ -n "${OUT:-}" ] && cp /tmp/qtrain-bench/train.out "$OUT/rehearse-$n.out" 2>/dev/null
}
run Qwen2.5-1.5B 8 --recompute-ffn --recompute-norm --recompute-att --lmhead-chunks=8
run Qwen2.5-3B 4 --recompute-block $OFFLOAD --lmhead-chunks=8
run Qwen2.5-7B 4 --recompute-block $OFFLOAD --offload-gradients --lmhead-chunks=8
run Qwen2.5-7B 4 --recompute-block $OFFLOAD --offload-gradients --lmhead-chunks=8 --matmul-dtype=e4m3
