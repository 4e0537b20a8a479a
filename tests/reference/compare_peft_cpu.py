#!/usr/bin/env python3
"""Reference check of qtrain's LoRA against HF transformers + peft (issue 33): the CPU model here (no GPU
needed), the GPU model with --device cuda.

For a random tiny Qwen2 (q/k/v biases), Llama and Qwen3 (head_dim 128, not hidden / heads; q/k norms),
saved by the installed transformers, and a PEFT adapter saved by the installed peft (rank 8, alpha 16,
every target, dropout 0, B non-zero), it runs BUILD/qtrain_lora_dump (base + --lora-from's adapter, on
--device in each of --dtypes) and PyTorch (fp32, eager attention, PeftModel, on the same device; no
TF32) on one batch and compares, for qtrain in fp32:
  the loss and every adapter gradient: max |a-b| / max |b| < 1e-4
  20 AdamW steps on that batch (torch.optim.AdamW, weight decay on the adapters): every step's loss
    (rel. < 1e-4) and the final adapters (max |a-b| / max |b| < 1e-3)
  qtrain's exported adapter loaded by PeftModel.from_pretrained: its logits against torch's trained
    PeftModel's (rel. < 1e-3), and qtrain's merged export (--merge-lora) against peft's
    merge_and_unload of that adapter (rel. < 1e-5 per tensor) and the merged model's logits against
    the PeftModel's (rel. < 1e-4)
and for qtrain in bf16 (--device cuda --dtypes fp32,bf16; PyTorch stays fp32) the same comparisons with
the bounds compare_hf.py puts on a bf16 qtrain against fp32 HF: each loss within 1e-2 (relative), and in
each group of tensors (the adapter gradients, the trained adapters, the merged tensors, the logits)
every cosine >= 0.995 and the median >= 0.999.

usage: uv run --no-project --with torch --index-url https://download.pytorch.org/whl/cpu \
         --extra-index-url https://pypi.org/simple --with transformers --with peft --with safetensors \
         --with numpy python3 tests/reference/compare_peft_cpu.py --build build [--work /tmp/qtrain-peft]
       on the GPU machine (torch with CUDA; BUILD/qtrain_lora_dump from a GPU build):
       python3 tests/reference/compare_peft_cpu.py --build BUILD --device cuda --dtypes fp32,bf16
       [--families qwen2,llama,qwen3]
--torch-device cpu runs PyTorch on the CPU whatever --device is (without a GPU, --device cuda then
exercises everything up to qtrain_lora_dump's refusal).
With --train-also=norms,embeddings (qtrain's flag; either --device) the PEFT adapter also has
modules_to_save (every RMSNorm, embed_tokens and lm_head), their copies perturbed before saving so qtrain
must take them from the adapter; their gradients and trained values are compared with the adapters'
(torch's AdamW decays the adapters and embeddings, not the norms, as qtrain does).
Exit code 0 only if every check passes; prints the numbers either way.
"""
import argparse
import os
import statistics
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.numpy import load_file
from safetensors.torch import load_file as load_torch_file  # bf16 files (numpy has no bf16)
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK, ALPHA, B, T, STEPS = 8, 16, 2, 32, 20
LR, WD, BETAS, EPS = 1e-3, 0.1, (0.9, 0.95), 1e-8


def config(family):
    # head dim 64 (hidden / heads), GQA 2: the GPU model's attention takes head dims 64 and 128 only
    common = dict(vocab_size=320, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=500000.0,
                  tie_word_embeddings=False, hidden_act="silu")
    if family == "qwen3":  # head_dim 128, not hidden / heads; q/k norms (perturbed with the other norms)
        return Qwen3Config(head_dim=128, **common)
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


