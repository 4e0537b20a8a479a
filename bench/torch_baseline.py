#!/usr/bin/env python3
"""PyTorch baseline for qtrain's benchmarks: HF Qwen2ForCausalLM with the same shapes, fp32 master
parameters, bf16 autocast, fused AdamW, optionally torch.compile; random tokens; prints tokens/s
(median over the timed steps), MFU and peak memory as one JSON line.

usage: python3 bench/torch_baseline.py --model Qwen2.5-0.5B --batch 16 --seq-len 1024 [--compile]
"""
import argparse
import json
import statistics
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

PRESETS = {  # published Qwen2.5 shapes (hidden, intermediate, layers, heads, kv heads, vocab, tied)
    "Qwen2.5-0.5B": (896, 4864, 24, 14, 2, 151936, True),
    "Qwen2.5-1.5B": (1536, 8960, 28, 12, 2, 151936, True),
    "Qwen2.5-3B": (2048, 11008, 36, 16, 2, 151936, True),
    "Qwen2.5-7B": (3584, 18944, 28, 28, 4, 152064, False),
}


def flops_per_token(h, i, L, heads, kv, vocab, T):
    d = h // heads
    per_layer = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * i
    return 6 * (L * per_layer + vocab * h) + 6 * L * T * heads * d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="Qwen2.5-0.5B", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    a = ap.parse_args()

    h, i, L, heads, kv, vocab, tied = PRESETS[a.model]
    cfg = Qwen2Config(hidden_size=h, intermediate_size=i, num_hidden_layers=L, num_attention_heads=heads,
                      num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=tied,
                      max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if a.compile else model

    def step(x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    times = []
    torch.cuda.reset_peak_memory_stats()
    for s in range(a.warmup + a.steps):
        x = torch.randint(0, 151643, (a.batch, a.seq_len), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step(x)
        loss.item()
        torch.cuda.synchronize()
        if s >= a.warmup:
            times.append(time.perf_counter() - t0)
    tokens = a.batch * a.seq_len
    tps = tokens / statistics.median(times)
    fpt = flops_per_token(h, i, L, heads, kv, vocab, a.seq_len)
    print(json.dumps({"system": "pytorch" + ("+compile" if a.compile else ""), "model": a.model, "batch": a.batch,
                      "seq_len": a.seq_len, "tokens_per_s": round(tps), "mfu": round(tps * fpt / (a.peak_tflops * 1e12), 4),
                      "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}))


if __name__ == "__main__":
    main()
