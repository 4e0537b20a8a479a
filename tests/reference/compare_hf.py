#!/usr/bin/env python3
"""External reference check of the GPU trainer against HF transformers (run on the GPU machine).

For several random-initialised shapes of each family (Qwen2ForCausalLM: tied and untied embeddings,
head dim 64 and 128, GQA ratios 1/4/7, vocab not a multiple of 128; Qwen3ForCausalLM: head_dim not
hidden/heads, q/k norm weights away from one, tied and untied; LlamaForCausalLM: llama3 RoPE scaling
whose blend and division act on frequencies that turn within the 96 positions, untied, eps 1e-5) it
saves the model with the installed
transformers (so config.json is in that version's own format: 5.x writes the RoPE base only in
rope_parameters), with a RoPE base and RMSNorm eps that no fallback gives (5e5 / 2e6, 1e-5; qtrain's
are 10000 and 1e-6) and random biases and norm weights (HF initialises them to 0 and 1). It
checks that qtrain read that base and eps, runs one forward+backward in qtrain (build/qtrain_dump)
and in PyTorch (fp32, eager attention), and compares the loss, the logits and every parameter gradient:
  fp32 qtrain vs fp32 HF: max |a-b| / max |b| < 1e-4 for loss, logits and every gradient
  bf16 qtrain vs fp32 HF: cosine >= 0.995 for every tensor, median cosine >= 0.999
  e4m3 qtrain (--dtypes e4m3: e4m3 matmuls, e5m2 gradients): loss within 1% of HF, and the gradients
    nearer to the CPU reference emulating the same FP8 rounding than to HF's fp32 (see below)
Then it trains 20 steps in fp32 with build/train (AdamW, constant lr, weight decay on matrices and
embeddings, global-norm clip) on a token file of exactly one batch, and the same 20 steps in PyTorch
(HF model + torch.optim.AdamW, same recipe) with eager and with sdpa attention: qtrain's loss at every
step must lie within max(4 x the eager-sdpa distance, 5e-5) (relative) of eager's. transformers then
loads qtrain's output/: its loss there must match the HF model's after the same 20 steps (same bound),
and its logits qtrain's own on that model (fp32: rel. error < 1e-4).

usage: python3 tests/reference/compare_hf.py --build build-gpu [--work /tmp/qtrain-ref]
       [--dtypes fp32,bf16,e4m3] [--flags "--recompute-block --use-cuda-graphs"] [--families qwen2,qwen3,llama]
Exit code 0 only if every check passes; prints the worst numbers either way.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import zlib

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors.numpy import load_file
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

# Llama 3's RoPE scaled so that it matters within T = 96 positions: wavelengths above 64 positions are
# divided by 4 and those between 16 and 64 blended (Llama 3.1's own: 8192 / factor 8).
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
SHAPES = [
    # name, family, vocab, hidden, inter, layers, heads, kv_heads, tied, rope_theta, rms_norm_eps, pad:
    # whether config.json sets pad_token_id (to a token of the batch: HF's nn.Embedding padding_idx then
    # gives that row no gradient from the lookup, and qtrain must do the same), extra config fields
    ("d64_gqa2_tied", "qwen2", 1000, 256, 512, 2, 4, 2, True, 500000.0, 1e-5, True, {}),
    ("d128_gqa4_untied", "qwen2", 1537, 512, 768, 3, 4, 1, False, 2000000.0, 1e-5, True, {}),
    ("d64_gqa7_untied", "qwen2", 2111, 448, 1024, 2, 7, 1, False, 500000.0, 1e-5, False, {}),
    ("d128_mha_tied", "qwen2", 777, 256, 384, 2, 2, 2, True, 2000000.0, 1e-5, False, {}),
    # Qwen3: head_dim 128 where hidden / heads is 64, and 64 where it is 48
    ("qwen3_d128_tied", "qwen3", 1000, 256, 512, 2, 4, 2, True, 1000000.0, 1e-5, True, {"head_dim": 128}),
    ("qwen3_d64_untied", "qwen3", 1283, 192, 384, 2, 4, 1, False, 500000.0, 1e-5, False, {"head_dim": 64}),
    ("llama3_d64_untied", "llama", 1283, 256, 640, 2, 4, 2, False, 500000.0, 1e-5, True, {"rope": LLAMA3_ROPE}),
]
CONFIG_CLASSES = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}
B, T = 2, 96
# lr 1e-4: the losses fall from ~8 to 3.3-0.016 in 20 steps. An optimizer mismatch in qtrain fails the
# check on the H200 (compare_hf_sensitivity.py, 2026-12-01; worst step against the 5e-5 bound, two shapes):
# --learning-rate +1% 8.6e-3 / 5.6e-2, --beta-2=0.999 2.6e-2 / 1.4e-1, --weight-decay=0 2.2e-4 / 1.1e-3,
# --grad-clip=0 1.5e-3 / 1.9, while qtrain itself stays within 1.2e-6 of HF eager on every shape. At 3e-4 the models memorise the batch (losses ~1e-3 after 20 steps) and the relative
# difference of such a loss is rounding noise: on the H200, d128_gqa4_untied reached 6.4e-5 at its
# last step (loss 0.0012) with every earlier step within 2.1e-5, and at 1e-4 1.8e-6 (eager-sdpa
# 8.3e-7; 2026-12-01, transformers 5.17). The bound's floor 5e-5: qtrain's CPU reference model, run
# the same way (--device=cpu), came within 1.8e-5 of HF eager on every shape at 3e-4 where HF's own
# eager-sdpa distance on the CPU was 1e-7 to 3e-6 (2026-12-01, CPU).
TRAIN_STEPS, LR, WEIGHT_DECAY, CLIP = 20, 1e-4, 0.1, 1.0
BOUND_FLOOR = 5e-5
DEVICE = "cuda"
TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5


def model_config(family, vocab, hidden, inter, layers, heads, kv, tied, theta, eps, pad=None, extra=None):
    """The config in the installed transformers' own terms (5.x: rope_parameters, 4.x: rope_theta and
    rope_scaling)."""
    extra = dict(extra or {})
    scaling = extra.pop("rope", {"rope_type": "default"})
    if TRANSFORMERS_5:
        rope = {"rope_parameters": {**scaling, "rope_theta": theta}}
    else:
        rope = {"rope_theta": theta, **({"rope_scaling": scaling} if scaling["rope_type"] != "default" else {})}
    return CONFIG_CLASSES[family](vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                                  tie_word_embeddings=tied, max_position_embeddings=4096, rms_norm_eps=eps,
                                  initializer_range=0.05, pad_token_id=pad, **rope, **extra)


def hf_rope_theta(cfg):
    """The base transformers' Qwen2RotaryEmbedding uses."""
    return cfg.rope_parameters["rope_theta"] if TRANSFORMERS_5 else cfg.rope_theta