class Checks:
    """The bounds of one qtrain dtype. fp32: each check's own bound on max |a-b| / max |b| (rel()). bf16:
    compare_hf.py's bounds for a bf16 qtrain against fp32 HF, whatever the fp32 bound: a loss within 1e-2
    (relative), and every tensor of a group at cosine >= 0.995 with the group's median >= 0.999."""

    def __init__(self, label, dtype):
        self.label, self.dtype, self.ok = label, dtype, True

    def report(self, what, good, text):
        self.ok &= good
        print(f"  {self.label} {what}: {text} ({'ok' if good else 'FAIL'})", flush=True)

    def losses(self, what, a, b, bound):  # scalars: every one within the bound
        err = max(abs(float(x) - float(y)) / abs(float(y)) for x, y in zip(a, b))
        bound = bound if self.dtype == "fp32" else 1e-2
        self.report(what, len(a) == len(b) and err < bound, f"{err:.3e} (< {bound:g})")

    def tensors(self, what, pairs, bound):  # {name: (qtrain, reference)}
        if self.dtype == "fp32":
            err, name = max((rel(a, b), n) for n, (a, b) in pairs.items())
            which = f" ({name})" if err > 0 else " (every tensor equal)"
            self.report(what + which if len(pairs) > 1 else what, err < bound, f"{err:.3e} (< {bound:g})")
            return
        coss = {n: cosine(a, b) for n, (a, b) in pairs.items()}
        worst = min(coss.items(), key=lambda kv: kv[1])
        med = statistics.median(coss.values())
        self.report(f"{what} ({worst[0]})" if len(pairs) > 1 else what, worst[1] >= 0.995 and med >= 0.999,
                    f"worst cos {worst[1]:.6f} (>= 0.995), median {med:.6f} (>= 0.999)")


def cosine(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30))


def make_case(family, work, train_also):
    """The saved base, the saved PEFT adapter and the batch (also written for qtrain_lora_dump)."""
    also = [m for part in train_also.split(",") if part for m in MODULES_TO_SAVE[part]]
    d = os.path.join(work, family)
    base_dir, adapter_dir = os.path.join(d, "base"), os.path.join(d, "adapter")
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
    return dict(dir=d, base=base_dir, adapter=adapter_dir, inputs=inputs, targets=targets, tokens=tokens, also=also)


def torch_reference(case, dev):
    """PyTorch on `dev` (fp32, eager attention): a fresh PeftModel of the saved base + adapter; the loss and
    the gradients of one batch, then STEPS AdamW steps (their losses, the trained tensors and the trained
    model's logits)."""
    inputs, targets = case["inputs"].to(dev), case["targets"].to(dev)
    # built on the CPU, then moved (the same parameter objects), so peft places nothing itself
    ref = PeftModel.from_pretrained(load(case["base"]), case["adapter"], is_trainable=True).to(dev)
    ref.train()
    params = {peft_name(n): p for n, p in ref.named_parameters() if p.requires_grad}
    extra = [n for n in params if ".lora_" not in n]
    assert len(params) - len(extra) == 2 * 7 * 2 and bool(extra) == bool(case["also"]), sorted(params)
    loss, _ = loss_of(ref, inputs, targets)
    loss.backward()
    out = dict(loss=loss.item(), grads={n: p.grad.cpu().numpy() for n, p in params.items()}, extra=extra)
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
    out["losses"] = losses
    out["params"] = {n: p.detach().cpu().numpy() for n, p in params.items()}
    ref.eval()
    with torch.no_grad():
        out["logits"] = loss_of(ref, inputs, targets)[1].cpu().numpy()
    return out


def run_qtrain(case, build, device, dtype, train_also):
    """build/qtrain_lora_dump on `device` in `dtype`: the dump's tensors and its export directories, or
    None when it failed (its error printed)."""
    d = os.path.join(case["dir"], f"qtrain-{device}-{dtype}")
    os.makedirs(d, exist_ok=True)
    dump = os.path.join(d, "dump.safetensors")
    export_dir, merged_dir = os.path.join(d, "adapter"), os.path.join(d, "merged")
    cmd = [os.path.join(build, "qtrain_lora_dump"), "--model", case["base"], "--adapter", case["adapter"],
           "--rank", str(RANK), "--alpha", str(ALPHA), "--tokens", case["tokens"], "--batch", str(B), "--seq-len",
           str(T), "--out", dump, "--steps", str(STEPS), "--lr", str(LR), "--weight-decay", str(WD), "--beta1",
           str(BETAS[0]), "--beta2", str(BETAS[1]), "--eps", str(EPS), "--export-dir", export_dir, "--merged-dir",
           merged_dir, "--train-also", train_also, "--device", device, "--dtype", dtype]
    if subprocess.run(cmd).returncode != 0:
        return None
    return load_file(dump), export_dir, merged_dir


