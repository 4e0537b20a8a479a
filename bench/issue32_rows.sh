#!/usr/bin/env bash
# Issue 32's rows on one H200: qtrain at llm.q's published one-GPU commands (its benchmarks/H100x1.md: seq 1024,
# bf16 weights and Adam moments, CUDA graphs, random tokens) beside llm.q itself where its bf16 path runs
# (bench/llmq_bench.sh; its FP8 path fails on cuBLASLt 13.1), and qtrain's candidates for the best 7B command.
# usage: BUILD_DIR=/tmp/gc/bin bench/issue32_rows.sh ROW...   (after `source scripts/gpu_carry_env.sh`)
#   ROW: 7b-bf16[-bgrad] | 7b-fp8 | 14b-bf16 | 14b-fp8[-bgrad] | 7b-best | 14b-best (-bf16 | -fp8: one half) | 14b-best-fp8-bf16m[-lmh] | 14b-best-bf16-bf16m | 14b-best-bf16-bgrad | 14b-best-fp8-bgrad | 7b-best-bgrad | llmq-7b-bf16 | llmq-14b-bf16 | seq32k | seq16k
# GA (default: the published accumulation of the row) and STEPS (default 3; the median is over the steps after
# the first) keep a row inside one device call: at the published accumulations a 7B bf16 step is ~40 s and a 14B
# one ~60-85 s, so give a row its own call or lower GA on BOTH sides of a comparison (compare like with like).
# qtrain's FP8 rows use its e5m2 backward and fast accumulation (--gradient-dtype=e5m2 --fp8-fast-accum=all):
# llm.q's FP8 command runs e4m3 matmuls only; what qtrain adds is stated beside each figure.
# The 14B FP8 "best" rows run batch 8 (what fits without the recomputed gate|up GEMM) at accumulation 64: llm.q's
# 16 x 32 sequences, 524,288 tokens an optimizer step, so the offloaded optimizer is paid once per as many tokens
# (session 25 measured them at 8 x 32, half the tokens a step: the optimizer's 1.48 s counted twice as often).
set -euo pipefail
cd "$(dirname "$0")/.."
F8="--matmul-dtype=e4m3 --gradient-dtype=e5m2 --fp8-fast-accum=all"
q() {  # q MODEL BATCH GA flags...: one qtrain row (+ $EXTRA, e.g. EXTRA=--gemm-autotune with SKIP=2: it decides
     # in the first step at GA >= 16, the LM head's shape after 48 calls)
  local m=$1 b=$2 ga=$3; shift 3
  # shellcheck disable=SC2086
  set -- "$@" ${EXTRA:-}
  echo "# qtrain $m batch $b accumulation ${GA:-$ga}: $*"
  GA=${GA:-$ga} STEPS=${STEPS:-3} SKIP=${SKIP:-1} timeout "${TIMEOUT:-580}" bench/bench_qtrain.sh "$m" "$b" --use-cuda-graphs "$@" 2>&1 | tail -1
}
for row in "$@"; do
  case $row in
    7b-bf16) q Qwen2.5-7B 4 128 --lmhead-chunks=2 --attn-bwd-chunks=2 ;;
    7b-bf16-bgrad) q Qwen2.5-7B 4 128 --lmhead-chunks=2 --attn-bwd-chunks=2 --param-grad-dtype=bf16 ;;  # llm.q's bf16
      # gradients too (its --model-dtype=bf16 keeps them in bf16): like for like with llm.q's command
    7b-fp8) q Qwen2.5-7B 16 32 $F8 --lmhead-chunks=4 --attn-bwd-chunks=4 --recompute-ffn --recompute-norm --offload-residual ;;
    14b-bf16) q Qwen2.5-14B 8 64 --lmhead-chunks=2 --attn-bwd-chunks=2 --offload-opt-m --offload-opt-v --offload-master \
                --recompute-ffn --offload-residual ;;
    14b-fp8)  # + --fp8-weight-transposes=jit: with both e4m3 copies of the matrices the command plans 150 GiB
      q Qwen2.5-14B 16 32 $F8 --fp8-weight-transposes=jit --lmhead-chunks=2 --offload-opt-m --offload-opt-v \
        --offload-master --recompute-ffn --recompute-norm --offload-residual ;;
    14b-fp8-bgrad)  # llm.q's 14B FP8 command with its bf16 gradients (llm.q keeps them in bf16): the 20 GiB they
      # free let the transposed e4m3 weights stay (no --fp8-weight-transposes=jit). Plans 131,553 MiB (--plan-only).
      q Qwen2.5-14B 16 32 $F8 --lmhead-chunks=2 --offload-opt-m --offload-opt-v --offload-master --recompute-ffn \
        --recompute-norm --offload-residual --param-grad-dtype=bf16 ;;
    7b-best)  # without --recompute-ffn (docs/perf-notes.md, session 21: its recomputed gate|up GEMMs are ~96 ms of a
              # ~775 ms micro-batch); plans 121.6 and 120.8 GiB (--plan-only, this commit)
      q Qwen2.5-7B 16 32 $F8 --lm-head-dtype=e4m3 --lmhead-chunks=4 --attn-bwd-chunks=4 --offload-residual \
        --offload-opt-m --offload-opt-v --master-dtype=bf16
      q Qwen2.5-7B 8 32 $F8 --lm-head-dtype=e4m3 --lmhead-chunks=4 --offload-opt-m --offload-opt-v ;;
    14b-best|14b-best-bf16|14b-best-fp8)
      # without the recomputed gate|up GEMM (docs/perf-notes.md, session 22: 13.6 of 97.6 GFLOP a token at 14B);
      # --recompute-swiglu keeps only the elementwise recompute. Plans (--plan-only, session 22): bf16 batch 8
      # 129,348 MiB; FP8 batch 8 138,586 MiB (tight: ~0.8 GiB of context on top). 14b-best runs both.
      [ "$row" = 14b-best-fp8 ] || q Qwen2.5-14B 8 64 --lmhead-chunks=2 --attn-bwd-chunks=2 --offload-opt-m \
        --offload-opt-v --offload-master --recompute-swiglu --offload-residual
      [ "$row" = 14b-best-bf16 ] || q Qwen2.5-14B 8 64 $F8 --fp8-weight-transposes=jit --lmhead-chunks=2 \
        --offload-opt-m --offload-opt-v --offload-master --recompute-swiglu --recompute-norm --offload-residual ;;
    14b-best-bf16-bf16m)  # 14b-best-bf16 with the bf16 weights as the master (not llm.q's: its master is an offloaded
      # fp32 copy): the optimizer moves the bf16 moments only over PCIe (~118 GB a step instead of ~237 GB)
      q Qwen2.5-14B 8 64 --lmhead-chunks=2 --attn-bwd-chunks=2 --offload-opt-m --offload-opt-v --master-dtype=bf16 \
        --recompute-swiglu --offload-residual ;;
    14b-best-fp8-bf16m)  # 14b-best-fp8 with the bf16 weights as the master instead of an offloaded fp32 master:
      # the offloaded optimizer then moves the bf16 moments only over PCIe (~118 GB a step instead of ~237 GB;
      # docs/perf-notes.md, session 23). Plans (--plan-only): 138,586 MiB on the device (as 14b-best-fp8), 60,183 MiB
      # pinned (116,527 with the fp32 master). Not llm.q's command (its master is fp32).
      q Qwen2.5-14B 8 64 $F8 --fp8-weight-transposes=jit --lmhead-chunks=2 --offload-opt-m --offload-opt-v \
        --master-dtype=bf16 --recompute-swiglu --recompute-norm --offload-residual ;;
    14b-best-fp8-bf16m-lmh)  # 14b-best-fp8-bf16m with the FP8 LM head (opt-in; its 300-step KJV loss held: README) in
      # 4 chunks: the head is 4.7 of 84 GFLOP a token at 14B, in bf16 until now. Plans 139,328 MiB (--plan-only).
      q Qwen2.5-14B 8 64 $F8 --fp8-weight-transposes=jit --lmhead-chunks=4 --lm-head-dtype=e4m3 --offload-opt-m \
        --offload-opt-v --master-dtype=bf16 --recompute-swiglu --recompute-norm --offload-residual ;;
    14b-best-bf16-bgrad)  # 14b-best-bf16 with bf16 gradients on the device, as llm.q keeps them: the 20 GiB pay for
      # no recompute and no residual offload. Plans 123,049 MiB (--plan-only).
      q Qwen2.5-14B 8 64 --lmhead-chunks=2 --attn-bwd-chunks=2 --offload-opt-m --offload-opt-v --offload-master \
        --param-grad-dtype=bf16 ;;
    14b-best-fp8-bgrad)  # bf16 gradients on the device (--param-grad-dtype=bf16, staged; session 24): 20 GiB freed
      # pay for no recompute and no residual offload, with the FP8 head. Plans 131,901 MiB (--plan-only).
      q Qwen2.5-14B 8 64 $F8 --fp8-weight-transposes=jit --lmhead-chunks=4 --lm-head-dtype=e4m3 --offload-opt-m \
        --offload-opt-v --master-dtype=bf16 --param-grad-dtype=bf16 ;;
    7b-best-bgrad)  # 7b-best's first command with bf16 gradients on the device: its bf16 moments fit on the device
      # too (no optimizer over PCIe), for jit transposes. Plans 135,416 MiB (--plan-only).
      q Qwen2.5-7B 16 32 $F8 --lm-head-dtype=e4m3 --lmhead-chunks=4 --attn-bwd-chunks=4 --offload-residual \
        --master-dtype=bf16 --param-grad-dtype=bf16 --fp8-weight-transposes=jit ;;
    llmq-7b-bf16) GA=${GA:-128} STEPS=${STEPS:-3} bench/llmq_bench.sh Qwen2.5-7B bf16 2>/dev/null | tail -1 ;;
    llmq-14b-bf16) GA=${GA:-64} STEPS=${STEPS:-3} bench/llmq_bench.sh Qwen2.5-14B bf16 2>/dev/null | tail -1 ;;
    seq32k)  # Qwen2.5's max_position_embeddings, batch 1, FP8 (plans: 0.5B 72.3 GiB, 1.5B 113.8 GiB with the default
             # flags; 7B needs the flags its plan names: 303.6 GiB without)
      for m in Qwen2.5-0.5B Qwen2.5-1.5B; do SEQ=32768 GA=${GA:-1} q $m 1 1 $F8; done
      SEQ=32768 GA=${GA:-1} q Qwen2.5-7B 1 1 $F8 --recompute-block --offload-opt-m --offload-opt-v --lmhead-chunks=8 \
        --attention=flash ;;
    seq16k)  # 0.5B FP8 at seq 16384 against HF + torch.compile (issue 32: >= 2.5x; 2.2x on 2026-12-03)
      SEQ=16384 GA=${GA:-1} q Qwen2.5-0.5B 2 1 $F8
      # + the FP8 LM head (opt-in, numerics changed; docs/perf-notes.md session 23: the tied 151,936 x 896 head is
      # ~15% of the step's flop at seq 16384, in bf16 until now)
      SEQ=16384 GA=${GA:-1} q Qwen2.5-0.5B 2 1 $F8 --lm-head-dtype=e4m3
      (cd bench && timeout 400 python3 torch_baseline.py --model Qwen2.5-0.5B --batch 2 --seq-len 16384 --compile 2>&1 | tail -1) ;;
    *) echo "issue32_rows.sh: unknown row '$row' (7b-bf16 7b-bf16-bgrad 7b-fp8 14b-bf16 14b-fp8 14b-fp8-bgrad 7b-best 14b-best 14b-best-bf16 14b-best-fp8 14b-best-fp8-bf16m 14b-best-fp8-bf16m-lmh 14b-best-bf16-bf16m 14b-best-bf16-bgrad 14b-best-fp8-bgrad 7b-best-bgrad llmq-7b-bf16 llmq-14b-bf16 seq32k seq16k)" >&2
       exit 2 ;;
  esac
done
