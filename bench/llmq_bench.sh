#!/usr/bin/env bash
# Times the peer trainer llm.q (IST-DASLab/llmq) on one GPU with the command its benchmarks/H100x1.md
# publishes for a model, so qtrain and llm.q can be measured in the same device call.
#
# usage: bench/llmq_bench.sh MODEL [DTYPE]      MODEL: Qwen2.5-0.5B|1.5B|3B|7B|14B, DTYPE: bf16 (default) | e4m3
#        bench/llmq_bench.sh --parse LOG MODEL BATCH GA [STEPS]   (only parse an llm.q stdout log; for testing)
#
# Needs the prebuilt llm.q binary tarball (llmq/train + llmq/lib/*.so; see bench/llmq_build.md), carried
# to the GPU machine as an ignored path. Environment:
#   LLMQ_TAR   tarball (default <repo>/.gpucarry/llmq/llmq.tar.xz)
#   LLMQ_DIR   where it is unpacked and where data/ and run/ go (default /tmp/llmq)
#   GA         --grad-accumulation (default: the published value for MODEL)
#   STEPS      optimizer steps to run (default 6); tokens_per_s is the median over steps 1..STEPS-1
#   TIMEOUT    seconds before train is killed (default 560, under a 600 s device-call limit); on a timeout the
#              JSON line is still printed from the steps logged so far (if >= 2), and the exit status is 124
#   CUDNN_LIB  cuDNN lib dir put first on LD_LIBRARY_PATH (default: the torch venv's pip cuDNN 9.19 if present;
#              the binary was compiled against cuDNN 9.19 headers)
# Published per-step times on 1xH100 (bf16): 7B ~38 s, 14B ~83 s (plus setup), so 6 steps of 14B at the published
# GA=64 do not fit in 600 s: use e.g. GA=16 or STEPS=3 there (a smaller GA amortizes the optimizer step, which
# for 14B runs on offloaded host memory, over fewer tokens, so tokens/s can come out lower than the published GA).
#
# The command is the published one: ${ARGS} and the model's flags from benchmarks/H100x1.md, with
#   --train-file/--eval-file pointing at random BIN.TOK v2 files (vocab 151643, written by
#   bench/make_random_tokens.py if absent; the train file holds enough tokens for STEPS+2 steps so no epoch
#   wrap/eval happens mid-run; the eval file is small), --grad-accumulation=$GA, and these additions that do
#   not touch the timed loop: --steps=$STEPS, --save-training-state=false, and --out-dir/--checkpoint-dir/
#   --log-file under $LLMQ_DIR/run. llm.q always runs a full eval and exports model.safetensors after the last
#   step (15 GB for 7B), so this script kills train (SIGTERM) once STEPS "[T] step" lines have appeared.
# Prints one JSON line on stdout; train's output streams to stderr and stays in $LLMQ_DIR/run/train.out.
set -euo pipefail

parse_log() {  # LOG MODEL BATCH GA [STEPS] -> JSON line (only steps < STEPS count, if given)
  python3 - "$@" <<'PY'
import json, re, statistics, sys
log, model, batch, ga = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
max_steps = int(sys.argv[5]) if len(sys.argv) > 5 else None
text = open(log, errors="replace").read()
# [T] step     1 [  0.2%] | time:  3185 ms | norm ... | tps  164k | sol 33.6%     (tps: "72939" or "164k";
# time: "N ms", or "N  s" from 100 s on)
pat = re.compile(r"^\[T\] step\s+(\d+)\s.*?\| time:\s*(\d+)\s*(ms|s)\s*\|.*?\| tps\s+(\d+)(k?)", re.M)
steps = {}
for m in pat.finditer(text):
    ms = int(m.group(2)) * (1 if m.group(3) == "ms" else 1000)
    if max_steps is None or int(m.group(1)) < max_steps:
        steps[int(m.group(1))] = (ms, int(m.group(4)) * (1000 if m.group(5) else 1))
if len(steps) < 2:
    sys.exit(f"llmq_bench: only {len(steps)} '[T] step' lines in {log}")
first = min(steps)
rest = [steps[s] for s in sorted(steps) if s != first]
tok_per_step = batch * 1024 * ga
setup = re.search(r"Setup took (\d+) seconds", text)
print(json.dumps({
    "system": "llm.q", "model": model, "batch": batch, "grad_accumulation": ga, "seq_len": 1024,
    "tokens_per_s": round(statistics.median(t for _, t in rest)),
    # same steps, from the printed step time (llm.q rounds tps >= 100k down to whole thousands)
    "tokens_per_s_from_time": round(tok_per_step / (statistics.median(ms for ms, _ in rest) / 1000)),
    "step_ms_median": statistics.median(ms for ms, _ in rest),
    "steps_measured": len(rest),
    "setup_s": int(setup.group(1)) if setup else None,
}))
PY
}

if [ "${1:-}" = "--parse" ]; then shift; parse_log "$@"; exit; fi

REPO=$(cd "$(dirname "$0")/.." && pwd)
MODEL=${1:?usage: bench/llmq_bench.sh MODEL [bf16|e4m3]}
DTYPE=${2:-bf16}
LLMQ_TAR=${LLMQ_TAR:-$REPO/.gpucarry/llmq/llmq.tar.xz}
LLMQ_DIR=${LLMQ_DIR:-/tmp/llmq}
STEPS=${STEPS:-6}
TIMEOUT=${TIMEOUT:-560}

