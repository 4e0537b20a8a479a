#!/usr/bin/env python3
"""External reference check of the GPU trainer against HF transformers (run on the GPU machine).

For several random-initialised Qwen2ForCausalLM shapes (tied and untied embeddings, head dim 64 and
128, GQA ratios 1/4/7, vocab not a multiple of 128) it saves the model as safetensors, runs one
forward+backward in qtrain (build/qtrain_dump) and in PyTorch (fp32, eager attention), and compares
the loss, the logits and every parameter gradient:
  fp32 qtrain vs fp32 HF: max |a-b| / max |b| < 1e-4 for loss, logits and every gradient
  bf16 qtrain vs fp32 HF: cosine >= 0.995 for every tensor, median cosine >= 0.999
  e4m3 qtrain (--dtypes e4m3: e4m3 matmuls, e5m2 gradients): loss within 1% of HF, and the gradients
    nearer to the CPU reference emulating the same FP8 rounding than to HF's fp32 (see below)
Then it trains 3 steps with build/train and checks that transformers loads qtrain's output/ and
gives the same logits as qtrain on it (fp32: rel. error < 1e-4).

usage: python3 tests/reference/compare_hf.py --build build-gpu [--work /tmp/qtrain-ref]
       [--dtypes fp32,bf16,e4m3] [--flags "--recompute-block --use-cuda-graphs"]
Exit code 0 only if every check passes; prints the worst numbers either way.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file
from transformers import Qwen2Config, Qwen2ForCausalLM

SHAPES = [
    # name, vocab, hidden, inter, layers, heads, kv_heads, tied
    ("d64_gqa2_tied", 1000, 256, 512, 2, 4, 2, True),
    ("d128_gqa4_untied", 1537, 512, 768, 3, 4, 1, False),
    ("d64_gqa7_untied", 2111, 448, 1024, 2, 7, 1, False),
    ("d128_mha_tied", 777, 256, 384, 2, 2, 2, True),
]
B, T = 2, 96


def write_tokens(path, tokens, vocab):
    header = np.zeros(256, dtype=np.int32)
    header[:2] = np.frombuffer(b"BIN.TOK\n", dtype=np.int32)
    header[2:7] = [2, 4, len(tokens), vocab, 0]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.int32).tobytes())


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def cosine(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return 1.0 if na == 0 and nb == 0 else float(a @ b / (na * nb))


def hf_reference(model_dir, tokens):
    model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").cuda()
    rows = torch.tensor(tokens, dtype=torch.long, device="cuda").view(B, T + 1)
    x, y = rows[:, :-1], rows[:, 1:]
    logits = model(input_ids=x).logits.float()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    grads = {n: p.grad.detach().cpu().numpy() for n, p in model.named_parameters()}
    return float(loss), logits.detach().cpu().numpy().reshape(B * T, -1), grads


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr, file=sys.stderr)
        raise SystemExit(f"command failed: {' '.join(cmd)}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build-gpu")
    ap.add_argument("--work", default="/tmp/qtrain-ref")
    ap.add_argument("--dtypes", default="fp32,bf16",
                    help="qtrain modes to compare: fp32, bf16, e4m3 (bf16 model, e4m3 matmuls, e5m2 gradients)")
    ap.add_argument("--flags", default="", help="extra qtrain_dump flags, e.g. '--recompute-block --use-cuda-graphs'")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    ok = True
    summary = []
    for name, vocab, hidden, inter, layers, heads, kv, tied in SHAPES:
        d = os.path.join(a.work, name)
        cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=tied,
                          max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-6,
                          initializer_range=0.05)
        torch.manual_seed(hash(name) % 1000)
        Qwen2ForCausalLM(cfg).save_pretrained(d, safe_serialization=True)
        rng = np.random.default_rng(1)
        tokens = rng.integers(0, vocab, size=B * (T + 1))
        tok_path = os.path.join(d, "tokens.bin")
        write_tokens(tok_path, tokens, vocab)
        ref_loss, ref_logits, ref_grads = hf_reference(d, tokens)

        for dtype in a.dtypes.split(","):
            out = os.path.join(d, f"qtrain_{dtype}.safetensors")
            emu_out = os.path.join(d, "qtrain_e4m3_cpu_emulation.safetensors")
            run([f"{a.build}/qtrain_dump", "--model", d, "--tokens", tok_path, "--batch", str(B), "--seq-len", str(T),
                 "--dtype", dtype, "--out", out] + (["--emulate-out", emu_out] if dtype == "e4m3" else [])
                + a.flags.split())
            q = load_file(out)
            loss = float(q["loss_and_norm"][0])
            errs = {"loss": abs(loss - ref_loss) / abs(ref_loss), "logits": rel_err(q["logits"], ref_logits)}
            coss = {"logits": cosine(q["logits"], ref_logits)}
            for n, g in ref_grads.items():
                key = "grad." + n
                if key not in q:  # tied lm_head is the embedding
                    continue
                errs[n] = rel_err(q[key], g)
                coss[n] = cosine(q[key], g)
            worst_err = max(errs.items(), key=lambda kv: kv[1])
            worst_cos = min(coss.items(), key=lambda kv: kv[1])
            med_cos = statistics.median(coss.values())
            if dtype == "fp32":
                passed = worst_err[1] < 1e-4
            elif dtype == "e4m3":
                # FP8 (e4m3 matmuls, e5m2 gradients) is compared with HF's fp32 AND with the CPU
                # reference emulating the same FP8 rounding on the same weights (qtrain_dump
                # --emulate-out). FP8's own noise is large on these random models: the exact CPU
                # emulation against fp32 on these shapes measured worst gradient cosine 0.926-0.976
                # and median 0.962-0.988 (k_proj weights lowest; 2026-11-30, CPU), so fixed bounds
                # near 1 cannot tell a correct FP8 path from a wrong one. The test: loss within 1%
                # of HF, and the GPU nearer to the emulation than to fp32, in the median and the
                # worst tensor (as tests/gpu/cuda_model_test.cpp). k_proj.bias is left out: its
                # exact gradient is zero (a bias shared by every key shifts all of a query's scores
                # equally; softmax ignores it), so every side holds only rounding noise there.
                e = load_file(emu_out)
                fcos = {k: v for k, v in coss.items() if not k.endswith("k_proj.bias")}
                ecos = {n: cosine(q["grad." + n], e["grad." + n]) for n in ref_grads
                        if "grad." + n in q and not n.endswith("k_proj.bias")}
                worst_cos = min(fcos.items(), key=lambda kv: kv[1])
                med_cos = statistics.median(fcos.values())
                worst_e = min(ecos.items(), key=lambda kv: kv[1])
                med_e = statistics.median(ecos.values())
                print(f"{name:18s} e4m3 vs CPU FP8 emulation: loss {float(e['loss_and_norm'][0]):.6f}, "
                      f"worst cos {worst_e[1]:.6f} ({worst_e[0]}), median cos {med_e:.6f}", flush=True)
                passed = errs["loss"] < 1e-2 and med_e >= med_cos and worst_e[1] >= worst_cos[1]
            else:
                passed = worst_cos[1] >= 0.995 and med_cos >= 0.999 and errs["loss"] < 1e-2
            ok &= passed
            line = (f"{name:18s} {dtype}: loss {loss:.6f} (hf {ref_loss:.6f}) worst rel err {worst_err[1]:.2e} "
                    f"({worst_err[0]}), worst cos {worst_cos[1]:.6f} ({worst_cos[0]}), median cos {med_cos:.6f} "
                    f"-> {'PASS' if passed else 'FAIL'}")
            print(line, flush=True)
            summary.append(line)

        # qtrain's exported model loads in transformers and gives qtrain's logits
        outdir = os.path.join(d, "output")
        run([f"{a.build}/train", "--device=cuda", f"--model={d}", f"--train-file={tok_path}", "--steps=3",
             f"--batch-size=1", f"--seq-len={T}", "--grad-accumulation=1", "--model-dtype=fp32",
             "--learning-rate=1e-3", "--warmup=0", "--eval-every-n-steps=0", f"--out-dir={outdir}",
             f"--checkpoint-dir={os.path.join(d, 'ckpt')}"])
        _, hf_logits, _ = hf_reference(outdir, tokens)
        qout = os.path.join(d, "qtrain_output.safetensors")
        run([f"{a.build}/qtrain_dump", "--model", outdir, "--tokens", tok_path, "--batch", str(B), "--seq-len", str(T),
             "--dtype", "fp32", "--out", qout])
        e = rel_err(load_file(qout)["logits"], hf_logits)
        passed = e < 1e-4
        ok &= passed
        line = f"{name:18s} export: transformers logits on output/ rel err {e:.2e} -> {'PASS' if passed else 'FAIL'}"
        print(line, flush=True)
        summary.append(line)
    print(json.dumps({"passed": bool(ok)}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
