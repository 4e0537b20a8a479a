#!/usr/bin/env bash
# One-call check on the GPU machine: build, GPU tests, a short training run on the GPU, and
# (optionally) benchmarks. Logs go to $OUT (the device tool's return folder) or ./gpu-logs.
# usage: scripts/gpu_check.sh [tests] [train] [bench] [bench8] [breakdown] [torch] [attbench] [ref] [ref5] [cmp] [demo]
#                             [rehearse] [aboptim] [abquants] [setup] [abattn] [abgemm] [abstep] [dp] [absplit] [z3] [reshard] [fp8head] [peft]
#        (default: tests train)
# PREBUILT=DIR skips the build and runs the binaries in DIR: after `source scripts/gpu_carry_env.sh` (which
# unpacks scripts/carry_binaries.sh's build-carry/carry.tar.xz) that is /tmp/gc/bin.
# Carry along (device tool `carry`): .devdeps (from ../shared/gpu/stage-deps.sh libxxhash-dev) and, for `cmp`,
# .refdata/{train,eval}.bin — the KJV token files: run scripts/demo.sh once, then
#   mkdir -p .refdata && cp demo-run/data/train.bin demo-run/data/eval.bin .refdata/
# (both folders are git-ignored via .git/info/exclude: echo /.refdata/ >> .git/info/exclude).
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${OUT:-gpu-logs}
mkdir -p "$LOGS"
PHASES=${*:-tests train}
export PATH="/usr/local/cuda/bin:$PATH"
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,clocks_throttle_reasons.active --format=csv \
  > "$LOGS/gpu.txt" 2>&1
t0=$(date +%s)
# PREBUILT=dir uses binaries built elsewhere (scripts/carry_binaries.sh) instead of building here.
B=${PREBUILT:-build-gpu}
export BUILD_DIR=$B QTRAIN_TRAIN_EXE=$PWD/$B/train
if [ -z "${PREBUILT:-}" ]; then
  if ! scripts/gpu_build.sh build-gpu > "$LOGS/build.log" 2>&1; then
    tail -50 "$LOGS/build.log"; echo "BUILD FAILED"; exit 1
  fi
  echo "build: $(( $(date +%s) - t0 )) s"
