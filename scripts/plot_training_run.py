#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.9"
# dependencies = ["matplotlib"]
# ///
"""Plots the training and evaluation loss of a qtrain run from its JSON Lines log.

usage: uv run scripts/plot_training_run.py output/log.jsonl [-o output/loss.png]
"""
import argparse
import json
import math
import sys


def read_log(path):
    steps, losses, eval_steps, eval_losses, lrs = [], [], [], [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            ev = json.loads(line)
            if ev.get("log") == "step":
                # a resumed run appends: later entries for the same step replace earlier ones
                while steps and steps[-1] >= ev["step"]:
                    steps.pop(); losses.pop(); lrs.pop()
                steps.append(ev["step"]); losses.append(ev["loss"]); lrs.append(ev.get("lr", math.nan))
            elif ev.get("log") == "eval":
                while eval_steps and eval_steps[-1] >= ev["step"]:
                    eval_steps.pop(); eval_losses.pop()
                eval_steps.append(ev["step"]); eval_losses.append(ev["loss"])
    return steps, losses, eval_steps, eval_losses, lrs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", help="JSON Lines log written by train (--log-file)")
    ap.add_argument("-o", "--output", default=None, help="PNG to write (default: loss.png beside the log)")
    args = ap.parse_args()

    steps, losses, eval_steps, eval_losses, lrs = read_log(args.log)
    if not steps:
        sys.exit(f"{args.log}: no step events found")
    out = args.output
    if out is None:
        out = args.log.rsplit("/", 1)[0] + "/loss.png" if "/" in args.log else "loss.png"

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(steps, losses, lw=1, alpha=0.8, label="train")
    if eval_steps:
        ax.plot(eval_steps, eval_losses, "o-", lw=1.5, label="eval")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(steps, lrs, color="gray", lw=0.8, ls="--", label="learning rate")
    ax2.set_ylabel("learning rate", color="gray")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper right")
    ax.set_title(f"{args.log}: final train {losses[-1]:.3f}" + (f", eval {eval_losses[-1]:.3f}" if eval_losses else ""))
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(out)


if __name__ == "__main__":
    main()
