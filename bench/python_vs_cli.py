"""The Python Trainer against the `train` command line on the GPU (issue 23): the same options give
the same per-step losses bit for bit, and the Python-driven loop (qtrain.Trainer.step() from Python,
one call per step) runs within 1% of the CLI's tokens/s. Runs each configuration CLI, Python, CLI,
Python and compares medians of the step times after the warm-up.
    python3 bench/python_vs_cli.py --train-exe build/train --tokens random.bin [--steps 40]
(needs `import qtrain` built with the CUDA backend: QTRAIN_WHEEL_CUDA=ON pip wheel .)"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import qtrain

CONFIGS = {
    "bf16": dict(),
    "fp8": dict(matmul_dtype="e4m3", gradient_dtype="e5m2", fp8_fast_accum="all"),
}


def step_events(log: Path) -> list:
    return [e for e in map(json.loads, log.read_text().splitlines()) if e["log"] == "step"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-exe", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--model", default="Qwen2.5-0.5B")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=10)
    ap.add_argument("--work", default="/tmp/pyvscli")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    ok = True
    for name, extra in CONFIGS.items():
        base = dict(model=a.model, from_scratch=True, device="cuda", train_file=a.tokens, seq_len=1024,
                    batch_size=a.batch, grad_accumulation=1, steps=a.steps, eval_every_n_steps=0,
                    model_dtype="bf16", opt_m_dtype="bf16", opt_v_dtype="bf16", learning_rate=3e-4, warmup=2,
                    overwrite=True, **extra)
        times = {"cli": [], "python": []}
        losses = {}
        for rep in range(2):
            for who in ("cli", "python"):
                tag = f"{name}-{who}-{rep}"
                opts = dict(base, out_dir=str(work / tag), log_file=str(work / f"{tag}.jsonl"),
                            checkpoint_dir=str(work / f"{tag}-ckpt"))
                if who == "cli":
                    r = subprocess.run([a.train_exe, *qtrain.flags(**opts)], capture_output=True, text=True)
                    if r.returncode != 0:
                        print(r.stdout[-2000:], r.stderr[-2000:])
                        return 1
                    ev = step_events(work / f"{tag}.jsonl")
                    times[who].extend(e["duration_ms"] for e in ev[a.skip:])
                else:
                    # the Python side's step time is the wall time of the whole t.step() call, from
                    # Python (the engine's own duration_ms leaves out the binding and the result dict)
                    walls = []
                    with qtrain.Trainer(**opts) as t:
                        while t.next_step < t.steps:
                            t0 = time.perf_counter()
                            t.step()
                            walls.append(1000 * (time.perf_counter() - t0))
                        t._session.finish()
                    ev = step_events(work / f"{tag}.jsonl")
                    times[who].extend(walls[a.skip:])
                losses[(who, rep)] = [e["loss"] for e in ev]
        same = all(v == losses[("cli", 0)] for v in losses.values())
        cli_ms, py_ms = statistics.median(times["cli"]), statistics.median(times["python"])
        print(f"{name}: per-step losses {'bit-identical' if same else 'DIFFER'} over {a.steps} steps x 4 runs "
              f"(final {losses[('cli', 0)][-1]:.6f} / {losses[('python', 0)][-1]:.6f}); median step "
              f"cli {cli_ms:.2f} ms, python {py_ms:.2f} ms: python at {100 * cli_ms / py_ms:.2f}% of the CLI's "
              f"tokens/s ({a.batch * 1024 / cli_ms * 1000:,.0f} vs {a.batch * 1024 / py_ms * 1000:,.0f})")
        ok = ok and same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