# benchmarks/H100x1.md (llm.q b77d969): batch, grad accumulation, remaining flags per model and matmul dtype
case "$MODEL:$DTYPE" in
  Qwen2.5-0.5B:bf16) B=32 GA0=16  FLAGS="" ;;
  Qwen2.5-0.5B:e4m3) B=32 GA0=16  FLAGS="" ;;
  Qwen2.5-1.5B:bf16) B=32 GA0=16  FLAGS="--lmhead-chunks=4" ;;
  Qwen2.5-1.5B:e4m3) B=32 GA0=16  FLAGS="" ;;
  Qwen2.5-3B:bf16)   B=16 GA0=32  FLAGS="" ;;
  Qwen2.5-3B:e4m3)   B=16 GA0=32  FLAGS="" ;;
  Qwen2.5-7B:bf16)   B=4  GA0=128 FLAGS="--lmhead-chunks=2 --attn-bwd-chunks=2" ;;
  Qwen2.5-7B:e4m3)   B=16 GA0=32  FLAGS="--lmhead-chunks=4 --attn-bwd-chunks=4 --recompute-ffn --recompute-norm --offload-residual" ;;
  Qwen2.5-14B:bf16)  B=8  GA0=64  FLAGS="--lmhead-chunks=2 --attn-bwd-chunks=2 --offload-opt-m --offload-opt-v --offload-master --recompute-ffn --offload-residual" ;;
  Qwen2.5-14B:e4m3)  B=16 GA0=32  FLAGS="--lmhead-chunks=2 --offload-opt-m --offload-opt-v --offload-master --recompute-ffn --recompute-norm --offload-residual" ;;
  *) echo "llmq_bench: no published H100x1 command for $MODEL $DTYPE" >&2; exit 2 ;;
esac
GA=${GA:-$GA0}

# unpack the binary (again if the tarball is newer than the unpacked copy)
if [ ! -x "$LLMQ_DIR/llmq/train" ] || [ "$LLMQ_TAR" -nt "$LLMQ_DIR/llmq/train" ]; then
  [ -f "$LLMQ_TAR" ] || { echo "llmq_bench: no tarball at $LLMQ_TAR" >&2; exit 2; }
  mkdir -p "$LLMQ_DIR"
  tar -xJf "$LLMQ_TAR" -C "$LLMQ_DIR"
  touch "$LLMQ_DIR/llmq/train"
fi

# random token files (BIN.TOK v2, int32 tokens, vocab 151643: the format llm.q's DataLoader reads)
PY=python3
python3 -c 'import numpy' 2>/dev/null || PY=/opt/torch/.venv/bin/python
DATA="$LLMQ_DIR/data"; mkdir -p "$DATA"
NTRAIN=$(( (B * 1024 * GA * (STEPS + 2) / 1048576 + 1) * 1048576 ))
TRAIN="$DATA/random-train-$NTRAIN.bin"; EVAL="$DATA/random-eval.bin"
[ -f "$TRAIN" ] || "$PY" "$REPO/bench/make_random_tokens.py" "$TRAIN" --tokens "$NTRAIN" --vocab 151643 --seed 1 >&2
[ -f "$EVAL" ] || "$PY" "$REPO/bench/make_random_tokens.py" "$EVAL" --tokens 262144 --vocab 151643 --seed 2 >&2

if [ -z "${CUDNN_LIB:-}" ] && [ -d /opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib ]; then
  CUDNN_LIB=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib
fi
export LD_LIBRARY_PATH="$LLMQ_DIR/llmq/lib${CUDNN_LIB:+:$CUDNN_LIB}:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

ARGS="--train-file=$TRAIN --eval-file=$EVAL \
 --ckpt-interval=10000 --from-scratch --seq-length=1024 --model-dtype=bf16 --opt-m-dtype=bf16 \
 --opt-v-dtype=bf16 --gpus=1 --use-cuda-graphs"
RUN="$LLMQ_DIR/run"; rm -rf "$RUN"; mkdir -p "$RUN"; cd "$RUN"
# shellcheck disable=SC2086
CMD=("$LLMQ_DIR/llmq/train" $ARGS --model="$MODEL" --matmul-dtype="$DTYPE" --batch-size="$B" --grad-accumulation="$GA" $FLAGS
     --steps="$STEPS" --save-training-state=false --out-dir="$RUN/out" --checkpoint-dir="$RUN/ckpt" --log-file="$RUN/log.json")
echo "llmq_bench: ${CMD[*]}" >&2
timeout --kill-after=30 "$TIMEOUT" "${CMD[@]}" > "$RUN/train.out" 2>&1 &
train=$!
tail -n +1 -f --pid=$train "$RUN/train.out" >&2 &
killed=0
while kill -0 $train 2>/dev/null; do
  if [ "$(grep -c '^\[T\] step' "$RUN/train.out" || true)" -ge "$STEPS" ]; then
    kill -TERM $train 2>/dev/null || true; killed=1; break
  fi
  sleep 1
done
status=0; wait $train || status=$?
sleep 1
if [ $killed = 0 ] && [ $status -ne 0 ]; then
  echo "llmq_bench: train exited with $status ($([ $status = 124 ] && echo "timeout ${TIMEOUT}s" || echo error))" >&2
  [ $status = 124 ] && parse_log "$RUN/train.out" "$MODEL" "$B" "$GA" "$STEPS" || true
  exit $status
fi
parse_log "$RUN/train.out" "$MODEL" "$B" "$GA" "$STEPS"
