#!/usr/bin/env python3
"""PEFT loads qtrain's `--train-also` adapter (issue 33; CPU, no GPU needed).

For a random tiny Qwen2 (untied, q/k/v biases), Qwen3 (q/k norms, tied) and Llama (tied), saved by the
installed transformers, it trains qtrain's CPU model a few steps with LoRA and
--train-also=norms,embeddings (the base in --model, loud learning rate so every trained tensor moves),
once writing the PEFT adapter and once --merge-lora, and checks:
  PeftModel.from_pretrained(base, adapter) puts every trained norm / embedding / LM head in its
    modules_to_save copies, with qtrain's values (bit for bit), and nothing is left unloaded;
  its logits against the merged export's logits (rel. < 1e-4);
  peft's merge_and_unload of that adapter against qtrain's merged export (rel. < 1e-5 per tensor).

usage: uv run --no-project --with torch --index-url https://download.pytorch.org/whl/cpu \
         --extra-index-url https://pypi.org/simple --with transformers --with peft --with safetensors \
         --with numpy python3 tests/reference/check_peft_train_also.py --build build [--work /tmp/qtrain-peft-also]
Exit code 0 only if every check passes; prints the numbers either way.
"""
import argparse
import os
import struct
import subprocess
import sys

import numpy as np
import torch
from peft import PeftModel
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

VOCAB = 96


def config(family):
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=0,
                  eos_token_id=0)
    if family == "qwen2":
        return Qwen2Config(tie_word_embeddings=False, **common)
    if family == "qwen3":
        return Qwen3Config(tie_word_embeddings=True, head_dim=12, **common)
    return LlamaConfig(tie_word_embeddings=True, **common)


def write_tokens(path, tokens):
    header = [0] * 256
    header[2:8] = [2, 4, len(tokens), VOCAB, 0, 0]
    with open(path, "wb") as f:
        f.write(b"BIN.TOK\n")
        f.write(struct.pack("<254i", *header[2:]))
        f.write(struct.pack(f"<{len(tokens)}i", *tokens))


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def run_family(family, build, work):
    d = os.path.join(work, family)
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(0)
    base_dir = os.path.join(d, "base")
    model = AutoModelForCausalLM.from_config(config(family), attn_implementation="eager").float()
    with torch.no_grad():
        for name, p in model.named_parameters():  # norms away from 1 so a wrong copy would show
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.save_pretrained(base_dir)
    rng = np.random.default_rng(1)
    tokens = os.path.join(d, "train.bin")
    write_tokens(tokens, [int(t) for t in rng.integers(1, VOCAB, 20000)])
    common = [os.path.join(build, "train"), "--device=cpu", f"--model={base_dir}", f"--train-file={tokens}",
              "--batch-size=2", "--seq-len=32", "--grad-accumulation=1", "--steps=4", "--learning-rate=2e-2",
              "--eval-every-n-steps=0", "--lora-rank=4", "--lora-alpha=8", "--train-also=norms,embeddings"]
    adapter_dir, merged_dir = os.path.join(d, "adapter"), os.path.join(d, "merged")
    for out, extra in ((adapter_dir, []), (merged_dir, ["--merge-lora"])):
        subprocess.run(common + [f"--out-dir={out}", f"--checkpoint-dir={out}-ckpt",
                                 f"--log-file={out}.jsonl", "--overwrite"] + extra, check=True, stdout=subprocess.DEVNULL)

    ok = True

    def check(what, err, bound):
        nonlocal ok
        good = err <= bound
        ok &= good
        print(f"  {family}: {what}: {err:.3g} (bound {bound:g}) {'ok' if good else 'FAIL'}")

    saved = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
    peft_model = PeftModel.from_pretrained(base, adapter_dir)
    state = peft_model.state_dict()
    worst, missing = 0.0, []
    for name, value in saved.items():
        if ".lora_" in name:
            continue
        # PEFT's in-memory name: the module's modules_to_save copy of the adapter "default"
        module, leaf = name.rsplit(".", 1)
        key = f"{module}.modules_to_save.default.{leaf}"
        if key not in state:
            missing.append(key)
            continue
        worst = max(worst, rel(state[key].numpy(), value))
    print(f"  {family}: {sum('.lora_' not in n for n in saved)} trained base tensors in the adapter")
    check("modules_to_save copies vs the adapter file" + (f" (not loaded: {missing})" if missing else ""),
          worst if not missing else float("inf"), 0.0)
    inputs = torch.tensor(rng.integers(1, VOCAB, (2, 16)))
    with torch.no_grad():
        peft_logits = peft_model(inputs).logits.numpy()
        merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32, attn_implementation="eager")
        merged_logits = merged(inputs).logits.numpy()
        base_logits = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)(inputs).logits.numpy()
    check("PeftModel logits vs the merged export's", rel(peft_logits, merged_logits), 1e-4)
    print(f"  {family}: (the training moved the logits by {rel(peft_logits, base_logits):.3g} from the base's)")
    ref = peft_model.merge_and_unload().state_dict()
    mine = load_file(os.path.join(merged_dir, "model.safetensors"))
    worst = max((rel(mine[n], ref[n].numpy()), n) for n in mine)
    check("merged export vs merge_and_unload" + (f" (worst {worst[1]})" if worst[0] > 0 else " (every tensor equal)"),
          worst[0], 1e-5)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--work", default="/tmp/qtrain-peft-also")
    a = ap.parse_args()
    ok = all([run_family(f, a.build, a.work) for f in ("qwen2", "qwen3", "llama")])
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
