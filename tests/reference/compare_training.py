#!/usr/bin/env python3
"""300 steps of training from one init: qtrain (bf16) vs PyTorch (HF Qwen2ForCausalLM, fp32 master
weights, bf16 autocast, torch AdamW), same data order, same hyper-parameters. Passes when the final
eval losses (whole eval set) agree within 1%.

usage: python3 tests/reference/compare_training.py --build build-gpu --train T.bin --eval E.bin
The PyTorch side re-implements qtrain's data order (src/train/data_loader.cpp: chunks of T+1 tokens,
per-epoch Fisher-Yates with splitmix64), LR schedule (src/train/lr_schedule.cpp) and AdamW grouping
(decay on matrices and embeddings only), so both see identical batches and learning rates.
"""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from transformers import Qwen2Config, Qwen2ForCausalLM

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def splitmix64(state):
    state = (state + GOLDEN) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def epoch_order(n, seed, epoch):
    s = (seed ^ ((0x5EEDDA7A + epoch * GOLDEN) & M64)) & M64
    _, rng = splitmix64(s)
    order = list(range(n))
    for i in range(n, 1, -1):
        rng, r = splitmix64(rng)
        j = r % i
        order[i - 1], order[j] = order[j], order[i - 1]
    return order


def read_tokens(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        return np.frombuffer(f.read(4 * int(header[4])), dtype=np.int32)


def lr_at(step, peak, total, warmup, final_frac):
    if step < warmup:
        return peak * (step + 1) / warmup
    pos = min(max((step - warmup) / max(total - warmup, 1), 0.0), 1.0)
    final = peak * final_frac
    return final + (peak - final) * 0.5 * (1 + math.cos(math.pi * pos))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-gpu")
    ap.add_argument("--train", required=True)
    ap.add_argument("--eval", required=True)
    ap.add_argument("--work", default="/tmp/qtrain-cmp")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--extra", default="", help="extra qtrain flags (e.g. --matmul-dtype=e4m3)")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    seed, final_frac, wd, clip = 42, 0.1, 0.1, 1.0

    # the shared init
    model_dir = os.path.join(a.work, "init")
    # RoPE base and eps that no fallback gives (qtrain's: 10000, 1e-6). transformers 5 turns the
    # rope_theta argument into rope_parameters and writes only that; 4.x writes rope_theta.
    theta, eps = 500000.0, 1e-5
    cfg = Qwen2Config(vocab_size=151936, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True,
                      max_position_embeddings=4096, rope_theta=theta, rms_norm_eps=eps)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(model_dir, safe_serialization=True)

    # qtrain
    out = os.path.join(a.work, "qtrain")
    cmd = [f"{a.build}/train", "--device=cuda", f"--model={model_dir}", f"--train-file={a.train}",
           f"--eval-file={a.eval}", f"--steps={a.steps}", f"--batch-size={a.batch}", f"--seq-len={a.seq_len}",
           "--grad-accumulation=1", f"--learning-rate={a.lr}", f"--warmup={a.warmup}",
           f"--final-lr-fraction={final_frac}", f"--weight-decay={wd}", f"--grad-clip={clip}", "--model-dtype=bf16",
           f"--eval-every-n-steps={a.steps}", "--eval-num-steps=0", f"--seed={seed}", f"--out-dir={out}",
           f"--checkpoint-dir={os.path.join(a.work, 'ckpt')}", "--overwrite"] + a.extra.split()  # a scratch dir
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        sys.exit("qtrain failed")
    events = [json.loads(l) for l in open(os.path.join(out, "log.jsonl"))]
    qcfg = next(e for e in events if e["log"] == "model")["config"]
    if qcfg["rope_theta"] != theta or qcfg["rms_norm_eps"] != eps:
        sys.exit(f"qtrain read rope_theta {qcfg['rope_theta']}, rms_norm_eps {qcfg['rms_norm_eps']} from "
                 f"{model_dir}/config.json (saved {theta}, {eps})")
    q_steps = [e["loss"] for e in events if e["log"] == "step"]
    q_eval = [e["loss"] for e in events if e["log"] == "eval"][-1]

    # PyTorch, same batches
    T, B = a.seq_len, a.batch
    train = read_tokens(a.train)
    n_chunks = (len(train) - 1) // T
    model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    epoch, pos, order = 0, 0, epoch_order(n_chunks, seed, 0)
    t_steps = []
    for step in range(a.steps):
        rows = []
        for _ in range(B):
            if pos >= n_chunks:
                epoch, pos = epoch + 1, 0
                order = epoch_order(n_chunks, seed, epoch)
            c = order[pos]
            pos += 1
            rows.append(train[c * T:c * T + T + 1])
        x = torch.tensor(np.stack(rows), dtype=torch.long, device="cuda")
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a.lr, a.steps, a.warmup, final_frac)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t_steps.append(float(loss))

    ev = read_tokens(a.eval)
    n_ev = (len(ev) - 1) // T
    total, count = 0.0, 0
    with torch.no_grad():
        for c0 in range(0, n_ev, B):
            rows = [ev[c * T:c * T + T + 1] for c in range(c0, min(c0 + B, n_ev))]
            x = torch.tensor(np.stack(rows), dtype=torch.long, device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(input_ids=x[:, :-1]).logits
            total += float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                           reduction="sum"))
            count += x[:, 1:].numel()
    t_eval = total / count

    for s in range(0, a.steps, 50):
        print(f"step {s:4d}: qtrain {q_steps[s]:.4f}  pytorch {t_steps[s]:.4f}")
    print(f"step {a.steps - 1:4d}: qtrain {q_steps[-1]:.4f}  pytorch {t_steps[-1]:.4f}")
    rel = abs(q_eval - t_eval) / t_eval
    ok = rel < 0.01
    print(f"final eval loss: qtrain {q_eval:.4f}  pytorch {t_eval:.4f}  rel diff {100 * rel:.2f}% -> "
          f"{'PASS' if ok else 'FAIL'} (< 1%)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
