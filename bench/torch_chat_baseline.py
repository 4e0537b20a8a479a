#!/usr/bin/env python3
"""PyTorch baseline for issue 31's fine-tuning throughput: the HF model of a preset (bench/torch_baseline.py's
shapes, random init: speed does not depend on the weights) trained on the conversations of a qtrain chat
token file, the way HF fine-tuning runs by default: a batch of whole conversations, padded to the longest
one in the batch (rounded up to a multiple of 64 so torch.compile sees few shapes), labels -100 on padding
and on the tokens the file's mask does not train, attention_mask for the padding. fp32 master parameters,
bf16 autocast, fused AdamW, optionally torch.compile (dynamic shapes).

The conversations come from the token file `tokenize` writes for chat data (BIN.TOK v2 with masks and
document starts, src/io/token_file.h), so both systems train on exactly the same tokens. Conversations
longer than --max-len are cut to it. Prints one JSON line: useful tokens/s (real tokens, padding not
counted) as the median over the timed steps, the padding fraction, peak memory.

usage: python3 bench/torch_chat_baseline.py --model Qwen2.5-0.5B --tokens chat.bin --batch 16 --max-len 2048 [--compile]
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from torch_baseline import PRESETS, make_config


def read_conversations(path):
    """(tokens, trained mask) per document of a BIN.TOK v2 file with document starts."""
    raw = np.fromfile(path, dtype=np.uint8)
    header = raw[:1024].view(np.int32)
    assert bytes(raw[:8]) == b"BIN.TOK\n", f"{path}: not a BIN.TOK file"
    n, has_masks, has_starts = int(header[4]), int(header[6]), int(header[7])
    assert has_starts, f"{path}: no document starts (write it with tokenize's chat mode)"
    tokens = raw[1024:1024 + 4 * n].view(np.int32)
    nbytes = (n + 7) // 8
    off = 1024 + 4 * n
    mask = np.unpackbits(raw[off:off + nbytes], bitorder="little")[:n].astype(bool) if has_masks else np.ones(n, bool)
    off += nbytes if has_masks else 0
    starts = np.flatnonzero(np.unpackbits(raw[off:off + nbytes], bitorder="little")[:n])
    ends = list(starts[1:]) + [n]
    return [(tokens[s:e], mask[s:e]) for s, e in zip(starts, ends)]


def make_batch(convs, max_len, pad_id, multiple, width=None):
    convs = [(t[:max_len], m[:max_len]) for t, m in convs]
    longest = max(len(t) for t, _ in convs)
    if width is None:
        width = min((longest + multiple - 1) // multiple * multiple, max(max_len, longest))
    convs = [(t[:width], m[:width]) for t, m in convs]
    ids = np.full((len(convs), width), pad_id, np.int64)
    labels = np.full((len(convs), width), -100, np.int64)
    attn = np.zeros((len(convs), width), np.int64)
    for r, (t, m) in enumerate(convs):
        ids[r, :len(t)] = t
        attn[r, :len(t)] = 1
        labels[r, :len(t)] = np.where(m, t, -100)  # HF shifts: label at i is predicted from position i-1
    useful = sum(len(t) for t, _ in convs)
    return torch.from_numpy(ids), torch.from_numpy(labels), torch.from_numpy(attn), useful, ids.size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="Qwen2.5-0.5B", choices=sorted(PRESETS))
    ap.add_argument("--tokens", required=True, help="chat token file written by tokenize (masks + document starts)")
    ap.add_argument("--batch", type=int, default=16, help="conversations per step")
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pad-multiple", type=int, default=64,
                    help="round the batch's width up to a multiple of this (fewer shapes for torch.compile: on the "
                         "H200, 2026-12-03, --compile at 64 was still recompiling after 300 s; --pad-multiple=--max-len "
                         "gives one static shape, i.e. padding every batch to --max-len)")
    a = ap.parse_args()

    convs = read_conversations(a.tokens)
    order = np.random.default_rng(a.seed).permutation(len(convs))
    family, h, i, L, heads, kv, d, vocab, tied = PRESETS[a.model]
    cfg = make_config(family, h, i, L, heads, kv, d, vocab, tied)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.0, fused=True)
    # Few widths (--max-len / --pad-multiple <= 8): compile each static shape once before timing, so no
    # timed step compiles; many widths: dynamic shapes (which, on the H200, kept recompiling past 300 s).
    widths = sorted({min(w, a.max_len) for w in range(a.pad_multiple, a.max_len + a.pad_multiple, a.pad_multiple)})
    static = len(widths) <= 8
    fwd = torch.compile(model, dynamic=not static) if a.compile else model

    def step(ids, labels, attn):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(input_ids=ids, attention_mask=attn, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    if a.compile and static:
        for w in widths:  # one step per width, on real conversations padded (or cut) to it
            t0 = time.perf_counter()
            warm = [convs[j] for j in order[:a.batch]]
            warm[-1] = (warm[-1][0][:w // 2], warm[-1][1][:w // 2])  # one padded row, as real batches have
            ids, labels, attn, _, _ = make_batch(warm, a.max_len, 0, a.pad_multiple, w)
            step(ids.cuda(), labels.cuda(), attn.cuda()).item()
            print(f"compiled width {w}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    rates, useful_total, slots_total = [], 0, 0
    torch.cuda.reset_peak_memory_stats()
    for s in range(a.warmup + a.steps):
        pick = order[(s * a.batch) % len(order):][:a.batch]
        if len(pick) < a.batch:
            pick = order[:a.batch]
        ids, labels, attn, useful, slots = make_batch([convs[j] for j in pick], a.max_len, 0, a.pad_multiple)
        ids, labels, attn = ids.cuda(), labels.cuda(), attn.cuda()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(ids, labels, attn).item()
        torch.cuda.synchronize()
        print(f"step {s}: width {ids.shape[1]}, {time.perf_counter() - t0:.3f} s", file=sys.stderr, flush=True)
        if s >= a.warmup:
            rates.append(useful / (time.perf_counter() - t0))
            useful_total += useful
            slots_total += slots
    system = "pytorch" + ("+compile" if a.compile else "") + "+padded"
    print(json.dumps({"system": system, "model": a.model, "conversations_per_step": a.batch, "max_len": a.max_len,
                      "pad_multiple": a.pad_multiple,
                      "useful_tokens_per_s": round(statistics.median(rates)),
                      "padding_fraction": round(1 - useful_total / slots_total, 4),
                      "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}))


if __name__ == "__main__":
    main()
