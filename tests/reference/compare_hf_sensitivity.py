#!/usr/bin/env python3
"""Is compare_hf.py's 20-step check sensitive enough? qtrain is trained with one optimizer flag wrong
(lr +1%, beta2, weight decay, clipping) on two shapes; each variant must FAIL the check.
usage (GPU machine): python3 tests/reference/compare_hf_sensitivity.py --build build-gpu"""
import argparse, contextlib, io, os, sys

ap = argparse.ArgumentParser()
ap.add_argument("--build", default="build-gpu")
BUILD = ap.parse_args().build
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_hf as c
base = [s for s in c.SHAPES if s[0] in ("d64_gqa2_tied", "d128_gqa4_untied")]
orig_run = c.run
caught = True
for flag, wrong in [(f"--learning-rate={c.LR}", f"--learning-rate={c.LR * 1.01}"), ("--beta-2=0.95", "--beta-2=0.999"),
                    (f"--weight-decay={c.WEIGHT_DECAY}", "--weight-decay=0.0"), (f"--grad-clip={c.CLIP}", "--grad-clip=0")]:
    c.run = lambda cmd, f=flag, w=wrong: orig_run([w if x == f else x for x in cmd])
    c.SHAPES = base
    sys.argv = ["compare_hf.py", "--build", BUILD, "--work", "/tmp/sens", "--dtypes", "fp32"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try: c.main()
        except SystemExit: pass
    lines = [l.strip() for l in buf.getvalue().splitlines() if "AdamW steps" in l]
    caught &= len(lines) == len(base)  # the check ran on every shape
    for line in lines:
        print(f"qtrain {wrong}: {line}")
        caught &= line.endswith("FAIL")
print("every mismatch caught" if caught else "SOME MISMATCH WAS NOT CAUGHT")
sys.exit(0 if caught else 1)
