#!/usr/bin/env bash
# Times qtrain on one GPU with the settings llm.q publishes its H100 numbers with:
#   --from-scratch --seq-len=1024 --model-dtype=bf16 --opt-m-dtype=bf16 --opt-v-dtype=bf16, random tokens.
# usage: bench/bench_qtrain.sh MODEL BATCH [extra train flags...]   (SEQ=n: --seq-len, default 1024)
# GA=n sets --grad-accumulation (default 1); SKIP=n leaves out the first n steps (default 3; --gemm-autotune
# needs ~25: it tries algorithms in place until then). Prints one JSON line: median tokens/s over the
# steps after those, and the plan's memory.
# STOP_AFTER=n kills train once n steps are logged (SIGKILL: no checkpoint, no HF export, which takes a
# minute or more at 7B/14B); default STEPS, STOP_AFTER= (empty) runs train to its end. With
# QTRAIN_TIME_BREAKDOWN=1 it also waits for the op timer's table, which train prints after its last step. A train still
# running when this script ends (a `timeout` around it) is killed with it, so it cannot hold the GPU's
# memory (or write over the next run's train.out) after the script is gone. Where nvidia-smi exists, peak_mib is the
# highest device memory in use sampled every 0.3 s (CUDA context included: what a smaller card needs), and sm_mhz and
# power_w the median SM clock and power draw of the samples at >= half the run's highest power (the busy ones: the
# H200 holds its power cap by lowering the clock, so a step's GEMMs can run below the rate measured in bursts).
# FLOOR=1 runs no training: bench/step_floor_bench times the same command's GEMMs and attention alone (its
# last line is JSON too; the whole output in $BENCH_DIR/floor.out), so every script that calls this one
# (issue32_rows.sh, lora_bench.sh) gives the floor of its rows with FLOOR=1. FLOOR_SUSTAIN=SECONDS also runs the
# micro-batch's GEMMs and attention in sequence for that long (step_floor_bench --sustain: the floor at the clock a
# long run holds).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-Qwen2.5-0.5B}; BATCH=${2:-16}; shift 2 || true
BUILD=${BUILD_DIR:-build-gpu}
WORK=${BENCH_DIR:-/tmp/qtrain-bench}
mkdir -p "$WORK"
if [ -n "${FLOOR:-}" ]; then
  sustain=(); [ -z "${FLOOR_SUSTAIN:-}" ] || sustain=(--sustain="$FLOOR_SUSTAIN")
  "$BUILD/step_floor_bench" ${sustain[@]+"${sustain[@]}"} --model="$MODEL" --from-scratch --seq-len="${SEQ:-1024}" --batch-size="$BATCH" \
    --grad-accumulation="${GA:-1}" --model-dtype=bf16 --opt-m-dtype=bf16 --opt-v-dtype=bf16 "$@" > "$WORK/floor.out" 2>&1 || { tail -5 "$WORK/floor.out"; exit 1; }
  tail -1 "$WORK/floor.out"
  exit 0
fi
# VOCAB: the token file's vocabulary (default Qwen's; Llama 3's is 128000 ordinary tokens)
VOCAB=${VOCAB:-151643}
# TOKENS=FILE trains on that token file instead (e.g. chat data from tokenize --chat)
if [ -z "${TOKENS:-}" ]; then
TOKENS="$WORK/random.bin"; [ "$VOCAB" = 151643 ] || TOKENS="$WORK/random-$VOCAB.bin"
fi
[ -f "$TOKENS" ] || python3 bench/make_random_tokens.py "$TOKENS" --tokens 40000000 --vocab "$VOCAB" >/dev/null
STEPS=${STEPS:-12}
STOP_AFTER=${STOP_AFTER-$STEPS}
rm -f "$WORK/log.jsonl"
train=; smi=
cleanup() { set +e; [ -z "$train" ] || kill -9 $train 2>/dev/null; [ -z "$smi" ] || kill $smi 2>/dev/null; return 0; }
trap cleanup EXIT
trap 'exit 143' TERM INT
nvidia-smi --query-gpu=memory.used,clocks.sm,power.draw --format=csv,noheader,nounits -lms 300 > "$WORK/smi.txt" 2>/dev/null &
smi=$!
"$BUILD/train" --model="$MODEL" --from-scratch --device=cuda --train-file="$TOKENS" \
  --seq-len="${SEQ:-1024}" --batch-size="$BATCH" --grad-accumulation="${GA:-1}" --steps="$STEPS" --eval-every-n-steps=0 \
  --model-dtype=bf16 --opt-m-dtype=bf16 --opt-v-dtype=bf16 --learning-rate=3e-4 --warmup=2 \
  --out-dir="$WORK/out" --log-file="$WORK/log.jsonl" --overwrite "$@" > "$WORK/train.out" 2>&1 &
