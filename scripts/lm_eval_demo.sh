#!/usr/bin/env bash
# Evaluates a Hugging Face model directory (the demo's demo-run/output/) with lm-eval on the local
# tasks of configs/lm_eval/ (held-out Genesis: kjv_genesis_mc, kjv_genesis_ppl; README "Evaluate with
# lm-eval"), offline. Writes OUT_DIR/results.json (lm-eval's results), OUT_DIR/samples_<task>.jsonl
# (each document's scores) and OUT_DIR/scores.md (the table below, also printed).
#   scripts/lm_eval_demo.sh MODEL_DIR [OUT_DIR]        (OUT_DIR default: MODEL_DIR/../lm_eval-results)
# Needs lm_eval 0.4.x with the hf extra (pip install "lm_eval[hf]"). Environment:
#   LM_EVAL_CORPUS      the corpus text (scripts/kjv_corpus.sh's output), default demo-run/kjv.txt
#   LM_EVAL_DATA        where the task data goes (scripts/lm_eval_tasks.py --out-dir), default demo-run/lm_eval
#   LM_EVAL_DEVICE      cuda or cpu (default: cuda when torch sees a GPU)
#   LM_EVAL_DTYPE       default float32
#   LM_EVAL_BATCH       default 32 on cuda, 8 on cpu
#   LM_EVAL_MAX_LENGTH  the rolling window of the perplexity task; default the --seq-len the model
#                       was trained with (MODEL_DIR/log.jsonl), else lm-eval's (max_position_embeddings)
#   LM_EVAL_LIMIT       evaluate only the first N documents of each task (a quick check)
#   PYTHON              default python3
#
# On the GPU machine (no network, no apt; device tool, run from the repository root): it has torch,
# transformers, accelerate, peft, pandas, pyarrow, scikit-learn and sacrebleu but not lm-eval, so
# .whl holds lm_eval 0.4.13 and the packages it needs that the image lacks (13 MB: datasets, evaluate,
# dill, multiprocess, pytablewriter and its six helpers, chardet, pytz, nltk, defusedxml,
# more-itertools, rouge-score, sqlitedict, word2number; pip download as the device README says,
# `pip wheel` for the last three, which PyPI has as sources only). It trains the GPU demo from
# build-demo/train (mkdir -p build-demo && cp build/train build-demo/; a CUDA build made here) on
# .refdata/ (mkdir -p .refdata && cp demo-run/data/train.bin demo-run/data/eval.bin demo-run/kjv.txt
# demo-run/qwen.tiktoken .refdata/), with .devdeps (../shared/gpu/stage-deps.sh: libfmt.so.9, which
# train links and the image lacks); carry: [".whl", "build-demo", ".refdata", ".devdeps"] (~40 MB):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; set -o pipefail; export PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=$PWD/.devdeps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}; nvidia-smi -L; DEMO_BIN=build-demo DEMO_DEVICE=cuda DEMO_TOKENIZER=.refdata/qwen.tiktoken DEMO_CORPUS=.refdata/kjv.txt DEMO_DATA=.refdata scripts/demo.sh > $OUT/demo.log 2>&1; echo "demo exit $?"; grep -E "^\[V\]|^== |^Done" $OUT/demo.log | tail -8; cp demo-run/output/log.jsonl $OUT/train_log.jsonl; scripts/lm_eval_demo.sh demo-run/output $OUT > $OUT/lm_eval.log 2>&1; echo "lm_eval exit $?"; grep -vE "it/s\]|s/it\]|examples/s\]" $OUT/lm_eval.log | tail -30
set -euo pipefail
usage="usage: scripts/lm_eval_demo.sh MODEL_DIR [OUT_DIR]"
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "$usage" >&2; exit 2; }
MODEL=$(cd "$1" && pwd)
OUT_DIR=${2:-$MODEL/../lm_eval-results}
mkdir -p "$OUT_DIR"; OUT_DIR=$(cd "$OUT_DIR" && pwd)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
CORPUS=${LM_EVAL_CORPUS:-demo-run/kjv.txt}
DATA=${LM_EVAL_DATA:-demo-run/lm_eval}
for f in config.json model.safetensors tokenizer.json; do
  [ -f "$MODEL/$f" ] || { echo "lm_eval_demo.sh: $MODEL has no $f (a model that train wrote with --tokenizer?)" >&2; exit 1; }
done
[ -f "$CORPUS" ] || { echo "lm_eval_demo.sh: no corpus text $CORPUS (scripts/kjv_corpus.sh, or set LM_EVAL_CORPUS)" >&2; exit 1; }
"$PY" -c "import lm_eval" 2>/dev/null || { echo "lm_eval_demo.sh: $PY has no lm_eval (pip install 'lm_eval[hf]')" >&2; exit 1; }

