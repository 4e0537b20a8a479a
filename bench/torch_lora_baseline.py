#!/usr/bin/env python3
"""PyTorch + PEFT baseline for issue 33's LoRA speed rows: the HF model of a preset (bench/torch_baseline.py's
shapes, random init: speed does not depend on the weights) loaded in bf16 and frozen, PEFT LoRA adapters
(rank --rank, alpha --alpha, dropout 0, every Linear of the blocks: q,k,v,o,gate,up,down; PEFT keeps them
in fp32 by default, autocast_adapter_dtype), bf16 autocast, fused AdamW over the adapters, optionally
torch.compile and gradient checkpointing (what HF fine-tuning uses to fit larger batches). Random
tokens at --seq-len. One JSON line: tokens/s (median over the timed steps), peak memory.

usage: python3 bench/torch_lora_baseline.py --model Qwen2.5-7B --batch 4 --seq-len 2048 [--compile | --compile-layers] [--checkpointing]
"""
import argparse
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM

from torch_baseline import PRESETS, make_config, time_random_token_steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="Qwen2.5-7B", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--compile", action="store_true", help="torch.compile the whole model")
    ap.add_argument("--compile-layers", action="store_true",
                    help="torch.compile each decoder layer instead (PyTorch's regional compilation: the layers are "
                         "alike, so one compiled layer is reused and compiling takes a layer's time, not the model's; "
                         "on the H200, 2026-12-04, whole-model compile of 7B + peft had not finished after 250 s)")
    ap.add_argument("--checkpointing", action="store_true", help="HF gradient checkpointing (recompute each block)")
    a = ap.parse_args()

    from peft import LoraConfig, get_peft_model

    family, h, i, L, heads, kv, d, vocab, tied = PRESETS[a.model]
    cfg = make_config(family, h, i, L, heads, kv, d, vocab, tied)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    # built on the GPU: HF's random init of a 7B model on the host takes a minute or more, and the
    # weights' values do not change the speed
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    print(f"# model built in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    if a.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    lora = LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = get_peft_model(model, lora)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0, fused=True)
    if a.compile and a.compile_layers:
        ap.error("--compile and --compile-layers: choose one")
    fwd = torch.compile(model) if a.compile else model
    if a.compile_layers:
        # the decoder layers under peft's wrappers: PeftModel -> LoraModel -> *ForCausalLM -> model.layers
        for layer in model.get_base_model().model.layers:
            layer.compile()

    def step(x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.perf_counter()
    tps = time_random_token_steps(step, a.batch, a.seq_len, vocab, a.warmup, a.steps)
    print(f"# {a.warmup} warm-up + {a.steps} timed steps (compilation included) in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr, flush=True)
    system = "pytorch+peft" + ("+compile" if a.compile else "") + ("+compile-layers" if a.compile_layers else "") + ("+checkpointing" if a.checkpointing else "")
    print(json.dumps({"system": system, "model": a.model, "batch": a.batch, "seq_len": a.seq_len, "rank": a.rank,
                      "trainable": sum(p.numel() for p in trainable), "tokens_per_s": round(tps),
                      "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}))


if __name__ == "__main__":
    main()