train=$!
# the op timer is on for any value but empty and 0 (cuda/op_timer.cpp)
timer_on=; [ -n "${QTRAIN_TIME_BREAKDOWN:-}" ] && [ "${QTRAIN_TIME_BREAKDOWN}" != 0 ] && timer_on=1
if [ -n "${STOP_AFTER:-}" ]; then
  while kill -0 $train 2>/dev/null; do
    if [ "$(cat "$WORK/log.jsonl" 2>/dev/null | grep -c '"log": *"step"')" -ge "$STOP_AFTER" ]; then
      # with the timer on, train prints its table after its last step, before the export: wait for the table's
      # last line ("idle or untimed"), so STOP_AFTER < STEPS then waits for every step (train may also have
      # ended by itself in between: the kill may find nothing)
      if [ -z "$timer_on" ] || grep -q "idle or untimed" "$WORK/train.out" 2>/dev/null; then
        kill -9 $train 2>/dev/null || true
      fi
    fi
    sleep 0.5
  done
fi
status=0; wait $train || status=$?
kill $smi 2>/dev/null || true; wait $smi 2>/dev/null || true
[ -n "${STOP_AFTER:-}" ] && [ $status -eq 137 ] && status=0
[ $status -eq 0 ] || { tail -5 "$WORK/train.out"; exit $status; }
python3 - "$WORK/log.jsonl" "$MODEL" "$BATCH" "${SKIP:-3}" "$WORK/smi.txt" "${SEQ:-1024}" <<'PY'
import json, statistics, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
steps = [e for e in ev if e["log"] == "step"][int(sys.argv[4]):]
alloc = next(e for e in ev if e["log"] == "allocator")
tps = statistics.median(e["step_tokens"] / e["duration_ms"] * 1000 for e in steps)
sol = next(e for e in ev if e["log"] == "sol")
# packed rows (--document-masking): useful tokens = the slots holding a document's token, padding not counted
ds = next((e for e in ev if e["log"] == "dataset" and e.get("packed")), None)
fill = ds["packed"]["document_tokens"] / (ds["packed"]["rows"] * int(sys.argv[6])) if ds else 1.0
# nvidia-smi's samples: "memory MiB, SM MHz, W" (a field it cannot read comes as "[N/A]")
def num(x):
    try:
        return float(x)
    except ValueError:
        return None
smi = [[num(f.strip()) for f in l.split(",")] for l in open(sys.argv[5]) if l.count(",") == 2]
mem = [r[0] for r in smi if r[0] is not None]
watts = [r[2] for r in smi if r[2] is not None]
busy = [r for r in smi if watts and r[2] is not None and r[2] >= max(watts) / 2 and r[1] is not None]
print(json.dumps({"system": "qtrain", "model": sys.argv[2], "batch": int(sys.argv[3]), "tokens_per_s": round(tps),
                  "mfu": round(tps * sol["flops_per_token"] / 989e12, 4),
                  "plan_gib": round(sum(s["device"] for s in alloc["stats"]) / 2**30, 2),
                  "pinned_gib": round(sum(s.get("pinned", 0) for s in alloc["stats"]) / 2**30, 2),
                  "peak_mib": int(max(mem)) if mem else None,
                  **({"sm_mhz": round(statistics.median(r[1] for r in busy)),
                      "power_w": round(statistics.median(r[2] for r in busy))} if busy else {}),
                  "final_loss": steps[-1]["loss"] if steps else None,
                  **({"fill_rate": round(fill, 4), "useful_tokens_per_s": round(tps * fill)} if ds else {})}))
PY