# Offline: the model and the data are local; nothing may reach for the Hub.
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export TOKENIZERS_PARALLELISM=false

# 1. The task data (and copies of the YAMLs that name it by its absolute path: the include path).
"$PY" scripts/lm_eval_tasks.py "$CORPUS" --out-dir "$DATA"

# 2. Settings.
DEVICE=${LM_EVAL_DEVICE:-$("$PY" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')}
DTYPE=${LM_EVAL_DTYPE:-float32}
if [ "$DEVICE" = cpu ]; then BATCH=${LM_EVAL_BATCH:-8}; else BATCH=${LM_EVAL_BATCH:-32}; fi
MAXLEN=${LM_EVAL_MAX_LENGTH:-}
if [ -z "$MAXLEN" ] && [ -f "$MODEL/log.jsonl" ]; then
  MAXLEN=$("$PY" -c '
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    if "options" in e:
        print(e["options"].get("seq-len", "")); break' "$MODEL/log.jsonl")
fi
MODEL_ARGS="pretrained=$MODEL,dtype=$DTYPE"
[ -n "$MAXLEN" ] && MODEL_ARGS+=",max_length=$MAXLEN"
LIMIT=(); [ -n "${LM_EVAL_LIMIT:-}" ] && LIMIT=(--limit "$LM_EVAL_LIMIT")

# 3. lm-eval (its own output folder holds the model path in its name; the files are copied out flat).
RAW=$(mktemp -d)
trap 'rm -rf "$RAW"' EXIT
echo "== lm_eval: model_args $MODEL_ARGS, device $DEVICE, batch $BATCH"
t0=$(date +%s)
"$PY" -m lm_eval --model hf --model_args "$MODEL_ARGS" \
  --tasks kjv_genesis_mc,kjv_genesis_ppl --include_path "$(cd "$DATA" && pwd)" \
  --device "$DEVICE" --batch_size "$BATCH" --output_path "$RAW" --log_samples "${LIMIT[@]}"
secs=$(( $(date +%s) - t0 ))

# 4. The scores.
"$PY" - "$RAW" "$OUT_DIR" "$MODEL" "$DEVICE" "$DTYPE" "$BATCH" "${MAXLEN:-default}" "$secs" <<'PY'
import glob, json, os, shutil, sys
raw, out, model, device, dtype, batch, maxlen, secs = sys.argv[1:]
results = sorted(glob.glob(f"{raw}/**/results_*.json", recursive=True), key=os.path.getmtime)
if not results:
    sys.exit("lm_eval_demo.sh: lm_eval wrote no results_*.json")
shutil.copyfile(results[-1], f"{out}/results.json")
for task in ("kjv_genesis_mc", "kjv_genesis_ppl"):
    for path in glob.glob(f"{raw}/**/samples_{task}_*.jsonl", recursive=True):
        shutil.copyfile(path, f"{out}/samples_{task}.jsonl")
r = json.load(open(results[-1]))
res, n = r["results"], r.get("n-samples", {})
def metric(task, name):
    v = res.get(task, {}).get(f"{name},none")
    s = res.get(task, {}).get(f"{name}_stderr,none")
    if v is None:
        return "n/a"
    return f"{v:.4f}" + (f" ± {s:.4f}" if isinstance(s, (int, float)) else "")
def count(task):
    return n.get(task, {}).get("effective", "?")
lines = [
    f"lm-eval {r.get('lm_eval_version', '?')} on {model} ({device}, {dtype}, batch {batch}, "
    f"max_length {maxlen}; {secs} s)",
    "",
    "| task | documents | metric | value |",
    "| --- | --- | --- | --- |",
    f"| kjv_genesis_mc | {count('kjv_genesis_mc')} | acc (chance 0.25) | {metric('kjv_genesis_mc', 'acc')} |",
    f"| kjv_genesis_mc | | acc_norm | {metric('kjv_genesis_mc', 'acc_norm')} |",
    f"| kjv_genesis_ppl | {count('kjv_genesis_ppl')} | word_perplexity | {metric('kjv_genesis_ppl', 'word_perplexity')} |",
    f"| kjv_genesis_ppl | | byte_perplexity | {metric('kjv_genesis_ppl', 'byte_perplexity')} |",
    f"| kjv_genesis_ppl | | bits_per_byte | {metric('kjv_genesis_ppl', 'bits_per_byte')} |",
]
text = "\n".join(lines) + "\n"
open(f"{out}/scores.md", "w").write(text)
print("== scores (" + out + "/scores.md)\n" + text, end="")
PY
