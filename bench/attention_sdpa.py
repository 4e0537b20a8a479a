"""PyTorch SDPA (flash backend) causal GQA attention, forward and backward, timed the way
bench/attention_bench.cu times qtrain's kernels: median of 20 runs (CUDA events around each run)
after 3 warm-ups, TFLOP/s counted as forward 4*B*Hq*T*T*D/2 (causal), backward 2.5x forward.

q, k, v are [B, T, H, D] bf16 tensors (the layout our fused projection produces) passed to SDPA as
[B, H, T, D] transposed views, as Hugging Face's Qwen2 does.

    python3 bench/attention_sdpa.py                 # the default shape list
    python3 bench/attention_sdpa.py B T Hq Hkv D    # one shape
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [
    (32, 1024, 14, 2, 64),   # Qwen2.5-0.5B, batch 32
    (16, 1024, 12, 2, 128),  # Qwen2.5-1.5B, batch 16
    (8, 2048, 12, 2, 128),   # 1.5B at seq 2048
    (4, 1024, 28, 4, 128),   # Qwen2.5-7B, batch 4
]


def median_ms(fn, warmup=3, iters=20):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[iters // 2]


def attention(q, k, v, gqa_native):
    """q [B,T,Hq,D], k/v [B,T,Hkv,D] -> out [B,Hq,T,D] (causal, flash backend)."""
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        if gqa_native:
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)
        rep = q.shape[2] // k.shape[2]
        return F.scaled_dot_product_attention(
            qt, kt.repeat_interleave(rep, dim=1), vt.repeat_interleave(rep, dim=1), is_causal=True)


def bench(B, T, Hq, Hkv, D):
    dev, dt = "cuda", torch.bfloat16
    q = (torch.rand(B, T, Hq, D, device=dev, dtype=dt) * 4 - 2).requires_grad_()
    k = (torch.rand(B, T, Hkv, D, device=dev, dtype=dt) * 4 - 2).requires_grad_()
    v = (torch.rand(B, T, Hkv, D, device=dev, dtype=dt) * 4 - 2).requires_grad_()
    dout = torch.rand(B, Hq, T, D, device=dev, dtype=dt) * 4 - 2

    gqa_native = True
    try:
        attention(q, k, v, True)
    except (RuntimeError, TypeError) as e:  # older torch / backend without GQA: expand K and V
        print(f"# enable_gqa unavailable on the flash backend ({e}); timing with K/V repeated")
        gqa_native = False

    fwd_ms = median_ms(lambda: attention(q, k, v, gqa_native))
    out = attention(q, k, v, gqa_native)
    bwd_ms = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))

    fwd_flops = 4.0 * B * Hq * T * T * D / 2.0
    bwd_flops = 2.5 * fwd_flops
    print(f"sdpa  B={B:<3d} T={T:<5d} Hq={Hq:<3d} Hkv={Hkv:<2d} D={D:<4d} | "
          f"fwd {fwd_ms:8.3f} ms {fwd_flops / fwd_ms * 1e-9:7.1f} TFLOP/s | "
          f"bwd {bwd_ms:8.3f} ms {bwd_flops / bwd_ms * 1e-9:7.1f} TFLOP/s | "
          f"fwd+bwd {(fwd_flops + bwd_flops) / (fwd_ms + bwd_ms) * 1e-9:7.1f} TFLOP/s"
          + ("" if gqa_native else " (K/V repeated)"), flush=True)


def main():
    args = [int(a) for a in sys.argv[1:]]
    if len(args) == 5:
        shapes = [tuple(args)]
    elif not args:
        shapes = SHAPES
    else:
        sys.exit(f"usage: {sys.argv[0]} [B T Hq Hkv D]")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for s in shapes:
        bench(*s)


if __name__ == "__main__":
    main()
