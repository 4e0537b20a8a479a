#!/usr/bin/env -S uv run --script
# /// script
# requires-python = ">=3.9"
# dependencies = ["wandb>=0.17"]
# ///
"""Uploads a finished qtrain run (its JSON Lines log, --log-file) to Weights & Biases.

usage: uv run scripts/export_wandb.py --log-file output/log.jsonl --project NAME [--name N] [--entity E]
                                      [--mode online|offline]

Every event goes through qtrain.wandb_logging.WandbLogger, the class a Python training loop uses as
its live callback, so an exported run looks like a live-logged one (history at wandb step = completed
optimizer steps, options/model/system/dataset/memory in the config, checkpoints, resumes and the end
in the summary and its `events` table). A log that holds several runs appended (`--continue` appends)
is exported as its final history: a later run's steps replace the earlier run's from its resume point
on (wandb_logging.final_events). With --mode=offline nothing is uploaded: `wandb sync` the run
directory printed at the end later (no account needed to write it).

The module is loaded from this checkout (python/qtrain/wandb_logging.py, by path: no wheel needed),
else from an installed qtrain (`import qtrain.wandb_logging`).
"""
import argparse
import importlib.util
import os
import sys


def load_wandb_logging():
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "qtrain", "wandb_logging.py")
    if os.path.exists(here):
        spec = importlib.util.spec_from_file_location("qtrain_wandb_logging", here)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # (dataclass-style lookups of the module by name)
        spec.loader.exec_module(module)
        return module
    import qtrain.wandb_logging

    return qtrain.wandb_logging


def export_settings():
    """An export's wandb settings: no system metrics or console of this (exporting) machine."""
    import wandb

    try:
        return wandb.Settings(x_disable_stats=True, console="off")
    except Exception:  # an older wandb without the setting
        return wandb.Settings(console="off")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log-file", required=True, help="JSON Lines log written by train (--log-file)")
    ap.add_argument("--project", required=True, help="W&B project")
    ap.add_argument("--name", default=None, help="run name (default: wandb's)")
    ap.add_argument("--entity", default=None, help="W&B entity (default: your default entity)")
    ap.add_argument("--mode", choices=["online", "offline"], default=None,
                    help="online uploads now, offline writes a local run for `wandb sync` (default: WANDB_MODE, else online)")
    args = ap.parse_args(argv)

    wl = load_wandb_logging()
    try:
        events, replaced = wl.final_events(wl.read_log(args.log_file))
    except (OSError, ValueError) as e:
        sys.exit(f"export_wandb: {e}")
    if not any(e.get("log") == "step" for e in events):
        sys.exit(f"export_wandb: {args.log_file}: no step events (is it a qtrain log?)")

    logger = wl.WandbLogger(project=args.project, name=args.name, entity=args.entity, mode=args.mode,
                            settings=export_settings(), job_type="export")
    with logger:
        for event in events:
            logger(event)
        if replaced:
            logger.run.summary["log/replaced_events"] = replaced
    steps = sum(1 for e in events if e.get("log") == "step")
    evals = sum(1 for e in events if e.get("log") == "eval")
    note = f" ({replaced} step/eval events of earlier runs in the log replaced by later ones)" if replaced else ""
    print(f"exported {steps} steps and {evals} evaluations from {args.log_file}{note}")
    print(f"with {os.path.realpath(wl.__file__)}")
    if getattr(logger.run, "url", None):
        print(f"run: {logger.run.url}")
    print(f"run directory: {os.path.dirname(logger.run.dir)}")


if __name__ == "__main__":
    main()
