"""qtrain-demo: the README's demo from Python. Tokenizes a text corpus (documents separated by blank
lines; the first is held out for evaluation, as scripts/demo.sh holds out Genesis), trains a small
Qwen2-architecture model on it from scratch with qtrain.Trainer — on the GPU when there is one, else
on the CPU reference model — exports it as a Hugging Face directory and plots the loss curve.

    qtrain-demo --text kjv.txt --tokenizer tokenizer.json      # scripts/kjv_corpus.sh writes kjv.txt
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from collections import Counter
from pathlib import Path

import qtrain

CONFIGS = Path(__file__).parent / "configs"  # demo-cpu / demo-gpu (the repo's configs/, in the wheel)


def find_tokenizer() -> str | None:
    """Qwen2.5's tokenizer.json from the local Hugging Face cache, as scripts/demo.sh looks for it."""
    import os

    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    for name in ("Qwen2.5-0.5B", "Qwen2.5-0.5B-Instruct", "Qwen2.5-1.5B"):
        for snap in sorted((home / "hub" / f"models--Qwen--{name}" / "snapshots").glob("*/tokenizer.json")):
            return str(snap)
    return None


def _gpu_visible() -> bool:
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="qtrain-demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--text", required=True, help="the corpus: plain text, documents separated by blank lines")
    p.add_argument("--tokenizer", help="tokenizer.json or a tiktoken file (default: Qwen2.5's from the HF cache)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--steps", type=int, help="optimizer steps (default: 600 on the GPU, 200 on the CPU)")
    p.add_argument("--out-dir", default="demo-run-py", help="token files, checkpoints, output/, log, loss.png")
    a = p.parse_args(argv)

    tokenizer = a.tokenizer or find_tokenizer()
    if not tokenizer:
        p.error("no --tokenizer given and no Qwen2.5 tokenizer.json in the local HF cache")
    docs = [d.strip() for d in Path(a.text).read_text(encoding="utf-8").split("\n\n") if d.strip()]
    if len(docs) < 2:
        p.error(f"--text {a.text}: {len(docs)} document(s); need at least 2 (the first is the eval set)")
    out = Path(a.out_dir)
    (out / "data").mkdir(parents=True, exist_ok=True)

    # 1. tokenize: the first document evaluates, the others train
    tok = qtrain.Tokenizer.load(tokenizer)
    vocab = json.loads((CONFIGS / "demo-cpu" / "config.json").read_text())["vocab_size"]
    eval_ids = qtrain.tokenize(docs[:1], tok, out=str(out / "data" / "eval.bin"), vocab_size=vocab)
    train_ids = qtrain.tokenize(docs[1:], tok, out=str(out / "data" / "train.bin"), vocab_size=vocab)
    print(f"== tokenized {len(docs)} documents: {len(train_ids)} training tokens, {len(eval_ids)} eval tokens")

    # 2. train
    device = a.device if a.device != "auto" else ("cuda" if _gpu_visible() else "cpu")
    if device == "cuda":
        model, flags = "demo-gpu", dict(batch_size=16, seq_len=512, steps=a.steps or 600, learning_rate=1e-3,
                                        warmup=50, eval_every_n_steps=100, eval_num_steps=20)
    else:
        model, flags = "demo-cpu", dict(batch_size=8, seq_len=128, steps=a.steps or 200, learning_rate=2e-3,
                                        warmup=20, eval_every_n_steps=50, eval_num_steps=8, lmhead_chunks=8)
    print(f"== training {model} on {device}")
    losses = []
    with qtrain.Trainer(model=str(CONFIGS / model), from_scratch=True, device=device, tokenizer=tokenizer,
                        train_file=str(out / "data" / "train.bin"), eval_file=str(out / "data" / "eval.bin"),
                        grad_accumulation=1, final_lr_fraction=0.1, weight_decay=0.1, grad_clip=1.0,
                        out_dir=str(out / "output"), checkpoint_dir=str(out / "ckpt"), overwrite=True,
                        callback=lambda e: losses.append(e) if e.get("log") in ("step", "eval") else None,
                        **flags) as t:
        t.run()

    # 3. against the unigram entropy of the training tokens, and the curve
    counts, n = Counter(train_ids.tolist()), len(train_ids)
    h = -sum(c / n * math.log(c / n) for c in counts.values())
    evals = [e["loss"] for e in losses if e["log"] == "eval"]
    print(f"== unigram entropy of the training tokens: {h:.3f} nats/token; final eval loss: {evals[-1]:.3f} "
          f"({h - evals[-1]:+.3f} below)")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("== no matplotlib (pip install 'qtrain[plot]'): no loss curve")
        return 0
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([e["step"] for e in losses if e["log"] == "step"], [e["loss"] for e in losses if e["log"] == "step"],
            label="train")
    ax.plot([e["step"] for e in losses if e["log"] == "eval"], evals, "o-", label="eval")
    ax.axhline(h, ls="--", c="gray", label="unigram entropy")
    ax.set_xlabel("step"), ax.set_ylabel("loss (nats/token)"), ax.legend()
    fig.savefig(out / "loss.png", dpi=120)
    print(f"== model: {out / 'output'}; loss curve: {out / 'loss.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