def save_random_model(d, cfg, seed):
    """HF's init plus what it leaves at 0 or 1 (biases, norm weights: the q/k norms too) drawn at
    random, so no zero bias or unit weight can hide a mistake."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif n.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.save_pretrained(d)


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
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="eager").to(DEVICE)
    rows = torch.tensor(tokens, dtype=torch.long, device=DEVICE).view(B, T + 1)
    x, y = rows[:, :-1], rows[:, 1:]
    logits = model(input_ids=x).logits.float()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    grads = {n: p.grad.detach().cpu().numpy() for n, p in model.named_parameters()}
    return float(loss), logits.detach().cpu().numpy().reshape(B * T, -1), grads


def batch_loss(model, rows):
    logits = model(input_ids=rows[:, :-1]).logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))


def hf_train(model_dir, rows, attn):
    """qtrain's recipe in PyTorch: AdamW (betas 0.9/0.95, eps 1e-8), weight decay on tensors of dim >= 2
    (matrices and embeddings), global-norm clip, constant lr, the same batch every step. Returns the
    loss of every step (before its update) and the loss after the last one. (torch's clip divides by
    norm + 1e-6, qtrain's by norm: a relative 1e-6 of the step, far below the bounds.)"""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attn).to(DEVICE)
    params = list(model.parameters())  # a tied lm_head is the embedding, listed once
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95), eps=1e-8)
    x = torch.tensor(rows, dtype=torch.long, device=DEVICE)
    losses = []
    for _ in range(TRAIN_STEPS):
        loss = batch_loss(model, x)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    with torch.no_grad():
        return losses, float(batch_loss(model, x))