def compare(case, ref, qtrain, c, dev):
    q, export_dir, merged_dir = qtrain
    c.losses("loss", [q["loss"][0]], [ref["loss"]], 1e-4)
    lora = {n: (q["grad." + n], g) for n, g in ref["grads"].items() if n not in ref["extra"]}
    c.tensors("worst adapter gradient", lora, 1e-4)
    if ref["extra"]:
        c.tensors(f"worst gradient of the {len(ref['extra'])} trained base tensors",
                  {n: (q["grad." + n], ref["grads"][n]) for n in ref["extra"]}, 1e-4)
    losses = ref["losses"]
    c.losses(f"{STEPS} AdamW steps, worst loss (first {losses[0]:.4f}, last {losses[-1]:.4f})", q["losses"], losses,
             1e-4)
    c.tensors(f"adapters after {STEPS} steps", {n: (q["param." + n], p) for n, p in ref["params"].items()}, 1e-3)

    inputs, targets = case["inputs"].to(dev), case["targets"].to(dev)
    with torch.no_grad():
        exported = PeftModel.from_pretrained(load(case["base"]), export_dir).to(dev)
        exported.eval()
        exp_logits = loss_of(exported, inputs, targets)[1].cpu().numpy()
        c.tensors("exported adapter in PeftModel: logits vs torch's trained", {"logits": (exp_logits, ref["logits"])},
                  1e-3)
        merged_ref = exported.merge_and_unload().state_dict()
        merged_q = load_torch_file(os.path.join(merged_dir, "model.safetensors"))
        c.tensors("merged export vs merge_and_unload",
                  {n: (t.float().numpy(), merged_ref[n].cpu().numpy()) for n, t in merged_q.items()}, 1e-5)
        merged_logits = loss_of(load(merged_dir).to(dev), inputs, targets)[1].cpu().numpy()
        c.tensors("merged model's logits vs the exported adapter's", {"logits": (merged_logits, exp_logits)}, 1e-4)


def run_family(family, build, work, train_also="", device="cpu", dtypes=("fp32",), torch_device=None):
    dev = torch_device or device
    case = make_case(family, work, train_also)
    ref = torch_reference(case, dev)
    ok = True
    for dtype in dtypes:
        c = Checks(f"{family} {device} {dtype}", dtype)
        qtrain = run_qtrain(case, build, device, dtype, train_also)
        if qtrain is None:
            c.report("qtrain_lora_dump", False, "failed (its error above)")
        else:
            compare(case, ref, qtrain, c, dev)
        ok &= c.ok
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build", help="the directory holding qtrain_lora_dump")
    ap.add_argument("--work", default="/tmp/qtrain-peft")
    ap.add_argument("--families", default="qwen2,llama,qwen3")
    ap.add_argument("--train-also", default="", help="qtrain's --train-also (norms,embeddings): modules_to_save")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="qtrain's model and PyTorch's device")
    ap.add_argument("--dtypes", default="fp32", help="qtrain's model dtypes, run in turn: fp32, bf16 (cuda only)")
    ap.add_argument("--torch-device", default=None,
                    help="PyTorch's device when not --device's (e.g. cpu, to exercise --device cuda without a GPU)")
    a = ap.parse_args(argv)
    dev = a.torch_device or a.device
    if dev == "cuda":  # full fp32 matmuls on the reference side (compare_hf.py)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    torch.set_num_threads(1)  # deterministic sums on the reference side
    import peft, transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")
    ok = all([run_family(f, a.build, a.work, a.train_also, a.device, a.dtypes.split(","), a.torch_device)
              for f in a.families.split(",")])
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
