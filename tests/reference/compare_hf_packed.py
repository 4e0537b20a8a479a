#!/usr/bin/env python3
"""Document masking against HF transformers (issue 31; run on the GPU machine).

A packed micro-batch — every row holds several documents of different lengths — goes through qtrain's
GPU model with document masking (build/qtrain_dump --doc-lengths: positions restart at each document,
attention stays inside it, a document's last token predicts nothing). transformers runs every document
ALONE as its own sequence (fp32, eager attention); its loss is the sum of all documents' token losses
over the number of predicted tokens, which is qtrain's micro-batch mean. Compared: the loss, the logits
of every token and every parameter gradient, with compare_hf.py's bounds (fp32 rel. error < 1e-4; bf16
cosine >= 0.995 every tensor, median >= 0.999, loss within 1%). Shapes: compare_hf.py's, one per
family (Qwen2 with biases, Qwen3 with q/k norm and head_dim != hidden/heads, Llama with llama3 RoPE).

usage: python3 tests/reference/compare_hf_packed.py --build build-gpu [--work /tmp/qtrain-ref-packed]
"""
import argparse
import os
import statistics
import subprocess
import sys
import zlib

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_hf import SHAPES, cosine, model_config, rel_err, save_random_model, write_tokens  # noqa: E402

B, T = 2, 96
# Lengths that cross and meet 16/32/64-token tiles, a 1-token document, and a row remainder.
DOC_LENGTHS = [37, 1, 20, 64]  # per row: 37, 1, 20, then the remaining 38
PICK = ["d64_gqa2_tied", "qwen3_d128_tied", "llama3_d64_untied"]


def doc_spans():
    """[(start, end)] per row, as qtrain_dump --doc-lengths cuts them."""
    spans = []
    for _ in range(B):
        row, t, d = [], 0, 0
        while t < T:
            n = min(DOC_LENGTHS[d % len(DOC_LENGTHS)], T - t)
            row.append((t, t + n))
            t += n
            d += 1
        spans.append(row)
    return spans


def hf_per_document(model_dir, rows):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="eager").cuda()
    x = torch.tensor(rows, dtype=torch.long, device="cuda")
    logits = torch.zeros(B, T, model.config.vocab_size, device="cuda")
    total, count = 0.0, 0
    for b, row in enumerate(doc_spans()):
        for s, e in row:
            out = model(input_ids=x[b:b + 1, s:e]).logits.float()[0]  # positions 0..e-s-1
            logits[b, s:e] = out.detach()
            if e - s > 1:
                total = total + F.cross_entropy(out[:-1], x[b, s + 1:e], reduction="sum")
                count += e - s - 1
    loss = total / count
    loss.backward()
    grads = {n: p.grad.detach().cpu().numpy() for n, p in model.named_parameters()}
    return float(loss), logits.cpu().numpy().reshape(B * T, -1), grads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-gpu")
    ap.add_argument("--work", default="/tmp/qtrain-ref-packed")
    ap.add_argument("--dtypes", default="fp32,bf16")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    ok = True
    for name, family, vocab, hidden, inter, layers, heads, kv, tied, theta, eps, _pad, extra in SHAPES:
        if name not in PICK:
            continue
        d = os.path.join(a.work, name)
        os.makedirs(d, exist_ok=True)
        cfg = model_config(family, vocab, hidden, inter, layers, heads, kv, tied, theta, eps, None, extra)
        save_random_model(d, cfg, zlib.crc32(name.encode()) % 1000)
        tokens = np.random.default_rng(2).integers(0, vocab, size=B * (T + 1))
        tok_path = os.path.join(d, "tokens.bin")
        write_tokens(tok_path, tokens, vocab)
        rows = tokens.reshape(B, T + 1)[:, :T]
        ref_loss, ref_logits, ref_grads = hf_per_document(d, rows)
        for dtype in a.dtypes.split(","):
            out = os.path.join(d, f"qtrain_{dtype}.safetensors")
            r = subprocess.run([f"{a.build}/qtrain_dump", "--model", d, "--tokens", tok_path, "--batch", str(B),
                                "--seq-len", str(T), "--dtype", dtype, "--out", out,
                                "--doc-lengths", ",".join(map(str, DOC_LENGTHS))], capture_output=True, text=True)
            if r.returncode != 0:
                print(r.stdout, r.stderr)
                ok = False
                continue
            q = load_file(out)
            loss = float(q["loss_and_norm"][0])
            errs = {"loss": abs(loss - ref_loss) / abs(ref_loss), "logits": rel_err(q["logits"], ref_logits)}
            coss = {"logits": cosine(q["logits"], ref_logits)}
            for n, g in ref_grads.items():
                if "grad." + n in q:
                    errs[n] = rel_err(q["grad." + n], g)
                    coss[n] = cosine(q["grad." + n], g)
            worst_err = max(errs.items(), key=lambda kv: kv[1])
            worst_cos = min(coss.items(), key=lambda kv: kv[1])
            med_cos = statistics.median(coss.values())
            if dtype == "fp32":
                passed = worst_err[1] < 1e-4
            else:
                passed = worst_cos[1] >= 0.995 and med_cos >= 0.999 and errs["loss"] < 1e-2
            ok &= passed
            print(f"{name:18s} packed {dtype}: loss {loss:.6f} (hf per document {ref_loss:.6f}) worst rel err "
                  f"{worst_err[1]:.2e} ({worst_err[0]}), worst cos {worst_cos[1]:.6f} ({worst_cos[0]}), median cos "
                  f"{med_cos:.6f} -> {'PASS' if passed else 'FAIL'}", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