def hf_loss(model_dir, rows):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="eager").to(DEVICE)
    with torch.no_grad():
        return float(batch_loss(model, torch.tensor(rows, dtype=torch.long, device=DEVICE)))


def rel(a, b):
    return abs(a - b) / abs(b)


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
    ap.add_argument("--families", default="qwen2,qwen3,llama", help="which families' shapes to run")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}", flush=True)
    ok = True
    summary = []

    def report(passed, line):
        nonlocal ok
        ok &= passed
        line += f" -> {'PASS' if passed else 'FAIL'}"
        print(line, flush=True)
        summary.append(line)

    families = a.families.split(",")
    for name, family, vocab, hidden, inter, layers, heads, kv, tied, theta, eps, with_pad, extra in SHAPES:
        if family not in families:
            continue
        d = os.path.join(a.work, name)
        rng = np.random.default_rng(1)
        tokens = rng.integers(0, vocab, size=B * (T + 1))
        pad = int(tokens[10]) if with_pad else None
        cfg = model_config(family, vocab, hidden, inter, layers, heads, kv, tied, theta, eps, pad, extra)
        save_random_model(d, cfg, zlib.crc32(name.encode()) % 1000)
        # The file is in this transformers' format, and transformers itself reads the intended base back.
        with open(os.path.join(d, "config.json")) as f:
            saved = json.load(f)
        back = CONFIG_CLASSES[family].from_pretrained(d)
        assert hf_rope_theta(back) == theta and back.rms_norm_eps == eps, (hf_rope_theta(back), back.rms_norm_eps)
        print(f"{name:18s} config.json: {saved.get('architectures')}, rope_theta {saved.get('rope_theta')}, "
              f"rope_parameters {saved.get('rope_parameters')}, rope_scaling {saved.get('rope_scaling')}, "
              f"head_dim {saved.get('head_dim')}, rms_norm_eps {saved.get('rms_norm_eps')}, pad_token_id "
              f"{saved.get('pad_token_id')}", flush=True)
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
                # exact gradient is small (a bias shared by every key would shift all of a query's
                # scores equally, which softmax ignores; only RoPE's rotation of it by the key's
                # position remains), so the FP8 sides hold mostly rounding noise there.
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
            report(passed, f"{name:18s} {dtype}: loss {loss:.6f} (hf {ref_loss:.6f}) worst rel err {worst_err[1]:.2e} "
                           f"({worst_err[0]}), worst cos {worst_cos[1]:.6f} ({worst_cos[0]}), median cos {med_cos:.6f}")

        # 20 fp32 steps of qtrain's trainer against the same steps in PyTorch. The token file holds
        # exactly B chunks of T+1 tokens (the data loader steps by T), so every step is one epoch over the
        # same rows; their order within the batch changes nothing but rounding.
        train_tokens = rng.integers(0, vocab, size=B * T + 1)
        if pad is not None:
            train_tokens[5] = pad  # an input position: the pad row's lookup gradient must stay out, every step
        train_path = os.path.join(d, "train_tokens.bin")
        write_tokens(train_path, train_tokens, vocab)
        rows = np.stack([train_tokens[c * T:c * T + T + 1] for c in range(B)])
        outdir = os.path.join(d, "output")
        run([f"{a.build}/train", "--device=cuda", f"--model={d}", f"--train-file={train_path}",
             f"--steps={TRAIN_STEPS}", f"--batch-size={B}", f"--seq-len={T}", "--grad-accumulation=1",
             "--model-dtype=fp32", f"--learning-rate={LR}", "--warmup=0", "--final-lr-fraction=1.0",
             f"--weight-decay={WEIGHT_DECAY}", f"--grad-clip={CLIP}", "--beta-1=0.9", "--beta-2=0.95",
             "--adam-epsilon=1e-8", "--eval-every-n-steps=0", f"--out-dir={outdir}", "--overwrite",  # scratch
             f"--checkpoint-dir={os.path.join(d, 'ckpt')}"])
        with open(os.path.join(outdir, "log.jsonl")) as f:
            events = [json.loads(line) for line in f]
        qcfg = next(e for e in events if e["log"] == "model")["config"]
        head_dim = extra.get("head_dim", hidden // heads)
        report(qcfg["rope_theta"] == theta and qcfg["rms_norm_eps"] == eps and qcfg["tie_word_embeddings"] == tied
               and qcfg["architectures"] == saved["architectures"] and qcfg.get("head_dim", hidden // heads) == head_dim,
               f"{name:18s} qtrain read: {qcfg['architectures']}, head_dim {qcfg.get('head_dim', hidden // heads)} "
               f"(saved {head_dim}), rope_theta {qcfg['rope_theta']} (saved {theta}), rms_norm_eps "
               f"{qcfg['rms_norm_eps']} (saved {eps}), tied {qcfg['tie_word_embeddings']} (saved {tied})")
        q_losses = [e["loss"] for e in events if e["log"] == "step"]
        eager, eager_after = hf_train(d, rows, "eager")
        sdpa, _ = hf_train(d, rows, "sdpa")
        attn_dist = max(rel(s_, e_) for s_, e_ in zip(sdpa, eager))  # what HF itself varies by
        bound = max(4 * attn_dist, BOUND_FLOOR)
        diffs = [rel(q, e_) for q, e_ in zip(q_losses, eager)]
        worst = max(range(len(diffs)), key=diffs.__getitem__) if diffs else 0
        report(len(q_losses) == TRAIN_STEPS and max(diffs, default=1.0) <= bound,
               f"{name:18s} {TRAIN_STEPS} fp32 AdamW steps: loss {eager[0]:.6f} -> {eager[-1]:.6f} (hf eager), "
               f"qtrain {q_losses[-1] if q_losses else float('nan'):.6f}; worst rel diff {max(diffs, default=1.0):.2e} "
               f"(step {worst}), eager-sdpa {attn_dist:.2e}, bound {bound:.2e}")

        # transformers loads qtrain's output/ as the same class: the loss of the HF model after the
        # same steps, and qtrain's own logits on that model.
        out_cfg = AutoConfig.from_pretrained(outdir)
        report(out_cfg.architectures == saved["architectures"] and type(out_cfg) is type(back)
               and out_cfg.to_dict().get("head_dim") == back.to_dict().get("head_dim")
               and out_cfg.to_dict().get("rope_parameters", out_cfg.to_dict().get("rope_scaling"))
               == back.to_dict().get("rope_parameters", back.to_dict().get("rope_scaling")),
               f"{name:18s} export: config.json {out_cfg.architectures} {type(out_cfg).__name__}, rope "
               f"{out_cfg.to_dict().get('rope_parameters', out_cfg.to_dict().get('rope_scaling'))}")
        exported = hf_loss(outdir, rows)
        report(rel(exported, eager_after) <= bound,
               f"{name:18s} export: transformers loss on output/ {exported:.6f}, hf after {TRAIN_STEPS} steps "
               f"{eager_after:.6f}, rel diff {rel(exported, eager_after):.2e} (bound {bound:.2e})")
        _, hf_logits, _ = hf_reference(outdir, tokens)
        qout = os.path.join(d, "qtrain_output.safetensors")
        run([f"{a.build}/qtrain_dump", "--model", outdir, "--tokens", tok_path, "--batch", str(B), "--seq-len", str(T),
             "--dtype", "fp32", "--out", qout])
        e = rel_err(load_file(qout)["logits"], hf_logits)
        report(e < 1e-4, f"{name:18s} export: transformers logits on output/ rel err {e:.2e}")
    print(json.dumps({"passed": bool(ok)}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
