#!/usr/bin/env python3
"""Writes config.json directories for the family benchmarks: the published shape of a preset, and for
Qwen3 its twin without the q/k norm (LlamaForCausalLM: no biases, the same head_dim, plain RoPE, the
same theta and eps), so that `train --from-scratch --model=DIR` of the two measures what the q/k norm
costs on the same shape.

usage: python3 bench/family_configs.py OUT_DIR   (writes OUT_DIR/Qwen3-0.6B, OUT_DIR/Qwen3-0.6B-no-qk-norm, ...)
"""
import json
import os
import sys

QWEN3 = {  # hidden, intermediate, layers, heads, kv heads, tied (head_dim 128, vocab 151936)
    "Qwen3-0.6B": (1024, 3072, 28, 16, 8, True),
    "Qwen3-1.7B": (2048, 6144, 28, 16, 8, True),
}


def main():
    out = sys.argv[1]
    for name, (h, i, layers, heads, kv, tied) in QWEN3.items():
        common = {"hidden_size": h, "intermediate_size": i, "num_hidden_layers": layers,
                  "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": 128, "vocab_size": 151936,
                  "tie_word_embeddings": tied, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
                  "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False,
                  "bos_token_id": 151643, "eos_token_id": 151645}
        for suffix, arch, mtype in (("", "Qwen3ForCausalLM", "qwen3"), ("-no-qk-norm", "LlamaForCausalLM", "llama")):
            d = os.path.join(out, name + suffix)
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump({"architectures": [arch], "model_type": mtype, **common}, f, indent=2)
            print(d)


if __name__ == "__main__":
    main()
