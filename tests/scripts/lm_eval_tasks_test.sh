#!/usr/bin/env bash
# ctest LmEvalTasks: scripts/lm_eval_tasks.py builds the local lm-eval tasks' data from the demo's
# corpus the same way twice (fixed seed), from Genesis alone: every multiple-choice row is a Genesis
# verse cut in two, its label naming the verse's own ending among 4 distinct ones; the perplexity
# passages are all of Genesis in order; the YAML copies name the data by absolute paths.
#   tests/scripts/lm_eval_tasks_test.sh SOURCE_DIR   (exit 77 = skipped: no `bible`)
set -euo pipefail
src="${1:?usage: lm_eval_tasks_test.sh SOURCE_DIR}"
command -v bible >/dev/null || { echo "skipped: no 'bible' command (Debian package bible-kjv)"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$src/scripts/kjv_corpus.sh" "$tmp/kjv.txt"
python3 "$src/scripts/lm_eval_tasks.py" "$tmp/kjv.txt" --out-dir "$tmp/a" >/dev/null
python3 "$src/scripts/lm_eval_tasks.py" "$tmp/kjv.txt" --out-dir "$tmp/b" >/dev/null
for f in kjv_genesis_mc.jsonl kjv_genesis_ppl.jsonl; do
  cmp "$tmp/a/$f" "$tmp/b/$f" || { echo "FAIL: $f differs between two runs" >&2; exit 1; }
done
python3 - "$tmp/kjv.txt" "$tmp/a" <<'PY'
import json, sys
corpus, out = sys.argv[1:]
genesis = open(corpus, encoding="utf-8").read().split("\n\n")[0].split("\n")
assert len(genesis) == 1533, len(genesis)
verses = set(genesis)
mc = [json.loads(l) for l in open(f"{out}/kjv_genesis_mc.jsonl", encoding="utf-8")]
assert len(mc) == sum(len(v.split()) >= 8 for v in genesis), len(mc)
labels = [0] * 4
for row in mc:
    endings = row["endings"]
    assert len(endings) == 4 and len(set(endings)) == 4, row
    assert row["context"] + " " + endings[row["label"]] in verses, row
    assert not row["context"].endswith(" ") and all(not e.startswith(" ") for e in endings), row
    labels[row["label"]] += 1
assert min(labels) > len(mc) // 8, labels  # the true ending is not always in one place
ppl = [json.loads(l) for l in open(f"{out}/kjv_genesis_ppl.jsonl", encoding="utf-8")]
assert "\n".join(r["text"] for r in ppl) == "\n".join(genesis), "passages are not Genesis in order"
for name in ("kjv_genesis_mc", "kjv_genesis_ppl"):
    yaml = open(f"{out}/{name}.yaml", encoding="utf-8").read()
    assert f"test: {out}/{name}.jsonl" in yaml, name
    assert f"task: {name}" in yaml, name
print(f"ok: {len(mc)} multiple-choice rows (labels {labels}), {len(ppl)} passages")
PY