fi
for phase in $PHASES; do
  case $phase in
    tests)
      timeout 400 $B/tests/qtrain_gpu_tests --gtest_brief=1 > "$LOGS/gpu-tests.log" 2>&1
      echo "gpu tests exit $?"
      grep -E "FAILED|PASSED|Failure|worst grad cosine" "$LOGS/gpu-tests.log" | head -40 ;;
    train)
      mkdir -p /tmp/qt && python3 bench/make_random_tokens.py /tmp/qt/tiny.bin --tokens 200000 --vocab 1000 >/dev/null
      timeout 120 $B/train --device=cuda --model=tests/reference/tiny-config --from-scratch \
        --train-file=/tmp/qt/tiny.bin --eval-file=/tmp/qt/tiny.bin --steps=30 --batch-size=4 --seq-len=128 \
        --learning-rate=3e-3 --eval-every-n-steps=10 --eval-num-steps=4 --out-dir=/tmp/qt/out \
        --checkpoint-dir=/tmp/qt/ckpt --ckpt-interval=15 --overwrite > "$LOGS/train.log" 2>&1
      echo "train exit $?"; grep -E "^\[T\] step +(0|1|29) |^\[V\]|error" "$LOGS/train.log" | head -12 ;;
    bench)
      for cfg in "Qwen2.5-0.5B 16" "Qwen2.5-0.5B 32" "Qwen2.5-1.5B 8" "Qwen2.5-1.5B 16"; do
        STEPS=10 timeout 120 bench/bench_qtrain.sh $cfg 2>&1 | tail -1
      done ;;
    bench8)  # FP8 against bf16 in the same call (issue 5's 0.5B / 1.5B targets)
      STEPS=10 timeout 120 bench/bench_qtrain.sh Qwen2.5-0.5B 16 2>&1 | tail -1
      for cfg in "Qwen2.5-0.5B 16" "Qwen2.5-1.5B 8"; do
        STEPS=10 timeout 120 bench/bench_qtrain.sh $cfg --matmul-dtype=e4m3 --gradient-dtype=e5m2 2>&1 | tail -1
      done
      STEPS=10 timeout 120 bench/bench_qtrain.sh Qwen2.5-0.5B 16 --matmul-dtype=e4m3 --gradient-dtype=e5m2 \
        --use-cuda-graphs 2>&1 | tail -1
      for cfg in "Qwen2.5-0.5B 16" "Qwen2.5-1.5B 8"; do  # with fast accumulation in every FP8 GEMM
        STEPS=10 timeout 120 bench/bench_qtrain.sh $cfg --matmul-dtype=e4m3 --gradient-dtype=e5m2 \
          --fp8-fast-accum=all 2>&1 | tail -1
      done ;;
    abattn)  # --attention=flash vs cudnn, bf16 and FP8, same call (~3 min)
      for cfg in "Qwen2.5-0.5B 16" "Qwen2.5-0.5B 16 --matmul-dtype=e4m3 --gradient-dtype=e5m2" \
                 "Qwen2.5-1.5B 8 --matmul-dtype=e4m3 --gradient-dtype=e5m2"; do
        for att in flash cudnn; do
          echo -n "$att $cfg: "; STEPS=10 timeout 120 bench/bench_qtrain.sh $cfg --attention=$att 2>&1 | tail -1
        done
      done ;;
    abgemm)  # FP8 fast accumulation and in-place GEMM autotuning against the plain heuristic, same call (~4 min)
      F8="--matmul-dtype=e4m3 --gradient-dtype=e5m2"
      for cfg in "Qwen2.5-0.5B 16 $F8" "Qwen2.5-0.5B 16 $F8 --fp8-fast-accum=forward" \
                 "Qwen2.5-0.5B 16 $F8 --fp8-fast-accum=all" "Qwen2.5-0.5B 16 $F8 --fp8-fast-accum=all --gemm-autotune" \
                 "Qwen2.5-0.5B 16 $F8 --fp8-fast-accum=all --use-cuda-graphs" \
                 "Qwen2.5-0.5B 16" "Qwen2.5-0.5B 16 --gemm-autotune" \
                 "Qwen2.5-1.5B 8 $F8" "Qwen2.5-1.5B 8 $F8 --fp8-fast-accum=all" \
                 "Qwen2.5-1.5B 8 $F8 --fp8-fast-accum=all --gemm-autotune"; do
        echo -n "$cfg: "; STEPS=40 SKIP=28 timeout 200 bench/bench_qtrain.sh $cfg 2>&1 | tail -1
        grep -h "GEMM autotune" /tmp/qtrain-bench/train.out || true
      done
      timeout 120 $B/step_floor_bench --model=Qwen2.5-0.5B --from-scratch --batch-size=16 --seq-len=1024 $F8 \
        --fp8-fast-accum=all | tail -4 ;;
    aboptim)  # zero-copy vs double-buffered optimizer, 7B streamed under 24 GiB (~6 min)
      STEPS=5 TIMEOUT=200 bench/rehearse_24gb.sh 7b-fp8-stream-bf16master 2>&1 | tail -4
      STEPS=5 TIMEOUT=200 EXTRA=--offload-double-buffer bench/rehearse_24gb.sh 7b-fp8-stream-bf16master 2>&1 | tail -4 ;;
    abquants)  # bf16 vs FP8 weight copies streamed (--offload-quants), 7B under 24 GiB, FP8 gradients (~5 min)
      STEPS=5 TIMEOUT=200 bench/rehearse_24gb.sh 7b-fp8-stream-bf16master 2>&1 | tail -4
      STEPS=5 TIMEOUT=200 EXTRA=--offload-quants bench/rehearse_24gb.sh 7b-fp8-stream-bf16master 2>&1 | tail -4 ;;
    setup)  # set-up time of a pinned-heavy run (71 GiB pinned): [Setup] lines of the 7B rehearsal (~2.5 min)
      STEPS=4 TIMEOUT=200 bench/rehearse_24gb.sh 7b-fp8-stream-bf16master 2>&1 | tail -3
      grep -E "^\[Setup\] [a-z ]+ in " /tmp/qtrain-bench/train.out
      timeout 60 $B/pinned_alloc_bench 8 16 ;;
    torch)
      timeout 240 python3 bench/torch_baseline.py --model Qwen2.5-0.5B --batch 16 --compile 2>&1 | tail -1
      timeout 240 python3 bench/torch_baseline.py --model Qwen2.5-1.5B --batch 8 --compile 2>&1 | tail -1 ;;
    attbench)
      timeout 120 $B/attention_bench 2>&1 | tail -20
      timeout 120 python3 bench/attention_sdpa.py 2>&1 | tail -12 ;;
    breakdown)
      for cfg in "Qwen2.5-0.5B 16" "Qwen2.5-1.5B 8"; do
        QTRAIN_TIME_BREAKDOWN=1 STEPS=8 timeout 240 bench/bench_qtrain.sh $cfg 2>&1 | tail -3
        grep -A30 "Time breakdown" /tmp/qtrain-bench/train.out | head -30
      done ;;
    cmp)
      timeout 400 python3 tests/reference/compare_training.py --build "$B" --train .refdata/train.bin \
        --eval .refdata/eval.bin 2>&1 | grep -vE "Loading|Writing|transformers" | tail -12 ;;
    demo)  # scripts/demo.sh's GPU training step on the KJV token files in .refdata
      timeout 300 $B/train --device=cuda --model=configs/demo-gpu --from-scratch \
        --train-file=.refdata/train.bin --eval-file=.refdata/eval.bin --final-lr-fraction=0.1 --weight-decay=0.1 \
        --grad-clip=1.0 --out-dir=/tmp/qt-demo/output --checkpoint-dir=/tmp/qt-demo/ckpt --batch-size=16 \
        --seq-len=512 --grad-accumulation=1 --steps=600 --learning-rate=1e-3 --warmup=50 --eval-every-n-steps=100 \
        --eval-num-steps=20 --overwrite > "$LOGS/demo.log" 2>&1
      echo "demo exit $?"; grep -E "^\[V\]|error" "$LOGS/demo.log" | tail -4; grep -E "^\[T\] step +599" "$LOGS/demo.log" ;;
    rehearse)  # issue 5's 24 GB rehearsal (1.5B, 3B, 7B bf16 and FP8 under --memory-limit=24GiB)
      bench/rehearse_24gb.sh 2>&1 | tail -12 ;;
    abstep)  # the optimizer step's read-back before AdamW (issue 17) against the step before it, same call:
             # $B/old/train is `train` built with the previous optimizer_step (carried), else it is rebuilt
             # here from .gpu-ab/cuda_model_step.cpp (the old file) into /tmp/qt-ab/build-ab
      F8="--matmul-dtype=e4m3 --gradient-dtype=e5m2 --fp8-fast-accum=all --gemm-autotune --use-cuda-graphs"
      OLD=$B/old
      if [ ! -x "$OLD/train" ]; then
        rm -rf /tmp/qt-ab && cp -r . /tmp/qt-ab 2>/dev/null; cp .gpu-ab/cuda_model_step.cpp /tmp/qt-ab/src/model/cuda/
        (cd /tmp/qt-ab && scripts/gpu_build.sh build-ab > /dev/null 2>&1) || echo "old build failed"
        OLD=/tmp/qt-ab/build-ab
      fi
      for round in 1 2; do
        for b in "$B" "$OLD"; do
          echo -n "$b 0.5B b32: "; BUILD_DIR=$b STEPS=40 SKIP=28 timeout 200 bench/bench_qtrain.sh Qwen2.5-0.5B 32 $F8 2>&1 | tail -1
        done
      done ;;
    dp)  # data parallel on one GPU (issue 18): the sharded path at world 1 against the plain one (dp_step_bench),
         # and 2 ranks on the GPU (copy engines) against 1 rank with 2x accumulation, with the per-op timing of the
         # collectives (QTRAIN_TIME_BREAKDOWN: every collective is on the compute stream, so all of it is exposed)
      for m in "Qwen2.5-0.5B 32 e4m3" "Qwen2.5-0.5B 32 bf16" "Qwen2.5-1.5B 16 e4m3"; do
        timeout 200 $B/dp_step_bench $m 12 2>&1 | tail -6
      done
      for flags in "--grad-accumulation=2" "--gpus=2 --gpu-ids=0,0 --memcpy-all-gather" \
                   "--gpus=2 --gpu-ids=0,0 --memcpy-all-gather --zero-level=2"; do
        echo "0.5B b16 e4m3 $flags:"; STEPS=12 timeout 200 bench/bench_qtrain.sh Qwen2.5-0.5B 16 \
          --matmul-dtype=e4m3 --gradient-dtype=e5m2 $flags 2>&1 | tail -1
        QTRAIN_TIME_BREAKDOWN=1 STEPS=6 timeout 200 bench/bench_qtrain.sh Qwen2.5-0.5B 16 --matmul-dtype=e4m3 \
          --gradient-dtype=e5m2 $flags > /dev/null 2>&1
        grep -E "all-reduce|reduce-scatter|all-gather|optimizer|sum of ops" /tmp/qtrain-bench/train.out | head -12
      done ;;
    z3)  # ZeRO-3 on one GPU (issue 19): 2 ranks (copy engines), ZeRO-2 against ZeRO-3, with the time the compute
         # stream waits for the layers' gathers (QTRAIN_TIME_BREAKDOWN "weight gather wait": the exposed part)
      for dt in "--matmul-dtype=e4m3 --gradient-dtype=e5m2" "--matmul-dtype=e4m3 --gradient-dtype=e4m3 --persistent-quants" ""; do
        for z in 2 3; do
          flags="--gpus=2 --gpu-ids=0,0 --memcpy-all-gather --zero-level=$z $dt"
          echo "0.5B b16 $flags:"; STEPS=12 timeout 200 bench/bench_qtrain.sh Qwen2.5-0.5B 16 $flags 2>&1 | tail -1
          QTRAIN_TIME_BREAKDOWN=1 STEPS=6 timeout 200 bench/bench_qtrain.sh Qwen2.5-0.5B 16 $flags > /dev/null 2>&1
          grep -E "gather|reduce|optimizer|sum of ops" /tmp/qtrain-bench/train.out | head -10
        done
      done ;;
    reshard)  # loading a checkpoint at another world size (issue 19): a 2-rank 0.5B block checkpoint loaded by 2
              # ranks (the same blocks), 1 rank and 3 ranks (resharding), then 2 again (all from the page cache)
      W=/tmp/qt-reshard; rm -rf $W; mkdir -p $W
      mkdir -p /tmp/qtrain-bench; [ -f /tmp/qtrain-bench/random.bin ] || python3 bench/make_random_tokens.py /tmp/qtrain-bench/random.bin --tokens 40000000 >/dev/null
      C="--model=Qwen2.5-0.5B --from-scratch --device=cuda --train-file=/tmp/qtrain-bench/random.bin --seq-len=1024 \
         --batch-size=8 --eval-every-n-steps=0 --opt-m-dtype=bf16 --opt-v-dtype=bf16"
      mc() { local ids; ids=$(printf '0,%.0s' $(seq "$1")); echo "--gpu-ids=${ids%,} --memcpy-all-gather"; }
      timeout 200 $B/train $C --steps=1 --ckpt-interval=1 --gpus=2 $(mc 2) --grad-accumulation=3 --checkpoint-dir=$W/ck --out-dir=$W/o \
        --log-file=$W/l.jsonl > $W/w.log 2>&1 || tail -5 $W/w.log
      du -sh $W/ck/step_00000001
      for run in "2 3" "1 6" "3 2" "2 3"; do
        set -- $run
        rm -rf $W/c$1; cp -r $W/ck $W/c$1
        timeout 200 $B/train $C --steps=2 --continue --gpus=$1 $( [ $1 -gt 1 ] && mc $1 ) --grad-accumulation=$2 \
          --checkpoint-dir=$W/c$1 --out-dir=$W/o$1 --log-file=$W/l$1.jsonl > $W/r$1.log 2>&1 || tail -5 $W/r$1.log
        echo "$1 ranks: $(grep -E 'state loaded in' $W/r$1.log)"
      done ;;
    absplit)  # single-GPU speed against the commit before the CudaModel split ($B/old/train, carried)
      F8="--matmul-dtype=e4m3 --gradient-dtype=e5m2"
      for round in $(seq "${ROUNDS:-1}"); do
        for cfg in "Qwen2.5-0.5B 32" "Qwen2.5-1.5B 16"; do
          for f in "" "$F8"; do
            for b in "$B" "$B/old"; do
              echo -n "$b $cfg ${f:-bf16}: "; BUILD_DIR=$b STEPS=12 timeout 200 bench/bench_qtrain.sh $cfg $f 2>&1 | tail -1
            done
          done
        done
      done ;;
    fp8head)  # the FP8 LM head (--lm-head-dtype=e4m3, issue 32): its GPU tests, then Llama-3.2-1B FP8 without and
              # with it in the same call (issue 30's flags; ~3 min)
      timeout 400 $B/tests/qtrain_gpu_tests --gtest_filter='CudaFp8LmHead.*:Modes/DataParallel.*/mode5:DataParallelGpu.ZeroThreeGivesZeroTwosBits' \
        > "$LOGS/fp8head-tests.log" 2>&1
      echo "fp8 head tests exit $?"
      grep -E "FAILED|PASSED|Failure|\[fp8 head|\[dp e4m3 with an FP8" "$LOGS/fp8head-tests.log" | head -40
      for head in bf16 e4m3; do
        VOCAB=128000 timeout 150 bench/bench_qtrain.sh Llama-3.2-1B 16 --matmul-dtype=e4m3 --gradient-dtype=e5m2 \
          --fp8-fast-accum=all --use-cuda-graphs --lm-head-dtype=$head 2>&1 | tail -1
      done ;;
    ref)
      timeout 300 python3 tests/reference/compare_hf.py --build "$B" 2>&1 | tail -20 ;;
    ref5)  # the HF comparison with issue 5's memory flags: everything streamed / offloaded / recomputed
      timeout 300 python3 tests/reference/compare_hf.py --build "$B" --dtypes bf16,e4m3 --flags \
        "--recompute-block --shard-weights --offload-gradients --shard-gradients --offload-opt-m --offload-opt-v \
         --offload-residual --master-dtype=bf16 --param-grad-dtype=bf16 --attn-bwd-chunks=2" 2>&1 | tail -20 ;;
    peft)  # the GPU LoRA against transformers + peft on CUDA (issue 33): fp32 and bf16, Qwen2/Llama/Qwen3
      timeout 300 python3 tests/reference/compare_peft_cpu.py --build "$B" --device cuda --dtypes fp32,bf16 \
        --work /tmp/qtrain-peft-gpu 2>&1 | grep -v "Loading weights\|Writing model" | tail -50 ;;
  esac
done
echo "total: $(( $(date +%s) - t0 )) s"
