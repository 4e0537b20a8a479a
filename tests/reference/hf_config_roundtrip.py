#!/usr/bin/env python3
"""config.json round trip through the real transformers libraries (CPU, no torch needed).

Each listed transformers version saves Qwen2 configs with a non-default RoPE base, RMSNorm eps and
tied/untied embeddings (save_pretrained: 4.x writes a top-level "rope_theta", 5.x only
"rope_parameters"). qtrain (`train --device=cpu --from-scratch --steps=0`) reads each one; the
"model" event of its log must hold the values that were saved. Then every version loads qtrain's
exported config.json and must see the same model: RoPE base and type, eps, tie, shapes, full
attention on every layer, and no warning from transformers while loading.

The libraries come from uv environments (`uv run --no-project --with transformers==V`), which uv
caches. Exits 77 (ctest SKIP_RETURN_CODE) when uv is missing or cannot set up an environment
(no network and nothing cached).

usage: hf_config_roundtrip.py --train build/train --work DIR [--uv PATH] [--versions 4.57.6,5.17.0]
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

SKIP = 77
SHAPE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)
# Values no fallback can give (qtrain's missing-field defaults are theta 10000, eps 1e-6, untied).
CASES = {
    "theta5e5_eps1e-5_tied": dict(rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "theta1e6_eps2e-6_untied": dict(rope_theta=1000000.0, rms_norm_eps=2e-6, tie_word_embeddings=False),
}


# ---- run inside a uv environment with one transformers version -------------------------------------

def hf_save(out_root):
    """Saves every case as this transformers version writes it."""
    import transformers
    from transformers import Qwen2Config
    v5 = int(transformers.__version__.split(".")[0]) >= 5
    for name, case in CASES.items():
        kw = dict(SHAPE, rms_norm_eps=case["rms_norm_eps"], tie_word_embeddings=case["tie_word_embeddings"])
        if v5:
            kw["rope_parameters"] = {"rope_type": "default", "rope_theta": case["rope_theta"]}
        else:
            kw["rope_theta"] = case["rope_theta"]
        Qwen2Config(**kw).save_pretrained(os.path.join(out_root, name))


def hf_load(dirs):
    """Prints, as JSON, what this transformers version builds its Qwen2 model from in each directory."""
    import logging
    import warnings
    import transformers
    from transformers import AutoConfig

    class Collect(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    handler = Collect()
    transformers.logging.get_logger().addHandler(handler)  # the library's root logger
    result = {"version": transformers.__version__, "configs": {}}
    for d in dirs:
        handler.messages.clear()
        # transformers says some warnings once per process (an lru_cache); each directory must be told.
        if hasattr(getattr(logging.Logger, "warning_once", None), "cache_clear"):
            logging.Logger.warning_once.cache_clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            c = AutoConfig.from_pretrained(d)
        v5 = int(transformers.__version__.split(".")[0]) >= 5  # 4.x keeps rope_parameters as an unread attribute
        # The values transformers' Qwen2RotaryEmbedding reads (4.x: rope_theta, rope_scaling's type;
        # 5.x: rope_parameters["rope_theta"], ["rope_type"]).
        if v5:
            theta, rope_type = c.rope_parameters.get("rope_theta"), c.rope_parameters.get("rope_type")
        else:
            rs = getattr(c, "rope_scaling", None)
            theta = c.rope_theta
            rope_type = rs.get("rope_type", rs.get("type")) if isinstance(rs, dict) else "default"
        result["configs"][d] = {
            "model_type": c.model_type,
            "rope_theta": theta,
            "rope_type": rope_type,
            "partial_rotary_factor": getattr(c, "partial_rotary_factor", None),
            "rms_norm_eps": c.rms_norm_eps,
            "tie_word_embeddings": c.tie_word_embeddings,
            "shape": {k: getattr(c, k) for k in SHAPE},
            "head_dim": getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
            "layer_types": list(c.layer_types),
            "sliding_window": c.sliding_window,  # None unless use_sliding_window
            "attention_dropout": c.attention_dropout,
            "hidden_act": c.hidden_act,
            "warnings": handler.messages + [str(w.message) for w in caught],
        }
    print(json.dumps(result))


# ---- the driver (plain python3) -------------------------------------------------------------------

def write_tokens(path, n, vocab):
    """A BIN.TOK v2 file: 256 int32 header words, then n int32 tokens."""
    header = [0] * 256
    header[0:2] = struct.unpack("<2i", b"BIN.TOK\n")
    header[2:7] = [2, 4, n, vocab, 0]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{n}i", *[(7 * i) % vocab for i in range(n)]))


class Env:
    """`uv run` with one transformers version; None from setup() when uv cannot provide it."""

    def __init__(self, uv, version):
        self.uv, self.version = uv, version

    def cmd(self, *args, offline=False):
        return [self.uv, "run", "--no-project", "--quiet"] + (["--offline"] if offline else []) + [
            "--with", f"transformers=={self.version}", "python", os.path.abspath(__file__)] + list(args)

    def setup(self):
        # Offline first: a cached environment needs no network; otherwise let uv fetch it once.
        for offline in (True, False):
            try:
                r = subprocess.run(self.cmd("--probe", offline=offline), capture_output=True, text=True,
                                   timeout=300)
            except subprocess.TimeoutExpired:  # a network that hangs rather than refuses
                print(f"uv timed out setting up transformers=={self.version}")
                return None
            if r.returncode == 0 and r.stdout.strip() == self.version:
                return self
        print(f"uv cannot provide transformers=={self.version}: {r.stderr.strip()[-800:]}")
        return None

    def run(self, *args):  # after setup() the environment is cached
        r = subprocess.run(self.cmd(*args, offline=True), capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"transformers {self.version} failed ({' '.join(args[:1])}):\n{r.stdout}\n{r.stderr}")
        return r.stdout


def close(a, b):
    return a is not None and abs(a - b) <= 1e-12 * abs(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", required=True, help="qtrain's train executable")
    ap.add_argument("--work", required=True, help="scratch directory (emptied first)")
    ap.add_argument("--uv", default=shutil.which("uv") or os.path.expanduser("~/.local/bin/uv"))
    ap.add_argument("--versions", default="4.57.6,5.17.0", help="transformers versions, comma separated")
    a = ap.parse_args()
    if not os.path.exists(a.uv):
        print(f"SKIP: uv not found ({a.uv})")
        return SKIP
    envs = [Env(a.uv, v).setup() for v in a.versions.split(",")]
    if None in envs:
        print("SKIP: a transformers environment is not available (no network and not cached)")
        return SKIP

    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    tokens = os.path.join(a.work, "tokens.bin")
    write_tokens(tokens, 64, SHAPE["vocab_size"])
    failures = []

    def check(ok, what):
        print(f"  {'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failures.append(what)

    exported = {}  # output dir -> the case it came from
    for env in envs:
        saved = os.path.join(a.work, f"saved-{env.version}")
        env.run("--save", saved)
        for name, case in CASES.items():
            src = os.path.join(saved, name)
            out = os.path.join(a.work, f"out-{env.version}-{name}")
            print(f"transformers {env.version} saved {name}; qtrain reads it:")
            r = subprocess.run([a.train, "--device=cpu", f"--model={src}", "--from-scratch", "--steps=0",
                                f"--train-file={tokens}", "--batch-size=1", "--seq-len=16", f"--out-dir={out}",
                                f"--checkpoint-dir={os.path.join(out, 'ckpt')}"], capture_output=True, text=True)
            if r.returncode != 0:
                check(False, f"qtrain on {src}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
                continue
            with open(os.path.join(out, "log.jsonl")) as f:
                model = next(e for e in map(json.loads, f) if e["log"] == "model")["config"]
            check(close(model["rope_theta"], case["rope_theta"]),
                  f"qtrain's rope_theta {model['rope_theta']} == {case['rope_theta']}")
            check(close(model["rms_norm_eps"], case["rms_norm_eps"]),
                  f"qtrain's rms_norm_eps {model['rms_norm_eps']} == {case['rms_norm_eps']}")
            check(model["tie_word_embeddings"] == case["tie_word_embeddings"],
                  f"qtrain's tie_word_embeddings {model['tie_word_embeddings']} == {case['tie_word_embeddings']}")
            exported[out] = case

    dirs = sorted(exported)
    for env in envs:
        print(f"transformers {env.version} loads qtrain's exported config.json:")
        seen = json.loads(env.run("--load", *dirs))
        check(seen["version"] == env.version, f"running transformers {seen['version']}")
        for d in dirs:
            case, c = exported[d], seen["configs"][d]
            tag = os.path.basename(d)
            check(close(c["rope_theta"], case["rope_theta"]) and c["rope_type"] == "default",
                  f"{tag}: RoPE {c['rope_type']} base {c['rope_theta']} == default {case['rope_theta']}")
            check(c["partial_rotary_factor"] in (None, 1.0), f"{tag}: partial_rotary_factor {c['partial_rotary_factor']}")
            check(close(c["rms_norm_eps"], case["rms_norm_eps"]), f"{tag}: rms_norm_eps {c['rms_norm_eps']}")
            check(c["tie_word_embeddings"] == case["tie_word_embeddings"],
                  f"{tag}: tie_word_embeddings {c['tie_word_embeddings']}")
            check(c["shape"] == SHAPE and c["head_dim"] == 8, f"{tag}: shape {c['shape']}, head_dim {c['head_dim']}")
            check(c["layer_types"] == ["full_attention"] * SHAPE["num_hidden_layers"] and c["sliding_window"] is None,
                  f"{tag}: layer_types {c['layer_types']}, sliding_window {c['sliding_window']}")
            check(c["model_type"] == "qwen2" and c["hidden_act"] == "silu" and c["attention_dropout"] == 0.0,
                  f"{tag}: {c['model_type']}, {c['hidden_act']}, attention_dropout {c['attention_dropout']}")
            check(not c["warnings"], f"{tag}: no warnings while loading {c['warnings']}")
    print(f"{len(failures)} failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--probe":
        import transformers
        print(transformers.__version__)
    elif len(sys.argv) > 1 and sys.argv[1] == "--save":
        hf_save(sys.argv[2])
    elif len(sys.argv) > 1 and sys.argv[1] == "--load":
        hf_load(sys.argv[2:])
    else:
        sys.exit(main())
