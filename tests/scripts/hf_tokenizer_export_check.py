#!/usr/bin/env python3
"""HF's own libraries load what `train --tokenizer=qwen.tiktoken` puts into output/, with qtrain's ids.

    python3 tests/scripts/hf_tokenizer_export_check.py --train build/train --tokenize build/tokenize \
        --reference-dir build/tokenizer-reference

Needs `tokenizers` and `transformers` (no torch); tests/scripts/hf_tokenizer_export_test.sh runs it
under `uv run` for ctest. On the varied reference corpus (reference.bin, the C++ tokenizer tests'
documents) it
  1. tokenizes with qtrain (`tokenize --tokenizer=qwen.tiktoken`, special tokens as text and recognized),
  2. trains a tiny Qwen2 model one step on those tokens with `train --tokenizer=qwen.tiktoken`,
  3. loads output/tokenizer.json with `tokenizers` and output/ with transformers' AutoTokenizer,
and checks that both give qtrain's ids for every document, in both special-token modes, and that
AutoTokenizer sees the Qwen2.5 base model's tokens (eos = pad = <|endoftext|> = 151643).
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

EOT = 151643


def reference_documents(path):
    """The raw documents of reference.bin (layout: scripts/tokenizer_make_reference.py)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"QTOKREF1", f"{path}: not a reference.bin"
    pos = 8

    def u32():
        nonlocal pos
        (v,) = struct.unpack_from("<I", data, pos)
        pos += 4
        return v

    def skip(item_bytes):  # `pos += 4 * u32()` would add to pos as it was before u32() moved it
        nonlocal pos
        n = u32()
        pos += item_bytes * n

    docs = []
    for _ in range(u32()):
        n = u32()
        docs.append(data[pos:pos + n])
        pos += n
        skip(1)  # the normalized text
        for _ in range(3):
            skip(4)  # the ids
    return docs


def token_file_ids(path):
    with open(path, "rb") as f:
        header = f.read(1024)
        assert header[:8] == b"BIN.TOK\n", f"{path}: not a BIN.TOK file"
        (n,) = struct.unpack_from("<i", header, 16)
        return list(struct.unpack(f"<{n}i", f.read(4 * n)))


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-3000:]}")
    return r.stdout


def compare(what, docs, hf_ids, qtrain_stream):
    """qtrain's stream is every document's ids followed by <|endoftext|>."""
    expected = []
    for ids in hf_ids:
        expected += list(ids) + [EOT]
    if expected == qtrain_stream:
        print(f"ok: {what}: {len(docs)} documents, {len(expected)} tokens equal")
        return True
    pos = 0
    for i, ids in enumerate(hf_ids):
        n = len(ids) + 1
        if qtrain_stream[pos:pos + n] != list(ids) + [EOT]:
            print(f"FAIL: {what}: document {i} {docs[i][:80]!r}:\n  HF:     {list(ids)[:40]}\n"
                  f"  qtrain: {qtrain_stream[pos:pos + n][:40]}")
            return False
        pos += n
    print(f"FAIL: {what}: {len(expected)} HF tokens, {len(qtrain_stream)} qtrain tokens")
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--tokenize", required=True)
    ap.add_argument("--reference-dir", required=True, help="holds qwen.tiktoken and reference.bin")
    args = ap.parse_args()
    import tokenizers
    import transformers

    tiktoken = os.path.join(args.reference_dir, "qwen.tiktoken")
    # HF takes text, qtrain bytes: the documents as Python reads files with errors="replace", the
    # same repair qtrain applies; empty ones dropped (nothing to compare).
    docs = [d.decode("utf-8", errors="replace") for d in reference_documents(os.path.join(args.reference_dir, "reference.bin"))]
    docs = [d for d in docs if d]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.jsonl")
        with open(corpus, "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"text": d}) + "\n")
        streams = {}
        for mode in ("text", "recognize"):
            out = os.path.join(tmp, f"data-{mode}")
            run([args.tokenize, f"--tokenizer={tiktoken}", f"--input={corpus}", f"--out-dir={out}",
                 f"--special-tokens={mode}", "--no-progress"])
            streams[mode] = token_file_ids(os.path.join(out, "train.bin"))

        model = os.path.join(tmp, "tiny-qwen")
        os.makedirs(model)
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936,
                       "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
                       "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
                       "bos_token_id": EOT, "eos_token_id": EOT, "hidden_act": "silu"}, f)
        output = os.path.join(tmp, "output")
        run([args.train, "--device=cpu", f"--model={model}", "--from-scratch", f"--tokenizer={tiktoken}",
             f"--train-file={os.path.join(tmp, 'data-text', 'train.bin')}", "--steps=1", "--batch-size=1",
             "--seq-len=32", "--grad-accumulation=1", f"--out-dir={output}", f"--checkpoint-dir={tmp}/ckpt"])

        ok = True
        tok = tokenizers.Tokenizer.from_file(os.path.join(output, "tokenizer.json"))
        ok &= compare(f"tokenizers {tokenizers.__version__}, special tokens recognized", docs,
                      [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)], streams["recognize"])
        tok.encode_special_tokens = True
        ok &= compare(f"tokenizers {tokenizers.__version__}, special tokens as text", docs,
                      [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)], streams["text"])

        auto = transformers.AutoTokenizer.from_pretrained(output)
        what = f"transformers {transformers.__version__} AutoTokenizer ({type(auto).__name__})"
        ok &= compare(f"{what}, special tokens recognized", docs,
                      auto(docs, add_special_tokens=False)["input_ids"], streams["recognize"])
        ok &= compare(f"{what}, split_special_tokens", docs,
                      auto(docs, add_special_tokens=False, split_special_tokens=True)["input_ids"], streams["text"])
        facts = {"class": type(auto).__name__, "len": len(auto), "eos": (auto.eos_token, auto.eos_token_id),
                 "pad": (auto.pad_token, auto.pad_token_id), "im_start": auto.convert_tokens_to_ids("<|im_start|>")}
        want = {"class": "Qwen2Tokenizer",  # transformers 5's name (4.x: Qwen2TokenizerFast)
                "len": 151665, "eos": ("<|endoftext|>", EOT), "pad": ("<|endoftext|>", EOT), "im_start": 151644}
        if facts != want:
            print(f"FAIL: {what}: {facts}, expected {want}")
            ok = False
        else:
            print(f"ok: {what}: {facts}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
