#!/usr/bin/env bash
# The README's main job: tokenize a real English corpus (the King James Bible, from Debian's
# bible-kjv package, available offline) with Qwen2.5's tokenizer, train a small Qwen2-architecture
# model on it from scratch — on the GPU when there is one, else on the CPU reference model (a few
# minutes on 2 cores) — and plot the loss curve. demo-run/output/ is then a Hugging Face model
# (weights, config.json and the tokenizer files) that transformers and lm_eval load as it is.
#   scripts/demo.sh            outputs under demo-run/ (token files, model, log, loss.png)
# Environment: DEMO_STEPS overrides the number of steps, DEMO_DEVICE=cpu|cuda the device.
# Inputs made elsewhere (the GPU machine has no apt and no network; scripts/lm_eval_demo.sh's header
# shows such a run): DEMO_BIN=DIR runs DIR/train (and DIR/tokenize) instead of setting up and
# building, DEMO_TOKENIZER=FILE is the tokenizer (tokenizer.json or qwen.tiktoken), DEMO_CORPUS=FILE
# the corpus text (scripts/kjv_corpus.sh's output), DEMO_DATA=DIR the token files (train*.bin,
# eval.bin) of that corpus, which skips tokenizing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${DEMO_BIN:-}" ]; then
  BIN=$DEMO_BIN
else
  scripts/setup.sh
  scripts/build.sh
  BIN=build
fi
UV=$(command -v uv || echo "$HOME/.local/bin/uv")
RUN=demo-run
mkdir -p "$RUN"

# 1. The tokenizer: Qwen2.5's own tokenizer.json from the local HF cache if present, else the same
#    BPE ranks as qwen.tiktoken from the qwen-agent wheel on PyPI.
TOKENIZER=${DEMO_TOKENIZER:-}
[ -n "$TOKENIZER" ] || for m in Qwen/Qwen2.5-0.5B Qwen/Qwen2.5-0.5B-Instruct Qwen/Qwen2.5-1.5B; do
  snap=$(ls -d "${HF_HOME:-$HOME/.cache/huggingface}"/hub/models--${m/\//--}/snapshots/*/ 2>/dev/null | head -n1 || true)
  if [ -n "$snap" ] && [ -f "$snap/tokenizer.json" ]; then TOKENIZER="$snap/tokenizer.json"; break; fi
done
if [ -z "$TOKENIZER" ]; then
  scripts/tokenizer_fetch_tiktoken.sh "$RUN" >/dev/null
  TOKENIZER="$RUN/qwen.tiktoken"
fi
echo "== tokenizer: $TOKENIZER"

# 2. The corpus: one document per book (66; a blank line between books), verse references removed.
#    Rebuilt every run (a quarter of a second), so a corpus left by an older demo is never reused.
#    DEMO_CORPUS: a corpus made elsewhere, copied (scripts/lm_eval_tasks.py reads $RUN/kjv.txt).
if [ -n "${DEMO_CORPUS:-}" ]; then
  cp "$DEMO_CORPUS" "$RUN/kjv.txt"
else
  scripts/kjv_corpus.sh "$RUN/kjv.txt"
fi
echo "== corpus: $RUN/kjv.txt ($(wc -c < "$RUN/kjv.txt") bytes)"

# 3. Tokenize: the first document, Genesis, is the eval set; the other 65 books train.
DATA=${DEMO_DATA:-$RUN/data}
if [ -n "${DEMO_DATA:-}" ]; then
  echo "== token files: $DATA (made elsewhere)"
else
  "$BIN/tokenize" --tokenizer="$TOKENIZER" --input="$RUN/kjv.txt" --doc-separator=blank-line \
    --eval-documents=1 --out-dir="$DATA"
fi

# 4. Train from scratch.
DEVICE=${DEMO_DEVICE:-auto}
if [ "$DEVICE" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then DEVICE=cuda; else DEVICE=cpu; fi
fi
if [ "$DEVICE" = cuda ]; then
  MODEL=configs/demo-gpu; FLAGS=(--batch-size=16 --seq-len=512 --grad-accumulation=1 --steps=${DEMO_STEPS:-600}
                                 --learning-rate=1e-3 --warmup=50 --eval-every-n-steps=100 --eval-num-steps=20)
else
  MODEL=configs/demo-cpu; FLAGS=(--batch-size=8 --seq-len=128 --grad-accumulation=1 --steps=${DEMO_STEPS:-200}
                                 --learning-rate=2e-3 --warmup=20 --eval-every-n-steps=50 --eval-num-steps=8
                                 --lmhead-chunks=8)
fi
echo "== training $MODEL on $DEVICE"
# The demo starts over each time: --overwrite replaces the model, log and checkpoints of an earlier
# demo in demo-run/ (train refuses that without it)
"$BIN/train" --device="$DEVICE" --model="$MODEL" --from-scratch --tokenizer="$TOKENIZER" \
  --train-file="$DATA/train*.bin" --eval-file="$DATA/eval.bin" \
  --final-lr-fraction=0.1 --weight-decay=0.1 --grad-clip=1.0 \
  --out-dir="$RUN/output" --checkpoint-dir="$RUN/ckpt" --overwrite "${FLAGS[@]}"

# 5. Compare with the unigram entropy of the training data, and plot.
python3 - "$RUN" "$DATA" <<'PY'
import array, collections, glob, json, math, sys
run, data = sys.argv[1:3]
counts = collections.Counter()
for path in glob.glob(f"{data}/train*.bin"):
    with open(path, "rb") as f:
        f.seek(1024)
        toks = array.array("i"); toks.frombytes(f.read())
    counts.update(toks)
n = sum(counts.values())
h = -sum(c / n * math.log(c / n) for c in counts.values())
evals = [json.loads(l) for l in open(f"{run}/output/log.jsonl") if '"eval"' in l]
last = evals[-1]["loss"] if evals else float("nan")
print(f"== unigram entropy of the training tokens: {h:.3f} nats/token; final eval loss: {last:.3f} "
      f"({h - last:+.3f} below)")
PY
# A failed plot does not fail the demo, but says why (uv missing, no network for matplotlib, a bug).
if PNG=$("$UV" run --quiet scripts/plot_training_run.py "$RUN/output/log.jsonl" -o "$RUN/loss.png" 2>"$RUN/plot.err"); then
  echo "== loss curve: $PNG"
else
  echo "== loss curve: plot failed ($UV run scripts/plot_training_run.py):" >&2
  cat "$RUN/plot.err" >&2
fi
echo "== HF model: $RUN/output/ ($(cd "$RUN/output" && echo model.safetensors config.json tokenizer*.json))"
