#!/usr/bin/env python3
"""Reference check of qtrain's CPU LoRA against HF transformers + peft (issue 33; no GPU needed).

For a random tiny Qwen2 (q/k/v biases) and Llama, saved by the installed transformers, and a PEFT
adapter saved by the installed peft (rank 8, alpha 16, every target, dropout 0, B non-zero), it runs
build/qtrain_lora_dump (the CPU reference model, base + --lora-from's adapter) and PyTorch (fp32, eager
attention, PeftModel) on one batch and compares:
  the loss and every adapter gradient: max |a-b| / max |b| < 1e-4
  20 AdamW steps on that batch (torch.optim.AdamW, weight decay on the adapters): every step's loss
    (rel. < 1e-4) and the final adapters (max |a-b| / max |b| < 1e-3)
  qtrain's exported adapter loaded by PeftModel.from_pretrained: its logits against torch's trained
    PeftModel's (rel. < 1e-3), and qtrain's merged export (--merge-lora) against peft's
    merge_and_unload of that adapter (rel. < 1e-5 per tensor) and the merged model's logits against
    the PeftModel's (rel. < 1e-4)

usage: uv run --no-project --with torch --index-url https://download.pytorch.org/whl/cpu \
         --extra-index-url https://pypi.org/simple --with transformers --with peft --with safetensors \
         --with numpy python3 tests/reference/compare_peft_cpu.py --build build [--work /tmp/qtrain-peft]
With --train-also=norms,embeddings (qtrain's flag) the PEFT adapter also has modules_to_save (every
RMSNorm, embed_tokens and lm_head), their copies perturbed before saving so qtrain must take them from
the adapter; their gradients and trained values are compared with the adapters' (torch's AdamW
decays the adapters and embeddings, not the norms, as qtrain does).
Exit code 0 only if every check passes; prints the numbers either way.
"""
import argparse
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK, ALPHA, B, T, STEPS = 8, 16, 2, 32, 20
LR, WD, BETAS, EPS = 1e-3, 0.1, (0.9, 0.95), 1e-8


def config(family):
    common = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=500000.0,
                  tie_word_embeddings=False, hidden_act="silu")
    return Qwen2Config(**common) if family == "qwen2" else LlamaConfig(**common)


def load(path):
    kw = dict(attn_implementation="eager")
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw)
    except TypeError:
        return AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, **kw)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def loss_of(model, inputs, targets):
    logits = model(input_ids=inputs).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-1), logits


def peft_name(name):  # PEFT's saved names have no adapter name (nor modules_to_save's wrapper)
    return name.replace(".modules_to_save.default", "").replace(".default", "")


MODULES_TO_SAVE = {"norms": ["input_layernorm", "post_attention_layernorm", "norm"],
                   "embeddings": ["embed_tokens", "lm_head"]}


