#!/usr/bin/env python3
"""Does a GEMM's speed depend on its operands' values? At a fixed clock it does not, but its power does (the
bits that toggle), and a GPU at its power cap holds it by lowering the clock. One 8192 x 5120 x 13824 GEMM
(14B's gate|up shape at batch 8 x 1024), bf16 (torch matmul) and FP8 e4m3 (torch._scaled_mm, fast
accumulation), on constant operands (0.011 everywhere) and on random ones (randn; the weight-like operand
x 0.02, x 50 again before the FP8 cast so its codes use the range): each run back to back for 5 s to reach
the clock it holds, then 2 s timed; the SM clock and power sampled by nvidia-smi during the 5 s.
Needs torch with CUDA (the GPU machine's reference stack); docs/perf-notes.md, session 26, has what it showed.

usage: python3 bench/gemm_data_power.py
"""
import subprocess
import time

import torch

M, K, N = 8192, 5120, 13824


def smi() -> str:
    return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True).stdout.strip()


def operands(dtype: str, kind: str):
    torch.manual_seed(0)
    if kind == "const":
        a, b = torch.full((M, K), 0.011, device="cuda"), torch.full((N, K), 0.011, device="cuda")
    else:
        a, b = torch.randn(M, K, device="cuda"), torch.randn(N, K, device="cuda") * 0.02
    if dtype == "bf16":
        a, b = a.bfloat16(), b.bfloat16()
        return lambda: a @ b.t()
    a, b = a.to(torch.float8_e4m3fn), (b * 50).to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    return lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True)


def main() -> None:
    for dtype in ("bf16", "fp8"):
        for kind in ("const", "randn"):
            f = operands(dtype, kind)
            for _ in range(20):
                f()
            torch.cuda.synchronize()
            t0, n, samples = time.time(), 0, []
            while time.time() - t0 < 5:  # reach the clock a long run holds
                for _ in range(20):
                    f()
                n += 20
                if n % 200 == 0:
                    samples.append(smi())
                if n % 100 == 0:
                    torch.cuda.synchronize()
            torch.cuda.synchronize()
            t1, m = time.time(), 0
            while time.time() - t1 < 2:
                for _ in range(20):
                    f()
                m += 20
                torch.cuda.synchronize()
            rate = 2 * M * K * N * m / (time.time() - t1) / 1e12
            print(f"{dtype} {kind}: {rate:.0f} TFLOP/s (last 2 s), clock,W samples {samples[-3:]}", flush=True)
            del f
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
