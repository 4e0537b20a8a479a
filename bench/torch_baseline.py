#!/usr/bin/env python3
"""PyTorch baseline for qtrain's benchmarks: the HF model of the preset's family (Qwen2ForCausalLM,
Qwen3ForCausalLM, LlamaForCausalLM) with the same shapes, fp32 master parameters, bf16 autocast, fused
AdamW, optionally torch.compile and torchao float8 training (tensorwise scaling, every Linear but
lm_head, as torchtitan does: the best PyTorch stack measured on the H200, /work/shared/gpu/NOTES.md);
random tokens; prints tokens/s (median over the timed steps), MFU and peak memory as one JSON line.

usage: python3 bench/torch_baseline.py --model Qwen2.5-0.5B --batch 16 --seq-len 1024 [--compile] [--float8]
"""
import argparse
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

# published shapes (hidden, intermediate, layers, heads, kv heads, head_dim, vocab, tied), as qtrain's presets
PRESETS = {
    "Qwen2.5-0.5B": ("qwen2", 896, 4864, 24, 14, 2, 64, 151936, True),
    "Qwen2.5-1.5B": ("qwen2", 1536, 8960, 28, 12, 2, 128, 151936, True),
    "Qwen2.5-3B": ("qwen2", 2048, 11008, 36, 16, 2, 128, 151936, True),
    "Qwen2.5-7B": ("qwen2", 3584, 18944, 28, 28, 4, 128, 152064, False),
    "Qwen3-0.6B": ("qwen3", 1024, 3072, 28, 16, 8, 128, 151936, True),
    "Qwen3-1.7B": ("qwen3", 2048, 6144, 28, 16, 8, 128, 151936, True),
    "Qwen3-8B": ("qwen3", 4096, 12288, 36, 32, 8, 128, 151936, False),
    "Llama-3.2-1B": ("llama", 2048, 8192, 16, 32, 8, 64, 128256, True),
    "Llama-3.2-3B": ("llama", 3072, 8192, 28, 24, 8, 128, 128256, True),
    "Llama-3.1-8B": ("llama", 4096, 14336, 32, 32, 8, 128, 128256, False),
}


def make_config(family, h, i, L, heads, kv, d, vocab, tied):
    common = dict(hidden_size=h, intermediate_size=i, num_hidden_layers=L, num_attention_heads=heads,
                  num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=tied)
    if family == "qwen2":
        return Qwen2Config(**common, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6)
    if family == "qwen3":
        return Qwen3Config(**common, head_dim=d, max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6)
    rope = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}
    import transformers
    if int(transformers.__version__.split(".")[0]) >= 5:  # 5.x reads rope_parameters, 4.x rope_scaling
        rope_args = {"rope_parameters": {**rope, "rope_theta": 5e5}}
    else:
        rope_args = {"rope_scaling": rope, "rope_theta": 5e5}
    return LlamaConfig(**common, head_dim=d, max_position_embeddings=131072, rms_norm_eps=1e-5, **rope_args)


def flops_per_token(h, i, L, heads, kv, d, vocab, T):
    per_layer = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * i
    return 6 * (L * per_layer + vocab * h) + 6 * L * T * heads * d


def time_random_token_steps(step, batch, seq_len, vocab, warmup, steps):
    """Median tokens/s of `steps` calls of step(x) after `warmup`, x fresh random tokens [batch, seq_len]
    on the GPU; resets the peak-memory counter first."""
    times = []
    torch.cuda.reset_peak_memory_stats()
    for s in range(warmup + steps):
        x = torch.randint(0, vocab - 256, (batch, seq_len), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(x).item()
        torch.cuda.synchronize()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
    return batch * seq_len / statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="Qwen2.5-0.5B", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--float8", action="store_true", help="torchao float8 training (tensorwise), every Linear but lm_head")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    a = ap.parse_args()

    family, h, i, L, heads, kv, d, vocab, tied = PRESETS[a.model]
    cfg = make_config(family, h, i, L, heads, kv, d, vocab, tied)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).cuda()
    if a.float8:
        from torchao.float8 import convert_to_float8_training
        convert_to_float8_training(model, module_filter_fn=lambda m, name: name != "lm_head")
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

    tps = time_random_token_steps(step, a.batch, a.seq_len, vocab, a.warmup, a.steps)
    fpt = flops_per_token(h, i, L, heads, kv, d, vocab, a.seq_len)
    system = "pytorch" + ("+float8" if a.float8 else "") + ("+compile" if a.compile else "")
    print(json.dumps({"system": system, "model": a.model, "batch": a.batch,
                      "seq_len": a.seq_len, "tokens_per_s": round(tps), "mfu": round(tps * fpt / (a.peak_tflops * 1e12), 4),
                      "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}))


if __name__ == "__main__":
    main()