def run_family(family, build, work, train_also=""):
    also = [m for part in train_also.split(",") if part for m in MODULES_TO_SAVE[part]]
    d = os.path.join(work, family)
    base_dir, adapter_dir = os.path.join(d, "base"), os.path.join(d, "adapter")
    export_dir, merged_dir = os.path.join(d, "qtrain-adapter"), os.path.join(d, "qtrain-merged")
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(config(family), attn_implementation="eager").float()
    with torch.no_grad():  # norms and biases away from HF's 1 and 0
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
            elif n.endswith(".bias"):
                p.normal_(0, 0.1)
    model.save_pretrained(base_dir, safe_serialization=True)
    pm = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS,
                                          bias="none", task_type="CAUSAL_LM", modules_to_save=also or None))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
            elif "modules_to_save" in n:  # not the base's values: qtrain must read them from the adapter
                p.add_(0.05 * torch.randn_like(p))
    pm.save_pretrained(adapter_dir)

    g = torch.Generator().manual_seed(7)
    inputs = torch.randint(0, 320, (B, T), generator=g)
    targets = torch.cat([inputs[:, 1:], torch.randint(0, 320, (B, 1), generator=g)], dim=1)
    targets[:, ::5] = -1
    tokens = os.path.join(d, "batch.i32")
    np.concatenate([inputs.numpy().astype(np.int32).ravel(), targets.numpy().astype(np.int32).ravel()]).tofile(tokens)
    dump = os.path.join(d, "dump.safetensors")
    cmd = [os.path.join(build, "qtrain_lora_dump"), "--model", base_dir, "--adapter", adapter_dir, "--rank", str(RANK),
           "--alpha", str(ALPHA), "--tokens", tokens, "--batch", str(B), "--seq-len", str(T), "--out", dump,
           "--steps", str(STEPS), "--lr", str(LR), "--weight-decay", str(WD), "--beta1", str(BETAS[0]), "--beta2",
           str(BETAS[1]), "--eps", str(EPS), "--export-dir", export_dir, "--merged-dir", merged_dir,
           "--train-also", train_also]
    subprocess.run(cmd, check=True)
    q = load_file(dump)

    ok = True
    def check(what, err, bound):
        nonlocal ok
        good = err < bound
        ok &= good
        print(f"  {family} {what}: {err:.3e} ({'ok' if good else 'FAIL'}, < {bound:g})")

    # fresh PyTorch side: the saved base + the saved adapter
    ref = PeftModel.from_pretrained(load(base_dir), adapter_dir, is_trainable=True)
    ref.train()
    params = {peft_name(n): p for n, p in ref.named_parameters() if p.requires_grad}
    extra = [n for n in params if ".lora_" not in n]
    assert len(params) - len(extra) == 2 * 7 * 2 and bool(extra) == bool(also), sorted(params)
    loss, _ = loss_of(ref, inputs, targets)
    loss.backward()
    check("loss", rel(q["loss"][0], loss.item()), 1e-4)
    worst = max((rel(q["grad." + n], p.grad.numpy()), n) for n, p in params.items())
    check(f"worst adapter gradient ({worst[1]})", worst[0], 1e-4)
    if extra:
        worst = max((rel(q["grad." + n], params[n].grad.numpy()), n) for n in extra)
        check(f"worst gradient of the {len(extra)} trained base tensors ({worst[1]})", worst[0], 1e-4)

    # qtrain decays matrices and embeddings, not norms
    decay = [p for n, p in params.items() if "norm" not in n]
    no_decay = [p for n, p in params.items() if "norm" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    losses = []
    for k in range(STEPS):
        if k > 0:
            opt.zero_grad()
            loss, _ = loss_of(ref, inputs, targets)
            loss.backward()
        losses.append(loss.item())
        opt.step()
    check(f"{STEPS} AdamW steps, worst loss (first {losses[0]:.4f}, last {losses[-1]:.4f})",
          max(abs(a - b) / abs(b) for a, b in zip(q["losses"], losses)), 1e-4)
    worst = max((rel(q["param." + n], p.detach().numpy()), n) for n, p in params.items())
    check(f"adapters after {STEPS} steps ({worst[1]})", worst[0], 1e-3)

    ref.eval()
    with torch.no_grad():
        _, ref_logits = loss_of(ref, inputs, targets)
        exported = PeftModel.from_pretrained(load(base_dir), export_dir)
        exported.eval()
        _, exp_logits = loss_of(exported, inputs, targets)
        check("exported adapter in PeftModel: logits vs torch's trained", rel(exp_logits, ref_logits), 1e-3)
        merged_ref = exported.merge_and_unload().state_dict()
        merged_q = load_file(os.path.join(merged_dir, "model.safetensors"))
        worst = max((rel(merged_q[n], merged_ref[n].numpy()), n) for n in merged_q)
        check("merged export vs merge_and_unload" + (f" ({worst[1]})" if worst[0] > 0 else " (every tensor equal)"),
              worst[0], 1e-5)
        _, merged_logits = loss_of(load(merged_dir), inputs, targets)
        check("merged model's logits vs the exported adapter's", rel(merged_logits, exp_logits), 1e-4)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--work", default="/tmp/qtrain-peft")
    ap.add_argument("--families", default="qwen2,llama")
    ap.add_argument("--train-also", default="", help="qtrain's --train-also (norms,embeddings): modules_to_save")
    a = ap.parse_args()
    torch.set_num_threads(1)  # deterministic sums on the reference side
    import peft, transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")
    ok = all([run_family(f, a.build, a.work, a.train_also) for f in a.families.split(",")])
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
